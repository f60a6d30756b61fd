/** Shapes shared by the grammar builders and the pattern compiler (kept apart so neither imports the other). */
import type { Budget } from "./budget.ts";

/**
 * What the text of a string must satisfy at once: every pattern (each as JSON Schema means it) and
 * the length bounds, counted in code points as JSON Schema counts them.
 */
export interface StringConstraints {
  patterns: readonly string[];
  minLength?: number;
  maxLength?: number;
}

/**
 * A compiled string constraint as GBNF rules, one per live state, written once: the text is
 * `json.join(name)` (or `raw`, for unescaped text), whose start rule is `name` + `-S0`.
 */
export interface PatternAutomaton {
  /** Rules (live states). */
  states: number;
  /** The rules' text, cut where their name prefix goes: as JSON-escaped string content. */
  json: string[];
  /** The same for raw text. */
  raw: string[];
  /** Characters of `json` (without the name prefixes). */
  chars: number;
  /** Work it took to compile (automaton steps: budget units). */
  steps: number;
}

/** Where a grammar build gets pattern automata (see `AutomatonCache`). */
export interface AutomatonSource {
  /**
   * The automaton of `c`; undefined when it is not compiled yet (a build that compiles it later and
   * runs again). Throws a `GrammarError` for constraints that cannot (or may not) be compiled.
   */
  automaton(c: StringConstraints): PatternAutomaton | undefined;
  /** The budget of the build running now, if any: grammars built during it charge their work to it. */
  readonly budget?: Budget;
}
