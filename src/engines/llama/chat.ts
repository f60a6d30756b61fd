/**
 * GGUF chat models: the prompt is the GGUF's own chat template; generation runs on our batched
 * loop ({@link Scheduler}) over llama.cpp; grammars enforce JSON output and forced tool calls in
 * the model's tool-call dialect; calls are parsed and returned, never executed.
 */
import type {
  ChatEngine,
  ChatEvent,
  ChatJob,
  EngineTool,
  FinishReason,
  SamplingOptions,
  TokenLogprobInfo,
} from "../types.ts";
import { EngineInputError } from "../types.ts";
import type { Logger } from "../../log.ts";
import type { LlamaLibrary } from "./ffi.ts";
import { Batch, type FlashAttention, type ModelPlacement, NativeContext, NativeModel } from "./native.ts";
import { Scheduler, type SchedulerStats } from "./scheduler.ts";
import { PromptCache } from "./prompt_cache.ts";
import { DEFAULT_PROMPT_CACHE_MIB } from "../../plan/memory.ts";
import { logprobsOf, type TokenLogprob, TokenSampler } from "./sampler.ts";
import { GrammarConstraint, type GrammarTrigger } from "./grammar.ts";
import {
  AutomatonCache,
  gbnfLiteral,
  GbnfRules,
  GrammarError,
  JsonGrammar,
  LruCache,
  textWithout,
} from "../../grammar/mod.ts";
import { ChatTemplate, type ThinkingFacts } from "./template.ts";
import { type CallTags, dialectOfTemplate, DIALECTS, type ToolDialect } from "./dialects/index.ts";
import { OutputParser, type OutputPiece } from "./output_parser.ts";
import { StopMatcher } from "./stop_strings.ts";
import { EventQueue } from "./event_queue.ts";
import { Slicer } from "../../event_loop.ts";
import type { ComputeClient } from "../compute_share.ts";

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

/** Most tool calls one turn may hold (bounds the grammar's repetition). */
const MAX_PARALLEL_CALLS = 8;
/** Prompt tokens per decode step (llama.cpp's micro-batch). */
const CHUNK = 512;
/** Grammars kept by their inputs: at most this many, of at most this many characters in all. */
const GRAMMAR_CACHE = { entries: 256, chars: 64 * 1024 * 1024 };

/** What constrains a job's output: a grammar, nothing, or a refusal (a 400), as built from its inputs. */
type GrammarPlan =
  | { kind: "grammar"; text: string; trigger?: GrammarTrigger }
  | { kind: "none" }
  | { kind: "refused"; error: EngineInputError };

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
  readonly #log: Logger;
  /** Tokens of the text that opens a tool call (a single token makes the lazy grammar cheap). */
  readonly #openTokens: number[];
  /** The call tags in grammars: the vocabulary's tokens where it has them (see CallTags). */
  readonly #callTags: CallTags;
  /** Grammars by their inputs: each schema is compiled once. */
  readonly #plans = new LruCache<GrammarPlan>(GRAMMAR_CACHE.entries, GRAMMAR_CACHE.chars);
  /** Automata of JSON-schema `pattern`s, shared by every grammar of this model. */
  readonly #automata = new AutomatonCache({ slices: (signal) => new Slicer(3, signal) });

  private constructor(
    model: NativeModel,
    ctx: NativeContext,
    batch: Batch,
    template: ChatTemplate,
    longestToken: number,
    opts: LlamaChatOptions,
    batching: string,
  ) {
    this.#model = model;
    this.#ctx = ctx;
    this.#batch = batch;
    this.#template = template;
    this.#longestToken = longestToken;
    this.#log = opts.log;
    this.batching = batching;
    this.promptCacheMiB = opts.promptCacheMiB ?? DEFAULT_PROMPT_CACHE_MIB;
    this.#promptCache = new PromptCache(this.promptCacheMiB * 1024 * 1024, model.recurrent);
    this.#scheduler = new Scheduler(model, ctx, batch, {
      chunk: CHUNK,
      maxCheckpoints: 4,
      checkpointSpacing: 256,
      oneSequencePerDecode: batching === "per sequence",
      promptCache: this.#promptCache,
    });
    this.contextSize = ctx.nCtxSeq;
    this.maxChoices = ctx.nSeqMax;
    this.vocabSize = model.nVocab;
    this.fim = model.fimTokens();
    this.dialect = opts.toolFormat ? DIALECTS[opts.toolFormat] : dialectOfTemplate(template.source);
    this.thinking = template.thinkingFacts();
    this.#openTokens = model.tokenize(this.dialect.open, true);
    const closeTokens = model.tokenize(this.dialect.close, true);
    this.#callTags = {
      open: this.#openTokens.length === 1 ? `<[${this.#openTokens[0]}]>` : gbnfLiteral(this.dialect.open),
      close: closeTokens.length === 1 ? `<[${closeTokens[0]}]>` : gbnfLiteral(this.dialect.close),
    };
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
      return new LlamaChatEngine(model, ctx, batch, template, vocabulary.longestToken, opts, batching);
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
      batched_tokens: s.batchedTokens,
      checkpoints_saved: s.checkpointsSaved,
      checkpoints_restored: s.checkpointsRestored,
      decode_seconds: s.decodeMs / 1000,
      sample_seconds: s.sampleMs / 1000,
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
    const slices = new Slicer(10, signal);
    for (const piece of rendered.pieces) {
      if (tokens.length > limit) return { text: rendered.text, tokens, complete: false };
      if (slices.due) await slices.pause();
      if (typeof piece === "number") tokens.push(piece);
      else {
        // About 2-4 ms of llama.cpp's time per 8 KB: longer texts go to a thread of their own.
        const ids = piece.length > 8192
          ? await model.tokenizeAsync(piece, false)
          : model.tokenize(piece, false);
        for (const id of ids) tokens.push(id);
      }
    }
    return { text: rendered.text, tokens, complete: true };
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

  detokenize(tokens: readonly number[]): string {
    return this.#model.detokenize(tokens, true);
  }

  tokenText(token: number): { token: string; bytes: number[] } {
    return this.tokenInfo(token);
  }

  /**
   * Tokens of a text: with `special`, special-token strings become their tokens (a raw prompt in the
   * client's own template); without, all of it is plain text.
   */
  tokenize(text: string, special = true): number[] {
    const addBos = this.#model.addBos && this.#model.bos >= 0 &&
      !text.startsWith(this.#model.detokenize([this.#model.bos]));
    const ids = special
      ? this.#model.tokenize(text, true)
      : this.#template.markup.fragments(text).flatMap((f) => this.#model.tokenize(f, false));
    return [...(addBos ? [this.#model.bos] : []), ...ids];
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
    const inThink = /<think>\s*$/.test(prompt);
    const thinking = inThink || (this.thinking.switchable && (job.enableThinking ?? this.thinking.defaultOn));
    const grammar = await this.#grammar(job, inThink, thinking, signal);
    const grammars = Array.from({ length: job.n }, (_, i) => i === 0 ? grammar : grammar?.clone() ?? null);
    const seed = job.sampling.seed ?? Math.floor(Math.random() * 2 ** 32);
    const sampler = new TokenSampler(samplingParams(this.#samplingOf(job), seed), this.#model.nVocab);
    const choices = grammars.map((g, i) => ({
      sampler: i === 0 ? sampler : sampler.fork(seed + i),
      grammar: g,
    }));
    const queue = new EventQueue<ChatEvent>();
    const promptEntries: TokenLogprobInfo[] = [];
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
      checkpoints: turnStarts(tokens, this.#model.tokenize("<|im_start|>", true)),
      reusePrefix: job.promptLogprobs ? false : job.cachePrompt,
      onPromptLogits: job.promptLogprobs
        ? (position, logits) => {
          const lp = logprobsOf(logits, tokens[position + 1], job.logprobs ?? 0);
          promptEntries.push({
            ...this.tokenInfo(lp.token),
            logprob: lp.logprob,
            top: lp.top.map((t) => ({ ...this.tokenInfo(t.token), logprob: t.logprob })),
          });
        }
        : undefined,
      signal: stop.signal,
      onStart: () => (startedAt = performance.now()),
      onPrompt: (info) => {
        queue.push({ type: "prompt", ...info, ...(startedAt !== undefined ? { startedAt } : {}) });
        if (job.promptLogprobs) queue.push({ type: "prompt_logprobs", entries: promptEntries });
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
    return { token: new TextDecoder().decode(bytes), bytes: Array.from(bytes) };
  }

  /** The bytes of a generated token. */
  piece(token: number): Uint8Array {
    return this.#model.piece(token);
  }

  /**
   * The grammar a job needs: forced tool calls, or constrained JSON output; under `auto` a lazy
   * grammar for calls the model opens. With thinking, a reasoning block may precede. Built once per
   * distinct input ({@link #plan}) and parsed by llama.cpp off the event loop.
   */
  async #grammar(job: ChatJob, inThink: boolean, thinking: boolean, signal: AbortSignal) {
    const plan = await this.#plan(job, inThink, thinking, signal);
    if (plan.kind === "none") return null;
    if (plan.kind === "refused") throw plan.error;
    const grammar = await GrammarConstraint.parse(this.#model, plan.text, plan.trigger);
    if (!grammar) {
      this.#log.error("llama.cpp rejected a generated grammar", { grammar: plan.text.slice(0, 2000) });
      throw new Error("the output grammar could not be built");
    }
    return grammar;
  }

  /**
   * What a job's grammar is, from the cache when the same inputs were seen before (the key is every
   * input the grammar depends on, as JSON: property order is part of it, as it orders the output).
   * Pattern automata are compiled between passes of the (synchronous) build, in slices that leave
   * the event loop free ({@link AutomatonCache.build}).
   */
  async #plan(job: ChatJob, inThink: boolean, thinking: boolean, signal: AbortSignal): Promise<GrammarPlan> {
    const forced = job.toolChoice === "required" || typeof job.toolChoice === "object";
    const mayCall = job.toolChoice === "auto" && job.tools.length > 0;
    // A forced call comes first, whatever the format; under auto a format allows a call or the format.
    const mode = forced
      ? "forced"
      : job.output.type !== "text"
      ? mayCall ? "call_or_output" : "output"
      : mayCall
      ? "auto"
      : undefined;
    if (!mode) return { kind: "none" };
    const key = JSON.stringify([
      mode,
      inThink,
      thinking,
      ...(mode === "output" || mode === "call_or_output" ? [job.output] : []),
      ...(mode === "output" ? [] : [
        job.toolChoice,
        job.parallelToolCalls,
        job.tools.map((t) => [t.name, t.parameters ?? null, t.strict ?? false]),
      ]),
    ]);
    const cached = this.#plans.get(key);
    if (cached) return cached;
    let plan: GrammarPlan;
    try {
      plan = await this.#automata.build(() => this.#buildPlan(job, mode, inThink, thinking), signal);
    } catch (e) {
      const error = e instanceof GrammarError ? toEngineError(e, null) : e;
      if (!(error instanceof EngineInputError)) throw error;
      plan = { kind: "refused", error };
    }
    this.#plans.set(key, plan, key.length + (plan.kind === "grammar" ? plan.text.length : 0));
    return plan;
  }

  /** One synchronous pass of building a job's grammar (see {@link #plan}). */
  #buildPlan(
    job: ChatJob,
    mode: "forced" | "output" | "call_or_output" | "auto",
    inThink: boolean,
    thinking: boolean,
  ): GrammarPlan {
    if (mode === "forced") {
      const tools = typeof job.toolChoice === "object"
        ? job.tools.filter((t) => t.name === (job.toolChoice as { name: string }).name)
        : job.tools;
      return { kind: "grammar", text: this.#callsGrammar(job, tools, inThink, thinking) };
    }
    if (mode === "output" || mode === "call_or_output") {
      const g = new JsonGrammar(new GbnfRules("", this.#automata));
      const param = job.output.type === "json_schema"
        ? "response_format.json_schema.schema"
        : "response_format";
      const payload = withParam(
        param,
        () =>
          job.output.type === "json_schema"
            ? g.schema(job.output.schema, param, "out")
            : g.schema({ type: "object" }, param, "out"),
      );
      const calls = mode === "call_or_output" ? this.#optionalCalls(g, job) : undefined;
      return {
        kind: "grammar",
        text: g.rules.text(
          `root ::= ${thinkPrefix(g, inThink, thinking)}${calls ? `( ${calls} | ${payload} )` : payload}`,
        ),
      };
    }
    let text: string;
    try {
      text = this.#callsGrammar(job, job.tools, false, false);
    } catch (e) {
      // `strict` promises the schema: a strict tool whose schema cannot be enforced is refused, as is
      // a schema past the work budget, whatever the tool.
      if (!(e instanceof EngineInputError) || job.tools.some((t) => t.strict)) throw e;
      if (e.code === "schema_too_large") throw e;
      // Otherwise `auto` promises no grammar: such calls are parsed from free text instead of failing.
      this.#log.debug("tool calls under auto are not grammar-constrained", { reason: e.message });
      return { kind: "none" };
    }
    const trigger = this.#openTokens.length === 1
      ? { tokens: this.#openTokens, patterns: [] }
      : { tokens: [], patterns: [`[\\s\\S]*?(${escapeRegExp(this.dialect.open)}[\\s\\S]*)`] };
    return { kind: "grammar", text, trigger };
  }

  /**
   * The calls an `auto` job with a response format may make instead of the format, in `g`; undefined
   * when their schemas cannot be enforced (then only the format is allowed; strict tools are refused).
   */
  #optionalCalls(g: JsonGrammar, job: ChatJob): string | undefined {
    try {
      return this.#callRules(g, job, job.tools);
    } catch (e) {
      if (!(e instanceof EngineInputError) || job.tools.some((t) => t.strict)) throw e;
      this.#log.debug("tool calls are not offered next to the response format", { reason: e.message });
      return undefined;
    }
  }

  /** One call (or, with parallel calls, up to MAX_PARALLEL_CALLS) of the given tools. */
  #callsGrammar(job: ChatJob, tools: EngineTool[], inThink: boolean, thinking: boolean): string {
    const g = new JsonGrammar(new GbnfRules("", this.#automata));
    return g.rules.text(`root ::= ${thinkPrefix(g, inThink, thinking)}${this.#callRules(g, job, tools)}`);
  }

  /** The call rules of `tools` in `g`: one call, or with parallel calls up to MAX_PARALLEL_CALLS. */
  #callRules(g: JsonGrammar, job: ChatJob, tools: EngineTool[]): string {
    const calls = tools.map((t) => {
      const i = job.tools.indexOf(t);
      const param = `tools[${i}].function.parameters`;
      return withParam(param, () => this.dialect.callRule(g, t, param, `t${i}`, this.#callTags));
    });
    const call = g.rules.add("call", calls.join(" | "));
    const more = job.parallelToolCalls ? ` ( "\\n" ${call} ){0,${MAX_PARALLEL_CALLS - 1}}` : "";
    return `${call}${more}`;
  }

  dispose(): Promise<void> {
    this.#template.dispose();
    this.#batch.free();
    this.#ctx.free();
    this.#model.free();
    return Promise.resolve();
  }
}

/** The reasoning a constrained answer may start with, as a grammar prefix. */
function thinkPrefix(g: JsonGrammar, inThink: boolean, thinking: boolean): string {
  if (!thinking && !inThink) return "";
  const reasoning = textWithout(g.rules, "reasoning", ["</think>", "<think>"]);
  const close = `${reasoning} "</think>" "\\n"{0,2} `;
  return inThink ? close : `( "<think>" ${close})? `;
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

/** Positions where a turn starts (`<|im_start|>`): good places for recurrent-state checkpoints. */
function turnStarts(tokens: readonly number[], marker: number[]): number[] {
  if (marker.length !== 1) return [];
  const out: number[] = [];
  tokens.forEach((t, i) => t === marker[0] && i > 0 && out.push(i));
  return out;
}

/** Runs `build`; an input error that names no request field is given `param`. */
function withParam<T>(param: string, build: () => T): T {
  try {
    return build();
  } catch (e) {
    if (e instanceof GrammarError) throw toEngineError(e, param);
    if (e instanceof EngineInputError && e.param === null) {
      throw new EngineInputError(e.message, param, e.code);
    }
    throw e;
  }
}

/** A schema the grammar package refused, as the engine reports bad input (a 400 naming `param`). */
function toEngineError(e: GrammarError, param: string | null): EngineInputError {
  return new EngineInputError(e.message, e.param ?? param, e.code);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
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

/** Turns one choice's tokens into events: text, stop sequences, reasoning, tool calls. */
class ChoiceOutput {
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
    readonly engine: LlamaChatEngine,
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
