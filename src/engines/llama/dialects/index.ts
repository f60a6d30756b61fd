/** The tool-call dialects, and which one a chat template speaks. */
import type { ToolDialect } from "./types.ts";
import { jsonDialect } from "./json.ts";
import { xmlDialect } from "./xml.ts";

export type { CallEvent, CallParser, CallTags, ToolDialect } from "./types.ts";

/** Every dialect by name (the registry's `toolFormat`). */
export const DIALECTS: Record<"json" | "xml", ToolDialect> = { json: jsonDialect, xml: xmlDialect };

/**
 * The dialect a chat template renders calls in: `<function=…>` blocks are the XML dialect
 * (Qwen3.5/3.6, Qwen3-Coder); anything else the JSON one.
 *
 * @example
 * ```ts
 * dialectOfTemplate("… <function={{ tool_call.name }}> …").name; // "xml"
 * ```
 */
export function dialectOfTemplate(template: string): ToolDialect {
  return /<function=/.test(template) && /<parameter=/.test(template) ? xmlDialect : jsonDialect;
}
