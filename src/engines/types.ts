/**
 * What the HTTP side needs from an inference backend. Engines never see HTTP or OpenAI JSON;
 * services never see node-llama-cpp or onnxruntime types.
 */
import type { ApiErrorType } from "../protocol/ops.ts";
import type { PromptLogprobs } from "./prompt_logprobs.ts";

/** A loaded embedding model. */
export interface EmbeddingEngine {
  /** Length of the pooled vector. */
  readonly nativeDims: number;
  /** Number of token ids the tokenizer knows; ids at or above it are invalid. */
  readonly vocabSize: number;
  /**
   * The exact token sequence the model will process for `text` (special tokens included). With
   * `limit`, the work may stop once the text is known to hold more than `limit` tokens: the answer
   * then holds more than `limit` ids, not all of them.
   */
  tokenize(text: string, limit?: number): Promise<number[]>;
  /**
   * `tokenize` of many texts at once, where that is cheaper than one at a time (a tokenizer on
   * another thread: one round trip).
   */
  tokenizeMany?(texts: readonly string[], limit?: number): Promise<number[][]>;
  /** Completes client-given token ids the way `tokenize` would (e.g. appends EOS). */
  completeTokens(ids: readonly number[]): number[];
  /** The text of token ids (for /detokenize), when the engine can say; long lists off the event loop. */
  detokenize?(ids: readonly number[], signal?: AbortSignal): Promise<string>;
  /** Engine counters for /metrics (tokens evaluated, decodes, …). */
  counters?(): Record<string, number>;
  /** An engine that forwards to remote servers: each one's state. */
  upstreams?(): UpstreamStatus[];
  /** Pooled vectors (not yet normalised), one per sequence, in order. */
  embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]>;
  /**
   * An engine that reads the entries itself (a remote server, whose tokenizer is its own): the
   * service passes them as given, with no tokenization or token limits of its own. Vectors are
   * the native ones (not yet truncated or normalised); `nativeDims` is 0 until the first is seen.
   */
  embedEntries?(
    entries: readonly (string | readonly number[])[],
    opts: { truncate: boolean; signal?: AbortSignal; requestId?: string },
  ): Promise<{ vectors: Float32Array[]; promptTokens: number }>;
  /** Frees native memory. */
  dispose(): Promise<void>;
}

/** A message as the chat engine receives it: roles and plain text, no wire details. */
export type EngineMessage =
  | { role: "system" | "user"; text: string }
  | { role: "assistant"; text: string; reasoning?: string; toolCalls: EngineHistoryCall[] }
  | { role: "tool"; text: string; toolCallId: string; toolName?: string };

/** A function call in the history: arguments as an object, as chat templates iterate them. */
export interface EngineHistoryCall {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
}

/** A function the model may call. */
export interface EngineTool {
  name: string;
  description?: string;
  /** JSON schema of the arguments object. */
  parameters?: Record<string, unknown>;
  /** OpenAI `strict`: calls must follow the schema, also under `tool_choice: auto`. */
  strict?: boolean;
}

/** What constrains the output. */
export type OutputConstraint =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; schema: Record<string, unknown> };

/** Sampling settings; absent fields take the engine's defaults. */
export interface SamplingOptions {
  temperature?: number;
  topP?: number;
  topK?: number;
  minP?: number;
  seed?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  repeatPenalty?: number;
  /** Token id → logit bias (-100 = never). */
  logitBias?: Record<number, number>;
}

/** One generation request. */
export interface ChatJob {
  messages: EngineMessage[];
  tools: EngineTool[];
  /** `none`, `auto`, `required`, or the one function that must be called. */
  toolChoice: "none" | "auto" | "required" | { name: string };
  parallelToolCalls: boolean;
  output: OutputConstraint;
  sampling: SamplingOptions;
  maxTokens?: number;
  stop: string[];
  /** The template's thinking switch; undefined: the model's default. */
  enableThinking?: boolean;
  /** Choices to generate from the one prompt. */
  n: number;
  /** Log-probabilities: how many alternatives per token (undefined: none). */
  logprobs?: number;
  /** False: do not reuse a cached prompt prefix (llama-server's `cache_prompt`). */
  cachePrompt?: boolean;
  /**
   * A raw prompt (legacy completions): these tokens instead of the chat template, and the output is
   * plain text (no reasoning or tool-call parsing).
   */
  rawPrompt?: number[];
  /** Report the log-probability of every prompt token after the first (legacy `echo` + `logprobs`). */
  promptLogprobs?: boolean;
  /**
   * The client reads the output as it is generated (`stream: true`). When false nothing reaches the
   * client before the end, so an engine forwarding to remote servers may retry a failure anywhere.
   */
  streamed?: boolean;
  /** The request id, for engines that pass it on to other servers and name it in their logs. */
  requestId?: string;
}

/** A token's log-probability as clients see it. */
export interface TokenLogprobInfo {
  token: string;
  bytes: number[];
  logprob: number;
  top: { token: string; bytes: number[]; logprob: number }[];
}

/** Why a choice ended. */
export type FinishReason = "stop" | "length" | "tool_calls";

/**
 * What a generation yields, in order: `prompt` once, then `first_token`, then per choice its
 * text, reasoning and calls, each choice ending with `end`.
 */
export type ChatEvent =
  | {
    type: "prompt";
    promptTokens: number;
    cachedTokens: number;
    /** The serving engine's own `system_fingerprint` (a remote server's), when it gave one. */
    systemFingerprint?: string;
    /**
     * `performance.now()` when the engine began the job, before the prompt was processed: a local
     * engine when the job got its sequences, a remote one when it sent the request. The end of the
     * request's queue wait.
     */
    startedAt?: number;
  }
  /**
   * Log-probabilities of the prompt's tokens 2…n given what precedes them (`promptLogprobs`), as
   * numbers: token texts are the engine's `tokenText`.
   */
  | { type: "prompt_logprobs"; logprobs: PromptLogprobs }
  /** The first token was generated (visible text may come later, or never). */
  | { type: "first_token" }
  | { type: "content"; choice: number; text: string }
  | { type: "reasoning"; choice: number; text: string }
  /** Log-probabilities of generated tokens, in order, with the part of the output they went to. */
  | {
    type: "logprobs";
    choice: number;
    channel: "content" | "reasoning" | "tool";
    entries: TokenLogprobInfo[];
  }
  | { type: "tool_call_start"; choice: number; index: number; id: string; name: string }
  | { type: "tool_call_arguments"; choice: number; index: number; text: string }
  | {
    type: "end";
    choice: number;
    finishReason: FinishReason;
    completionTokens: number;
    reasoningTokens: number;
    /** The `stop` sequence that ended the choice (absent: it ended otherwise, or the engine cannot tell). */
    stopSequence?: string;
  }
  /**
   * The final counts, from an engine that learns them only at the end (a remote server's usage):
   * they replace what `prompt` and the `end` events said.
   */
  | {
    type: "usage";
    promptTokens: number;
    cachedTokens: number;
    completionTokens: number;
    reasoningTokens: number;
  };

/** A loaded chat model. */
export interface ChatEngine {
  /** Context window of one sequence in tokens (prompt + completion). */
  readonly contextSize: number;
  /** Most choices (n) one request may ask for. */
  readonly maxChoices: number;
  /** Engine counters for /metrics (tokens evaluated, reused, generated, decodes, …). */
  counters?(): Record<string, number>;
  /** An engine that forwards to remote servers: each one's state. */
  upstreams?(): UpstreamStatus[];
  /** Runs one job; stops and frees its sequences when `signal` aborts or the iterator is returned. */
  generate(job: ChatJob, signal: AbortSignal): AsyncIterable<ChatEvent>;
  /**
   * Token ids of `text`; `special`: parse special-token text (chat markup) into special tokens
   * (only for text that is the client's own template: legacy completions, `/tokenize` of text).
   * Long texts are tokenized without holding the event loop; `signal` ends the work early.
   */
  tokenize(text: string, special: boolean, signal?: AbortSignal): Promise<number[]>;
  /** The text of `tokens` (special tokens included); long lists without holding the event loop. */
  detokenize(tokens: readonly number[], signal?: AbortSignal): Promise<string>;
  /**
   * The prompt the chat template renders for these messages: its text, and its tokens, in which
   * only the template's own markup is special tokens (client text is tokenized as text).
   */
  prompt(
    job: Pick<ChatJob, "messages" | "tools" | "toolChoice" | "enableThinking">,
    signal?: AbortSignal,
  ): Promise<{ text: string; tokens: number[] }>;
  /** Number of token ids (ids at or above are invalid). */
  readonly vocabSize: number;
  /** Whether the vocabulary has fill-in-the-middle tokens (legacy completions' `suffix`). */
  readonly fim?: { prefix: number; suffix: number; middle: number };
  /** Text of a token (for log-probabilities of given tokens). */
  tokenText(token: number): { token: string; bytes: number[] };
  /** Frees native memory. */
  dispose(): Promise<void>;
}

/** One remote server behind an engine, as /health, /v1/models and readiness report it. */
export interface UpstreamStatus {
  /** The configured label (never the URL). */
  name: string;
  /** `unknown` until first checked; `unhealthy`: its health check fails; `ejected`: too many failures. */
  state: "unknown" | "healthy" | "unhealthy" | "ejected";
  /** Whether new requests may go to it. */
  routable: boolean;
  /** Requests sent to it and not yet finished. */
  inFlight: number;
  /** Failed requests in a row. */
  failures: number;
}

/** A request the engine cannot serve as asked (e.g. too long, or a schema it cannot enforce). */
export class EngineInputError extends Error {
  override name = "EngineInputError";
  constructor(message: string, readonly param: string | null, readonly code: string | null = null) {
    super(message);
  }
}

/**
 * What a remote engine (a fleet of OpenAI-compatible servers) tells the client when it refuses or
 * fails a request: the status, error type, param, code and headers (e.g. `retry-after`) that
 * services pass on as the API error, never naming the upstream.
 *
 * @example
 * ```ts
 * function timedOut(): never {
 *   throw new EngineUpstreamError("The engine serving 'm' did not answer in time.", 504, "timeout_error", null, "upstream_timeout");
 * }
 * ```
 */
export class EngineUpstreamError extends Error {
  override name = "EngineUpstreamError";
  constructor(
    message: string,
    readonly status: number,
    readonly type: ApiErrorType,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}
