/**
 * The last line of the structured-output guarantee: finished JSON is checked against the client's
 * schema, so keywords no grammar can express (`uniqueItems`, `not`, …) still hold. Validators are
 * compiled once per schema (a small LRU cache).
 */
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020";

const ajv = new Ajv2020({
  strict: false,
  allErrors: false,
  validateFormats: true,
  validateSchema: false,
  logger: false,
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
 * become numbers.
 */
export function toDraft2020(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(toDraft2020);
  if (typeof schema !== "object" || schema === null) return schema;
  const s = schema as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === "$schema") continue;
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
      // A schema the validator cannot read: the grammar alone vouches for the output.
      return { ok: true, ...({ note: (e as Error).message } as object) };
    }
  }
  cache.set(key, validate);
  if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value!);
  if (validate(value)) return { ok: true };
  return { ok: false, reason: ajv.errorsText(validate.errors) };
}
