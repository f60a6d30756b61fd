/**
 * The output check's validator: Ajv (JSON Schema 2020-12) with the string formats the grammar knows,
 * compiled once per schema (a small LRU cache). Run in the output-check worker
 * (`schema_worker.ts`), never on the server's thread: compiling a large schema takes Ajv seconds,
 * and checking a value can take as long as a client's patterns make it.
 */
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020";
import type { RegExpLike, SchemaValidateFunction } from "ajv/dist/types";
import { FORMAT_CHECKS, LruCache, type MatchWork, PatternMatcher, PatternWorkError } from "../grammar/mod.ts";

/**
 * The outcome of one check; `overlap`: where (a JSON pointer into the value) the value matched several of a
 * `oneOf`'s alternatives, which a grammar cannot rule out (it enforces at least one).
 */
export type CheckResult = { ok: true } | { ok: false; reason: string; timedOut?: boolean; overlap?: string };

/**
 * Ajv's regular expressions for `pattern` and `patternProperties`: {@link PatternMatcher}, linear in
 * the text, where V8's backtracking engine takes exponential time on patterns such as `^(a+)+b$`.
 * Request validation refuses any pattern it cannot take; should one get here, compiling the schema
 * throws and nothing is vouched for unchecked.
 */
const linearRegExp = Object.assign((source: string): RegExpLike => {
  const matcher = PatternMatcher.compile(source);
  compiledStates += matcher.states;
  // Ajv keys its compiled patterns by toString().
  const like = { test: (text: string) => matcher.test(text, work), toString: () => `/${source}/u` };
  return like;
}, { code: "PatternMatcher" });

/**
 * Pattern work one check may do (units of {@link MatchWork}: ~27 ns each here, so about half a
 * second at most). A pattern within the request limits (20,000 automaton states) on a long text can
 * cost more: each character may build a state of thousands of entries (`a(?:.{190}){100}$` on 100,000
 * characters: 195 s). The check is then cut off as a check over its time limit is (400
 * `schema_too_large`), but at once rather than after 10 s.
 */
export const CHECK_WORK = 20_000_000;
/** The allowance of the check running now. */
const work: MatchWork = { left: CHECK_WORK };
/** Automaton states of the patterns compiled since the last schema's compilation began. */
let compiledStates = 0;

const ajv = new Ajv2020({
  code: { regExp: linearRegExp },
  strict: false,
  // Flat code: with allErrors false, ajv nests one `if` per keyword and property, and the code of an
  // object of 3,000 properties overflows the stack; validity is the same either way.
  allErrors: true,
  validateFormats: true,
  validateSchema: false,
  logger: false,
  // Decimal steps in decimal, not binary: 0.07 is a multiple of 0.01.
  multipleOfPrecision: 9,
  // Each referenced schema is compiled once and called: inlined, a schema of a few thousand nodes
  // referenced a few dozen times is compiled into code a hundred times its size.
  inlineRefs: false,
});
// `uniqueItems` in time linear in the array: each item's canonical text (keys sorted) in a set, where
// Ajv compares every pair of non-primitive items (a long array of objects took it seconds).
const uniqueItems: SchemaValidateFunction = (schema: boolean, data: unknown[]): boolean => {
  const seen = new Map<string, number>();
  for (let later = 0; schema && later < data.length; later++) {
    const key = canonicalJson(data[later]);
    const earlier = seen.get(key);
    if (earlier !== undefined) {
      // Ajv's own words and params (`i` the later item, `j` the earlier one).
      uniqueItems.errors = [{
        keyword: "uniqueItems",
        message: `must NOT have duplicate items (items ## ${earlier} and ${later} are identical)`,
        params: { i: later, j: earlier },
      }];
      return false;
    }
    seen.set(key, later);
  }
  return true;
};
ajv.removeKeyword("uniqueItems");
ajv.addKeyword({
  keyword: "uniqueItems",
  type: "array",
  schemaType: "boolean",
  errors: true,
  validate: uniqueItems,
});

/**
 * JSON text of `v` with object keys sorted: equal texts for values JSON Schema calls equal. Written
 * with a stack of its own, not recursion: output may nest deeper than the call stack goes.
 */
export function canonicalJson(v: unknown): string {
  const out: string[] = [];
  const stack: ({ text: string } | { value: unknown })[] = [{ value: v }];
  while (stack.length > 0) {
    const step = stack.pop()!;
    if ("text" in step) {
      out.push(step.text);
      continue;
    }
    const x = step.value;
    if (Array.isArray(x)) {
      stack.push({ text: "]" });
      for (let i = x.length - 1; i >= 0; i--) {
        stack.push({ value: x[i] });
        if (i > 0) stack.push({ text: "," });
      }
      stack.push({ text: "[" });
    } else if (x !== null && typeof x === "object") {
      const o = x as Record<string, unknown>;
      const keys = Object.keys(o).sort();
      stack.push({ text: "}" });
      for (let i = keys.length - 1; i >= 0; i--) {
        stack.push({ value: o[keys[i]] }, { text: `${JSON.stringify(keys[i])}:` });
        if (i > 0) stack.push({ text: "," });
      }
      stack.push({ text: "{" });
    } else out.push(JSON.stringify(x));
  }
  return out.join("");
}

// The string formats the grammar knows (ajv itself checks none without ajv-formats), by the patterns
// the grammar intersects with them, in linear time like every pattern.
for (const [name, source] of Object.entries(FORMAT_CHECKS)) {
  const matcher = PatternMatcher.compile(source);
  ajv.addFormat(name, (text: string) => matcher.test(text, work));
}
/** A compiled schema: its validator, and the schema object Ajv keeps it under. */
interface Compiled {
  validate: ValidateFunction;
  schema: object;
}

/**
 * Compiled schemas by their JSON text: up to 256, and 200,000 pattern automaton states in all (a
 * state takes ~300 bytes): a schema of many large patterns is not kept beside 255 others. Ajv keeps
 * every schema it compiled (by the object): it lets go of each with its entry.
 */
const cache = new LruCache<Compiled>(256, 200_000, (_, c) => ajv.removeSchema(c.schema));
/** Most characters of a failure's reason (all errors are collected). */
const MAX_REASON = 1000;

/**
 * Older drafts' forms in the 2020-12 vocabulary: `items: [...]` tuples become `prefixItems`
 * (`additionalItems` then `items`), `definitions` refs stay resolvable, boolean exclusive bounds
 * become numbers. Identifiers (`$id`, `$anchor`) are left out: every `$ref` is resolved from the
 * root, as the grammar and {@link checkSchemaLimits} resolve it.
 */
export function toDraft2020(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(toDraft2020);
  if (typeof schema !== "object" || schema === null) return schema;
  const s = schema as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === "$schema" || k === "$id" || k === "$anchor" || k === "$dynamicAnchor") continue;
    if (k === "items" && Array.isArray(v)) out.prefixItems = v.map(toDraft2020);
    else if (k === "additionalItems") out.items = toDraft2020(v);
    else if ((k === "exclusiveMinimum" || k === "exclusiveMaximum") && typeof v === "boolean") continue;
    else out[k] = toDraft2020(v);
  }
  if (s.exclusiveMinimum === true && typeof s.minimum === "number") {
    out.exclusiveMinimum = s.minimum;
    delete out.minimum;
  }
  if (s.exclusiveMaximum === true && typeof s.maximum === "number") {
    out.exclusiveMaximum = s.maximum;
    delete out.maximum;
  }
  return out;
}

/**
 * Whether `value` satisfies the schema whose JSON text is `key`; the reason when it does not, or when
 * the schema cannot be compiled (nothing is vouched for unchecked).
 *
 * @example
 * ```ts
 * validateJson(JSON.stringify({ type: "array", uniqueItems: true }), [1, 1]); // { ok: false, reason: "…" }
 * ```
 */
export function validateJson(key: string, value: unknown): CheckResult {
  let entry = cache.get(key);
  if (!entry) {
    compiledStates = 0;
    const schema = toDraft2020(JSON.parse(key)) as object;
    try {
      entry = { validate: ajv.compile(schema), schema };
    } catch (e) {
      ajv.removeSchema(schema);
      // Request validation refuses such schemas (400 naming the keyword); should one get through,
      // nothing is vouched for unchecked.
      return { ok: false, reason: `the schema cannot be compiled for checking: ${(e as Error).message}` };
    }
    // Kept by the states of its patterns (a schema of none still counts one).
    cache.set(key, entry, compiledStates + 1);
  }
  const validate = entry.validate;
  work.left = CHECK_WORK;
  try {
    if (validate(value)) return { ok: true };
  } catch (e) {
    if (e instanceof PatternWorkError) {
      return { ok: false, reason: `its patterns took more than ${CHECK_WORK} steps`, timedOut: true };
    }
    return { ok: false, reason: `the check failed: ${(e as Error).message}` };
  }
  const reason = ajv.errorsText(validate.errors).slice(0, MAX_REASON);
  const overlap = validate.errors?.find((e) =>
    e.keyword === "oneOf" && Array.isArray(e.params.passingSchemas)
  );
  return overlap ? { ok: false, reason, overlap: overlap.instancePath } : { ok: false, reason };
}
