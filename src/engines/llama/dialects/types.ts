/**
 * A tool-call dialect: how one model family writes calls (its grammar), how they are read back
 * from streamed text (its parser), and how earlier calls are given to its chat template.
 */
import type { EngineTool } from "../../types.ts";
import type { JsonGrammar } from "../../../grammar/mod.ts";

/** What a call parser reports while the text of one call streams in. */
export type CallEvent =
  /** The function's name is known. */
  | { type: "name"; name: string }
  /** The next piece of the arguments' JSON text. */
  | { type: "arguments"; text: string };

/** The result of a finished call block. */
export type CallResult =
  | { ok: true; name: string }
  | { ok: false };

/** Parses the text between a call's opening and closing tags. */
export interface CallParser {
  push(text: string): CallEvent[];
  /** The block is complete (`closed`) or the output ended inside it. */
  end(closed: boolean): { events: CallEvent[]; result: CallResult };
}

/**
 * The GBNF of a call's opening and closing tags. Where the vocabulary has a tag as one token, the
 * grammar names that token (`<[151657]>`): only the token opens a call, as the model was trained to
 * write it, and a logit bias on it holds; the same text spelled in ordinary tokens is plain text.
 */
export interface CallTags {
  open: string;
  close: string;
}

/** One dialect. */
export interface ToolDialect {
  readonly name: "json" | "xml";
  /** The text that opens a call. */
  readonly open: string;
  /** The text that closes a call. */
  readonly close: string;
  /**
   * A GBNF rule matching one complete call of `tool`, opening and closing tags included, written as
   * `tags` gives them (the vocabulary's single tokens where it has them, else the text).
   */
  callRule(grammar: JsonGrammar, tool: EngineTool, param: string, hint: string, tags: CallTags): string;
  /** A parser for the text inside one call. */
  parser(tools: readonly EngineTool[]): CallParser;
}

/**
 * Removes whitespace outside strings from streamed JSON text, keeping state across pieces.
 *
 * @example
 * ```ts
 * const c = new JsonCompactor();
 * c.push('{ "a": "x y",') + c.push(' "b": 1 }'); // '{"a":"x y","b":1}'
 * ```
 */
export class JsonCompactor {
  #inString = false;
  #escaped = false;

  push(text: string): string {
    let out = "";
    for (const ch of text) {
      if (this.#inString) {
        out += ch;
        if (this.#escaped) this.#escaped = false;
        else if (ch === "\\") this.#escaped = true;
        else if (ch === '"') this.#inString = false;
      } else if (ch === '"') {
        this.#inString = true;
        out += ch;
      } else if (ch !== " " && ch !== "\n" && ch !== "\t" && ch !== "\r") out += ch;
    }
    return out;
  }
}

/**
 * True when every value `schema` allows is a string (the XML dialect then writes it raw); local
 * `$ref`s are followed through `root` (the tool's parameter schema, where pydantic puts `$defs`).
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

/** The target of a local `$ref` (`#/$defs/X`, `#/definitions/X`, any JSON pointer) in `root`. */
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

/** The schema of parameter `key` of `tool`, if declared. */
export function parameterSchema(tool: EngineTool | undefined, key: string): unknown {
  const props = (tool?.parameters as { properties?: Record<string, unknown> } | undefined)?.properties;
  return props && typeof props === "object" ? props[key] : undefined;
}
