/**
 * Building blocks of GBNF, llama.cpp's grammar format: quoted literals, character classes, a
 * rule set with unique names, and "any text that does not contain X".
 */
import { Budget, COSTS } from "./budget.ts";
import { GrammarError } from "./errors.ts";
import type { AutomatonSource } from "./types.ts";

/**
 * The largest count llama.cpp's grammar parser takes in a repetition (`x{n}`, `x{m,n}`): a count of
 * 2,000 or more fails to parse (MAX_REPETITION_THRESHOLD in llama-grammar.cpp), except a maximum
 * over 2,000, which it silently drops (`x{0,5000}` is read as `x*`).
 */
export const MAX_REPETITION = 1999;

/**
 * A GBNF string literal for `text`.
 *
 * @example
 * ```ts
 * gbnfLiteral('say "hi"\n'); // "\"say \\\"hi\\\"\\n\""
 * ```
 */
export function gbnfLiteral(text: string): string {
  return `"${text.replace(LITERAL_ESCAPES, (ch) => escapeChar(ch, '"'))}"`;
}

/** The characters a GBNF literal escapes (a regular expression replace is many times faster than a loop). */
// deno-lint-ignore no-control-regex
const LITERAL_ESCAPES = /[\\"\x00-\x1f\x7f]/g;

/** A character class matching exactly `chars` (negated: every character but them). */
export function gbnfClass(chars: Iterable<string>, negated = false): string {
  let out = negated ? "[^" : "[";
  for (const ch of new Set(chars)) out += escapeChar(ch, "]");
  return out + "]";
}

function isHighSurrogate(unit: number): boolean {
  return unit >= 0xd800 && unit <= 0xdbff;
}

function isLowSurrogate(unit: number): boolean {
  return unit >= 0xdc00 && unit <= 0xdfff;
}

function escapeChar(ch: string, quote: string): string {
  switch (ch) {
    case "\\":
      return "\\\\";
    case "\n":
      return "\\n";
    case "\r":
      return "\\r";
    case "\t":
      return "\\t";
    case quote:
      return `\\${quote}`;
    // llama.cpp's grammar parser knows no `\^` escape (a 500 once): a class writes `^` by its code.
    case "^":
      return quote === "]" ? "\\x5e" : ch;
    case "-":
    case "[":
      return quote === "]" ? `\\${ch}` : ch;
  }
  const code = ch.codePointAt(0)!;
  if (code < 0x20 || code === 0x7f) return `\\x${code.toString(16).padStart(2, "0")}`;
  return ch;
}

/**
 * A set of named GBNF rules. Rule names are made unique with a prefix, and identical bodies
 * share one rule.
 *
 * @example
 * ```ts
 * const rules = new GbnfRules("t0-");
 * const yes = rules.add("answer", '"yes" | "no"');
 * rules.text(`root ::= ${yes}`);
 * ```
 */
export class GbnfRules {
  readonly #rules = new Map<string, string>();
  readonly #byBody = new Map<string, string>();
  /** The rule of each set of strings given to {@link alternatives}, by the sorted set. */
  readonly #bySet = new Map<string, string>();
  /** The next suffix to try for each base name (names are never freed: the ones below are taken). */
  readonly #nextSuffix = new Map<string, number>();
  readonly #prefix: string;
  /** Rules added as text ({@link addText}), and how many. */
  readonly #texts: string[] = [];
  #textRules = 0;
  /** The work this grammar may cost: every rule written is charged to it. */
  readonly budget: Budget;

  /**
   * `automata`: where compiled `pattern` automata come from (an `AutomatonCache`, say); `budget`: the
   * work the grammar may cost (default: the running build's budget of `automata`, else a new one).
   */
  constructor(prefix = "", readonly automata?: AutomatonSource, budget?: Budget) {
    this.#prefix = prefix.replace(/[^a-zA-Z0-9-]/g, "-");
    this.budget = budget ?? automata?.budget ?? new Budget();
  }

  /**
   * A rule matching exactly the strings `texts` (at least one; repeats allowed), their shared
   * beginnings written once: `"ab" ("c" | x)` with `x ::= "dd" ("e" | "f")` for abc, abdde and abddf,
   * rather than one alternative per string. llama.cpp keeps an open alternative for every way the
   * output so far can be read and checks each against every candidate token: 1,000 values sharing a
   * 240-character beginning kept 1,000 open through it (64 tokens took 62 s and slowed every other
   * chat); as a tree, one. Every branching point is a rule of its own, so no group nests in another.
   * Charged as the flat form was (every character of every string), and the same set again reuses
   * its rule.
   *
   * @example
   * ```ts
   * const rules = new GbnfRules();
   * const name = rules.alternatives("unit", ['"celsius"', '"centigrade"', '"fahrenheit"']);
   * rules.text(`root ::= ${name}`);
   * // unit ::= "\"" (unit-1 | "fahrenheit\"")
   * // unit-1 ::= "ce" ("lsius\"" | "ntigrade\"")
   * ```
   */
  alternatives(hint: string, texts: readonly string[]): string {
    if (texts.length === 0) throw new Error("alternatives of no string");
    // Sorted by code units, the strings sharing a beginning are neighbours, the shortest first.
    const words = [...new Set(texts)].sort();
    let chars = 0;
    for (const w of words) chars += w.length + 3;
    this.budget.charge(chars * COSTS.char);
    const key = JSON.stringify(words);
    const known = this.#bySet.get(key);
    if (known) return known;
    const root = this.reserve(hint);
    this.#bySet.set(key, root);
    const pending: { lo: number; hi: number; depth: number; name: string }[] = [];
    const node = (lo: number, hi: number, depth: number): string => {
      const first = words[lo], last = words[hi - 1];
      let p = depth;
      while (p < first.length && p < last.length && first.charCodeAt(p) === last.charCodeAt(p)) p++;
      // Not between the two halves of a surrogate pair that one of the strings goes on with.
      if (p > depth && isHighSurrogate(first.charCodeAt(p - 1))) {
        for (let i = lo; i < hi; i++) {
          if (isLowSurrogate(words[i].charCodeAt(p))) {
            p--;
            break;
          }
        }
      }
      const parts: string[] = [];
      if (p > depth) parts.push(gbnfLiteral(first.slice(depth, p)));
      const endsHere = first.length === p;
      const alts: string[] = [];
      for (let i = endsHere ? lo + 1 : lo; i < hi;) {
        const c = words[i].codePointAt(p)!;
        let j = i + 1;
        while (j < hi && words[j].codePointAt(p) === c) j++;
        if (j - i === 1) {
          alts.push(gbnfLiteral(words[i].slice(p)));
        } else {
          const name = this.reserve(hint);
          pending.push({ lo: i, hi: j, depth: p, name });
          alts.push(name);
        }
        i = j;
      }
      if (alts.length > 0) parts.push(`(${alts.join(" | ")})${endsHere ? "?" : ""}`);
      return parts.length > 0 ? parts.join(" ") : '""';
    };
    pending.push({ lo: 0, hi: words.length, depth: 0, name: root });
    for (let next = pending.pop(); next; next = pending.pop()) {
      this.define(next.name, node(next.lo, next.hi, next.depth));
    }
    return root;
  }

  /** Adds a rule and returns its name (an existing rule with the same body is reused). */
  add(hint: string, body: string): string {
    const existing = this.#byBody.get(body);
    if (existing) {
      this.budget.charge(body.length * COSTS.char);
      return existing;
    }
    const name = this.reserve(hint);
    this.define(name, body);
    return name;
  }

  /** A fresh name for a rule defined later (recursion). */
  reserve(hint: string): string {
    const base = `${this.#prefix}${hint.replace(/[^a-zA-Z0-9-]/g, "-").replace(/-+/g, "-") || "r"}`
      .toLowerCase();
    let name = base;
    let i = this.#nextSuffix.get(base) ?? 1;
    if (this.#rules.has(name)) {
      for (name = `${base}-${i}`; this.#rules.has(name); name = `${base}-${++i}`);
      this.#nextSuffix.set(base, i + 1);
    }
    this.budget.charge((name.length + 8) * COSTS.char);
    this.#rules.set(name, "");
    return name;
  }

  /** Sets the body of a reserved rule. */
  define(name: string, body: string): void {
    this.budget.charge(body.length * COSTS.char);
    this.#rules.set(name, body);
    if (!this.#byBody.has(body)) this.#byBody.set(body, name);
  }

  /**
   * Adds `count` rules written as GBNF text (each line `name ::= body`). Their names must be ones
   * {@link reserve} never gives (it gives lower case only: e.g. a reserved name + `-S1`).
   */
  addText(text: string, count: number): void {
    this.budget.charge(text.length * COSTS.copiedChar);
    this.#texts.push(text);
    this.#textRules += count;
  }

  /**
   * `symbol` (one rule name, literal or class) repeated `min` to `max` times (`max` undefined: no
   * bound), written as llama.cpp can parse it, and charged for the rules llama.cpp writes out for it.
   * A maximum over {@link MAX_REPETITION} is left out (`bounded` false: the caller must check it
   * another way); a minimum over it is refused naming `keyword`.
   *
   * @example
   * ```ts
   * const rules = new GbnfRules();
   * rules.repeat("char", 1, 20, "minLength"); // { text: "char{1,20}", bounded: true }
   * rules.repeat("char", 0, 5000, "minLength"); // { text: "char{0,}", bounded: false }
   * ```
   */
  repeat(
    symbol: string,
    min: number,
    max: number | undefined,
    keyword: string,
  ): { text: string; bounded: boolean } {
    if (min > MAX_REPETITION) {
      throw new GrammarError(
        `The JSON schema keyword '${keyword}' asks for ${min}; a grammar can require at most ${MAX_REPETITION} ` +
          "(llama.cpp's repetition limit).",
        { code: "unsupported_schema", keyword },
      );
    }
    if (max !== undefined && max < min) {
      // llama.cpp reads `x{5,3}` as 2^64 − 2 optional copies: it would fill memory.
      throw new GrammarError(`A repetition of at least ${min} and at most ${max} is empty.`, {
        code: "invalid_schema",
        keyword,
      });
    }
    const bounded = max === undefined || max <= MAX_REPETITION;
    const hi = max !== undefined && max <= MAX_REPETITION ? max : undefined;
    this.budget.charge(((hi ?? min) + 1) * COSTS.repetition);
    return { text: `${symbol}{${min},${hi ?? ""}}`, bounded };
  }

  /** Rules defined so far. */
  get size(): number {
    return this.#rules.size + this.#textRules;
  }

  /** The grammar text: `head` lines first, then every rule. */
  text(...head: string[]): string {
    return [...head, ...[...this.#rules].map(([n, b]) => `${n} ::= ${b}`)].join("\n") + "\n" +
      this.#texts.join("");
  }
}

/**
 * A rule matching any text (possibly empty) that contains none of `markers`, built from their
 * Aho-Corasick automaton (so `<</think>` still ends at the right place).
 *
 * @example
 * ```ts
 * const rules = new GbnfRules("t0-");
 * const reasoning = textWithout(rules, "reasoning", ["</think>", "<think>"]);
 * rules.text(`root ::= ${reasoning} "</think>"`);
 * ```
 */
export function textWithout(rules: GbnfRules, hint: string, markers: string | readonly string[]): string {
  const words = (typeof markers === "string" ? [markers] : [...markers]).map((m) => [...m]);
  // Trie of the markers: node 0 is the root; `end` marks a completed marker.
  const next: Map<string, number>[] = [new Map()];
  const end: boolean[] = [false];
  for (const w of words) {
    let node = 0;
    for (const ch of w) {
      let to = next[node].get(ch);
      if (to === undefined) {
        to = next.length;
        next.push(new Map());
        end.push(false);
        next[node].set(ch, to);
      }
      node = to;
    }
    end[node] = true;
  }
  // Failure links, breadth first; a node whose failure is a match is a match too.
  const fail = new Array(next.length).fill(0);
  const order: number[] = [];
  for (const to of next[0].values()) order.push(to);
  for (let i = 0; i < order.length; i++) {
    const node = order[i];
    for (const [ch, to] of next[node]) {
      let f = fail[node];
      while (f !== 0 && !next[f].has(ch)) f = fail[f];
      fail[to] = next[f].get(ch) ?? 0;
      if (fail[to] === to) fail[to] = 0;
      end[to] ||= end[fail[to]];
      order.push(to);
    }
  }
  const step = (node: number, ch: string): number => {
    let n = node;
    while (n !== 0 && !next[n].has(ch)) n = fail[n];
    return next[n].get(ch) ?? 0;
  };
  const alphabet = new Set(words.flat());
  const live = next.map((_, i) => i).filter((i) => !end[i]);
  const names = new Map(live.map((i) => [i, rules.reserve(`${hint}-s${i}`)]));
  for (const state of live) {
    // Characters that lead somewhere other than the root; all others go back to the root.
    const moves = new Map<string, number>();
    for (const ch of alphabet) {
      const to = step(state, ch);
      if (to !== 0) moves.set(ch, to);
    }
    const alts = [`${gbnfClass(moves.keys(), true)} ${names.get(0)}`];
    for (const [ch, to] of moves) if (!end[to]) alts.push(`${gbnfLiteral(ch)} ${names.get(to)}`);
    // Every state may also end here: the text stops before a marker is complete.
    rules.define(names.get(state)!, `( ${alts.join(" | ")} )?`);
  }
  return names.get(0)!;
}
