/**
 * JSON Schema `pattern` (an ECMA-262 regular expression) → GBNF for the inside of a JSON string.
 * The pattern is compiled to a deterministic automaton over code points, so every string the
 * grammar allows matches the pattern exactly: literals, `.`, classes, `\d \w \s` and their
 * negations, groups, alternation, quantifiers, and lookaheads at the start (`^(?!…)…`, as pydantic
 * writes for Decimal), which become intersections. As JSON Schema defines it, a pattern matches
 * anywhere in the string unless anchored with `^`/`$`. Characters are emitted as a JSON string
 * needs them (`"` as `\"`, `\` as `\\`). Backreferences, lookbehinds and word boundaries have no
 * grammar: they are refused.
 */

/** Thrown for a pattern the grammar cannot express; the message says what. */
export class PatternError extends Error {
  /** Whether the automaton outgrew its bound (the pattern itself may be fine on its own). */
  readonly tooLarge: boolean;
  constructor(message: string, tooLarge = false) {
    super(message);
    this.tooLarge = tooLarge;
  }
}

/**
 * What the text of a string must satisfy at once: every pattern (each as JSON Schema means it) and
 * the length bounds, counted in code points as JSON Schema counts them.
 */
export interface StringConstraints {
  patterns: readonly string[];
  minLength?: number;
  maxLength?: number;
}

/** Most automaton states a pattern may need. */
const MAX_STATES = 4000;
const MAX_CODE = 0x10ffff;

/** A set of code points as sorted, disjoint, inclusive ranges. */
type CharSet = [number, number][];

type Node =
  | { kind: "set"; set: CharSet }
  | { kind: "seq"; items: Node[] }
  | { kind: "alt"; items: Node[] }
  | { kind: "repeat"; item: Node; min: number; max: number | undefined }
  | { kind: "empty" };

function normalize(set: CharSet): CharSet {
  const sorted = set.filter(([a, b]) => a <= b).sort((x, y) => x[0] - y[0]);
  const out: CharSet = [];
  for (const [a, b] of sorted) {
    const last = out.at(-1);
    if (last && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** Every character a JSON string can hold (code points, without lone surrogates). */
const ANY: CharSet = [[0, 0xd7ff], [0xe000, MAX_CODE]];

function complement(set: CharSet): CharSet {
  const out: CharSet = [];
  let next = 0;
  for (const [a, b] of normalize(set)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= MAX_CODE) out.push([next, MAX_CODE]);
  return intersectSets(out, ANY);
}

function intersectSets(a: CharSet, b: CharSet): CharSet {
  const out: CharSet = [];
  for (const [x, y] of a) {
    for (const [u, v] of b) {
      if (Math.max(x, u) <= Math.min(y, v)) out.push([Math.max(x, u), Math.min(y, v)]);
    }
  }
  return normalize(out);
}

const cp = (ch: string) => ch.codePointAt(0)!;
const DIGIT: CharSet = [[0x30, 0x39]];
const WORD: CharSet = normalize([[0x61, 0x7a], [0x41, 0x5a], [0x30, 0x39], [0x5f, 0x5f]]);
const SPACE: CharSet = normalize([[0x20, 0x20], [0x09, 0x0d], [0xa0, 0xa0], [0xfeff, 0xfeff], [
  0x2028,
  0x2029,
]]);
const DOT: CharSet = complement([[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]]);

/** The parsed pattern: optional start lookaheads, the body, and its anchors. */
interface Pattern {
  lookaheads: { negative: boolean; node: Node; anchoredEnd: boolean }[];
  body: Node;
  anchoredStart: boolean;
  anchoredEnd: boolean;
}

class Parser {
  #i = 0;
  constructor(readonly src: string) {}

  fail(why: string): never {
    throw new PatternError(`${why} at position ${this.#i} of the pattern`);
  }
  get done(): boolean {
    return this.#i >= this.src.length;
  }
  peek(k = 0): string | undefined {
    return this.src[this.#i + k];
  }
  eat(text: string): boolean {
    if (this.src.startsWith(text, this.#i)) {
      this.#i += text.length;
      return true;
    }
    return false;
  }

  pattern(): Pattern {
    const anchoredStart = this.eat("^");
    const lookaheads: Pattern["lookaheads"] = [];
    while (this.peek() === "(" && this.peek(1) === "?" && (this.peek(2) === "=" || this.peek(2) === "!")) {
      if (!anchoredStart) this.fail("a lookahead that is not at the anchored start");
      this.#i += 2;
      const negative = this.src[this.#i++] === "!";
      this.eat("^");
      const node = this.alternation();
      const anchoredEnd = this.eat("$");
      if (!this.eat(")")) this.fail("a missing ')'");
      lookaheads.push({ negative, node, anchoredEnd });
    }
    const body = this.alternation();
    const anchoredEnd = this.eat("$");
    if (!this.done) this.fail(`unexpected '${this.peek()}'`);
    return { lookaheads, body, anchoredStart, anchoredEnd };
  }

  alternation(): Node {
    const items = [this.sequence()];
    while (this.eat("|")) items.push(this.sequence());
    return items.length === 1 ? items[0] : { kind: "alt", items };
  }

  sequence(): Node {
    const items: Node[] = [];
    while (!this.done && this.peek() !== "|" && this.peek() !== ")") {
      if (this.peek() === "$" && (this.#i === this.src.length - 1 || this.peek(1) === ")")) break;
      items.push(this.quantified(this.atom()));
    }
    return items.length === 0 ? { kind: "empty" } : items.length === 1 ? items[0] : { kind: "seq", items };
  }

  quantified(item: Node): Node {
    let out: Node;
    if (this.eat("*")) out = { kind: "repeat", item, min: 0, max: undefined };
    else if (this.eat("+")) out = { kind: "repeat", item, min: 1, max: undefined };
    else if (this.eat("?")) out = { kind: "repeat", item, min: 0, max: 1 };
    else {
      const m = this.src.slice(this.#i).match(/^\{(\d+)(,(\d*))?\}/);
      if (!m) return item;
      this.#i += m[0].length;
      const min = Number(m[1]);
      const max = m[2] === undefined ? min : m[3] === "" ? undefined : Number(m[3]);
      if (max !== undefined && max < min) this.fail("a {min,max} quantifier with max below min");
      if (min > 256 || (max ?? 0) > 256) this.fail("a repetition over 256");
      out = { kind: "repeat", item, min, max };
    }
    this.eat("?"); // a lazy quantifier matches the same strings
    if (/^[*+?]/.test(this.peek() ?? "") || /^\{\d/.test(this.src.slice(this.#i))) {
      this.fail("a quantifier after a quantifier");
    }
    return out;
  }

  atom(): Node {
    const ch = this.src[this.#i++];
    switch (ch) {
      case "(": {
        if (this.eat("?")) {
          if (this.eat(":")) { /* non-capturing */ }
          else if (/^<[A-Za-z]\w*>/.test(this.src.slice(this.#i))) {
            this.#i = this.src.indexOf(">", this.#i) + 1; // a named group matches the same strings
          } else this.fail("a lookaround inside the pattern");
        }
        const inner = this.alternation();
        if (!this.eat(")")) this.fail("a missing ')'");
        return inner;
      }
      case ")":
        this.fail("an unmatched ')'");
        break;
      case "[":
        return { kind: "set", set: this.#class() };
      case ".":
        return { kind: "set", set: DOT };
      case "^":
      case "$":
        this.fail(`'${ch}' inside the pattern (only at its start and end)`);
        break;
      case "\\": {
        const e = this.src[this.#i++];
        if (e === undefined) this.fail("a trailing backslash");
        return { kind: "set", set: this.#escapeSet(e) ?? [[this.#escapeChar(e), this.#escapeChar(e)]] };
      }
      case "*":
      case "+":
      case "?":
        this.fail(`a quantifier '${ch}' with nothing to repeat`);
        break;
      case "{":
        if (/^\d+(,\d*)?\}/.test(this.src.slice(this.#i))) {
          this.fail("a quantifier '{' with nothing to repeat");
        }
    }
    const code = this.#codePoint(ch);
    return { kind: "set", set: [[code, code]] };
  }

  #codePoint(first: string): number {
    const c = first.charCodeAt(0);
    if (c >= 0xd800 && c < 0xdc00 && this.#i < this.src.length) return cp(first + this.src[this.#i++]);
    return c;
  }

  #escapeSet(e: string): CharSet | undefined {
    switch (e) {
      case "d":
        return DIGIT;
      case "D":
        return complement(DIGIT);
      case "w":
        return WORD;
      case "W":
        return complement(WORD);
      case "s":
        return SPACE;
      case "S":
        return complement(SPACE);
    }
    return undefined;
  }

  #escapeChar(e: string): number {
    const simple: Record<string, number> = { n: 10, r: 13, t: 9, f: 12, v: 11, "0": 0 };
    if (e in simple) return simple[e];
    if (e === "b" || e === "B") this.fail("word boundaries have no grammar");
    if (e === "x" || e === "u") {
      const n = e === "x" ? 2 : 4;
      const hex = this.src.slice(this.#i, this.#i + n);
      if (!new RegExp(`^[0-9a-fA-F]{${n}}$`).test(hex)) this.fail(`a malformed \\${e} escape`);
      this.#i += n;
      return parseInt(hex, 16);
    }
    if (/[1-9]/.test(e)) this.fail("backreferences have no grammar");
    if (/[A-Za-z]/.test(e)) this.fail(`the escape '\\${e}' is not supported`);
    return this.#codePoint(e);
  }

  #class(): CharSet {
    const negated = this.eat("^");
    const items: CharSet = [];
    let first = true;
    while (!this.done && (this.peek() !== "]" || first)) {
      first = false;
      const ch = this.src[this.#i++];
      let lo: number;
      if (ch === "\\") {
        const e = this.src[this.#i++];
        const set = e === undefined ? this.fail("a trailing backslash") : this.#escapeSet(e);
        if (set) {
          items.push(...set);
          continue;
        }
        lo = this.#escapeChar(e);
      } else lo = this.#codePoint(ch);
      if (this.peek() === "-" && this.peek(1) !== undefined && this.peek(1) !== "]") {
        this.#i++;
        const h = this.src[this.#i++];
        const hi = h === "\\" ? this.#escapeChar(this.src[this.#i++]) : this.#codePoint(h);
        if (hi < lo) this.fail("a class range out of order");
        items.push([lo, hi]);
      } else items.push([lo, lo]);
    }
    if (!this.eat("]")) this.fail("a missing ']'");
    return negated ? complement(items) : normalize(items);
  }
}

/** A nondeterministic automaton: transitions on char sets, epsilon moves. */
class Nfa {
  readonly edges: { set: CharSet; to: number }[][] = [];
  readonly eps: number[][] = [];
  add(): number {
    this.edges.push([]);
    this.eps.push([]);
    return this.edges.length - 1;
  }
  /** States for `node` between `from` and a new end state, which is returned. */
  build(node: Node, from: number): number {
    switch (node.kind) {
      case "empty":
        return from;
      case "set": {
        const to = this.add();
        this.edges[from].push({ set: node.set, to });
        return to;
      }
      case "seq":
        return node.items.reduce((at, item) => this.build(item, at), from);
      case "alt": {
        const end = this.add();
        for (const item of node.items) this.eps[this.build(item, from)].push(end);
        return end;
      }
      case "repeat": {
        let at = from;
        for (let i = 0; i < node.min; i++) at = this.build(node.item, at);
        if (node.max === undefined) {
          const loop = this.add();
          this.eps[at].push(loop);
          this.eps[this.build(node.item, loop)].push(loop);
          return loop;
        }
        const end = this.add();
        this.eps[at].push(end);
        for (let i = node.min; i < node.max; i++) {
          at = this.build(node.item, at);
          this.eps[at].push(end);
        }
        return end;
      }
    }
  }
}

/** A deterministic automaton over disjoint char-set "letters". */
interface Dfa {
  /** transitions[state] = list of [letter index, next state]. */
  next: Map<number, number>[];
  accepting: boolean[];
}

/** Splits the code points into letters: maximal ranges no char set cuts. */
function letters(sets: CharSet[]): CharSet {
  const cuts = new Set<number>([0, MAX_CODE + 1]);
  for (const s of sets) for (const [a, b] of s) cuts.add(a).add(b + 1);
  const points = [...cuts].sort((a, b) => a - b);
  // Lone surrogates are no characters: the letters leave them out.
  return points.slice(0, -1).map((p, i): [number, number] => [p, points[i + 1] - 1])
    .filter(([a, b]) => inSet(ANY, [a, b]));
}

function setsOf(node: Node, out: CharSet[] = []): CharSet[] {
  if (node.kind === "set") out.push(node.set);
  else if (node.kind === "seq" || node.kind === "alt") node.items.forEach((n) => setsOf(n, out));
  else if (node.kind === "repeat") setsOf(node.item, out);
  return out;
}

function inSet(set: CharSet, [a, b]: [number, number]): boolean {
  return set.some(([x, y]) => a >= x && b <= y);
}

/** The automaton of strings matching `node` exactly (or with anything before/after when unanchored). */
function compile(node: Node, alphabet: CharSet, anyBefore: boolean, anyAfter: boolean): Dfa {
  const nfa = new Nfa();
  const start = nfa.add();
  let from = start;
  if (anyBefore) {
    from = nfa.build({ kind: "repeat", item: { kind: "set", set: ANY }, min: 0, max: undefined }, from);
  }
  let end = nfa.build(node, from);
  if (anyAfter) {
    end = nfa.build({ kind: "repeat", item: { kind: "set", set: ANY }, min: 0, max: undefined }, end);
  }
  const closure = (states: number[]) => {
    const seen = new Set(states);
    const stack = [...states];
    while (stack.length) for (const t of nfa.eps[stack.pop()!]) if (!seen.has(t)) seen.add(t), stack.push(t);
    return [...seen].sort((a, b) => a - b);
  };
  const keyOf = (s: number[]) => s.join(",");
  const first = closure([start]);
  const index = new Map([[keyOf(first), 0]]);
  const sets = [first];
  const dfa: Dfa = { next: [], accepting: [] };
  for (let i = 0; i < sets.length; i++) {
    if (sets.length > MAX_STATES) {
      throw new PatternError(`the pattern needs over ${MAX_STATES} automaton states`, true);
    }
    const cur = sets[i];
    dfa.accepting[i] = cur.includes(end);
    dfa.next[i] = new Map();
    alphabet.forEach((letter, li) => {
      const moved = cur.flatMap((s) => nfa.edges[s].filter((e) => inSet(e.set, letter)).map((e) => e.to));
      if (moved.length === 0) return;
      const target = closure(moved);
      const key = keyOf(target);
      if (!index.has(key)) {
        index.set(key, sets.length);
        sets.push(target);
      }
      dfa.next[i].set(li, index.get(key)!);
    });
  }
  return dfa;
}

/** Strings accepted by `a` and (if `negate`, not) by `b`: the product automaton. */
function intersect(a: Dfa, b: Dfa, negate: boolean, alphabetSize: number): Dfa {
  const DEAD = -1;
  const index = new Map<string, number>([["0,0", 0]]);
  const pairs: [number, number][] = [[0, 0]];
  const out: Dfa = { next: [], accepting: [] };
  for (let i = 0; i < pairs.length; i++) {
    if (pairs.length > MAX_STATES) {
      throw new PatternError(`the constraints need over ${MAX_STATES} automaton states`, true);
    }
    const [x, y] = pairs[i];
    const inB = y !== DEAD && b.accepting[y];
    out.accepting[i] = a.accepting[x] && (negate ? !inB : inB);
    out.next[i] = new Map();
    for (let li = 0; li < alphabetSize; li++) {
      const nx = a.next[x].get(li);
      if (nx === undefined) continue;
      const ny = y === DEAD ? DEAD : b.next[y].get(li) ?? DEAD;
      if (!negate && ny === DEAD) continue;
      const key = `${nx},${ny}`;
      if (!index.has(key)) {
        index.set(key, pairs.length);
        pairs.push([nx, ny]);
      }
      out.next[i].set(li, index.get(key)!);
    }
  }
  return out;
}

/** States from which an accepting state can be reached. */
function live(d: Dfa): Set<number> {
  const alive = new Set<number>(d.accepting.flatMap((a, i) => a ? [i] : []));
  let grew = true;
  while (grew) {
    grew = false;
    d.next.forEach((m, i) => {
      if (!alive.has(i) && [...m.values()].some((t) => alive.has(t))) {
        alive.add(i);
        grew = true;
      }
    });
  }
  return alive;
}

/** A char set as GBNF alternatives: raw characters, or JSON-encoded ones (`json`). */
function charSetGbnf(set: CharSet, json: boolean): string {
  if (!json) {
    const item = (c: number) => {
      if (c < 0x20) return `\\x${c.toString(16).padStart(2, "0")}`;
      const ch = String.fromCodePoint(c);
      return /[\]\\^-]/.test(ch) ? `\\${ch}` : ch;
    };
    return `[${set.map(([a, b]) => a === b ? item(a) : `${item(a)}-${item(b)}`).join("")}]`;
  }
  const alts: string[] = [];
  const raw: string[] = [];
  const item = (c: number) => {
    if (c === 0x5d || c === 0x5c || c === 0x5e || c === 0x2d) return `\\${String.fromCodePoint(c)}`;
    return String.fromCodePoint(c);
  };
  for (const [a, b] of set) {
    for (let c = a; c <= Math.min(b, 0x1f); c++) alts.push(jsonEscape(c));
    let lo = Math.max(a, 0x20);
    for (const special of [0x22, 0x5c]) {
      if (special >= lo && special <= b) {
        if (special > lo) raw.push(special - 1 === lo ? item(lo) : `${item(lo)}-${item(special - 1)}`);
        alts.push(jsonEscape(special));
        lo = special + 1;
      }
    }
    if (lo <= b) raw.push(lo === b ? item(lo) : `${item(lo)}-${item(b)}`);
  }
  if (raw.length > 0) alts.unshift(`[${raw.join("")}]`);
  return alts.length === 1 ? alts[0] : `( ${alts.join(" | ")} )`;
}

/** The JSON escape of a character that must be escaped, as a GBNF literal. */
function jsonEscape(c: number): string {
  const encoded = JSON.stringify(String.fromCharCode(c)).slice(1, -1);
  return `"${encoded.replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
}

/** Strings of `min` to `max` letters (any letters; `max` undefined: no upper bound). */
function lengthDfa(alphabetSize: number, min: number, max: number | undefined): Dfa {
  const last = max ?? min;
  if (last > MAX_STATES) {
    throw new PatternError(`a length bound over ${MAX_STATES} next to a pattern or format`, true);
  }
  const dfa: Dfa = { next: [], accepting: [] };
  for (let i = 0; i <= last; i++) {
    dfa.accepting[i] = i >= min;
    dfa.next[i] = new Map();
    const to = i < last ? i + 1 : max === undefined ? last : undefined;
    if (to !== undefined) { for (let li = 0; li < alphabetSize; li++) dfa.next[i].set(li, to); }
  }
  return dfa;
}

/**
 * Rules for the inside of JSON strings matching `pattern`, or meeting all of `constraints`
 * (`json` false: raw text, unescaped); returns the start rule's name. Throws a
 * {@link PatternError} for what no grammar can express, or when the automaton grows too large.
 *
 * @example
 * ```ts
 * const start = patternRules(rules, "sku", "^[A-Z]{3}-\\d{4}$");
 * const code = patternRules(rules, "code", { patterns: ["^[a-z]+$"], maxLength: 8 });
 * ```
 */
export function patternRules(
  rules: { reserve(hint: string): string; define(name: string, body: string): void },
  hint: string,
  constraints: string | StringConstraints,
  json = true,
): string {
  const c = typeof constraints === "string" ? { patterns: [constraints] } : constraints;
  const parsed = c.patterns.map((p) => new Parser(p).pattern());
  const alphabet = letters([
    ...parsed.flatMap((p) => [...setsOf(p.body), ...p.lookaheads.flatMap((l) => setsOf(l.node))]),
    ANY,
  ]);
  const min = c.minLength ?? 0;
  let dfa: Dfa | undefined;
  for (const p of parsed) {
    let one = compile(p.body, alphabet, !p.anchoredStart, !p.anchoredEnd);
    for (const l of p.lookaheads) {
      one = intersect(one, compile(l.node, alphabet, false, !l.anchoredEnd), l.negative, alphabet.length);
    }
    dfa = dfa ? intersect(dfa, one, false, alphabet.length) : one;
  }
  if (min > 0 || c.maxLength !== undefined || !dfa) {
    const length = lengthDfa(alphabet.length, min, c.maxLength);
    dfa = dfa ? intersect(dfa, length, false, alphabet.length) : length;
  }
  const alive = live(dfa);
  if (!alive.has(0)) {
    throw new PatternError(
      c.patterns.length === 1 && min === 0 && c.maxLength === undefined
        ? "the pattern matches no string"
        : "no string meets all of the pattern, format and length constraints",
    );
  }
  const names = new Map([...alive].map((s) => [s, rules.reserve(`${hint}-s${s}`)]));
  for (const s of alive) {
    // Letters to the same state share one alternative.
    const byTarget = new Map<number, CharSet>();
    for (const [li, t] of dfa.next[s]) {
      if (!alive.has(t)) continue;
      byTarget.set(t, [...(byTarget.get(t) ?? []), alphabet[li]]);
    }
    const alts = [...byTarget].map(([t, set]) => `${charSetGbnf(normalize(set), json)} ${names.get(t)}`);
    if (dfa.accepting[s]) alts.push('""');
    rules.define(names.get(s)!, alts.join(" | "));
  }
  return names.get(0)!;
}
