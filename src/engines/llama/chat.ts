/**
 * GGUF chat models: the prompt is the GGUF's own chat template; generation runs on our batched
 * loop ({@link Scheduler}) over llama.cpp; grammars enforce JSON output and forced tool calls in
 * the model's tool-call dialect; calls are parsed and returned, never executed.
 *
 * This module is the engine: loading (with the batching check), prompts and tokens, and the glue
 * from a job to the scheduler. A job's grammar is `chat_grammar.ts`; a choice's events are
 * `chat_output.ts`; what the chat template tells is `template_facts.ts`.
 */
import type { ChatEngine, ChatEvent, ChatJob, SamplingOptions } from "../types.ts";
import { EngineInputError } from "../types.ts";
import type { Logger } from "../../log.ts";
import type { LlamaLibrary } from "./ffi.ts";
import { Batch, type FlashAttention, type ModelPlacement, NativeContext, NativeModel } from "./native.ts";
import { Scheduler, type SchedulerStats } from "./scheduler.ts";
import { PromptCache } from "./prompt_cache.ts";
import { DEFAULT_PROMPT_CACHE_MIB } from "../../plan/memory.ts";
import { logprobsOf, TokenSampler } from "./sampler.ts";
import { ChatTemplate } from "./template.ts";
import {
  readTemplateFacts,
  type TemplateFacts,
  type ThinkingFacts,
  type ThinkMarkers,
} from "./template_facts.ts";
import { DIALECTS, type ToolDialect } from "./dialects/index.ts";
import { ChatGrammars } from "./chat_grammar.ts";
import { ChoiceOutput } from "./chat_output.ts";
import { EventQueue } from "./event_queue.ts";
import { PromptLogprobs } from "../prompt_logprobs.ts";
import type { ComputeClient } from "../compute_share.ts";
import { loopTurn, turnIfHeld } from "../../event_loop.ts";

/** Longest wait of {@link LlamaChatEngine.dispose} for the generation loop to stop. */
const DISPOSE_WAIT_MS = 5_000;

/** How to load a GGUF chat model. */
export interface LlamaChatOptions {
  modelPath: string;
  /** Layers on the GPU; -1 = all. */
  gpuLayers: number;
  /** Tensor overrides and multi-GPU split (llama.cpp model parameters). */
  placement?: ModelPlacement;
  threads: number;
  /** Sequences decoded together (requests × choices). */
  parallel: number;
  /** Tokens per sequence. */
  contextSize: number;
  /** Tool-call dialect; default: read from the chat template. */
  toolFormat?: "json" | "xml";
  /** `off`: one sequence per decode; `auto`: batched unless {@link checkBatching} finds a difference. */
  batchSequences?: "auto" | "off";
  /** llama.cpp's flash attention (default `auto`). */
  flashAttention?: FlashAttention;
  /** The model's turn on the machine's compute (see compute_share.ts). */
  compute?: ComputeClient;
  /** Host memory for saved prompt states, MiB (default {@link DEFAULT_PROMPT_CACHE_MIB}; 0 = none). */
  promptCacheMiB?: number;
  log: Logger;
}

/**
 * `VSERVE_SCHEDULER_TRACE=FILE`: the generation loop's events (admissions, prefix sources, saves,
 * restores, decodes and prompt chunks with their milliseconds), one JSON line each, for diagnosis.
 */
function schedulerTrace(): ((event: Record<string, unknown>) => void) | undefined {
  const path = Deno.env.get("VSERVE_SCHEDULER_TRACE");
  if (!path) return undefined;
  const file = Deno.openSync(path, { write: true, create: true, append: true });
  const encoder = new TextEncoder();
  return (event) =>
    file.writeSync(encoder.encode(JSON.stringify({ t: Math.round(performance.now()), ...event }) + "\n"));
}

/** Prompt tokens per decode step (llama.cpp's micro-batch). */
const CHUNK = 512;
/** Token texts (one decoder for all: a token's bytes are decoded whole, without state). */
const UTF8 = new TextDecoder();

/** A chat model on one llama.cpp context with `parallel` sequences. */
export class LlamaChatEngine implements ChatEngine {
  readonly contextSize: number;
  readonly maxChoices: number;
  readonly vocabSize: number;
  readonly fim?: { prefix: number; suffix: number; middle: number };
  readonly dialect: ToolDialect;
  readonly thinking: ThinkingFacts;
  /**
   * How concurrent sequences are decoded: `batched`, `batched (checked)` (a recurrent model whose
   * batched decode matched one-at-a-time decoding at load), or `per sequence` (configured, or the
   * check found a difference).
   */
  readonly batching: string;
  /** Host memory the prompt cache may take, MiB (0: none). */
  readonly promptCacheMiB: number;
  readonly #model: NativeModel;
  readonly #ctx: NativeContext;
  readonly #batch: Batch;
  readonly #scheduler: Scheduler;
  readonly #promptCache: PromptCache;
  readonly #template: ChatTemplate;
  /** Bytes of the vocabulary's longest token (for a lower bound of a text's tokens). */
  readonly #longestToken: number;
  /** The markup token that opens a turn: where recurrent-state checkpoints go (none: no such token). */
  readonly #turnStart: number | null;
  /** The tags around a reasoning block. */
  readonly #think: ThinkMarkers;
  /** Tokens of the text that opens a tool call (a single token makes the lazy grammar cheap). */
  readonly #openTokens: number[];
  /** The job's grammars (see chat_grammar.ts). */
  readonly #grammars: ChatGrammars;

  private constructor(
    model: NativeModel,
    ctx: NativeContext,
    batch: Batch,
    template: ChatTemplate,
    facts: TemplateFacts,
    longestToken: number,
    opts: LlamaChatOptions,
    batching: string,
  ) {
    this.#model = model;
    this.#ctx = ctx;
    this.#batch = batch;
    this.#template = template;
    this.#longestToken = longestToken;
    this.batching = batching;
    this.promptCacheMiB = opts.promptCacheMiB ?? DEFAULT_PROMPT_CACHE_MIB;
    this.#promptCache = new PromptCache(this.promptCacheMiB * 1024 * 1024, model.recurrent);
    this.#scheduler = new Scheduler(model, ctx, batch, {
      chunk: CHUNK,
      maxCheckpoints: 4,
      checkpointSpacing: 256,
      oneSequencePerDecode: batching === "per sequence",
      promptCache: this.#promptCache,
      trace: schedulerTrace(),
    });
    this.contextSize = ctx.nCtxSeq;
    this.maxChoices = ctx.nSeqMax;
    this.vocabSize = model.nVocab;
    this.fim = model.fimTokens();
    this.dialect = opts.toolFormat ? DIALECTS[opts.toolFormat] : facts.dialect;
    this.thinking = facts.thinking;
    this.#turnStart = facts.turnStart?.id ?? null;
    this.#think = facts.think;
    this.#openTokens = model.tokenize(this.dialect.open, true);
    this.#grammars = new ChatGrammars(model, this.dialect, this.#openTokens, facts.think, opts.log);
  }

  /**
   * Loads the model and one context of `parallel` sequences × `contextSize` tokens.
   *
   * @example
   * ```ts
   * import type { LlamaLibrary } from "./ffi.ts";
   * import type { Logger } from "../../log.ts";
   * async function open(lib: LlamaLibrary, modelPath: string, log: Logger) {
   *   return await LlamaChatEngine.load(lib, { modelPath, gpuLayers: 0, threads: 2, parallel: 4, contextSize: 4096, log });
   * }
   * ```
   */
  static async load(lib: LlamaLibrary, opts: LlamaChatOptions): Promise<LlamaChatEngine> {
    const model = await NativeModel.load(lib, opts.modelPath, opts.gpuLayers, opts.placement);
    try {
      const source = model.chatTemplate();
      if (!source) throw new Error(`'${opts.modelPath}' has no chat template (tokenizer.chat_template)`);
      const vocabulary = await model.scanVocabulary();
      const template = new ChatTemplate({
        source,
        specials: {
          bos: model.bos >= 0 ? model.detokenize([model.bos]) : "",
          eos: model.eos >= 0 ? model.detokenize([model.eos]) : "",
        },
        markup: vocabulary.markup,
      });
      // Parsing the template (11-12 ms for Qwen3.6's) and probing it (5-6 ms) are turns of their own:
      // with the vocabulary scan's last slice they were one 24-35 ms block of a server already serving.
      await loopTurn();
      const facts = readTemplateFacts(template);
      await loopTurn();
      const parallel = Math.max(1, opts.parallel);
      const ctx = await NativeContext.create(model, {
        nCtx: opts.contextSize * parallel,
        nBatch: CHUNK + parallel,
        nUbatch: CHUNK + parallel,
        nSeqMax: parallel,
        threads: opts.threads,
        flashAttention: opts.flashAttention,
        embeddings: false,
        kvUnified: false,
        compute: opts.compute,
      });
      const batch = new Batch(lib, CHUNK + parallel);
      // One sequence has nothing to batch with.
      let batching = "batched";
      if (parallel >= 2 && opts.batchSequences === "off") batching = "per sequence";
      else if (parallel >= 2 && model.recurrent) {
        const difference = await checkBatching(model, ctx, batch);
        batching = difference === 0 ? "batched (checked)" : "per sequence";
        if (difference > 0) {
          opts.log.warn(
            "decoding several sequences in one batch gives other results than one at a time on this " +
              `backend (largest logit difference ${difference.toFixed(3)}): decoding one sequence at a time`,
            { model: opts.modelPath },
          );
        }
      }
      return new LlamaChatEngine(model, ctx, batch, template, facts, vocabulary.longestToken, opts, batching);
    } catch (e) {
      model.free();
      throw e;
    }
  }

  /** Counters of the generation loop. */
  get stats(): SchedulerStats {
    return this.#scheduler.stats;
  }

  counters(): Record<string, number> {
    const s = this.#scheduler.stats;
    const c = this.#promptCache.stats;
    return {
      prompt_tokens_evaluated: s.promptTokensEvaluated,
      prompt_tokens_reused: s.promptTokensReused,
      prompt_tokens_copied: s.promptTokensCopied,
      prefix_copies: s.prefixCopies,
      prefix_waits: s.prefixWaits,
      prompt_cache_hits: c.hits,
      prompt_cache_tokens_restored: c.tokensRestored,
      prompt_cache_saves: c.saves,
      prompt_cache_evictions: c.evictions,
      prompt_cache_seconds: s.promptCacheMs / 1000,
      // (gauges: read as they are)
      prompt_cache_bytes: c.bytes,
      prompt_cache_entries: c.entries,
      tokens_generated: s.tokensGenerated,
      decodes: s.decodes,
      decodes_on_thread: this.#ctx.decodes.onThread,
      decodes_host_busy: this.#ctx.decodes.hostBusy,
      loop_turns: this.#ctx.decodes.turns,
      batched_tokens: s.batchedTokens,
      checkpoints_saved: s.checkpointsSaved,
      checkpoints_restored: s.checkpointsRestored,
      decode_seconds: s.decodeMs / 1000,
      sample_seconds: s.sampleMs / 1000,
      draws_off_loop: s.drawsOffLoop,
      step_seconds: s.stepMs / 1000,
    };
  }

  /**
   * A job's prompt: the chat template's text, and its tokens, in which only the template's own
   * markup is special tokens: every client string is tokenized as text (see `markup.ts`). The tools
   * are in it under every tool_choice: under `none` too, as OpenAI and Anthropic keep them visible,
   * so an agent's turn without calls keeps the prompt prefix of its other turns (and the model
   * cannot open a call: see {@link #samplingOf}).
   * Large histories render on a worker thread, and long texts are tokenized off the event loop or
   * between its turns. `limit`: stop early once the prompt has more tokens (`complete` false).
   */
  async prompt(
    job: Pick<ChatJob, "messages" | "tools" | "toolChoice" | "enableThinking">,
    signal?: AbortSignal,
    limit = Infinity,
  ): Promise<{ text: string; tokens: number[]; complete: boolean }> {
    const rendered = await this.#template.renderAsync({
      messages: job.messages,
      tools: job.tools,
      thinking: job.enableThinking,
    }, signal);
    const model = this.#model;
    const tokens: number[] = [];
    if (model.addBos && model.bos >= 0 && !rendered.text.startsWith(model.detokenize([model.bos]))) {
      tokens.push(model.bos);
    }
    // A prompt put together from the worker's reply, or rendered here, is not one block with its tokenizing.
    await turnIfHeld(5, signal);
    const { complete } = await model.tokenizePieces(rendered.pieces, { signal, limit, into: tokens });
    return { text: rendered.text, tokens, complete };
  }

  /**
   * A job's sampling options; under tool_choice `none` with tools, the token that opens a call is
   * never sampled. (A dialect whose opener is several tokens gets no ban: its call markup is then
   * plain text, since nothing is parsed as a call under `none`.)
   */
  #samplingOf(job: ChatJob): SamplingOptions {
    if (job.toolChoice !== "none" || job.tools.length === 0 || this.#openTokens.length !== 1) {
      return job.sampling;
    }
    return { ...job.sampling, logitBias: { ...job.sampling.logitBias, [this.#openTokens[0]]: -100 } };
  }

  detokenize(tokens: readonly number[], signal?: AbortSignal): Promise<string> {
    return this.#model.detokenizeInSlices(tokens, signal);
  }

  tokenText(token: number): { token: string; bytes: number[] } {
    return this.tokenInfo(token);
  }

  /**
   * Tokens of a text: with `special`, special-token strings become their tokens (a raw prompt in the
   * client's own template); without, all of it is plain text. Without holding the event loop (see
   * {@link NativeModel.tokenizePieces}); the special-token strings are found here, in one pass.
   */
  async tokenize(text: string, special = true, signal?: AbortSignal): Promise<number[]> {
    const model = this.#model;
    const tokens = model.addBos && model.bos >= 0 && !text.startsWith(model.detokenize([model.bos]))
      ? [model.bos]
      : [];
    const markup = this.#template.markup;
    const pieces = special ? markup.specialPieces(text) : markup.fragments(text);
    return (await model.tokenizePieces(pieces, { signal, into: tokens })).tokens;
  }

  async *generate(job: ChatJob, signal: AbortSignal): AsyncGenerator<ChatEvent> {
    if (job.n > this.maxChoices) {
      throw new EngineInputError(
        `n may be at most ${this.maxChoices} on this model (its parallel sequences).`,
        "n",
        "invalid_value",
      );
    }
    const raw = job.rawPrompt !== undefined;
    const limit = this.contextSize;
    const room = limit - Math.max(job.maxTokens ?? 1, 1);
    const tooLong = (tokens: string) =>
      new EngineInputError(
        `This model's context window is ${limit} tokens; the ${
          raw ? "prompt takes" : "messages take"
        } ${tokens}` +
          (job.maxTokens ? ` and max_tokens asks for ${job.maxTokens} more` : "") +
          `. Shorten the ${raw ? "prompt" : "messages"} or lower max_tokens.`,
        raw ? "prompt" : "messages",
        "context_length_exceeded",
      );
    let prompt = "";
    let tokens: number[];
    if (raw) tokens = job.rawPrompt!;
    else {
      // A history far past the context is refused before it is rendered.
      const floor = this.#template.promptFloor(job.messages, this.#longestToken);
      if (floor > room) throw tooLong(`at least ${floor} tokens`);
      const rendered = await this.prompt(job, signal, room);
      if (!rendered.complete) throw tooLong(`more than ${room} tokens`);
      ({ text: prompt, tokens } = rendered);
    }
    if (tokens.length > room) throw tooLong(`${tokens.length} tokens`);
    const inThink = prompt.trimEnd().endsWith(this.#think.open);
    const thinking = inThink || (this.thinking.switchable && (job.enableThinking ?? this.thinking.defaultOn));
    const grammar = await this.#grammars.grammar(job, inThink, thinking, signal);
    const grammars = Array.from({ length: job.n }, (_, i) => i === 0 ? grammar : grammar?.clone() ?? null);
    const seed = job.sampling.seed ?? Math.floor(Math.random() * 2 ** 32);
    const sampler = new TokenSampler(samplingParams(this.#samplingOf(job), seed), this.#model.nVocab);
    const choices = grammars.map((g, i) => ({
      sampler: i === 0 ? sampler : sampler.fork(seed + i),
      grammar: g,
    }));
    const queue = new EventQueue<ChatEvent>();
    const promptLogprobs = new PromptLogprobs(job.logprobs ?? 0, job.promptLogprobs ? tokens.length : 1);
    const outputs = choices.map((_, i) => new ChoiceOutput(i, this, job, inThink, queue, raw));
    let firstToken = false;
    let startedAt: number | undefined;
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    const run = this.#scheduler.run({
      prompt: tokens,
      choices,
      maxTokens: job.maxTokens ?? limit - tokens.length,
      logprobs: job.logprobs,
      checkpoints: turnStarts(tokens, this.#turnStart),
      reusePrefix: job.promptLogprobs ? false : job.cachePrompt,
      onPromptLogits: job.promptLogprobs
        ? (position, logits) => {
          const lp = logprobsOf(logits, tokens[position + 1], job.logprobs ?? 0);
          promptLogprobs.push(lp.token, lp.logprob, lp.top);
        }
        : undefined,
      signal: stop.signal,
      onStart: () => (startedAt = performance.now()),
      onPrompt: (info) => {
        queue.push({ type: "prompt", ...info, ...(startedAt !== undefined ? { startedAt } : {}) });
        if (job.promptLogprobs) queue.push({ type: "prompt_logprobs", logprobs: promptLogprobs });
      },
      onToken: (choice, token, logprob) => {
        if (!firstToken) {
          firstToken = true;
          queue.push({ type: "first_token" });
          // The first token goes out at once, not at the end of a burst of decodes on this thread.
          this.#ctx.endBurst();
        }
        return outputs[choice].token(token, logprob);
      },
      onEnd: (choice, cause) => outputs[choice].end(cause),
    }).then(() => queue.close(), (e) => queue.fail(e));
    try {
      yield* queue;
    } finally {
      if (!stop.signal.aborted) stop.abort(new DOMException("generation stopped", "AbortError"));
      signal.removeEventListener("abort", onAbort);
      await run;
      for (const c of choices) c.grammar?.free();
    }
  }

  /** The text and bytes of a token (for log-probabilities). */
  tokenInfo(token: number): { token: string; bytes: number[] } {
    const bytes = this.#model.piece(token);
    return { token: UTF8.decode(bytes), bytes: Array.from(bytes) };
  }

  /** The bytes of a generated token. */
  piece(token: number): Uint8Array {
    return this.#model.piece(token);
  }

  async dispose(): Promise<void> {
    this.#template.dispose();
    // A decode or a grammar's step may still be running on another thread (requests are aborted
    // first; they end at the loop's next look): freeing under it would crash the process.
    await this.#scheduler.stopped(DISPOSE_WAIT_MS);
    this.#batch.free();
    this.#ctx.free();
    this.#model.free();
  }
}

/**
 * Decodes two short texts on sequences 0 and 1, then one more token of each, once in one batch and
 * once one sequence at a time, and compares the logits: 0 when they agree within the backend's
 * rounding, else the largest difference. A recurrent model's state goes through kernels of their own
 * for several sequences (llama.cpp's AMX matrix product got them wrong), and wrong output would be
 * silent; the check costs four small decodes at load.
 */
export async function checkBatching(model: NativeModel, ctx: NativeContext, batch: Batch): Promise<number> {
  const texts = ["The river runs past the old stone mill.", "Bells ring over the quiet town at noon."];
  const prompts = texts.map((t) => model.tokenize(t, false));
  const next = prompts[1][0];
  const run = async (together: boolean): Promise<Float32Array[]> => {
    ctx.clear();
    const out: Float32Array[] = [];
    for (const [seq, prompt] of prompts.entries()) {
      batch.clear();
      prompt.forEach((t, i) => batch.add(t, i, seq, false));
      await ctx.decode(batch);
      if (together) continue;
      batch.clear();
      batch.add(next, prompt.length, seq, true);
      await ctx.decode(batch);
      out.push(ctx.logits(0).slice());
    }
    if (together) {
      batch.clear();
      prompts.forEach((prompt, seq) => batch.add(next, prompt.length, seq, true));
      await ctx.decode(batch);
      out.push(ctx.logits(0).slice(), ctx.logits(1).slice());
    }
    return out;
  };
  try {
    const [alone, batched] = [await run(false), await run(true)];
    let largest = 0;
    let spread = 0;
    for (let s = 0; s < alone.length; s++) {
      let lo = Infinity, hi = -Infinity;
      for (let i = 0; i < alone[s].length; i++) {
        largest = Math.max(largest, Math.abs(alone[s][i] - batched[s][i]));
        lo = Math.min(lo, alone[s][i]);
        hi = Math.max(hi, alone[s][i]);
      }
      spread = Math.max(spread, hi - lo);
    }
    // Kernels that batch differently round differently (GPUs): only differences beyond that count.
    return largest <= 0.02 * spread ? 0 : largest;
  } finally {
    ctx.clear();
  }
}

/** Positions where a turn starts (its `marker` token): good places for recurrent-state checkpoints. */
function turnStarts(tokens: readonly number[], marker: number | null): number[] {
  if (marker === null) return [];
  const out: number[] = [];
  tokens.forEach((t, i) => t === marker && i > 0 && out.push(i));
  return out;
}

/** OpenAI-style sampling options as the sampler's settings (OpenAI's defaults). */
function samplingParams(s: SamplingOptions, seed: number) {
  return {
    temperature: s.temperature ?? 1,
    topK: s.topK ?? 0,
    topP: s.topP ?? 1,
    minP: s.minP ?? 0,
    seed,
    presencePenalty: s.presencePenalty ?? 0,
    frequencyPenalty: s.frequencyPenalty ?? 0,
    repeatPenalty: s.repeatPenalty ?? 1,
    logitBias: new Map(
      Object.entries(s.logitBias ?? {}).map(([t, v]) => [Number(t), v <= -100 ? -Infinity : v]),
    ),
  };
}
