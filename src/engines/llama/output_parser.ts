/**
 * Splits streamed model text of Qwen-style chat models into reasoning (`<think>…</think>`),
 * content and tool calls (`<tool_call>{"name", "arguments"}</tool_call>`), holding back a
 * partial tag at a chunk's end so that tags split across chunks are still recognised.
 */

/** One piece of parsed output. */
export type ParsedPiece =
  | { type: "content"; text: string }
  | { type: "reasoning"; text: string }
  | { type: "tool_call"; name: string; arguments: string }
  | { type: "invalid_tool_call"; raw: string };

const TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"] as const;

/**
 * A streaming parser: `push` chunks, then `end`.
 *
 * @example
 * ```ts
 * const p = new QwenOutputParser(false);
 * p.push("<think>hm</think>Hi"); // [{type:"reasoning",text:"hm"}, {type:"content",text:"Hi"}]
 * ```
 */
export class QwenOutputParser {
  #mode: "content" | "reasoning" | "tool_call";
  #held = "";
  #call = "";
  #seenContent = false;

  /** `startInReasoning`: the prompt already opened a `<think>` block. */
  constructor(startInReasoning: boolean) {
    this.#mode = startInReasoning ? "reasoning" : "content";
  }

  /** Parses a chunk; returns the pieces that are complete. */
  push(chunk: string): ParsedPiece[] {
    const out: ParsedPiece[] = [];
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
      const tag = TAGS.find((t) => text.startsWith(t));
      if (tag) {
        this.#onTag(out, tag);
        text = text.slice(tag.length);
        continue;
      }
      if (TAGS.some((t) => t.startsWith(text))) {
        this.#held = text; // maybe the start of a tag: wait for more
        break;
      }
      this.#emit(out, "<");
      text = text.slice(1);
    }
    return out;
  }

  /** Flushes what is held; an unterminated tool call is reported as invalid. */
  end(): ParsedPiece[] {
    const out: ParsedPiece[] = [];
    if (this.#held) this.#emit(out, this.#held);
    this.#held = "";
    if (this.#mode === "tool_call") out.push({ type: "invalid_tool_call", raw: `<tool_call>${this.#call}` });
    return out;
  }

  #emit(out: ParsedPiece[], text: string) {
    if (!text) return;
    if (this.#mode === "tool_call") {
      this.#call += text;
      return;
    }
    const type = this.#mode;
    if (type === "content") {
      // Templates put blank lines after </think>; they are not content.
      if (!this.#seenContent) text = text.replace(/^\n+/, "");
      if (!text) return;
      this.#seenContent = true;
    }
    const last = out.at(-1);
    if (last && last.type === type) last.text += text;
    else out.push({ type, text });
  }

  #onTag(out: ParsedPiece[], tag: (typeof TAGS)[number]) {
    if (this.#mode === "tool_call") {
      if (tag === "</tool_call>") {
        out.push(parseCall(this.#call));
        this.#call = "";
        this.#mode = "content";
      } else this.#call += tag;
      return;
    }
    if (tag === "<think>" && !this.#seenContent) this.#mode = "reasoning";
    else if (tag === "</think>" && this.#mode === "reasoning") this.#mode = "content";
    else if (tag === "<tool_call>" && this.#mode === "content") this.#mode = "tool_call";
    else this.#emit(out, tag);
  }
}

function parseCall(raw: string): ParsedPiece {
  try {
    const v = JSON.parse(raw.trim());
    if (typeof v?.name === "string" && v.arguments !== undefined) {
      if (typeof v.arguments === "string") return { type: "tool_call", name: v.name, arguments: v.arguments };
      return { type: "tool_call", name: v.name, arguments: rawArguments(raw) ?? JSON.stringify(v.arguments) };
    }
  } catch { /* falls through */ }
  return { type: "invalid_tool_call", raw: `<tool_call>${raw}</tool_call>` };
}

/** The model's own text of `"arguments"` when it is the last key (Qwen's format), else undefined. */
function rawArguments(raw: string): string | undefined {
  const m = raw.match(/"arguments"\s*:\s*([\s\S]*)\}\s*$/);
  if (!m) return undefined;
  const text = m[1].trim();
  try {
    JSON.parse(text);
    return compactJson(text);
  } catch {
    return undefined;
  }
}

/** Removes insignificant whitespace from valid JSON text without reinterpreting its numbers. */
function compactJson(text: string): string {
  return text.replace(/"(?:[^"\\]|\\.)*"|\s+/g, (m) => (m.startsWith('"') ? m : ""));
}
