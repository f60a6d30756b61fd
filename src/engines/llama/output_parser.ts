/**
 * Splits a chat model's streamed text into reasoning (`<think>…</think>`), content and tool
 * calls, whose inside the model's dialect parses. Tags split across chunks are held back until
 * they are complete.
 */
import type { EngineTool } from "../types.ts";
import type { CallEvent, CallParser, ToolDialect } from "./dialects/index.ts";
import { THINK_MARKERS } from "./template_facts.ts";

/** One piece of parsed output. */
export type OutputPiece =
  | { type: "content"; text: string }
  | { type: "reasoning"; text: string }
  | { type: "call_start"; index: number; name: string }
  | { type: "call_arguments"; index: number; text: string }
  /** `complete`: the call's closing tag was written (false: the output ended inside it). */
  | { type: "call_end"; index: number; complete: boolean };

const { open: THINK_OPEN, close: THINK_CLOSE } = THINK_MARKERS;

/**
 * A streaming parser: `push` chunks, then `end`.
 *
 * @example
 * ```ts
 * import { jsonDialect } from "./dialects/json.ts";
 * const p = new OutputParser(jsonDialect, [], false);
 * p.push("<think>hm</think>Hi"); // [{type:"reasoning",text:"hm"}, {type:"content",text:"Hi"}]
 * ```
 */
export class OutputParser {
  readonly #dialect: ToolDialect;
  readonly #tools: readonly EngineTool[];
  readonly #tags: string[];
  #mode: "content" | "reasoning" | "call";
  #held = "";
  #seenContent = false;
  /** Newlines here are layout (after </think>, between calls), not content. */
  #stripNewlines = true;
  #call: { parser: CallParser; raw: string; started: boolean; index: number } | undefined;
  #calls = 0;

  /**
   * `tools`: the offered tools (none: call tags are plain text); `startInReasoning`: the prompt
   * already opened a `<think>` block.
   */
  constructor(dialect: ToolDialect, tools: readonly EngineTool[], startInReasoning: boolean) {
    this.#dialect = dialect;
    this.#tools = tools;
    this.#mode = startInReasoning ? "reasoning" : "content";
    this.#tags = [THINK_OPEN, THINK_CLOSE, ...(tools.length > 0 ? [dialect.open, dialect.close] : [])];
  }

  /** Tool calls started so far. */
  get calls(): number {
    return this.#calls;
  }

  /** Where the next text goes: content, reasoning or a tool call. */
  get mode(): "content" | "reasoning" | "call" {
    return this.#mode;
  }

  push(chunk: string): OutputPiece[] {
    const out: OutputPiece[] = [];
    let text = this.#held + chunk;
    this.#held = "";
    while (text.length > 0) {
      const at = text.indexOf("<");
      if (at < 0) {
        this.#emit(out, text);
        break;
      }
      if (at > 0) this.#emit(out, text.slice(0, at));
      text = text.slice(at);
      const tag = this.#tags.find((t) => text.startsWith(t));
      if (tag) {
        this.#onTag(out, tag);
        text = text.slice(tag.length);
        continue;
      }
      if (this.#tags.some((t) => t.startsWith(text))) {
        this.#held = text; // maybe the start of a tag: wait for more
        break;
      }
      this.#emit(out, "<");
      text = text.slice(1);
    }
    return out;
  }

  /**
   * Flushes held text; a call the output ended inside is closed as incomplete, and a call tag it
   * ended inside is dropped (neither is ever shown as text).
   */
  end(): OutputPiece[] {
    const out: OutputPiece[] = [];
    const cutCallTag = this.#tools.length > 0 && this.#dialect.open.startsWith(this.#held);
    if (this.#held && !cutCallTag) this.#emit(out, this.#held);
    this.#held = "";
    if (this.#mode === "call") this.#closeCall(out, false);
    return out;
  }

  #emit(out: OutputPiece[], text: string) {
    if (!text) return;
    if (this.#mode === "call") {
      const call = this.#call!;
      call.raw += text;
      this.#forward(out, call.parser.push(text));
      return;
    }
    const type = this.#mode;
    if (type === "content") {
      // Templates put blank lines after </think> and between calls; they are not content.
      if (this.#stripNewlines) text = text.replace(/^\n+/, "");
      if (!text) return;
      this.#seenContent = true;
      this.#stripNewlines = false;
    }
    const last = out.at(-1);
    if (last && last.type === type) last.text += text;
    else out.push({ type, text });
  }

  #forward(out: OutputPiece[], events: CallEvent[]) {
    const call = this.#call!;
    for (const e of events) {
      if (e.type === "name") {
        call.started = true;
        out.push({ type: "call_start", index: call.index, name: e.name });
      } else if (call.started) {
        const last = out.at(-1);
        if (last?.type === "call_arguments" && last.index === call.index) last.text += e.text;
        else out.push({ type: "call_arguments", index: call.index, text: e.text });
      }
    }
  }

  #onTag(out: OutputPiece[], tag: string) {
    if (this.#mode === "call") {
      if (tag === this.#dialect.close) this.#closeCall(out, true);
      else this.#emit(out, tag);
      return;
    }
    if (tag === THINK_OPEN && !this.#seenContent && this.#mode === "content") this.#mode = "reasoning";
    else if (tag === THINK_CLOSE && this.#mode === "reasoning") {
      this.#mode = "content";
      this.#stripNewlines = true;
    } else if (tag === this.#dialect.open && this.#mode === "content") {
      this.#mode = "call";
      this.#call = { parser: this.#dialect.parser(this.#tools), raw: "", started: false, index: this.#calls };
    } else this.#emit(out, tag);
  }

  #closeCall(out: OutputPiece[], closed: boolean) {
    const call = this.#call!;
    this.#call = undefined;
    this.#mode = "content";
    const { events, result } = call.parser.end(closed);
    this.#call = call;
    this.#forward(out, events);
    this.#call = undefined;
    if (result.ok && call.started) {
      this.#calls++;
      out.push({ type: "call_end", index: call.index, complete: closed });
      this.#stripNewlines = true;
    } else if (closed) {
      this.#emit(out, `${this.#dialect.open}${call.raw}${this.#dialect.close}`);
    }
  }
}
