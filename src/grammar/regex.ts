/**
 * JSON Schema `pattern` (an ECMA-262 regular expression) → GBNF for the inside of a JSON string.
 * The pattern is compiled to a deterministic automaton over code points, so every string the
 * grammar allows matches the pattern exactly: literals, `.`, classes, `\d \w \s` and their
 * negations, groups, alternation, quantifiers, and lookaheads at the start (`^(?!…)…`, as pydantic
 * writes for Decimal), which become intersections. As JSON Schema defines it, a pattern matches
 * anywhere in the string unless anchored with `^`/`$`. Characters are emitted as a JSON string
 * needs them (`"` as `\"`, `\` as `\\`). Backreferences, lookbehinds and word boundaries have no
 * grammar: they are refused.
 *
 * Building an automaton can blow up (states multiply with each `(a|b)` before a `{10}`), so its work
 * is metered and bounded ({@link PATTERN_LIMITS}), and done in steps that a request runs in short
 * slices between other work; automata are cached by pattern ({@link AutomatonCache}).
 */

import type { GbnfRules } from "./gbnf.ts";
import { Budget, COSTS, overBudget, SCHEMA_BUDGET } from "./budget.ts";
import { LruCache } from "./lru.ts";
import { GrammarError } from "./errors.ts";
import type { AutomatonSource, PatternAutomaton, StringConstraints } from "./types.ts";

export type { PatternAutomaton, StringConstraints };

/**
 * Thrown for a pattern the grammar cannot express, or whose automaton outgrows its bound; the
 * message says what (a phrase the caller puts in its own sentence).
 */
export class PatternError extends GrammarError {
  /** Whether the automaton outgrew its bound (the pattern itself may be fine on its own). */
  readonly tooLarge: boolean;
  constructor(message: string, tooLarge = false) {
    super(message, { code: tooLarge ? "schema_too_large" : "unsupported_schema", keyword: "pattern" });
    this.tooLarge = tooLarge;
  }
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
/**
 * Every code point, lone surrogates included: what the unanchored ends of a pattern skip (the
 * grammar's alphabet leaves the surrogates out; a tested text may hold one).
 */
const EVERYTHING: CharSet = [[0, MAX_CODE]];

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
/** ECMA-262's WhiteSpace and LineTerminator: what `\s` matches. */
const SPACE: CharSet = normalize([
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
]);
const DOT: CharSet = complement([[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]]);
/** Any text at all: an unanchored end of a pattern (the grammar's letters leave lone surrogates out). */
const ANY_TEXT: Node = { kind: "repeat", item: { kind: "set", set: EVERYTHING }, min: 0, max: undefined };

/** The parsed pattern: optional start lookaheads, the body, and its anchors. */
interface Pattern {
  lookaheads: { negative: boolean; node: Node; anchoredEnd: boolean }[];
  body: Node;
  anchoredStart: boolean;
  anchoredEnd: boolean;
}

class Parser {
  #i = 0;
  #depth = 0;
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

  /**
   * The pattern: one branch, or several (`^a|b$` is `(^a)|(b$)`, as in ECMA-262: each top-level
   * alternative has its own anchors), written as one anchored alternation of them.
   */
  pattern(): Pattern {
    const branches = [this.branch()];
    while (this.eat("|")) branches.push(this.branch());
    if (!this.done) this.fail(`unexpected '${this.peek()}'`);
    if (branches.length === 1) return branches[0];
    if (branches.some((b) => b.lookaheads.length > 0)) {
      this.fail("a lookahead in a pattern of several top-level alternatives");
    }
    const items = branches.map((b): Node => ({
      kind: "seq",
      items: [...(b.anchoredStart ? [] : [ANY_TEXT]), b.body, ...(b.anchoredEnd ? [] : [ANY_TEXT])],
    }));
    return { lookaheads: [], body: { kind: "alt", items }, anchoredStart: true, anchoredEnd: true };
  }

  /** One top-level alternative: its start anchor and lookaheads, its body, its end anchor. */
  branch(): Pattern {
    const anchoredStart = this.eat("^");
    const lookaheads: Pattern["lookaheads"] = [];
    while (this.peek() === "(" && this.peek(1) === "?" && (this.peek(2) === "=" || this.peek(2) === "!")) {
      if (!anchoredStart) this.fail("a lookahead that is not at the anchored start");
      this.#i += 2;
      const negative = this.src[this.#i++] === "!";
      const { node, anchoredEnd } = this.#lookahead();
      if (!this.eat(")")) this.fail("a missing ')'");
      lookaheads.push({ negative, node, anchoredEnd });
    }
    const body = this.sequence();
    const anchoredEnd = this.eat("$");
    if (!this.done && this.peek() !== "|") this.fail(`unexpected '${this.peek()}'`);
    return { lookaheads, body, anchoredStart, anchoredEnd };
  }

  /** A start lookahead's inside: alternatives, each with its own end anchor (`(?=a|b$)`). */
  #lookahead(): { node: Node; anchoredEnd: boolean } {
    const parts: { node: Node; anchoredEnd: boolean }[] = [];
    do {
      this.eat("^"); // the lookahead is at the start already
      const node = this.sequence();
      parts.push({ node, anchoredEnd: this.eat("$") });
    } while (this.eat("|"));
    if (parts.length === 1) return parts[0];
    const items = parts.map((p): Node => p.anchoredEnd ? p.node : { kind: "seq", items: [p.node, ANY_TEXT] });
    return { node: { kind: "alt", items }, anchoredEnd: true };
  }

  alternation(): Node {
    const items = [this.sequence()];
    while (this.eat("|")) items.push(this.sequence());
    return items.length === 1 ? items[0] : { kind: "alt", items };
  }

  sequence(): Node {
    const items: Node[] = [];
    while (!this.done && this.peek() !== "|" && this.peek() !== ")") {
      if (this.peek() === "$" && (this.#i === this.src.length - 1 || /[|)]/.test(this.peek(1)!))) break;
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
          else if (/^<[A-Za-z_$][\w$]*>/.test(this.src.slice(this.#i))) {
            this.#i = this.src.indexOf(">", this.#i) + 1; // a named group matches the same strings
          } else this.fail("a lookaround inside the pattern");
        }
        if (++this.#depth > PATTERN_LIMITS.maxNesting) {
          throw new PatternTooLargeError(`a pattern nests groups over ${PATTERN_LIMITS.maxNesting} deep`);
        }
        const inner = this.alternation();
        if (!this.eat(")")) this.fail("a missing ')'");
        this.#depth--;
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
        const set = this.#escapeSet(e);
        if (set) return { kind: "set", set };
        const code = this.#escapeChar(e, false);
        return { kind: "set", set: [[code, code]] };
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

  /** The character of the escape `\e` (its first letter read), `inClass`: inside `[...]`. */
  #escapeChar(e: string, inClass: boolean): number {
    const simple: Record<string, number> = { n: 10, r: 13, t: 9, f: 12, v: 11, "0": 0 };
    if (e in simple) return simple[e];
    if (e === "b" && inClass) return 8; // backspace, as ECMA-262 reads \b in a class
    if (e === "b" || e === "B") this.fail("word boundaries have no grammar");
    if (e === "c" && /^[A-Za-z]/.test(this.peek() ?? "")) return this.src.charCodeAt(this.#i++) % 32;
    if (e === "x") return this.#hex(2, "x");
    if (e === "u") {
      if (this.eat("{")) {
        const end = this.src.indexOf("}", this.#i);
        const hex = end < 0 ? "" : this.src.slice(this.#i, end);
        if (!/^[0-9a-fA-F]{1,6}$/.test(hex) || parseInt(hex, 16) > MAX_CODE) {
          this.fail("a malformed \\u{} escape");
        }
        this.#i = end + 1;
        return parseInt(hex, 16);
      }
      const unit = this.#hex(4, "u");
      // A surrogate pair written as two escapes is one character, as in unicode mode.
      if (unit >= 0xd800 && unit < 0xdc00 && /^\\u[dD][c-fC-F][0-9a-fA-F]{2}/.test(this.src.slice(this.#i))) {
        this.#i += 2;
        const low = this.#hex(4, "u");
        return 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00);
      }
      return unit;
    }
    if (/[1-9]/.test(e)) this.fail("backreferences have no grammar");
    if (/[A-Za-z]/.test(e)) this.fail(`the escape '\\${e}' is not supported`);
    return this.#codePoint(e);
  }

  /** `n` hex digits of a `\x`/`\u` escape, as a number. */
  #hex(n: number, e: string): number {
    const hex = this.src.slice(this.#i, this.#i + n);
    if (hex.length !== n || !/^[0-9a-fA-F]+$/.test(hex)) this.fail(`a malformed \\${e} escape`);
    this.#i += n;
    return parseInt(hex, 16);
  }

  #class(): CharSet {
    const negated = this.eat("^");
    const items: CharSet = [];
    // `[]` matches nothing and `[^]` any character, as in ECMA-262 (a `]` first is no literal).
    while (!this.done && this.peek() !== "]") {
      const ch = this.src[this.#i++];
      let lo: number;
      if (ch === "\\") {
        const e = this.src[this.#i++];
        const set = e === undefined ? this.fail("a trailing backslash") : this.#escapeSet(e);
        if (set) {
          items.push(...set);
          continue;
        }
        lo = this.#escapeChar(e, true);
      } else lo = this.#codePoint(ch);
      if (this.peek() === "-" && this.peek(1) !== undefined && this.peek(1) !== "]") {
        this.#i++;
        const h = this.src[this.#i++];
        const hi = h === "\\" ? this.#escapeChar(this.src[this.#i++], true) : this.#codePoint(h);
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
    if (this.edges.length >= PATTERN_LIMITS.maxNfaStates) {
      throw new PatternTooLargeError(
        `a pattern needs over ${PATTERN_LIMITS.maxNfaStates} automaton states once its repetitions are written out`,
      );
    }
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

/** Epsilon closures in one automaton (states marked by a stamp: no set made per closure). */
class Closures {
  readonly #mark: Uint32Array;
  #stamp = 0;
  constructor(readonly nfa: Nfa) {
    this.#mark = new Uint32Array(nfa.edges.length);
  }

  /** The states `seeds` reach by epsilon moves, themselves included, ascending. */
  of(seeds: readonly number[]): number[] {
    if (this.#stamp >= 0xffff_fff0) {
      this.#mark.fill(0);
      this.#stamp = 0;
    }
    const stamp = ++this.#stamp;
    const mark = this.#mark;
    const out: number[] = [];
    const stack: number[] = [];
    for (const s of seeds) if (mark[s] !== stamp) (mark[s] = stamp), stack.push(s);
    while (stack.length) {
      const s = stack.pop()!;
      out.push(s);
      for (const t of this.nfa.eps[s]) if (mark[t] !== stamp) (mark[t] = stamp), stack.push(t);
    }
    return out.sort((a, b) => a - b);
  }
}

/** A deterministic automaton over disjoint char-set "letters". */
interface Dfa {
  /** transitions[state] = list of [letter index, next state]. */
  next: Map<number, number>[];
  accepting: boolean[];
}

/** Splits the code points into letters: maximal ranges no char set cuts. */
function letters(sets: CharSet[], surrogates = false): CharSet {
  const cuts = new Set<number>([0, MAX_CODE + 1]);
  for (const s of sets) for (const [a, b] of s) cuts.add(a).add(b + 1);
  const points = [...cuts].sort((a, b) => a - b);
  const all = points.slice(0, -1).map((p, i): [number, number] => [p, points[i + 1] - 1]);
  // Lone surrogates are no characters a grammar writes: its letters leave them out (a tested text
  // may hold one: `surrogates`).
  return surrogates ? all : all.filter(([a, b]) => inSet(ANY, [a, b]));
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
function* compile(
  node: Node,
  alphabet: CharSet,
  anyBefore: boolean,
  anyAfter: boolean,
  meter: Meter,
): Generator<void, Dfa> {
  const nfa = new Nfa();
  const start = nfa.add();
  let from = start;
  if (anyBefore) {
    from = nfa.build(ANY_TEXT, from);
  }
  let end = nfa.build(node, from);
  if (anyAfter) {
    end = nfa.build(ANY_TEXT, end);
  }
  // Each char set as the runs of letters it covers (letter indices, pairs of first and last).
  const spans = new Map<CharSet, number[]>();
  const spansOf = (set: CharSet): number[] => {
    let out = spans.get(set);
    if (out) return out;
    out = [];
    for (const [a, b] of set) {
      let li = firstLetterFrom(alphabet, a);
      const first = li;
      while (li < alphabet.length && alphabet[li][1] <= b) li++;
      if (li > first) out.push(first, li - 1);
    }
    meter.charge(set.length);
    spans.set(set, out);
    return out;
  };
  const closures = new Closures(nfa);
  const closure = (seeds: readonly number[]): number[] => {
    const out = closures.of(seeds);
    meter.charge(out.length);
    return out;
  };
  const first = closure([start]);
  const index = new Map([[first.join(","), 0]]);
  const sets = [first];
  // DFA state reached from a set of moved-to NFA states (the same set recurs for many letters).
  const byMoved = new Map<string, number>();
  const buckets: number[][] = alphabet.map(() => []);
  const touched: number[] = [];
  const dfa: Dfa = { next: [], accepting: [] };
  for (let i = 0; i < sets.length; i++) {
    if (sets.length > MAX_STATES) {
      throw new PatternError(`the pattern needs over ${MAX_STATES} automaton states`, true);
    }
    const cur = sets[i];
    dfa.accepting[i] = cur.includes(end);
    const next = new Map<number, number>();
    dfa.next[i] = next;
    for (const s of cur) {
      for (const e of nfa.edges[s]) {
        const runs = spansOf(e.set);
        for (let k = 0; k < runs.length; k += 2) {
          meter.charge(runs[k + 1] - runs[k] + 1);
          for (let li = runs[k]; li <= runs[k + 1]; li++) {
            if (buckets[li].length === 0) touched.push(li);
            buckets[li].push(e.to);
          }
          if (meter.due()) yield;
        }
      }
    }
    touched.sort((a, b) => a - b);
    for (const li of touched) {
      const moved = uniqueSorted(buckets[li]);
      buckets[li] = [];
      // Keys, lookups and closures cost more than a move: counted as such.
      meter.charge(8 + moved.length);
      const movedKey = moved.join(",");
      let target = byMoved.get(movedKey);
      if (target === undefined) {
        const set = closure(moved);
        const key = set.join(",");
        target = index.get(key);
        if (target === undefined) {
          target = sets.length;
          index.set(key, target);
          sets.push(set);
        }
        byMoved.set(movedKey, target);
      }
      next.set(li, target);
    }
    touched.length = 0;
    if (meter.due()) yield;
  }
  return dfa;
}

/** The distinct numbers of `list`, ascending (sorts `list` in place). */
function uniqueSorted(list: number[]): number[] {
  list.sort((a, b) => a - b);
  let n = 0;
  for (let i = 0; i < list.length; i++) if (i === 0 || list[i] !== list[i - 1]) list[n++] = list[i];
  list.length = n;
  return list;
}

/** The index of the first letter that ends at or after `code` (letters are sorted and disjoint). */
function firstLetterFrom(alphabet: CharSet, code: number): number {
  let lo = 0;
  let hi = alphabet.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (alphabet[mid][1] < code) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Strings accepted by `a` and (if `negate`, not) by `b`: the product automaton. */
function* intersect(a: Dfa, b: Dfa, negate: boolean, meter: Meter): Generator<void, Dfa> {
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
    meter.charge(a.next[x].size + 1);
    for (const [li, nx] of a.next[x]) {
      const ny = y === DEAD ? DEAD : b.next[y].get(li) ?? DEAD;
      if (!negate && ny === DEAD) continue;
      const key = `${nx},${ny}`;
      let to = index.get(key);
      if (to === undefined) {
        to = pairs.length;
        index.set(key, to);
        pairs.push([nx, ny]);
      }
      out.next[i].set(li, to);
    }
    if (meter.due()) yield;
  }
  return out;
}

/** States from which an accepting state can be reached. */
function live(d: Dfa): Set<number> {
  const from: number[][] = d.next.map(() => []);
  d.next.forEach((m, i) => m.forEach((t) => from[t].push(i)));
  const alive = new Set<number>(d.accepting.flatMap((a, i) => a ? [i] : []));
  const stack = [...alive];
  while (stack.length) {
    for (const s of from[stack.pop()!]) if (!alive.has(s)) alive.add(s), stack.push(s);
  }
  return alive;
}

/** A char set as GBNF alternatives: raw characters, or JSON-encoded ones (`json`). */
function charSetGbnf(set: CharSet, json: boolean): string {
  if (!json) {
    const item = (c: number) => {
      if (c < 0x20) return `\\x${c.toString(16).padStart(2, "0")}`;
      const ch = String.fromCodePoint(c);
      // llama.cpp's grammar parser knows no `\^` escape: `^` is written by its code.
      if (c === 0x5e) return "\\x5e";
      return /[\]\\-]/.test(ch) ? `\\${ch}` : ch;
    };
    return `[${set.map(([a, b]) => a === b ? item(a) : `${item(a)}-${item(b)}`).join("")}]`;
  }
  const alts: string[] = [];
  const raw: string[] = [];
  const item = (c: number) => {
    if (c === 0x5e) return "\\x5e";
    if (c === 0x5d || c === 0x5c || c === 0x2d) return `\\${String.fromCodePoint(c)}`;
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
function* lengthDfa(
  alphabetSize: number,
  min: number,
  max: number | undefined,
  meter: Meter,
): Generator<void, Dfa> {
  const last = max ?? min;
  if (last > MAX_STATES) {
    throw new PatternError(`a length bound over ${MAX_STATES} next to a pattern or format`, true);
  }
  const dfa: Dfa = { next: [], accepting: [] };
  for (let i = 0; i <= last; i++) {
    dfa.accepting[i] = i >= min;
    dfa.next[i] = new Map();
    const to = i < last ? i + 1 : max === undefined ? last : undefined;
    meter.charge(alphabetSize + 1);
    if (to !== undefined) { for (let li = 0; li < alphabetSize; li++) dfa.next[i].set(li, to); }
    if (meter.due()) yield;
  }
  return dfa;
}

/**
 * Bounds on the work of building one automaton; beyond them a request is a 400 `schema_too_large`
 * ({@link PatternTooLargeError}). A step is about one move of one automaton state on one letter (a
 * fraction of a microsecond): a million take well under a second. All the automata of one request
 * are bounded by its schema budget (a step is one unit of it).
 */
export const PATTERN_LIMITS = {
  /** Characters of one pattern. */
  maxLength: 16_384,
  /** Groups nested in one another. */
  maxNesting: 64,
  /** States of a pattern's nondeterministic automaton, repetitions written out. */
  maxNfaStates: 20_000,
  /** Steps to build one automaton. */
  maxSteps: 1_000_000,
  /** Moves (rule alternatives) of one automaton. */
  maxMoves: 100_000,
  /** Characters of the automata rules in one grammar (the synchronous part of building it is a copy). */
  maxRequestChars: 4_000_000,
} as const;

/** A pattern (or constraints) too costly to compile: `schema_too_large`, naming the limit. */
export class PatternTooLargeError extends GrammarError {
  /** `perRequest`: the request's budget ran out (the same pattern may compile in another request). */
  constructor(what: string, readonly perRequest = false) {
    super(`The JSON schema is too large to enforce: ${what}.`, { code: "schema_too_large" });
  }
}

/** Counts the steps of building automata and says when a slice of work is due to yield. */
class Meter {
  used = 0;
  #yielded = 0;
  constructor(readonly limit: number, readonly refuse: () => Error) {}

  charge(steps: number): void {
    this.used += steps;
    if (this.used > this.limit) throw this.refuse();
  }

  /** True every few hundred steps: a point where a sliced build may let other work run. */
  due(): boolean {
    if (this.used - this.#yielded < 256) return false;
    this.#yielded = this.used;
    return true;
  }
}

/** Builds the automaton of `c`, a step at a time (each `yield` is a point where other work may run). */
function* automatonSteps(c: StringConstraints, meter: Meter): Generator<void, PatternAutomaton> {
  for (const p of c.patterns) {
    if (p.length > PATTERN_LIMITS.maxLength) {
      throw new PatternTooLargeError(`a pattern is longer than ${PATTERN_LIMITS.maxLength} characters`);
    }
  }
  const parsed = c.patterns.map((p) => new Parser(p).pattern());
  const alphabet = letters([
    ...parsed.flatMap((p) => [...setsOf(p.body), ...p.lookaheads.flatMap((l) => setsOf(l.node))]),
    ANY,
  ]);
  const min = c.minLength ?? 0;
  let dfa: Dfa | undefined;
  for (const p of parsed) {
    let one = yield* compile(p.body, alphabet, !p.anchoredStart, !p.anchoredEnd, meter);
    for (const l of p.lookaheads) {
      const look = yield* compile(l.node, alphabet, false, !l.anchoredEnd, meter);
      one = yield* intersect(one, look, l.negative, meter);
    }
    dfa = dfa ? yield* intersect(dfa, one, false, meter) : one;
  }
  if (min > 0 || c.maxLength !== undefined || !dfa) {
    const length = yield* lengthDfa(alphabet.length, min, c.maxLength, meter);
    dfa = dfa ? yield* intersect(dfa, length, false, meter) : length;
  }
  const alive = live(dfa);
  if (!alive.has(0)) {
    throw new PatternError(
      c.patterns.length === 1 && min === 0 && c.maxLength === undefined
        ? "the pattern matches no string"
        : "no string meets all of the pattern, format and length constraints",
    );
  }
  // Live states renumbered in order; letters to the same state share one move. The rules are
  // written here, where the work is metered and sliced, so that using them is one string join.
  const number = new Map([...alive].sort((a, b) => a - b).map((s, i) => [s, i]));
  const json = new RuleText();
  const raw = new RuleText();
  let moves = 0;
  for (const [s, i] of number) {
    const byTarget = new Map<number, CharSet>();
    for (const [li, t] of dfa.next[s]) {
      const to = number.get(t);
      if (to === undefined) continue;
      const set = byTarget.get(to);
      const [a, b] = alphabet[li];
      const last = set?.at(-1);
      if (!set) byTarget.set(to, [[a, b]]);
      else if (last && last[1] + 1 === a) last[1] = b;
      else set.push([a, b]);
    }
    json.start(i);
    raw.start(i);
    for (const [to, set] of byTarget) {
      const ranges = normalize(set);
      json.move(charSetGbnf(ranges, true), to);
      raw.move(charSetGbnf(ranges, false), to);
      meter.charge(8 * ranges.length + 8);
    }
    if (dfa.accepting[s]) json.end(), raw.end();
    moves += byTarget.size + 1;
    if (moves > PATTERN_LIMITS.maxMoves) {
      throw new PatternTooLargeError(`a pattern needs more than ${PATTERN_LIMITS.maxMoves} automaton moves`);
    }
    meter.charge(dfa.next[s].size + 1);
    if (meter.due()) yield;
  }
  const text = json.segments();
  return {
    states: number.size,
    json: text,
    raw: raw.segments(),
    chars: text.reduce((n, t) => n + t.length, 0),
    steps: meter.used,
  };
}

/** Writes automaton rules as text segments to be joined with their name prefix. */
class RuleText {
  readonly #segments: string[] = [];
  #current = "";
  #alternatives = 0;

  /** The rule of state `i` begins. */
  start(i: number): void {
    this.#close();
    this.#name(i);
    this.#current += " ::= ";
  }

  /** An alternative: a char class, then state `to`. */
  move(charClass: string, to: number): void {
    this.#current += `${this.#alternatives++ ? " | " : ""}${charClass} `;
    this.#name(to);
  }

  /** The alternative of ending here. */
  end(): void {
    this.#current += `${this.#alternatives++ ? " | " : ""}""`;
  }

  segments(): string[] {
    this.#close();
    return [...this.#segments, this.#current];
  }

  #name(i: number): void {
    this.#segments.push(this.#current);
    this.#current = `-S${i}`;
  }

  #close(): void {
    if (this.#alternatives > 0 || this.#segments.length > 0) this.#current += "\n";
    this.#alternatives = 0;
  }
}

/** Runs a stepwise build to its end at once. */
function runSteps<T>(steps: Generator<void, T>): T {
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
  }
}

/**
 * Cuts long work into slices: {@link due} says the current slice is used up, {@link pause} lets other
 * work run (and throws if the work was cancelled meanwhile). The server's event-loop slicer has
 * this shape.
 */
export interface Slices {
  readonly due: boolean;
  pause(): Promise<void>;
}

/** Slices for one build, cancelled by `signal`. */
export type SliceSource = (signal?: AbortSignal) => Slices;

/** Slices of `sliceMs` with a timer turn between them (the default where the caller gives none). */
export function timerSlices(sliceMs = 3): SliceSource {
  return (signal) => {
    let since = performance.now();
    return {
      get due() {
        return performance.now() - since >= sliceMs;
      },
      async pause() {
        await new Promise((resolve) => setTimeout(resolve, 0));
        signal?.throwIfAborted();
        since = performance.now();
      },
    };
  };
}

/** Runs a stepwise build in slices, letting other work run between them. */
async function runSliced<T>(steps: Generator<void, T>, slices: Slices): Promise<T> {
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
    if (slices.due) await slices.pause();
  }
}

/**
 * A meter for one automaton: the per-automaton bound, or what is left of the request's budget
 * (`limit`: the budget's size, for the message).
 */
function automatonMeter(requestLeft = Infinity, limit = SCHEMA_BUDGET): Meter {
  const steps = Math.min(PATTERN_LIMITS.maxSteps, requestLeft);
  return new Meter(
    steps,
    () =>
      steps < PATTERN_LIMITS.maxSteps
        ? new PatternTooLargeError(overBudget(limit, "compiling its patterns"), true)
        : new PatternTooLargeError(`a pattern needs more than ${PATTERN_LIMITS.maxSteps} automaton steps`),
  );
}

/** One grammar build's automata still to compile, and those the request's budget refused. */
interface BuildSession {
  missing: Map<string, StringConstraints>;
  refused: Map<string, Error>;
  /** Characters of the automata rules this pass writes (bounds the synchronous part of a build). */
  chars: number;
  /** This pass's budget: the automata it uses (their steps) and the rest of its work. */
  budget: Budget;
}

/**
 * Compiled pattern automata by their constraints (least recently used dropped first), so each
 * pattern is compiled once; refusals are kept too, so a costly refused pattern costs once.
 * {@link build} runs a synchronous grammar build and compiles the automata it needs between its
 * passes in short slices, so a costly schema never stalls the event loop.
 *
 * @example
 * ```ts
 * import { JsonGrammar } from "./json_schema.ts";
 * import { GbnfRules } from "./gbnf.ts";
 * const automata = new AutomatonCache();
 * const text = await automata.build(() => {
 *   const g = new JsonGrammar(new GbnfRules("", automata));
 *   return g.rules.text(`root ::= ${g.schema({ type: "string", pattern: "^a+$" }, "response_format", "out")}`);
 * });
 * ```
 */
export class AutomatonCache implements AutomatonSource {
  readonly #entries: LruCache<PatternAutomaton | Error>;
  readonly #slices: SliceSource;
  /** Work units one build may cost: its automata's steps and the rest of the grammar. */
  readonly #limit: number;
  #session?: BuildSession;
  #turn: Promise<void> = Promise.resolve();
  /** The turn of the last grammar build pass queued (see {@link build}). */
  #passTurn: Promise<void> = Promise.resolve();
  /** Automata compiled (or refused) so far: with a warm cache, building a grammar compiles none. */
  compiled = 0;

  /**
   * `slices`: how {@link build} cuts its compilations (default: 3 ms slices with a timer turn
   * between them); at most `maxEntries` automata of `maxChars` characters of rules in all are kept.
   */
  constructor(
    opts: { slices?: SliceSource; budget?: number; maxEntries?: number; maxChars?: number } = {},
  ) {
    this.#entries = new LruCache(opts.maxEntries ?? 256, opts.maxChars ?? 32 * 1024 * 1024);
    this.#slices = opts.slices ?? timerSlices();
    this.#limit = opts.budget ?? SCHEMA_BUDGET;
  }

  /**
   * The budget of the pass of {@link build} running now: grammars built in it charge their work,
   * and the steps of every automaton they use, to it.
   */
  get budget(): Budget | undefined {
    return this.#session?.budget;
  }

  /**
   * The automaton of `c`: from the cache; inside {@link build}, undefined when not compiled yet (the
   * build compiles it and runs again); elsewhere compiled now. Throws what compiling threw.
   */
  automaton(c: StringConstraints): PatternAutomaton | undefined {
    const key = JSON.stringify([c.patterns, c.minLength ?? 0, c.maxLength ?? null]);
    const session = this.#session;
    const known = this.#entries.get(key) ?? session?.refused.get(key);
    if (known instanceof Error) throw known;
    if (known && session) {
      session.chars += known.chars;
      if (session.chars > PATTERN_LIMITS.maxRequestChars) {
        throw new PatternTooLargeError(
          `its patterns need more than ${PATTERN_LIMITS.maxRequestChars} characters of grammar rules in all`,
        );
      }
    }
    if (known) return known;
    if (session) {
      session.missing.set(key, c);
      return undefined;
    }
    return this.#compile(key, () => runSteps(automatonSteps(c, automatonMeter())));
  }

  /**
   * Runs `build` (synchronous, deterministic) until it needs no automaton it does not have: the
   * missing ones are compiled in between, in slices, within the request's step budget.
   */
  async build<T>(build: () => T, signal?: AbortSignal): Promise<T> {
    const session: BuildSession = {
      missing: new Map(),
      refused: new Map(),
      chars: 0,
      budget: new Budget(this.#limit),
    };
    const slices = this.#slices(signal);
    for (;;) {
      // A pass is synchronous (up to the budget: about 20 ms): passes of all requests take turns,
      // each on a turn of the event loop of its own, so two never run without other work between.
      const turn = this.#passTurn.then(() => slices.pause());
      this.#passTurn = turn.catch(() => {});
      await turn;
      session.missing.clear();
      session.chars = 0;
      // Each pass does the whole build again: its budget starts afresh and is charged again the
      // steps of every automaton it uses (compiled in an earlier pass or request, or just now).
      session.budget = new Budget(this.#limit);
      this.#session = session;
      let result: { value: T } | { error: unknown };
      try {
        result = { value: build() };
      } catch (error) {
        result = { error };
      } finally {
        this.#session = undefined;
      }
      // Without missing automata the pass was complete: its result (or error) is the build's.
      if (session.missing.size === 0) {
        if ("error" in result) throw result.error;
        return result.value;
      }
      // What the pass used, with the automata it did not have yet: the next pass adds their steps.
      let used = session.budget.used;
      for (const [key, c] of session.missing) {
        // Past the budget the rest are refused for this request without compiling a step of them
        // (each refusal used to parse its patterns first: 280 of them one 100 ms block).
        if (used >= this.#limit) {
          session.refused.set(
            key,
            new PatternTooLargeError(overBudget(this.#limit, "compiling its patterns"), true),
          );
          continue;
        }
        if (slices.due) await slices.pause();
        await this.#oneAtATime(async () => {
          signal?.throwIfAborted();
          if (this.#entries.get(key) !== undefined) return; // compiled for another request meanwhile
          const meter = automatonMeter(this.#limit - used, this.#limit);
          this.compiled++;
          try {
            // The build's own slicer: many small automata, each under a slice, are still cut into slices.
            const automaton = await runSliced(automatonSteps(c, meter), slices);
            this.#entries.set(key, automaton, 2 * automaton.chars);
          } catch (e) {
            // The request's budget ran out: refused for this request only, not for the pattern.
            if (e instanceof PatternTooLargeError && e.perRequest) session.refused.set(key, e);
            // Refusals of the pattern itself are kept: the next pass meets them where the pattern is.
            else if (e instanceof PatternError || e instanceof PatternTooLargeError) {
              this.#entries.set(key, e);
            } else throw e;
          } finally {
            used += Math.max(1, meter.used);
          }
        });
      }
    }
  }

  /** Runs compilations one at a time: concurrent builds then take one slice per turn between them. */
  #oneAtATime(work: () => Promise<void>): Promise<void> {
    const run = this.#turn.then(work);
    this.#turn = run.catch(() => {});
    return run;
  }

  #compile(key: string, compile: () => PatternAutomaton): PatternAutomaton {
    this.compiled++;
    try {
      const automaton = compile();
      this.#entries.set(key, automaton, 2 * automaton.chars);
      return automaton;
    } catch (e) {
      if (e instanceof PatternError || e instanceof PatternTooLargeError) this.#entries.set(key, e);
      throw e;
    }
  }
}

/**
 * Rules for the inside of JSON strings matching `pattern`, or meeting all of `constraints`
 * (`json` false: raw text, unescaped); returns the start rule's name. Throws a
 * {@link PatternError} for what no grammar can express, or when the automaton grows too large,
 * and a {@link PatternTooLargeError} when building it would take too long.
 *
 * @example
 * ```ts
 * import { GbnfRules } from "./gbnf.ts";
 * const rules = new GbnfRules("");
 * const sku = patternRules(rules, "sku", "^[A-Z]{3}-\\d{4}$");
 * const code = patternRules(rules, "code", { patterns: ["^[a-z]+$"], maxLength: 8 });
 * ```
 */
export function patternRules(
  rules: GbnfRules,
  hint: string,
  constraints: string | StringConstraints,
  json = true,
): string {
  const c = typeof constraints === "string" ? { patterns: [constraints] } : constraints;
  const automaton = rules.automata
    ? rules.automata.automaton(c)
    : runSteps(automatonSteps(c, automatonMeter(rules.budget.left, rules.budget.limit)));
  const name = rules.reserve(hint);
  if (!automaton) {
    // Not compiled yet: a stand-in for this pass of the build (the next pass has the automaton).
    rules.define(name, '""');
    return name;
  }
  // Every use of an automaton costs the steps of compiling it, cached or not: a request's verdict
  // does not depend on what other requests compiled before it.
  rules.budget.charge(automaton.steps * COSTS.automatonStep, "compiling its patterns");
  rules.define(name, `${name}-S0`);
  rules.addText((json ? automaton.json : automaton.raw).join(name), automaton.states);
  return name;
}

/** Automaton states a matcher keeps built; past them it starts over (its work stays linear). */
const MATCHER_STATES = 2048;
/** Entries (nondeterministic states) of the kept states' sets, in all: the memory bound of the states kept. */
const MATCHER_ENTRIES = 1_000_000;

/**
 * What tests of patterns may cost (one unit: a character read, or a nondeterministic state moved,
 * closed over or keyed while a deterministic state is built); {@link PatternMatcher.test} takes one
 * and throws {@link PatternWorkError} once it is spent.
 */
export interface MatchWork {
  left: number;
}

/** The work allowance of {@link MatchWork} ran out. */
export class PatternWorkError extends Error {
  override name = "PatternWorkError";
}

/**
 * One automaton of a {@link PatternMatcher}: the pattern's nondeterministic automaton, whose
 * deterministic states are built as a text needs them (a set of its states each) and kept, up to
 * {@link MATCHER_STATES} and {@link MATCHER_ENTRIES}. A text costs at most one state's construction
 * per character, each bounded by the automaton's size: no backtracking.
 */
class LazyDfa {
  readonly #nfa = new Nfa();
  readonly #end: number;
  readonly #alphabet: CharSet;
  /** Whether the automaton ends with "anything after" (then a match is known at its first accept). */
  readonly #openEnd: boolean;
  #sets: number[][] = [];
  #entries = 0;
  #index = new Map<string, number>();
  #next: Map<number, number>[] = [];
  #accepting: boolean[] = [];
  readonly #closures: Closures;
  /**
   * A test is under way (or was stopped, by a time limit, between two of its updates: the next
   * test then starts from nothing rather than trust the states).
   */
  #busy = false;

  constructor(node: Node, anyBefore: boolean, anyAfter: boolean) {
    let at = this.#nfa.add();
    if (anyBefore) at = this.#nfa.build(ANY_TEXT, at);
    at = this.#nfa.build(node, at);
    this.#end = anyAfter ? this.#nfa.build(ANY_TEXT, at) : at;
    this.#openEnd = anyAfter;
    this.#alphabet = letters(setsOf(node), true);
    this.#closures = new Closures(this.#nfa);
  }

  /** States of the nondeterministic automaton. */
  get size(): number {
    return this.#nfa.edges.length;
  }

  /** Deterministic states built by the last {@link test} (the rest were built before and kept). */
  built = 0;

  /** Whether the whole of `text` is a string of the automaton; charges `work` (see {@link MatchWork}). */
  test(text: string, work: MatchWork): boolean {
    if (this.#busy || this.#sets.length >= MATCHER_STATES || this.#entries >= MATCHER_ENTRIES) this.#reset();
    this.#busy = true;
    let state = this.#intern(this.#closure([0], work));
    for (const ch of text) {
      if (this.#openEnd && this.#accepting[state]) break;
      if (--work.left < 0) throw new PatternWorkError("the pattern tests took too many steps");
      const letter = firstLetterFrom(this.#alphabet, ch.codePointAt(0)!);
      let to = this.#next[state].get(letter);
      if (to === undefined) {
        const moved = this.#move(this.#sets[state], this.#alphabet[letter], work);
        if (this.#sets.length >= MATCHER_STATES || this.#entries >= MATCHER_ENTRIES) {
          this.#reset();
          state = -1;
        }
        to = this.#intern(this.#closure(moved, work));
        if (state >= 0) this.#next[state].set(letter, to);
      }
      state = to;
      if (this.#sets[state].length === 0) break;
    }
    this.#busy = false;
    return this.#accepting[state];
  }

  #reset(): void {
    this.#sets = [];
    this.#entries = 0;
    this.#index = new Map();
    this.#next = [];
    this.#accepting = [];
  }

  #intern(set: number[]): number {
    const key = set.join(",");
    let id = this.#index.get(key);
    if (id === undefined) {
      id = this.#sets.length;
      this.built++;
      this.#sets.push(set);
      this.#next.push(new Map());
      this.#accepting.push(set.includes(this.#end));
      this.#entries += set.length;
      // Last: a state is found by its key only once it is whole.
      this.#index.set(key, id);
    }
    return id;
  }

  #move(set: readonly number[], letter: [number, number], work: MatchWork): number[] {
    const out: number[] = [];
    for (const s of set) for (const e of this.#nfa.edges[s]) if (inSet(e.set, letter)) out.push(e.to);
    work.left -= set.length;
    return out;
  }

  #closure(seeds: readonly number[], work: MatchWork): number[] {
    const out = this.#closures.of(seeds);
    // Closing over, sorting and keying the set: a few units an entry.
    work.left -= 4 * out.length;
    if (work.left < 0) throw new PatternWorkError("the pattern tests took too many steps");
    return out;
  }
}

/** The states {@link Nfa.build} adds for `node`. */
function nfaStates(node: Node): number {
  switch (node.kind) {
    case "empty":
      return 0;
    case "set":
      return 1;
    case "seq":
      return node.items.reduce((n, item) => n + nfaStates(item), 0);
    case "alt":
      return node.items.reduce((n, item) => n + nfaStates(item), 1);
    case "repeat": {
      const one = nfaStates(node.item);
      return node.min * one + 1 + (node.max === undefined ? one : (node.max - node.min) * one);
    }
  }
}

/**
 * A JSON Schema `pattern` as the output check tests it, in time linear in the text whatever the
 * pattern: the automaton the grammar is built from, run a character at a time (no backtracking, so
 * no pattern can make a check take exponential time). It takes the patterns the grammar takes and
 * refuses the rest ({@link PatternError}, {@link PatternTooLargeError}), and matches as ECMA-262's
 * unicode mode does, but that a lone surrogate in the text (a `\ud800` escape in JSON) matches only
 * an escape of itself and the unanchored ends, not `.`, a negated class, `\S`, `\D` or `\W`.
 *
 * @example
 * ```ts
 * const m = PatternMatcher.compile("^(a+)+b$");
 * m.test("a".repeat(10_000) + "!"); // false, at once
 * ```
 */
export class PatternMatcher {
  /** The body, then each start lookahead (`negative`: the text must not match it). */
  readonly #parts: { dfa: LazyDfa; negative: boolean }[];

  private constructor(parts: { dfa: LazyDfa; negative: boolean }[], readonly states: number) {
    this.#parts = parts;
  }

  /**
   * Whether {@link compile} would take `source`, without building anything: throws what it would
   * throw, else returns the automaton states it would build. Parsing only: linear in the pattern.
   */
  static measure(source: string): number {
    return PatternMatcher.#measured(PatternMatcher.#parse(source));
  }

  /** The matcher of `source`; throws for a pattern the grammar could not take either. */
  static compile(source: string): PatternMatcher {
    const p = PatternMatcher.#parse(source);
    const states = PatternMatcher.#measured(p);
    const parts = [
      { dfa: new LazyDfa(p.body, !p.anchoredStart, !p.anchoredEnd), negative: false },
      ...p.lookaheads.map((l) => ({ dfa: new LazyDfa(l.node, false, !l.anchoredEnd), negative: l.negative })),
    ];
    return new PatternMatcher(parts, states);
  }

  static #parse(source: string): Pattern {
    if (source.length > PATTERN_LIMITS.maxLength) {
      throw new PatternTooLargeError(`a pattern is longer than ${PATTERN_LIMITS.maxLength} characters`);
    }
    return new Parser(source).pattern();
  }

  /** The states the automata of `p` take (as {@link Nfa.build} writes them), within the limit. */
  static #measured(p: Pattern): number {
    const ends = (anyBefore: boolean, anyAfter: boolean) => 1 + (anyBefore ? 2 : 0) + (anyAfter ? 2 : 0);
    const states = nfaStates(p.body) + ends(!p.anchoredStart, !p.anchoredEnd) +
      p.lookaheads.reduce((n, l) => n + nfaStates(l.node) + ends(false, !l.anchoredEnd), 0);
    if (states > PATTERN_LIMITS.maxNfaStates) {
      throw new PatternTooLargeError(
        `a pattern needs over ${PATTERN_LIMITS.maxNfaStates} automaton states once its repetitions are written out`,
      );
    }
    return states;
  }

  /**
   * Whether `text` matches the pattern (anywhere in it, unless anchored), as JSON Schema means.
   * `work`: the allowance it draws on (by default, one of its own for this text), whose end throws
   * {@link PatternWorkError}; a test stopped so, or by a time limit, leaves the matcher sound.
   */
  test(text: string, work: MatchWork = { left: PatternMatcher.#workFor(text, this.states) }): boolean {
    for (const part of this.#parts) part.dfa.built = 0;
    return this.#parts.every((part) => part.dfa.test(text, work) !== part.negative);
  }

  /** An allowance that no test of `text` can spend: a state built for each character, each whole. */
  static #workFor(text: string, states: number): number {
    return (text.length + 1) * (5 * states + 1);
  }

  /** Automaton states the last {@link test} built: at most one a character of the text, a part. */
  get built(): number {
    return this.#parts.reduce((n, part) => n + part.dfa.built, 0);
  }
}
