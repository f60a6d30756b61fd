/**
 * What the dialects read from a tool's parameter schema: a parameter's schema, the target of a
 * local `$ref`, and whether a schema allows strings only.
 */
import type { EngineTool } from "../../types.ts";

/**
 * True when every value `schema` allows is a string (the XML dialect then writes it raw); local
 * `$ref`s are followed through `root` (the tool's parameter schema, where pydantic puts `$defs`).
 *
 * @example
 * ```ts
 * isStringSchema({ enum: ["a", "b"] }); // true
 * isStringSchema({ anyOf: [{ type: "string" }, { type: "null" }] }); // false
 * isStringSchema({ $ref: "#/$defs/Name" }, { $defs: { Name: { type: "string" } } }); // true
 * ```
 */
export function isStringSchema(schema: unknown, root?: unknown, depth = 0): boolean {
  if (typeof schema !== "object" || schema === null || depth > 16) return false;
  const s = schema as Record<string, unknown>;
  if (typeof s.$ref === "string") return isStringSchema(resolveRef(root, s.$ref), root, depth + 1);
  if (s.type === "string") return true;
  if (Array.isArray(s.enum)) return s.enum.length > 0 && s.enum.every((v) => typeof v === "string");
  if (s.const !== undefined) return typeof s.const === "string";
  const alts = (s.anyOf ?? s.oneOf ?? s.allOf) as unknown[] | undefined;
  if (Array.isArray(alts)) {
    return alts.length > 0 &&
      (s.allOf ? alts.some : alts.every).call(alts, (a) => isStringSchema(a, root, depth + 1));
  }
  return false;
}

/**
 * The target of a local `$ref` (`#/$defs/X`, `#/definitions/X`, any JSON pointer) in `root`.
 *
 * @example
 * ```ts
 * resolveRef({ $defs: { "a/b": { type: "integer" } } }, "#/$defs/a~1b"); // { type: "integer" }
 * resolveRef({}, "other.json#/x"); // undefined
 * ```
 */
export function resolveRef(root: unknown, ref: string): unknown {
  if (!ref.startsWith("#")) return undefined;
  let at: unknown = root;
  for (const raw of ref.slice(1).split("/").slice(1)) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (typeof at !== "object" || at === null) return undefined;
    at = (at as Record<string, unknown>)[key];
  }
  return at;
}

/**
 * The schema of parameter `key` of `tool`, if declared.
 *
 * @example
 * ```ts
 * const tool = { name: "f", parameters: { type: "object", properties: { city: { type: "string" } } } };
 * parameterSchema(tool, "city"); // { type: "string" }
 * parameterSchema(tool, "unit"); // undefined
 * ```
 */
export function parameterSchema(tool: EngineTool | undefined, key: string): unknown {
  const props = (tool?.parameters as { properties?: Record<string, unknown> } | undefined)?.properties;
  return props && typeof props === "object" ? props[key] : undefined;
}
