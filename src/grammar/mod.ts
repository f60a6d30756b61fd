/**
 * JSON Schema and regular expressions → GBNF, llama.cpp's grammar format: grammars whose every output
 * is JSON valid under a schema (or text matching a pattern). A package of its own: it imports nothing
 * from the server. Its callers inject what it must not decide alone: how long work pauses for other
 * work ({@link AutomatonCache}'s slices) and how much work a schema may cost.
 * Every refusal is a {@link GrammarError} naming the keyword and where it is.
 *
 * @example
 * ```ts
 * import { AutomatonCache, GbnfRules, JsonGrammar } from "./mod.ts";
 * const automata = new AutomatonCache();
 * const text = await automata.build(() => {
 *   const g = new JsonGrammar(new GbnfRules("", automata));
 *   return g.rules.text(`root ::= ${g.schema({ type: "string", pattern: "^a+$" }, "response_format", "out")}`);
 * });
 * ```
 */
export { GrammarError, type GrammarErrorCode } from "./errors.ts";
export { Budget, budgetError, COSTS, SCHEMA_BUDGET } from "./budget.ts";
export { measureSchema, resolvePointer, type SchemaMeasure } from "./measure.ts";
export { gbnfClass, gbnfLiteral, GbnfRules, textWithout } from "./gbnf.ts";
export { LruCache } from "./lru.ts";
export {
  FORMAT_CHECKS,
  GRAMMAR_KEYWORDS,
  JsonGrammar,
  mergeSchemas,
  multiplesBetween,
  VALIDATED_KEYWORDS,
  warmUpGrammar,
} from "./json_schema.ts";
export {
  AutomatonCache,
  type MatchWork,
  PATTERN_LIMITS,
  PatternError,
  PatternMatcher,
  patternRules,
  PatternTooLargeError,
  PatternWorkError,
  type Slices,
  type SliceSource,
  timerSlices,
} from "./regex.ts";
export type { AutomatonSource, PatternAutomaton, StringConstraints } from "./types.ts";
