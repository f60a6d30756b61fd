/**
 * `POST /v1/completions` for a model served by upstreams: relayed to the upstream's own
 * `/completions`, which vLLM, llama-server and vserve all serve. A raw prompt, token-id prompts,
 * `echo`, legacy `logprobs` and `suffix` all depend on the tokenizer, which is the upstream's, so
 * the gateway checks the request against its own schema and limits, passes it on, and gives the
 * answer back under one `cmpl-` id of its own and the client's model id (with the upstream's
 * `system_fingerprint`). The upstream is always asked to stream, with usage: retries before the
 * first byte, the first-byte and idle limits work as for chat, and a non-streamed answer is
 * assembled here from the chunks.
 */
import type { Logger } from "../../log.ts";
import type { Completion, CompletionLogprobs, CompletionRequest } from "../../protocol/completions.ts";
import type { CompletionUsage } from "../../protocol/common.ts";
import { EngineInputError, EngineUpstreamError } from "../types.ts";
import { type Outcome, UpstreamFailure } from "./failure.ts";
import { affinityKey, type Lease, type Upstream, type UpstreamPool } from "./pool.ts";
import { post, statusFailure } from "./wire.ts";

/** What the relay needs from the server for one request. */
export interface RelayContext {
  created: number;
  signal: AbortSignal;
  log: Logger;
  requestId: string;
  /** The request was sent upstream at `startedAt` (`performance.now()`): the end of its queue wait. */
  onStarted?: (startedAt?: number) => void;
  onUsage?: (usage: CompletionUsage) => void;
}

type Choice = Completion["choices"][number];

/** A relayed completion: the whole of it, or its chunks (a failure after the first byte is thrown by them). */
export type RelayedCompletion =
  | { kind: "completion"; completion: Completion }
  | { kind: "stream"; chunks: AsyncGenerator<Completion> };

interface WireCompletionChunk {
  choices?: {
    text?: string | null;
    index?: number;
    logprobs?: CompletionLogprobs | null;
    finish_reason?: string | null;
  }[];
  usage?: CompletionUsage | null;
  system_fingerprint?: string | null;
  error?: unknown;
  object?: string;
  code?: unknown;
}

/**
 * Answers one legacy completions request through the model's upstreams: the completion, or (with
 * `stream`) its `text_completion` chunks. What the client is told is thrown as an engine error
 * (`EngineInputError`, `EngineUpstreamError`); the client's abort and unexpected errors as they are.
 *
 * @example
 * ```ts
 * import { poolOf } from "./load.ts";
 * import type { CompletionRequest } from "../../protocol/completions.ts";
 * async function answer(body: CompletionRequest, engine: unknown, ctx: RelayContext) {
 *   const pool = poolOf(engine);
 *   if (pool) return await relayCompletion(body, pool, ctx);
 * }
 * ```
 */
export async function relayCompletion(
  req: CompletionRequest,
  pool: UpstreamPool,
  ctx: RelayContext,
): Promise<RelayedCompletion> {
  checkRequest(req);
  const model = pool.model;
  const routing = pool.routing;
  const id = `cmpl-${crypto.randomUUID().replaceAll("-", "")}`;
  const { model: _, stream: __, stream_options: ___, ...rest } = req;
  const body: Record<string, unknown> = { ...rest, stream: true, stream_options: { include_usage: true } };
  // llama-server and vserve call it repeat_penalty, vLLM repetition_penalty; each ignores the other.
  if (req.repeat_penalty != null) body.repetition_penalty = req.repeat_penalty;
  // Prompts sharing a long start (few-shot examples, a file's head) go where that prefix is cached.
  const first = typeof req.prompt === "string"
    ? req.prompt
    : typeof req.prompt[0] === "string"
    ? req.prompt[0]
    : "";
  const affinity = affinityKey(first, routing.affinityPrefixChars);
  const abort = new AbortController();
  const signal = AbortSignal.any([ctx.signal, abort.signal]);
  const clientError = (e: unknown) => {
    if (signal.aborted) return e;
    if (e instanceof UpstreamFailure) return e.toEngineError(model);
    return e;
  };
  let startedAt: number | undefined;
  const open = async (u: Upstream, sig: AbortSignal) => {
    startedAt ??= performance.now();
    let ex;
    try {
      ex = await post(u, "/completions", { ...body, model: u.model }, {
        signal: sig,
        routing,
        model,
        requestId: ctx.requestId,
      });
    } catch (e) {
      throw notOffered(e);
    }
    const data = ex.events();
    const reader = new CompletionReader(u, model);
    try {
      const first = await data.next();
      if (first.done) throw UpstreamFailure.broken("the answer was an empty stream");
      const done = first.value.trim() === "[DONE]";
      return { data, reader, chunks: done ? [] : [reader.read(first.value)], done, upstream: u };
    } catch (e) {
      await data.return(undefined).catch(() => {});
      throw e;
    }
  };
  const base = (reader: CompletionReader) => ({
    id,
    object: "text_completion" as const,
    created: ctx.created,
    model: req.model,
    ...(reader.fingerprint ? { system_fingerprint: reader.fingerprint } : {}),
  });

  if (!req.stream) {
    // Nothing reaches the client before the end: a failure anywhere is retried like one before the first byte.
    let result;
    try {
      const { value, lease } = await pool.dispatch(
        { signal, affinity, requestId: ctx.requestId },
        async (u, sig, firstByte) => {
          const s = await open(u, sig);
          firstByte();
          try {
            for (let done = s.done; !done;) {
              const r = await s.data.next();
              if (r.done) throw UpstreamFailure.broken("the stream ended without [DONE]");
              done = r.value.trim() === "[DONE]";
              if (!done) s.chunks.push(s.reader.read(r.value));
            }
          } finally {
            await s.data.return(undefined).catch(() => {});
          }
          return s;
        },
      );
      lease.end("ok");
      result = value;
    } catch (e) {
      throw clientError(e);
    }
    ctx.onStarted?.(startedAt);
    const usage = result.reader.usage();
    ctx.onUsage?.(usage);
    const body: Completion = {
      ...base(result.reader),
      choices: assemble(result.chunks.flatMap((c) => c.choices)),
      usage,
    };
    return { kind: "completion", completion: body };
  }

  let stream: Awaited<ReturnType<typeof open>>;
  let lease: Lease;
  try {
    ({ value: stream, lease } = await pool.dispatch({ signal, affinity, requestId: ctx.requestId }, open));
  } catch (e) {
    throw clientError(e);
  }
  ctx.onStarted?.(startedAt);
  const { data, reader } = stream;
  const head = base(reader);
  // The client may leave before the stream is first read (its `finally` would not run then).
  signal.addEventListener("abort", () => lease.end("cancelled"), { once: true });
  const wantUsage = req.stream_options?.include_usage === true;
  async function* chunks(): AsyncGenerator<Completion> {
    let outcome: Outcome = "cancelled";
    let reason: string | undefined;
    try {
      for (const c of stream.chunks) if (c.choices.length > 0) yield { ...head, choices: c.choices };
      for (let done = stream.done; !done;) {
        const r = await data.next();
        if (r.done) throw UpstreamFailure.broken("the stream ended without [DONE]");
        done = r.value.trim() === "[DONE]";
        if (done) break;
        const c = reader.read(r.value);
        if (c.choices.length > 0) yield { ...head, choices: c.choices };
      }
      const usage = reader.usage();
      ctx.onUsage?.(usage);
      if (wantUsage) yield { ...head, choices: [], usage };
      outcome = "ok";
    } catch (e) {
      if (signal.aborted) throw e;
      const f = e instanceof UpstreamFailure ? e : UpstreamFailure.broken(`the stream broke: ${e}`);
      outcome = f.outcome;
      reason = f.message;
      ctx.log.error("upstream stream failed after its first byte", {
        request_id: ctx.requestId,
        model,
        upstream: stream.upstream.name,
        url: stream.upstream.base,
        reason,
      });
      throw f.toEngineError(model);
    } finally {
      if (outcome === "cancelled") abort.abort(new DOMException("stream cancelled", "AbortError"));
      await data.return(undefined).catch(() => {});
      lease.end(outcome, reason);
    }
  }
  return { kind: "stream", chunks: chunks() };
}

/** The checks a local model makes that need no tokenizer, with the same messages. */
function checkRequest(req: CompletionRequest): void {
  const n = req.n ?? 1;
  if (req.best_of != null && req.best_of !== n) {
    throw new EngineInputError(
      "best_of other than n is not supported; send best_of equal to n or leave it out.",
      "best_of",
    );
  }
  const p = req.prompt;
  const prompts = typeof p === "string" || typeof p[0] === "number" ? [p] : p as (string | number[])[];
  if (prompts.length > 64) {
    throw new EngineInputError("prompt holds more than 64 prompts.", "prompt", "too_many_inputs");
  }
  prompts.forEach((x, i) => {
    const param = prompts.length === 1 ? "prompt" : `prompt[${i}]`;
    if (x === "" && req.suffix == null) {
      throw new EngineInputError(`${param} is empty.`, param, "invalid_value");
    }
  });
}

/**
 * An upstream without legacy completions (404, 405 or 501 on `/completions`: a chat-only server)
 * refuses this request, not every request: the client is told so, and the upstream is not failed.
 */
function notOffered(e: unknown): unknown {
  if (!(e instanceof UpstreamFailure) || ![404, 405, 501].includes(e.status ?? 0)) return e;
  return new UpstreamFailure(e.message, "rejected", false, (m) =>
    new EngineUpstreamError(
      `The engines serving '${m}' do not offer legacy completions; use /v1/chat/completions.`,
      400,
      "invalid_request_error",
      "model",
      "unsupported_for_upstream_model",
    ), e.status);
}

/** Reads one stream's chunks: their choices (normalised), and the fingerprint and usage seen. */
class CompletionReader {
  fingerprint?: string;
  #usage?: CompletionUsage;

  constructor(readonly upstream: Upstream, readonly model: string) {}

  read(data: string): { choices: Choice[] } {
    let chunk: WireCompletionChunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      throw UpstreamFailure.broken(`a stream event is not JSON: ${data.slice(0, 200)}`, false);
    }
    if (!chunk || typeof chunk !== "object") {
      throw UpstreamFailure.broken(`a stream event is not an object: ${data.slice(0, 200)}`, false);
    }
    if (chunk.error !== undefined || chunk.object === "error") {
      const e = (typeof chunk.error === "object" && chunk.error) ? chunk.error as { code?: unknown } : chunk;
      const status = typeof e.code === "number" && e.code >= 400 && e.code < 600 ? e.code : 500;
      throw statusFailure(status, data, undefined, this.upstream, this.model);
    }
    if (this.fingerprint === undefined && typeof chunk.system_fingerprint === "string") {
      this.fingerprint = chunk.system_fingerprint.slice(0, 256);
    }
    if (chunk.usage) this.#usage = chunk.usage;
    return {
      choices: (chunk.choices ?? []).map((c) => ({
        text: typeof c.text === "string" ? c.text : "",
        index: c.index ?? 0,
        logprobs: legacyLogprobs(c.logprobs),
        finish_reason: c.finish_reason == null ? null : c.finish_reason === "length" ? "length" : "stop",
      })),
    };
  }

  /** The upstream's usage (zeros when it sent none). */
  usage(): CompletionUsage {
    const u = this.#usage;
    const prompt = u?.prompt_tokens ?? 0;
    const completion = u?.completion_tokens ?? 0;
    return {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      prompt_tokens_details: { cached_tokens: u?.prompt_tokens_details?.cached_tokens ?? 0 },
    };
  }
}

/** The upstream's legacy `logprobs` when they have the four parallel arrays, else null. */
function legacyLogprobs(x: unknown): CompletionLogprobs | null {
  const l = x as CompletionLogprobs | null | undefined;
  if (!l || typeof l !== "object") return null;
  const { tokens, token_logprobs, top_logprobs, text_offset } = l;
  if (![tokens, token_logprobs, top_logprobs, text_offset].every(Array.isArray)) return null;
  return { tokens, token_logprobs, top_logprobs, text_offset };
}

/** Streamed choice pieces joined into whole choices, in index order. */
function assemble(pieces: Choice[]): Choice[] {
  const byIndex = new Map<number, Choice>();
  for (const p of pieces) {
    const c = byIndex.get(p.index);
    if (!c) {
      byIndex.set(p.index, {
        ...p,
        logprobs: p.logprobs && {
          tokens: [...p.logprobs.tokens],
          token_logprobs: [...p.logprobs.token_logprobs],
          top_logprobs: [...p.logprobs.top_logprobs],
          text_offset: [...p.logprobs.text_offset],
        },
      });
      continue;
    }
    c.text += p.text;
    if (p.logprobs) {
      c.logprobs ??= { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
      c.logprobs.tokens.push(...p.logprobs.tokens);
      c.logprobs.token_logprobs.push(...p.logprobs.token_logprobs);
      c.logprobs.top_logprobs.push(...p.logprobs.top_logprobs);
      c.logprobs.text_offset.push(...p.logprobs.text_offset);
    }
    if (p.finish_reason) c.finish_reason = p.finish_reason;
  }
  return [...byIndex.values()].sort((a, b) => a.index - b.index);
}
