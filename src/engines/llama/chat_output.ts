/**
 * A choice's output: its sampled tokens become {@link ChatEvent}s (content, reasoning and tool calls
 * through the output parser, stop sequences, log-probabilities, the finish reason).
 */
import type { ChatEvent, ChatJob, FinishReason, TokenLogprobInfo } from "../types.ts";
import type { TokenLogprob } from "./sampler.ts";
import type { ToolDialect } from "./dialects/index.ts";
import { OutputParser, type OutputPiece } from "./output_parser.ts";
import { StopMatcher } from "./stop_strings.ts";
import type { EventQueue } from "./event_queue.ts";

/** What a choice's output needs of its model (the chat engine is one). */
export interface ChoiceModel {
  /** The tool-call dialect its output is parsed in. */
  readonly dialect: ToolDialect;
  /** The bytes of a generated token. */
  piece(token: number): Uint8Array;
  /** The text and bytes of a token (for log-probabilities). */
  tokenInfo(token: number): { token: string; bytes: number[] };
}

/**
 * Turns one choice's tokens into events: text, stop sequences, reasoning, tool calls.
 *
 * @example
 * ```ts
 * import type { ChatEvent, ChatJob } from "../types.ts";
 * import { EventQueue } from "./event_queue.ts";
 * function firstChoice(model: ChoiceModel, job: ChatJob, tokens: number[]): EventQueue<ChatEvent> {
 *   const queue = new EventQueue<ChatEvent>();
 *   const output = new ChoiceOutput(0, model, job, false, queue);
 *   for (const token of tokens) if (!output.token(token)) break; // false: a stop sequence ended it
 *   output.end("eog"); // pushes the choice's end event with its finish reason
 *   return queue;
 * }
 * ```
 */
export class ChoiceOutput {
  readonly #decoder = new TextDecoder();
  readonly #stops: StopMatcher;
  readonly #parser: OutputParser;
  readonly #ids: string[] = [];
  #tokens = 0;
  #reasoningTokens = 0;
  #ended = false;
  /** The stop sequence that ended the choice. */
  #stopSequence?: string;
  #pendingLogprobs: TokenLogprobInfo[] = [];

  constructor(
    readonly index: number,
    readonly engine: ChoiceModel,
    readonly job: ChatJob,
    inThink: boolean,
    readonly queue: EventQueue<ChatEvent>,
    readonly raw = false,
  ) {
    this.#stops = new StopMatcher(job.stop);
    this.#parser = new OutputParser(engine.dialect, job.toolChoice === "none" ? [] : job.tools, inThink);
  }

  /** A generated token; false when a stop sequence ended the choice. */
  token(token: number, logprob?: TokenLogprob): boolean {
    this.#tokens++;
    const wasReasoning = this.#parserMode() === "reasoning";
    if (wasReasoning) this.#reasoningTokens++;
    if (logprob) this.#pendingLogprobs.push(this.#logprobInfo(logprob));
    const text = this.#decoder.decode(this.engine.piece(token), { stream: true });
    const { text: safe, stopped, matched } = this.#stops.push(text);
    if (matched !== undefined) this.#stopSequence = matched;
    this.#parse(safe);
    return !stopped;
  }

  end(cause: "eog" | "length" | "stop") {
    if (this.#ended) return;
    this.#ended = true;
    if (cause !== "stop") this.#parse(this.#decoder.decode() + this.#stops.flush());
    if (!this.raw) this.#forward(this.#parser.end());
    this.#flushLogprobs();
    const finishReason: FinishReason = cause === "length"
      ? "length"
      : this.#parser.calls > 0
      ? "tool_calls"
      : "stop";
    this.queue.push({
      type: "end",
      choice: this.index,
      finishReason,
      completionTokens: this.#tokens,
      reasoningTokens: this.#reasoningTokens,
      ...(cause === "stop" && this.#stopSequence !== undefined ? { stopSequence: this.#stopSequence } : {}),
    });
  }

  #parserMode(): "content" | "reasoning" | "tool" {
    const mode = this.#parser.mode;
    return mode === "call" ? "tool" : mode;
  }

  #parse(text: string) {
    if (!text) return;
    // Raw completions are plain text: no reasoning or tool-call markup is interpreted.
    if (this.raw) this.#forward([{ type: "content", text }]);
    else this.#forward(this.#parser.push(text));
  }

  #forward(pieces: OutputPiece[]) {
    for (const p of pieces) {
      switch (p.type) {
        case "content":
          this.queue.push({ type: "content", choice: this.index, text: p.text });
          break;
        case "reasoning":
          this.queue.push({ type: "reasoning", choice: this.index, text: p.text });
          break;
        case "call_start": {
          const id = `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
          this.#ids[p.index] = id;
          this.queue.push({ type: "tool_call_start", choice: this.index, index: p.index, id, name: p.name });
          break;
        }
        case "call_arguments":
          this.queue.push({ type: "tool_call_arguments", choice: this.index, index: p.index, text: p.text });
          break;
        case "call_end":
          break;
      }
    }
    this.#flushLogprobs();
  }

  #flushLogprobs() {
    if (this.#pendingLogprobs.length === 0) return;
    this.queue.push({
      type: "logprobs",
      choice: this.index,
      channel: this.#parserMode(),
      entries: this.#pendingLogprobs,
    });
    this.#pendingLogprobs = [];
  }

  #logprobInfo(lp: TokenLogprob): TokenLogprobInfo {
    return {
      ...this.engine.tokenInfo(lp.token),
      logprob: lp.logprob,
      top: lp.top.map((t) => ({ ...this.engine.tokenInfo(t.token), logprob: t.logprob })),
    };
  }
}
