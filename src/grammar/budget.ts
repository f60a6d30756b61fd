/**
 * The schema budget: how much work one request's schemas may cost, in units of about 5 ns of
 * compiling on one core, counted as the work happens so that whatever the trick, work past the
 * budget is never done. See docs/grammar.md for what each step costs.
 */
import { GrammarError } from "./errors.ts";

/** Units one request's schemas may cost (≈ 20 ms of compiling, or 4 million automaton steps). */
export const SCHEMA_BUDGET = 4_000_000;

/**
 * What each kind of work costs, in budget units. A unit is about 5 ns of compiling (measured on
 * the costliest shapes, with a cold JIT: a whole budget of synchronous work is about 20 ms on one
 * core), or one automaton step (those run in slices between other work).
 */
export const COSTS = {
  /** Compiling one schema node (keyword checks, the rules it adds). */
  node: 400,
  /** Checking one schema node's keyword values (once per schema compiled). */
  checkedNode: 40,
  /** Resolving one `$ref`. */
  ref: 100,
  /** Merging one keyword of one schema into another (allOf, a `$ref` beside other keywords). */
  mergeKey: 100,
  /** One character of GBNF text written, or of a value compared or quoted. */
  char: 2,
  /** One character of a compiled automaton's rules copied into a grammar. */
  copiedChar: 1,
  /** One rule llama.cpp writes out for a bounded repetition (`x{0,50}` is 50 rules). */
  repetition: 100,
  /** Measuring one schema node with its in-place applicators (`$ref`, `allOf`, …) expanded. */
  expandedNode: 10,
  /** One step of compiling a pattern automaton. */
  automatonStep: 1,
  /**
   * One state of a pattern's nondeterministic automaton, wherever the pattern is: the output check
   * builds it (~0.5 µs, ~300 bytes) and tests the output with it. 80,000 states fill the budget.
   */
  patternState: 50,
} as const;

/**
 * A budget of work units; {@link charge} throws a `GrammarError` (`schema_too_large`, naming the
 * limit) once the work charged passes it.
 *
 * @example
 * ```ts
 * const budget = new Budget();
 * budget.charge(COSTS.node);
 * ```
 */
export class Budget {
  #used = 0;

  constructor(readonly limit = SCHEMA_BUDGET) {}

  /** Units charged so far. */
  get used(): number {
    return this.#used;
  }

  /** Units left. */
  get left(): number {
    return Math.max(0, this.limit - this.#used);
  }

  /** Charges `units`; throws when the total passes the limit (`what`: the work, for the message). */
  charge(units: number, what = "compiling it"): void {
    this.#used += units;
    if (this.#used > this.limit) throw budgetError(this.limit, what);
  }
}

/** The refusal of a schema whose work would pass the budget. */
export function budgetError(limit: number, what = "compiling it"): GrammarError {
  return new GrammarError(`The JSON schema is too large to enforce: ${overBudget(limit, what)}.`, {
    code: "schema_too_large",
  });
}

/** Why {@link budgetError} refuses, as a phrase (for messages that word the rest themselves). */
export function overBudget(limit: number, what: string): string {
  return `${what} takes more than the schema budget of ${limit} work units ` +
    "(each $ref, allOf, anyOf/oneOf alternative, property and item schema expanded, each grammar rule and " +
    "pattern automaton step counts)";
}
