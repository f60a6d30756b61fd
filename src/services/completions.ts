/**
 * The OpenAI semantics of `POST /v1/completions` (legacy text completions: lm-eval-harness, code
 * completion plugins, LangChain's non-chat class): raw prompts, `echo`, legacy `logprobs`, `suffix`
 * (fill-in-the-middle), several prompts and `n` choices each, streamed as `text_completion` chunks.
 */
import { abortedError, ApiError, badRequest, fromUpstreamError } from "../http/errors.ts";
import type { Completion, CompletionLogprobs, CompletionRequest } from "../protocol/completions.ts";
import type { CompletionUsage } from "../protocol/common.ts";
import type { ChatEngine, ChatEvent, ChatJob, TokenLogprobInfo } from "../engines/types.ts";
import { EngineInputError, EngineUpstreamError } from "../engines/types.ts";
import type { PromptLogprobs } from "../engines/prompt_logprobs.ts";
import { relayCompletion } from "../engines/upstream/completions.ts";
import type { UpstreamPool } from "../engines/upstream/pool.ts";
import type { Logger } from "../log.ts";
import { samplingOptions } from "./sampling.ts";
import { Slicer } from "../event_loop.ts";

/** Per-request context from the server. */
export interface CompletionContext {
  created: number;
  signal: AbortSignal;
  log: Logger;
  requestId: string;
  systemFingerprint?: string;
  /** Every prompt's job has started (got its sequences) at `startedAt` (`performance.now()`). */
  onStarted?: (startedAt?: number) => void;
  onUsage?: (usage: CompletionUsage) => void;
}

/**
 * A completions request's outcome: the whole completion, or its chunks (errors after the first
 * byte are thrown by them; `toError` shapes them).
 */
export type CompletionRun =
  | { kind: "completion"; completion: Completion }
  | { kind: "stream"; chunks: AsyncGenerator<Completion>; toError: (e: unknown) => ApiError };

/** Legacy logprobs accumulated for one choice. */
class LegacyLogprobs {
  readonly out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  #offset: number;
  constructor(offset: number) {
    this.#offset = offset;
  }
  /** Appends entries; `first` marks the prompt's first token, which has no logprob. */
  add(entries: TokenLogprobInfo[], first?: { token: string }): CompletionLogprobs {
    const part: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    if (first) this.#push(part, first.token, null, null);
    for (const e of entries) {
      this.#push(part, e.token, e.logprob, Object.fromEntries(e.top.map((t) => [t.token, t.logprob])));
    }
    return part;
  }

  /** One token's entry, in the whole answer and in `part`. */
  #push(part: CompletionLogprobs, token: string, logprob: number | null, top: Record<string, number> | null) {
    for (const target of [this.out, part]) {
      target.tokens.push(token);
      target.token_logprobs.push(logprob);
      target.top_logprobs.push(top);
      target.text_offset.push(this.#offset);
    }
    this.#offset += token.length;
  }

  /**
   * The prompt's log-probabilities (`first`: its first token, which has no logprob), with a turn of
   * the event loop every `slices` (a 2,000-token prompt's entries with 20 alternatives each are ~15
   * ms of work). Token texts come from `text`, each looked up once: the answer's strings are shared.
   */
  async addPrompt(
    table: PromptLogprobs,
    first: { token: string },
    text: (token: number) => string,
    slices: Slicer,
  ): Promise<CompletionLogprobs> {
    const part = this.add([], first);
    const texts = new Map<number, string>();
    const textOf = (token: number) => {
      let t = texts.get(token);
      if (t === undefined) texts.set(token, t = text(token));
      return t;
    };
    for (let i = 0; i < table.length; i++) {
      if ((i & 255) === 0 && slices.due) await slices.pause();
      const top: [string, number][] = [];
      for (let j = 0, n = table.alternatives(i); j < n; j++) {
        top.push([textOf(table.alternativeToken(i, j)), table.alternativeLogprob(i, j)]);
      }
      this.#push(part, textOf(table.token(i)), table.logprob(i), Object.fromEntries(top));
    }
    return part;
  }
}

/**
 * Answers one completions request: the completion, or (with `stream`) its `text_completion` chunks.
 *
 * @example
 * ```ts
 * import type { CompletionRequest } from "../protocol/completions.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * async function answer(body: CompletionRequest, engine: ChatEngine, ctx: CompletionContext) {
 *   return await createCompletion(body, engine, ctx);
 * }
 * ```
 */
export async function createCompletion(
  req: CompletionRequest,
  engine: ChatEngine,
  ctx: CompletionContext,
): Promise<CompletionRun> {
  const prompts = await toPrompts(req, engine, ctx.signal);
  const n = req.n ?? 1;
  if (req.best_of != null && req.best_of !== n) {
    throw badRequest(
      "best_of other than n is not supported; send best_of equal to n or leave it out.",
      "best_of",
    );
  }
  const id = `cmpl-${crypto.randomUUID().replaceAll("-", "")}`;
  const abort = new AbortController();
  const signal = AbortSignal.any([ctx.signal, abort.signal]);
  const toError = (e: unknown) => {
    if (e instanceof ApiError) return e;
    if (e instanceof EngineInputError) return badRequest(e.message, e.param, e.code);
    if (e instanceof EngineUpstreamError) return fromUpstreamError(e);
    if (signal.aborted) return abortedError(signal.reason);
    return new ApiError(500, "server_error", "The model failed while generating.", null, "generation_failed");
  };
  const logprobs = req.logprobs ?? undefined;
  const tokenText = (token: number) => engine.tokenText(token).token;
  const echo = req.echo ?? false;
  const jobs = prompts.map((tokens): ChatJob => ({
    messages: [],
    tools: [],
    toolChoice: "none",
    parallelToolCalls: false,
    output: { type: "text" },
    sampling: samplingOptions(req),
    maxTokens: req.max_tokens ?? 16,
    stop: (req.stop == null ? [] : typeof req.stop === "string" ? [req.stop] : req.stop).filter((s) =>
      s !== ""
    ),
    n,
    logprobs,
    cachePrompt: req.cache_prompt ?? undefined,
    rawPrompt: tokens,
    promptLogprobs: echo && logprobs !== undefined,
  }));
  // Start every prompt's generation at once; errors before the first event are plain HTTP errors.
  const iterators = jobs.map((job) => engine.generate(job, signal)[Symbol.asyncIterator]());
  let firsts: IteratorResult<ChatEvent>[];
  try {
    firsts = await Promise.all(iterators.map((it) => it.next()));
  } catch (e) {
    abort.abort(new DOMException("failed", "AbortError"));
    throw toError(e);
  }
  // The request waited until its last prompt got sequences.
  const starts = firsts.flatMap((f) =>
    !f.done && f.value.type === "prompt" && f.value.startedAt ? [f.value.startedAt] : []
  );
  ctx.onStarted?.(starts.length === firsts.length ? Math.max(...starts) : undefined);
  const promptTokens = firsts.reduce(
    (s, f) => s + (!f.done && f.value.type === "prompt" ? f.value.promptTokens : 0),
    0,
  );
  const cachedTokens = firsts.reduce(
    (s, f) => s + (!f.done && f.value.type === "prompt" ? f.value.cachedTokens : 0),
    0,
  );
  const base = {
    id,
    object: "text_completion" as const,
    created: ctx.created,
    model: req.model,
    ...(ctx.systemFingerprint ? { system_fingerprint: ctx.systemFingerprint } : {}),
  };
  const echoText = await Promise.all(prompts.map((t) => (echo ? engine.detokenize(t, signal) : "")));

  /** Events of prompt p with choice indexes made global (p × n + choice). */
  async function* events(p: number): AsyncGenerator<{ index: number; event: ChatEvent }> {
    for (let r = await iterators[p].next(); !r.done; r = await iterators[p].next()) {
      const ev = r.value;
      yield { index: "choice" in ev ? p * n + ev.choice : p * n, event: ev };
    }
  }
  const usageOf = (completion: number) => ({
    prompt_tokens: promptTokens,
    completion_tokens: completion,
    total_tokens: promptTokens + completion,
    prompt_tokens_details: { cached_tokens: cachedTokens },
  });

  if (!req.stream) {
    const choices = prompts.flatMap((_, p) =>
      Array.from({ length: n }, (_, j) => ({
        text: echoText[p],
        index: p * n + j,
        lp: logprobs !== undefined ? new LegacyLogprobs(echoText[p].length) : undefined,
        finish: "stop" as "stop" | "length",
        tokens: 0,
      }))
    );
    const slices = new Slicer(10, signal);
    try {
      await Promise.all(prompts.map(async (tokens, p) => {
        let promptTable: PromptLogprobs | undefined;
        for await (const { index, event } of events(p)) {
          const c = choices[index];
          if (event.type === "prompt_logprobs") promptTable = event.logprobs;
          else if (event.type === "content") c.text += event.text;
          else if (event.type === "logprobs") c.lp?.add(event.entries);
          else if (event.type === "end") {
            c.finish = event.finishReason === "length" ? "length" : "stop";
            c.tokens = event.completionTokens;
          }
        }
        if (promptTable) {
          // The prompt's log-probabilities lead every choice of this prompt: made once, shared (8
          // choices of a 2,000-token prompt, each made anew, held the event loop for 130 ms).
          const prompt = await new LegacyLogprobs(0).addPrompt(
            promptTable,
            engine.tokenText(tokens[0]),
            tokenText,
            slices,
          );
          for (let j = 0; j < n; j++) {
            const c = choices[p * n + j];
            const own = c.lp!.out;
            c.lp = new LegacyLogprobs(0);
            c.lp.out.tokens = prompt.tokens.concat(own.tokens);
            c.lp.out.token_logprobs = prompt.token_logprobs.concat(own.token_logprobs);
            c.lp.out.top_logprobs = prompt.top_logprobs.concat(own.top_logprobs);
            c.lp.out.text_offset = prompt.text_offset.concat(own.text_offset);
          }
        }
      }));
    } catch (e) {
      throw toError(e);
    }
    const usage = usageOf(choices.reduce((s, c) => s + c.tokens, 0));
    ctx.onUsage?.(usage);
    const body: Completion = {
      ...base,
      choices: choices.map((c) => ({
        text: c.text,
        index: c.index,
        logprobs: c.lp ? c.lp.out : null,
        finish_reason: c.finish,
      })),
      usage,
    };
    return { kind: "completion", completion: body };
  }

  async function* chunks(): AsyncGenerator<Completion> {
    let completed = false;
    let tokens = 0;
    try {
      const lps = prompts.flatMap((_, p) =>
        Array.from({ length: n }, () => new LegacyLogprobs(echoText[p].length))
      );
      // Echoed prompts first (their log-probabilities arrive with the prompt event).
      const merged = mergeStreams(prompts.map((_, p) => events(p)));
      const echoed = new Set<number>();
      const slices = new Slicer(10, signal);
      const echoChunk = async (index: number, table?: PromptLogprobs) => {
        const p = Math.floor(index / n);
        echoed.add(index);
        let lp: CompletionLogprobs | null = null;
        if (logprobs !== undefined && table) {
          lp = await new LegacyLogprobs(0).addPrompt(
            table,
            engine.tokenText(prompts[p][0]),
            tokenText,
            slices,
          );
        }
        return { ...base, choices: [{ text: echoText[p], index, logprobs: lp, finish_reason: null }] };
      };
      for await (const { index, event } of merged) {
        if (event.type === "prompt_logprobs") {
          const p = Math.floor(index / n);
          for (let j = 0; j < n; j++) yield await echoChunk(p * n + j, event.logprobs);
          continue;
        }
        if (echo && !echoed.has(index) && "choice" in event) yield await echoChunk(index);
        if (event.type === "content") {
          yield { ...base, choices: [{ text: event.text, index, logprobs: null, finish_reason: null }] };
        } else if (event.type === "logprobs" && logprobs !== undefined) {
          const part = lps[index].add(event.entries);
          yield { ...base, choices: [{ text: "", index, logprobs: part, finish_reason: null }] };
        } else if (event.type === "end") {
          tokens += event.completionTokens;
          yield {
            ...base,
            choices: [{
              text: "",
              index,
              logprobs: null,
              finish_reason: event.finishReason === "length" ? "length" : "stop",
            }],
          };
        }
      }
      const usage = usageOf(tokens);
      ctx.onUsage?.(usage);
      if (req.stream_options?.include_usage) yield { ...base, choices: [], usage };
      completed = true;
    } finally {
      if (!completed) {
        abort.abort(new DOMException("stream cancelled", "AbortError"));
        await Promise.all(iterators.map((it) => it.return?.()));
        ctx.log.info("stream cancelled", { request_id: ctx.requestId });
      }
    }
  }
  return { kind: "stream", chunks: chunks(), toError };
}

/**
 * Answers one completions request through a model's upstreams (their tokenizer reads the prompt),
 * with the relay's engine errors as API errors.
 *
 * @example
 * ```ts
 * import { poolOf } from "../engines/upstream/load.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { CompletionRequest } from "../protocol/completions.ts";
 * async function answer(body: CompletionRequest, engine: ChatEngine, ctx: CompletionContext) {
 *   const pool = poolOf(engine);
 *   return pool ? await createRelayedCompletion(body, pool, ctx) : await createCompletion(body, engine, ctx);
 * }
 * ```
 */
export async function createRelayedCompletion(
  req: CompletionRequest,
  pool: UpstreamPool,
  ctx: CompletionContext,
): Promise<CompletionRun> {
  const toError = (e: unknown): ApiError => {
    if (e instanceof EngineInputError) return badRequest(e.message, e.param, e.code);
    if (e instanceof EngineUpstreamError) return fromUpstreamError(e);
    if (ctx.signal.aborted) return abortedError(ctx.signal.reason);
    return new ApiError(
      500,
      "server_error",
      "The relay of the completion failed.",
      null,
      "generation_failed",
    );
  };
  let run;
  try {
    run = await relayCompletion(req, pool, ctx);
  } catch (e) {
    throw toError(e);
  }
  return run.kind === "completion" ? run : { ...run, toError };
}

/** The prompts as token lists (with fill-in-the-middle markup when `suffix` is given). */
async function toPrompts(
  req: CompletionRequest,
  engine: ChatEngine,
  signal: AbortSignal,
): Promise<number[][]> {
  const p = req.prompt;
  let prompts: (string | number[])[];
  if (typeof p === "string") prompts = [p];
  else if (typeof p[0] === "number") prompts = [p as number[]];
  else prompts = p as (string | number[])[];
  if (prompts.length > 64) {
    throw badRequest("prompt holds more than 64 prompts.", "prompt", "too_many_inputs");
  }
  if (req.suffix != null && !engine.fim) {
    throw badRequest(
      "suffix needs a model with fill-in-the-middle tokens; this model has none.",
      "suffix",
      "unsupported_value",
    );
  }
  const out: number[][] = [];
  for (const [i, x] of prompts.entries()) {
    const param = prompts.length === 1 ? "prompt" : `prompt[${i}]`;
    if (typeof x === "string") {
      if (x === "" && req.suffix == null) throw badRequest(`${param} is empty.`, param, "invalid_value");
      out.push(await engine.tokenize(x, true, signal));
      continue;
    }
    const bad = x.findIndex((t) => t >= engine.vocabSize);
    if (bad >= 0) {
      throw badRequest(
        `${param} holds token id ${x[bad]}; this model's vocabulary has ids 0..${engine.vocabSize - 1}.`,
        param,
        "invalid_value",
      );
    }
    out.push(x);
  }
  if (req.suffix != null) {
    const { prefix, suffix, middle } = engine.fim!;
    const tail = await engine.tokenize(req.suffix, false, signal);
    return out.map((t) => [prefix, ...t, suffix, ...tail, middle]);
  }
  return out;
}

/** Interleaves several async streams, yielding items as they come. */
async function* mergeStreams<T>(streams: AsyncGenerator<T>[]): AsyncGenerator<T> {
  const pending = new Map(streams.map((s, i) => [i, s.next().then((r) => ({ i, r }))]));
  while (pending.size > 0) {
    const { i, r } = await Promise.race(pending.values());
    if (r.done) pending.delete(i);
    else {
      pending.set(i, streams[i].next().then((r) => ({ i, r })));
      yield r.value;
    }
  }
}
