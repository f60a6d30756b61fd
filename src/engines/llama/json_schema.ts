/**
 * Checks that a client's JSON schema can be enforced by node-llama-cpp's grammar generator and
 * converts it to that dialect. Keywords it cannot enforce are refused (never silently ignored).
 */
import { EngineInputError } from "../types.ts";

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
  "strict",
]);
const SUPPORTED = new Set([
  "type",
  "const",
  "enum",
  "oneOf",
  "anyOf",
  "$defs",
  "definitions",
  "$ref",
  "properties",
  "required",
  "additionalProperties",
  "minProperties",
  "maxProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "format",
]);
const FORMATS = new Set(["date-time", "time", "date"]);

/**
 * The schema in the grammar generator's dialect (`anyOf` → `oneOf`, `definitions` → `$defs`);
 * throws {@link EngineInputError} naming the first keyword it cannot enforce.
 *
 * @example
 * ```ts
 * toGrammarSchema({ type: "object", properties: { a: { type: "string", maxLength: 8 } } }, "response_format");
 * ```
 */
export function toGrammarSchema(schema: unknown, param: string, path = "#"): Record<string, unknown> {
  if (
    schema === true || (typeof schema === "object" && schema !== null && Object.keys(schema).length === 0)
  ) {
    return {};
  }
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    throw new EngineInputError(`The JSON schema at ${path} must be an object.`, param, "invalid_schema");
  }
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(schema)) {
    if (ANNOTATIONS.has(key)) {
      if (key === "description" && typeof value === "string") out.description = value;
      continue;
    }
    if (!SUPPORTED.has(key)) {
      throw new EngineInputError(
        `The JSON schema keyword '${key}' at ${path} cannot be enforced by the grammar; remove it ` +
          `(supported: ${[...SUPPORTED].join(", ")}).`,
        param,
        "unsupported_schema",
      );
    }
    const at = `${path}/${key}`;
    switch (key) {
      case "properties":
      case "$defs":
      case "definitions":
        out[key === "definitions" ? "$defs" : key] = Object.fromEntries(
          Object.entries(value as Record<string, unknown>).map((
            [k, v],
          ) => [k, toGrammarSchema(v, param, `${at}/${k}`)]),
        );
        break;
      case "oneOf":
      case "anyOf":
      case "prefixItems":
        if (!Array.isArray(value)) {
          throw new EngineInputError(`${at} must be an array.`, param, "invalid_schema");
        }
        out[key === "anyOf" ? "oneOf" : key] = value.map((v, i) => toGrammarSchema(v, param, `${at}/${i}`));
        break;
      case "items":
      case "additionalProperties":
        out[key] = typeof value === "boolean" ? value : toGrammarSchema(value, param, at);
        break;
      case "$ref":
        out.$ref = String(value).replace("#/definitions/", "#/$defs/");
        break;
      case "format":
        if (!FORMATS.has(String(value))) {
          throw new EngineInputError(
            `The JSON schema format '${value}' at ${path} cannot be enforced (supported: date-time, time, date).`,
            param,
            "unsupported_schema",
          );
        }
        out.format = value;
        break;
      default:
        out[key] = value;
    }
  }
  return out;
}
