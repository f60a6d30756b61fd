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
