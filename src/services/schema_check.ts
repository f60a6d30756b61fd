/**
 * The last line of the structured-output guarantee: finished JSON is checked against the client's
 * schema, so keywords no grammar can express (`uniqueItems`, `not`, …) still hold. Validators are
 * compiled once per schema (a small LRU cache).
 */
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020";
import { badRequest } from "../http/errors.ts";
import { Budget, GrammarError, measureSchema } from "../grammar/mod.ts";

const ajv = new Ajv2020({
  strict: false,
  allErrors: false,
  validateFormats: true,
  validateSchema: false,
  logger: false,
  // Decimal steps in decimal, not binary: 0.07 is a multiple of 0.01.
  multipleOfPrecision: 9,
  // Each referenced schema is compiled once and called: inlined, a schema of a few thousand nodes
  // referenced a few dozen times is compiled into code a hundred times its size.
  inlineRefs: false,
});
// The string formats the grammar knows (ajv itself checks none without ajv-formats).
const FORMATS: Record<string, RegExp> = {
  date: /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/,
  time: /^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)$/,
  "date-time":
    /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[tT ]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)$/,
  uuid: /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/,
  email: /^[^\s@]+@[^\s@]+\.[^\s@]+$/,
  hostname: /^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$/,
  ipv4: /^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/,
  uri: /^[a-zA-Z][a-zA-Z0-9+.-]*:[^\s]*$/,
};
for (const [name, re] of Object.entries(FORMATS)) ajv.addFormat(name, re);
const cache = new Map<string, ValidateFunction>();
const CACHE_SIZE = 256;

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
 * Whether `value` satisfies `schema`; the reason when it does not.
 *
 * @example
 * ```ts
 * checkAgainstSchema({ type: "array", uniqueItems: true }, [1, 1]); // { ok: false, reason: "…" }
 * ```
 */
export function checkAgainstSchema(
  schema: unknown,
  value: unknown,
): { ok: true } | { ok: false; reason: string } {
  const key = JSON.stringify(schema);
  let validate = cache.get(key);
  if (validate) cache.delete(key);
  else {
    try {
      validate = ajv.compile(toDraft2020(schema) as object);
    } catch (e) {
      // Request validation refuses such schemas (400 naming the keyword); should one get through,
      // nothing is vouched for unchecked.
      return { ok: false, reason: `the schema cannot be compiled for checking: ${(e as Error).message}` };
    }
  }
  cache.set(key, validate);
  if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value!);
  if (validate(value)) return { ok: true };
  return { ok: false, reason: ajv.errorsText(validate.errors) };
}

/** Bounds on a schema a request may carry (OpenAI's own are lower: 5 levels, 1,000 enum values). */
export const SCHEMA_LIMITS = { maxDepth: 64, maxNodes: 10_000, maxEnumValues: 1_000, maxBytes: 256 * 1024 };

/**
 * Refuses a schema over the size limits with a 400 naming the limit, before any recursive work
 * (conversion to a grammar, compilation) can overflow the stack or stall the event loop.
 * Iterative, so a schema nested 100,000 levels deep is measured, not recursed into. Then the work
 * of checking values against it is measured with `$ref`s and `allOf`/`anyOf`/`oneOf` expanded
 * (charged to `budget`, one per request), and loops of them with no property or item between are
 * refused: see the grammar package's `measureSchema`.
 */
export function checkSchemaLimits(schema: unknown, param: string, budget = new Budget()): void {
  const fail = (what: string) => {
    throw badRequest(`The JSON schema at ${param} is too large: ${what}.`, param, "schema_too_large");
  };
  const stack: [unknown, number][] = [[schema, 0]];
  let nodes = 0;
  let enumValues = 0;
  let bytes = 0;
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (++nodes > SCHEMA_LIMITS.maxNodes) fail(`more than ${SCHEMA_LIMITS.maxNodes} values`);
    if (depth > SCHEMA_LIMITS.maxDepth) fail(`nested deeper than ${SCHEMA_LIMITS.maxDepth} levels`);
    if (typeof node === "string") bytes += node.length;
    if (bytes > SCHEMA_LIMITS.maxBytes) fail(`more than ${SCHEMA_LIMITS.maxBytes} characters of strings`);
    if (typeof node !== "object" || node === null) continue;
    if (Array.isArray(node)) {
      for (const v of node) stack.push([v, depth + 1]);
      continue;
    }
    for (const [k, v] of Object.entries(node)) {
      bytes += k.length;
      if (k === "enum" && Array.isArray(v)) {
        enumValues += v.length;
        if (enumValues > SCHEMA_LIMITS.maxEnumValues) {
          fail(`more than ${SCHEMA_LIMITS.maxEnumValues} enum values in all`);
        }
      }
      stack.push([v, depth + 1]);
    }
  }
  try {
    measureSchema(schema, param, budget);
  } catch (e) {
    if (e instanceof GrammarError) throw badRequest(e.message, param, e.code);
    throw e;
  }
}
