/**
 * A chat model served by remote OpenAI-compatible servers, behind the same engine interface as a
 * local one: the job goes out as a streamed chat request, and the upstream's chunks come back as
 * engine events, so the chat service applies its own rules to them (one id, our model id, role
 * first, reasoning under both names, usage, `[DONE]`, error events, schema checks).
 */
import type { Logger } from "../../log.ts";
import type {
  ChatEngine,
  ChatEvent,
  ChatJob,
  EngineMessage,
  FinishReason,
  TokenLogprobInfo,
  UpstreamStatus,
} from "../types.ts";
import { EngineUpstreamError } from "../types.ts";
import { affinityKey, type Upstream, type UpstreamPool } from "./pool.ts";
import { type Outcome, UpstreamFailure } from "./failure.ts";
import { post, statusFailure } from "./wire.ts";

/**
 * The chat engine of a model whose `backend` is `openai`.
 *
 * @example
 * ```ts
 * import type { UpstreamPool } from "./pool.ts";
 * import type { ChatJob } from "../types.ts";
 * import type { Logger } from "../../log.ts";
 * async function relay(pool: UpstreamPool, job: ChatJob, log: Logger, signal: AbortSignal) {
 *   const engine = new UpstreamChatEngine(pool, { log, contextSize: 32768 });
 *   for await (const ev of engine.generate(job, signal)) console.log(ev);
 * }
 * ```
 */
export class UpstreamChatEngine implements ChatEngine {
  readonly contextSize: number;
  readonly maxChoices = 128;
  readonly vocabSize = 0;
  readonly #log: Logger;

  constructor(readonly pool: UpstreamPool, opts: { log: Logger; contextSize?: number }) {
    this.#log = opts.log;
    this.contextSize = opts.contextSize ?? 0;
  }

  upstreams(): UpstreamStatus[] {
    return this.pool.statuses();
  }

  async *generate(job: ChatJob, signal: AbortSignal): AsyncGenerator<ChatEvent> {
    // Legacy completions are relayed whole (see `completions.ts`): a raw token prompt cannot be sent.
    if (job.rawPrompt || job.promptLogprobs) throw unsupported(this.pool.model, "a raw token prompt");
    const model = this.pool.model;
    const routing = this.pool.routing;
    const body = upstreamRequest(job);
    const affinity = affinityKey(affinityText(job, routing.affinityPrefixChars), routing.affinityPrefixChars);
    const opts = { signal, affinity, requestId: job.requestId };
    let startedAt: number | undefined;
    /** Sends the request and reads the answer's first event (its failures are the attempt's). */
    const open = async (u: Upstream, sig: AbortSignal) => {
      startedAt ??= performance.now();
      const ex = await post(u, "/chat/completions", { ...body, model: u.model }, {
        signal: sig,
        routing,
        model,
        requestId: job.requestId,
      });
      const data = ex.events();
      const reader = new ChunkReader(u, model);
      try {
        const first = await data.next();
        if (first.done) throw UpstreamFailure.broken("the answer was an empty stream");
        const done = first.value.trim() === "[DONE]";
        // An error event first is the request's answer (retried or refused like a status).
        const events = done ? [] : [...reader.events(first.value)];
        return { data, reader, events, done, upstream: u };
      } catch (e) {
        await data.return(undefined).catch(() => {});
        throw e;
      }
    };
    const prompt = (reader: ChunkReader): ChatEvent => ({
      type: "prompt",
      promptTokens: 0,
      cachedTokens: 0,
      ...(reader.fingerprint ? { systemFingerprint: reader.fingerprint } : {}),
      ...(startedAt !== undefined ? { startedAt } : {}),
    });

    if (job.streamed === false) {
      // Nothing reaches the client before the end: a failure anywhere is retried like one before the first byte.
      let events: ChatEvent[];
      let reader: ChunkReader;
      let lease;
      try {
        ({ value: { events, reader }, lease } = await this.pool.dispatch(opts, async (u, sig, firstByte) => {
          const s = await open(u, sig);
          firstByte();
          if (!s.done) s.events.push(...await readAll(s.data, s.reader));
          else s.events.push(...s.reader.finish());
          return s;
        }));
      } catch (e) {
        throw this.#clientError(e, signal);
      }
      lease.end("ok");
      yield prompt(reader);
      // The first token came long before this moment: no time-to-first-token observation rather than a
      // wrong one (vserve_upstream_first_byte_seconds has it).
      yield* events.filter((e) => e.type !== "first_token");
      return;
    }

    let stream;
    let lease;
    try {
      ({ value: stream, lease } = await this.pool.dispatch(opts, open));
    } catch (e) {
      throw this.#clientError(e, signal);
    }
    let outcome: Outcome = "cancelled";
    let reason: string | undefined;
    const { reader, data } = stream;
    try {
      yield prompt(reader);
      yield* stream.events;
      let done = stream.done;
      while (!done) {
        const r = await data.next();
        if (r.done) throw UpstreamFailure.broken("the stream ended without [DONE]");
        done = r.value.trim() === "[DONE]";
        if (!done) yield* reader.events(r.value);
      }
      yield* reader.finish();
      outcome = "ok";
    } catch (e) {
      if (signal.aborted) throw e;
      const f = e instanceof UpstreamFailure ? e : UpstreamFailure.broken(`the stream broke: ${e}`);
      outcome = f.outcome;
      reason = f.message;
      this.#log.error("upstream stream failed after its first byte", {
        request_id: job.requestId,
        model,
        upstream: stream.upstream.name,
        url: stream.upstream.base,
        reason,
      });
      throw f.toEngineError(model);
    } finally {
      await data.return(undefined).catch(() => {});
      lease.end(outcome, reason);
    }
  }

  /** The error for a request that never got an answer: the client's abort as is, else ours. */
  #clientError(e: unknown, signal: AbortSignal): unknown {
    if (signal.aborted) return e;
    if (e instanceof UpstreamFailure) return e.toEngineError(this.pool.model);
    return e;
  }

  tokenize(): Promise<number[]> {
    return Promise.reject(unsupported(this.pool.model, "/tokenize"));
  }

  detokenize(): Promise<string> {
    return Promise.reject(unsupported(this.pool.model, "/detokenize"));
  }

  prompt(): Promise<{ text: string; tokens: number[] }> {
    return Promise.reject(unsupported(this.pool.model, "/tokenize"));
  }

  tokenText(): { token: string; bytes: number[] } {
    throw unsupported(this.pool.model, "log-probabilities of given tokens");
  }

  dispose(): Promise<void> {
    this.pool.dispose();
    return Promise.resolve();
  }
}

/** 400 for what a model served by upstreams does not offer (its tokenizer is theirs). */
export function unsupported(model: string, what: string): EngineUpstreamError {
  return new EngineUpstreamError(
    `The model '${model}' is served by remote engines: ${what} is not available for it.`,
    400,
    "invalid_request_error",
    "model",
    "unsupported_for_upstream_model",
  );
}

/** Reads the rest of a stream up to `[DONE]` (for a request whose client waits for the whole answer). */
async function readAll(data: AsyncGenerator<string>, reader: ChunkReader): Promise<ChatEvent[]> {
  const out: ChatEvent[] = [];
  try {
    for (let r = await data.next(); !r.done; r = await data.next()) {
      if (r.value.trim() === "[DONE]") {
        out.push(...reader.finish());
        return out;
      }
      out.push(...reader.events(r.value));
    }
  } finally {
    await data.return(undefined).catch(() => {});
  }
  throw UpstreamFailure.broken("the stream ended without [DONE]");
}

interface WireLogprob {
  token?: string;
  logprob?: number;
  bytes?: number[] | null;
  top_logprobs?: WireLogprob[];
}

interface WireChunk {
  choices?: {
    index?: number;
    delta?: {
      content?: string | null;
      reasoning_content?: string | null;
      reasoning?: string | null;
      tool_calls?: {
        index?: number;
        id?: string;
        function?: { name?: string; arguments?: string };
      }[];
    };
    logprobs?: { content?: WireLogprob[] | null } | null;
    finish_reason?: string | null;
    /** vLLM: the stop string (or token id) that ended the choice. */
    stop_reason?: string | number | null;
  }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    prompt_tokens_details?: { cached_tokens?: number } | null;
    completion_tokens_details?: { reasoning_tokens?: number } | null;
  } | null;
  system_fingerprint?: string | null;
  error?: unknown;
  object?: string;
  message?: string;
  code?: unknown;
}

const encoder = new TextEncoder();

/** Turns one stream's chunks into engine events, remembering what it saw across chunks. */
class ChunkReader {
  #first = false;
  readonly #calls = new Set<string>();
  #usage: WireChunk["usage"];
  /** The first `system_fingerprint` the upstream sent. */
  fingerprint?: string;

  constructor(readonly upstream: Upstream, readonly model: string) {}

  *events(data: string): Generator<ChatEvent> {
    let chunk: WireChunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      throw UpstreamFailure.broken(`a stream event is not JSON: ${data.slice(0, 200)}`, false);
    }
    if (chunk.error !== undefined || chunk.object === "error") {
      const e = (typeof chunk.error === "object" && chunk.error) ? chunk.error as { code?: unknown } : chunk;
      const status = typeof e.code === "number" && e.code >= 400 && e.code < 600 ? e.code : 500;
      throw statusFailure(status, data, undefined, this.upstream, this.model);
    }
    if (this.fingerprint === undefined && typeof chunk.system_fingerprint === "string") {
      this.fingerprint = chunk.system_fingerprint.slice(0, 256);
    }
    for (const c of chunk.choices ?? []) {
      const choice = c.index ?? 0;
      const d = c.delta ?? {};
      const reasoning = d.reasoning_content || d.reasoning;
      if (!this.#first && (d.content || reasoning || d.tool_calls?.length || c.finish_reason)) {
        this.#first = true;
        yield { type: "first_token" };
      }
      if (reasoning) yield { type: "reasoning", choice, text: reasoning };
      if (d.content) yield { type: "content", choice, text: d.content };
      if (c.logprobs?.content?.length) {
        yield { type: "logprobs", choice, channel: "content", entries: c.logprobs.content.map(logprobInfo) };
      }
      for (const t of d.tool_calls ?? []) {
        const index = t.index ?? 0;
        const key = `${choice}:${index}`;
        if (!this.#calls.has(key)) {
          this.#calls.add(key);
          yield {
            type: "tool_call_start",
            choice,
            index,
            id: t.id || `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
            name: t.function?.name ?? "",
          };
        }
        if (t.function?.arguments) {
          yield { type: "tool_call_arguments", choice, index, text: t.function.arguments };
        }
      }
      if (c.finish_reason) {
        yield {
          type: "end",
          choice,
          finishReason: finishReason(c.finish_reason),
          completionTokens: 0,
          reasoningTokens: 0,
          ...(c.finish_reason === "stop" && typeof c.stop_reason === "string"
            ? { stopSequence: c.stop_reason }
            : {}),
        };
      }
    }
    if (chunk.usage) this.#usage = chunk.usage;
  }

  /** After `[DONE]`: the upstream's usage, when it sent one. */
  *finish(): Generator<ChatEvent> {
    const u = this.#usage;
    if (!u) return;
    yield {
      type: "usage",
      promptTokens: u.prompt_tokens ?? 0,
      cachedTokens: u.prompt_tokens_details?.cached_tokens ?? 0,
      completionTokens: u.completion_tokens ?? 0,
      reasoningTokens: u.completion_tokens_details?.reasoning_tokens ?? 0,
    };
  }
}

function finishReason(reason: string): FinishReason {
  if (reason === "length" || reason === "tool_calls") return reason;
  if (reason === "function_call") return "tool_calls";
  return "stop";
}

function logprobInfo(e: WireLogprob): TokenLogprobInfo {
  const token = e.token ?? "";
  return {
    token,
    bytes: e.bytes ?? [...encoder.encode(token)],
    logprob: e.logprob ?? 0,
    top: (e.top_logprobs ?? []).map((t) => ({
      token: t.token ?? "",
      bytes: t.bytes ?? [...encoder.encode(t.token ?? "")],
      logprob: t.logprob ?? 0,
    })),
  };
}

/** The upstream request for a job (without `model`, which is per upstream): always streamed. */
export function upstreamRequest(job: ChatJob): Record<string, unknown> {
  const s = job.sampling;
  const body: Record<string, unknown> = {
    messages: job.messages.map(wireMessage),
    stream: true,
    stream_options: { include_usage: true },
  };
  const set = (key: string, value: unknown) => {
    if (value !== undefined) body[key] = value;
  };
  if (job.n !== 1) body.n = job.n;
  if (job.tools.length > 0) {
    body.tools = job.tools.map((t) => ({
      type: "function",
      function: {
        name: t.name,
        ...(t.description !== undefined ? { description: t.description } : {}),
        ...(t.parameters !== undefined ? { parameters: t.parameters } : {}),
        ...(t.strict !== undefined ? { strict: t.strict } : {}),
      },
    }));
    body.tool_choice = typeof job.toolChoice === "string"
      ? job.toolChoice
      : { type: "function", function: { name: job.toolChoice.name } };
    body.parallel_tool_calls = job.parallelToolCalls;
  }
  if (job.output.type === "json_object") body.response_format = { type: "json_object" };
  if (job.output.type === "json_schema") {
    body.response_format = {
      type: "json_schema",
      json_schema: { name: "response", schema: job.output.schema },
    };
  }
  set("temperature", s.temperature);
  set("top_p", s.topP);
  set("top_k", s.topK);
  set("min_p", s.minP);
  set("seed", s.seed);
  set("presence_penalty", s.presencePenalty);
  set("frequency_penalty", s.frequencyPenalty);
  // llama-server and vserve call it repeat_penalty, vLLM repetition_penalty; each ignores the other.
  set("repeat_penalty", s.repeatPenalty);
  set("repetition_penalty", s.repeatPenalty);
  if (s.logitBias) {
    body.logit_bias = Object.fromEntries(Object.entries(s.logitBias).map(([k, v]) => [String(k), v]));
  }
  set("max_tokens", job.maxTokens);
  if (job.stop.length > 0) body.stop = job.stop;
  if (job.enableThinking !== undefined) body.chat_template_kwargs = { enable_thinking: job.enableThinking };
  if (job.logprobs !== undefined) {
    body.logprobs = true;
    body.top_logprobs = job.logprobs;
  }
  set("cache_prompt", job.cachePrompt);
  return body;
}

function wireMessage(m: EngineMessage): Record<string, unknown> {
  switch (m.role) {
    case "system":
    case "user":
      return { role: m.role, content: m.text };
    case "assistant":
      return {
        role: "assistant",
        content: m.toolCalls.length > 0 && m.text === "" ? null : m.text,
        ...(m.toolCalls.length > 0
          ? {
            tool_calls: m.toolCalls.map((c) => ({
              id: c.id,
              type: "function",
              function: { name: c.name, arguments: JSON.stringify(c.arguments) },
            })),
          }
          : {}),
        ...(m.reasoning ? { reasoning_content: m.reasoning } : {}),
      };
    case "tool":
      return { role: "tool", tool_call_id: m.toolCallId, content: m.text };
  }
}

/**
 * The start of the conversation as the model would read it (tools, then each message), up to
 * `chars` characters: what prefix affinity hashes.
 */
export function affinityText(job: Pick<ChatJob, "messages" | "tools">, chars: number): string {
  if (chars <= 0) return "";
  let out = job.tools.length > 0 ? JSON.stringify(job.tools) + "\n" : "";
  for (const m of job.messages) {
    if (out.length >= chars) break;
    out += `<${m.role}>${m.text}`;
    if (m.role === "assistant") {
      out += (m.reasoning ?? "") + m.toolCalls.map((c) => `${c.name}${JSON.stringify(c.arguments)}`).join("");
    }
    out += "\n";
  }
  return out.slice(0, chars);
}
