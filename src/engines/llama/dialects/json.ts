/**
 * The JSON dialect (Qwen3, Hermes): `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`.
 */
import type { EngineTool } from "../../types.ts";
import { gbnfLiteral, type JsonGrammar } from "../../../grammar/mod.ts";
import type { CallEvent, CallParser, CallResult, CallTags, ToolDialect } from "./types.ts";
import { JsonCompactor } from "./json_compactor.ts";

const HEAD = /^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*/;

/** Calls as a JSON object with `name` and `arguments` inside `<tool_call>` tags. */
export const jsonDialect: ToolDialect = {
  name: "json",
  open: "<tool_call>",
  close: "</tool_call>",
  callRule(grammar: JsonGrammar, tool: EngineTool, param: string, hint: string, tags: CallTags): string {
    const args = grammar.schema(objectSchema(tool.parameters), param, hint);
    return grammar.rules.add(
      `${hint}-call`,
      `${tags.open} ${gbnfLiteral(`\n{"name": ${JSON.stringify(tool.name)}, "arguments": `)} ${args} ${
        gbnfLiteral("}\n")
      } ${tags.close}`,
    );
  },
  parser: () => new JsonCallParser(),
};

/** Tool parameters as an object schema (a missing schema means any object). */
export function objectSchema(parameters: Record<string, unknown> | undefined): Record<string, unknown> {
  if (!parameters || Object.keys(parameters).length === 0) return { type: "object" };
  return parameters.type === undefined ? { type: "object", ...parameters } : parameters;
}

/** Streams the arguments' text as soon as `"arguments":` has been seen. */
class JsonCallParser implements CallParser {
  #buffer = "";
  #name: string | undefined;
  /** Where the arguments start in the buffer, once known. */
  #argsAt = -1;
  /** Arguments text released so far (compacted). */
  #released = 0;
  readonly #compactor = new JsonCompactor();

  push(text: string): CallEvent[] {
    this.#buffer += text;
    const out: CallEvent[] = [];
    if (this.#name === undefined) {
      const m = this.#buffer.match(HEAD);
      if (!m) return out;
      try {
        this.#name = JSON.parse(`"${m[1]}"`) as string;
      } catch {
        return out;
      }
      this.#argsAt = m[0].length;
      this.#released = this.#argsAt;
      out.push({ type: "name", name: this.#name });
    }
    // Hold back a closing brace and whitespace: they may be the end of the outer object.
    const safe = this.#buffer.replace(/\}?\s*$/, "").length;
    if (safe > this.#released) {
      const piece = this.#compactor.push(this.#buffer.slice(this.#released, safe));
      this.#released = safe;
      if (piece) out.push({ type: "arguments", text: piece });
    }
    return out;
  }

  end(closed: boolean): { events: CallEvent[]; result: CallResult } {
    const events: CallEvent[] = [];
    if (this.#name === undefined) {
      // Not in the expected order: accept any JSON object with a name and arguments.
      try {
        const v = JSON.parse(this.#buffer.trim());
        if (closed && typeof v?.name === "string" && v.arguments !== undefined) {
          const args = typeof v.arguments === "string" ? v.arguments : JSON.stringify(v.arguments);
          events.push({ type: "name", name: v.name }, { type: "arguments", text: args });
          return { events, result: { ok: true, name: v.name } };
        }
      } catch { /* not a call */ }
      return { events, result: { ok: false } };
    }
    let rest = this.#buffer.slice(this.#released);
    if (closed) rest = rest.replace(/\}\s*$/, "");
    const piece = this.#compactor.push(rest);
    if (piece) events.push({ type: "arguments", text: piece });
    return { events, result: { ok: true, name: this.#name } };
  }
}
