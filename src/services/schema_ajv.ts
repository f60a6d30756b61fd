/**
 * The output check's validator: Ajv (JSON Schema 2020-12) with the string formats the grammar knows,
 * compiled once per schema (a small LRU cache). Run in the output-check worker
 * (`schema_worker.ts`), never on the server's thread: compiling a large schema takes Ajv seconds,
 * and checking a value can take as long as a client's patterns make it.
 */
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020";
import type { RegExpLike, SchemaValidateFunction } from "ajv/dist/types";
import { FORMAT_CHECKS, PatternMatcher } from "../grammar/mod.ts";

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
  // Ajv keys its compiled patterns by toString().
  const like = { test: (text: string) => matcher.test(text), toString: () => `/${source}/u` };
  return like;
}, { code: "PatternMatcher" });

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
  for (let j = 0; schema && j < data.length; j++) {
    const key = canonicalJson(data[j]);
    const i = seen.get(key);
    if (i !== undefined) {
      uniqueItems.errors = [{
        keyword: "uniqueItems",
        message: `must NOT have duplicate items (items ## ${j} and ${i} are identical)`,
        params: { i: j, j: i },
      }];
      return false;
    }
    seen.set(key, j);
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

/** JSON text of `v` with object keys sorted: equal texts for values JSON Schema calls equal. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

// The string formats the grammar knows (ajv itself checks none without ajv-formats), by the patterns
// the grammar intersects with them, in linear time like every pattern.
for (const [name, source] of Object.entries(FORMAT_CHECKS)) {
  const matcher = PatternMatcher.compile(source);
  ajv.addFormat(name, (text: string) => matcher.test(text));
}
const cache = new Map<string, ValidateFunction>();
const CACHE_SIZE = 256;
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
  let validate = cache.get(key);
  if (validate) cache.delete(key);
  else {
    try {
      validate = ajv.compile(toDraft2020(JSON.parse(key)) as object);
    } catch (e) {
      // Request validation refuses such schemas (400 naming the keyword); should one get through,
      // nothing is vouched for unchecked.
      return { ok: false, reason: `the schema cannot be compiled for checking: ${(e as Error).message}` };
    }
  }
  cache.set(key, validate);
  if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value!);
  try {
    if (validate(value)) return { ok: true };
  } catch (e) {
    return { ok: false, reason: `the check failed: ${(e as Error).message}` };
  }
  const reason = ajv.errorsText(validate.errors).slice(0, MAX_REASON);
  const overlap = validate.errors?.find((e) =>
    e.keyword === "oneOf" && Array.isArray(e.params.passingSchemas)
  );
  return overlap ? { ok: false, reason, overlap: overlap.instancePath } : { ok: false, reason };
}
