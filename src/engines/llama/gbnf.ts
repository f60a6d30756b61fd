/**
 * Building blocks of GBNF, llama.cpp's grammar format: quoted literals, character classes, a
 * rule set with unique names, "any text that does not contain X", and a cache for built grammars.
 */
import type { AutomatonCache } from "./regex_gbnf.ts";

/**
 * A GBNF string literal for `text`.
 *
 * @example
 * ```ts
 * gbnfLiteral('say "hi"\n'); // "\"say \\\"hi\\\"\\n\""
 * ```
 */
export function gbnfLiteral(text: string): string {
  let out = '"';
  for (const ch of text) out += escapeChar(ch, '"');
  return out + '"';
}

/** A character class matching exactly `chars` (negated: every character but them). */
export function gbnfClass(chars: Iterable<string>, negated = false): string {
  let out = negated ? "[^" : "[";
  for (const ch of new Set(chars)) out += escapeChar(ch, "]");
  return out + "]";
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
    case "^":
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
  readonly #prefix: string;
  /** Rules added as text ({@link addText}), and how many. */
  readonly #texts: string[] = [];
  #textRules = 0;

  /** `automata`: compiled `pattern` automata to reuse (see {@link AutomatonCache}). */
  constructor(prefix = "", readonly automata?: AutomatonCache) {
    this.#prefix = prefix.replace(/[^a-zA-Z0-9-]/g, "-");
  }

  /** Adds a rule and returns its name (an existing rule with the same body is reused). */
  add(hint: string, body: string): string {
    const existing = this.#byBody.get(body);
    if (existing) return existing;
    const name = this.reserve(hint);
    this.define(name, body);
    return name;
  }

  /** A fresh name for a rule defined later (recursion). */
  reserve(hint: string): string {
    const base = `${this.#prefix}${hint.replace(/[^a-zA-Z0-9-]/g, "-").replace(/-+/g, "-") || "r"}`
      .toLowerCase();
    let name = base;
    for (let i = 1; this.#rules.has(name); i++) name = `${base}-${i}`;
    this.#rules.set(name, "");
    return name;
  }

  /** Sets the body of a reserved rule. */
  define(name: string, body: string): void {
    this.#rules.set(name, body);
    if (!this.#byBody.has(body)) this.#byBody.set(body, name);
  }

  /**
   * Adds `count` rules written as GBNF text (each line `name ::= body`). Their names must be ones
   * {@link reserve} never gives (it gives lower case only: e.g. a reserved name + `-S1`).
   */
  addText(text: string, count: number): void {
    this.#texts.push(text);
    this.#textRules += count;
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

/**
 * A map that keeps its most recently used entries, within a number of entries and a total size
 * (what `size` means is the caller's: characters, say).
 *
 * @example
 * ```ts
 * const texts = new LruCache<string>(2);
 * texts.set("a", "root ::= \"a\"", 14);
 * texts.get("a"); // 'root ::= "a"'
 * ```
 */
export class LruCache<V> {
  readonly #entries = new Map<string, { value: V; size: number }>();
  #size = 0;

  constructor(readonly maxEntries: number, readonly maxSize = Infinity) {}

  /** The value for `key`, now the most recently used; undefined when absent. */
  get(key: string): V | undefined {
    const entry = this.#entries.get(key);
    if (!entry) return undefined;
    this.#entries.delete(key);
    this.#entries.set(key, entry);
    return entry.value;
  }

  /** Stores `value`, dropping the least recently used entries beyond the bounds. */
  set(key: string, value: V, size = 0): void {
    const old = this.#entries.get(key);
    if (old) {
      this.#entries.delete(key);
      this.#size -= old.size;
    }
    if (size > this.maxSize) return;
    this.#entries.set(key, { value, size });
    this.#size += size;
    for (const [k, e] of this.#entries) {
      if (this.#entries.size <= this.maxEntries && this.#size <= this.maxSize) break;
      this.#entries.delete(k);
      this.#size -= e.size;
    }
  }

  /** Entries held. */
  get size(): number {
    return this.#entries.size;
  }
}
