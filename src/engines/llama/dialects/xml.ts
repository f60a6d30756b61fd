/**
 * The XML dialect (Qwen3.5, Qwen3.6, Qwen3-Coder):
 * `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n…</function>\n</tool_call>`.
 * String values are raw text, others JSON; the parameter schema says which. Streamed arguments
 * are JSON: string values stream as they are written, other values once complete.
 */
import type { EngineTool } from "../../types.ts";
import { gbnfLiteral, type JsonGrammar, textWithout } from "../../../grammar/mod.ts";
import { objectSchema } from "./json.ts";
import type { CallEvent, CallParser, CallResult, CallTags, ToolDialect } from "./types.ts";
import { isStringSchema, parameterSchema, resolveRef } from "./parameter_schema.ts";

const VALUE_END = "\n</parameter>";
const CLOSE = "</tool_call>";
/** What a raw value may never hold: the end of its parameter, of the call. */
const RAW_MARKERS = [VALUE_END, CLOSE];

/** Calls as `<function=…>` with one `<parameter=…>` block per argument. */
export const xmlDialect: ToolDialect = {
  name: "xml",
  open: "<tool_call>",
  close: CLOSE,
  callRule(grammar: JsonGrammar, tool: EngineTool, param: string, hint: string, tags: CallTags): string {
    const rules = grammar.rules;
    const schema = objectSchema(tool.parameters);
    const props = (schema.properties ?? {}) as Record<string, unknown>;
    const required = new Set(Array.isArray(schema.required) ? schema.required.map(String) : []);
    const names = Object.keys(props);
    let params: string;
    if (names.length === 0 && schema.additionalProperties !== false) {
      const free = textWithout(rules, `${hint}-raw`, RAW_MARKERS);
      params = `( "<parameter=" [a-zA-Z0-9_.-]{1,64} ">\\n" ${free} ${gbnfLiteral(`${VALUE_END}\n`)} )*`;
    } else {
      params = names.map((key) => {
        const value = valueRule(
          grammar,
          withDefinitions(props[key], schema),
          schema,
          `${param}.properties.${key}`,
          `${hint}-${key}`,
        );
        const block = `${gbnfLiteral(`<parameter=${key}>\n`)} ${value} ${gbnfLiteral(`${VALUE_END}\n`)}`;
        return required.has(key) ? block : `( ${block} )?`;
      }).join(" ") || '""';
    }
    return rules.add(
      `${hint}-call`,
      `${tags.open} ${gbnfLiteral(`\n<function=${tool.name}>\n`)} ${params} ${
        gbnfLiteral("</function>\n")
      } ${tags.close}`,
    );
  },
  parser: (tools) => new XmlCallParser(tools),
};

/**
 * A parameter's schema, made self-contained: it is compiled on its own, so the parameter schema's
 * `$defs` / `definitions` (where pydantic and zod put shared types) come along for its `$ref`s.
 */
function withDefinitions(schema: unknown, root: Record<string, unknown>): unknown {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return schema;
  const defs: Record<string, unknown> = {};
  for (const k of ["$defs", "definitions"]) if (root[k] !== undefined) defs[k] = root[k];
  return Object.keys(defs).length === 0 ? schema : { ...defs, ...schema };
}

/** A parameter value: raw text for strings, JSON otherwise. */
function valueRule(
  grammar: JsonGrammar,
  schema: unknown,
  root: unknown,
  param: string,
  hint: string,
): string {
  if (!isStringSchema(schema, root)) return grammar.schema(schema ?? true, param, hint);
  return grammar.rawString(inlineRefs(schema, root) as Record<string, unknown>, param, hint, RAW_MARKERS);
}

/** A string schema with its local `$ref`s replaced by their targets (string schemas do not recurse). */
function inlineRefs(schema: unknown, root: unknown, depth = 0): unknown {
  if (typeof schema !== "object" || schema === null || depth > 16) return schema;
  const s = { ...schema as Record<string, unknown> };
  delete s.$defs;
  delete s.definitions;
  if (typeof s.$ref === "string") {
    const target = resolveRef(root, s.$ref);
    delete s.$ref;
    const inner = inlineRefs(target, root, depth + 1);
    return typeof inner === "object" && inner !== null ? { ...inner as Record<string, unknown>, ...s } : s;
  }
  for (const k of ["anyOf", "oneOf", "allOf"]) {
    if (Array.isArray(s[k])) s[k] = (s[k] as unknown[]).map((a) => inlineRefs(a, root, depth + 1));
  }
  if (Array.isArray(s.allOf)) {
    // allOf of string schemas (pydantic wraps a referenced enum this way): their merge.
    const parts = s.allOf as Record<string, unknown>[];
    delete s.allOf;
    return Object.assign({}, ...parts, s);
  }
  return s;
}

const FUNCTION_OPEN = /^\s*<function=([^>\n]{1,128})>\n?/;
const PARAM_OPEN = /^\s*<parameter=([^>\n]{1,128})>\n?/;
const FUNCTION_CLOSE = /^\s*<\/function>\s*$/;

/** Reads one call and emits its arguments as JSON text. */
class XmlCallParser implements CallParser {
  readonly #tools: readonly EngineTool[];
  #buffer = "";
  #tool: EngineTool | undefined;
  #name: string | undefined;
  /** Inside a parameter value: its key and whether it streams as a raw string. */
  #param: { key: string; raw: boolean; value: string; sent: number } | undefined;
  #count = 0;
  #closed = false;

  constructor(tools: readonly EngineTool[]) {
    this.#tools = tools;
  }

  push(text: string): CallEvent[] {
    this.#buffer += text;
    const out: CallEvent[] = [];
    this.#advance(out, false);
    return out;
  }

  end(closed: boolean): { events: CallEvent[]; result: CallResult } {
    const events: CallEvent[] = [];
    this.#advance(events, true);
    if (this.#name === undefined) return { events, result: { ok: false } };
    if (this.#param) this.#finishParam(events, closed);
    if (!this.#closed) events.push({ type: "arguments", text: this.#count === 0 ? "{}" : "}" });
    return { events, result: { ok: true, name: this.#name } };
  }

  #advance(out: CallEvent[], final: boolean) {
    while (!this.#closed) {
      if (this.#name === undefined) {
        const m = this.#buffer.match(FUNCTION_OPEN);
        if (!m || (!final && !this.#buffer.slice(m[0].length).length && !m[0].endsWith("\n"))) return;
        this.#name = m[1].trim();
        this.#tool = this.#tools.find((t) => t.name === this.#name);
        this.#buffer = this.#buffer.slice(m[0].length);
        out.push({ type: "name", name: this.#name });
        continue;
      }
      if (this.#param) {
        if (!this.#streamParam(out, final)) return;
        continue;
      }
      const p = this.#buffer.match(PARAM_OPEN);
      if (p && (final || p[0].endsWith("\n") || this.#buffer.length > p[0].length)) {
        const key = p[1].trim();
        this.#buffer = this.#buffer.slice(p[0].length);
        const schema = parameterSchema(this.#tool, key);
        this.#param = { key, raw: isStringSchema(schema, this.#tool?.parameters), value: "", sent: 0 };
        out.push({ type: "arguments", text: `${this.#count === 0 ? "{" : ","}${JSON.stringify(key)}:` });
        this.#count++;
        if (this.#param.raw) out.push({ type: "arguments", text: '"' });
        continue;
      }
      if (FUNCTION_CLOSE.test(this.#buffer) && (final || this.#buffer.includes("</function>"))) {
        out.push({ type: "arguments", text: this.#count === 0 ? "{}" : "}" });
        this.#closed = true;
        this.#buffer = "";
        return;
      }
      const trimmed = this.#buffer.trimStart();
      // Wait while the text may still become a tag; skip stray text between parameters.
      const maybeTag = trimmed === "" || "<parameter=".startsWith(trimmed.slice(0, 11)) ||
        trimmed.startsWith("<parameter=") || "</function>".startsWith(trimmed.slice(0, 11));
      if (maybeTag && !final) return;
      const next = trimmed.indexOf("<", 1);
      if (next < 0 || final) {
        this.#buffer = "";
        return;
      }
      this.#buffer = trimmed.slice(next);
    }
  }

  /** Consumes value text up to the closing tag; false when more text is needed. */
  #streamParam(out: CallEvent[], final: boolean): boolean {
    const param = this.#param!;
    const at = this.#buffer.indexOf("</parameter>");
    if (at >= 0) {
      param.value += this.#buffer.slice(0, at);
      this.#buffer = this.#buffer.slice(at + "</parameter>".length);
      this.#finishParam(out, true);
      return true;
    }
    if (final) return false;
    // Keep back what may be the start of "\n</parameter>".
    let keep = 0;
    for (let k = Math.min(VALUE_END.length, this.#buffer.length); k > 0; k--) {
      if (VALUE_END.startsWith(this.#buffer.slice(-k))) {
        keep = k;
        break;
      }
    }
    param.value += this.#buffer.slice(0, this.#buffer.length - keep);
    this.#buffer = this.#buffer.slice(this.#buffer.length - keep);
    if (param.raw && param.value.length > param.sent) {
      out.push({ type: "arguments", text: JSON.stringify(param.value.slice(param.sent)).slice(1, -1) });
      param.sent = param.value.length;
    }
    return false;
  }

  #finishParam(out: CallEvent[], complete: boolean) {
    const param = this.#param!;
    this.#param = undefined;
    let value = param.value;
    if (complete && value.endsWith("\n")) value = value.slice(0, -1);
    if (param.raw) {
      const rest = value.slice(param.sent);
      out.push({ type: "arguments", text: `${JSON.stringify(rest).slice(1, -1)}"` });
      return;
    }
    out.push({ type: "arguments", text: jsonValue(value) });
  }
}

/** A non-string parameter's text as JSON: kept when it parses, else quoted as a string. */
function jsonValue(text: string): string {
  const t = text.trim();
  try {
    JSON.parse(t);
    return t.replace(/"(?:[^"\\]|\\.)*"|\s+/g, (m) => (m.startsWith('"') ? m : ""));
  } catch {
    return JSON.stringify(text);
  }
}
