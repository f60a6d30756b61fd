/**
 * GGUF embedding models: inputs from all requests share decodes as separate sequences of one
 * context. For last-token pooling (Qwen3-Embedding) only each input's last token has an output,
 * so the output buffer holds one row per input, not one per token, which bounds memory. Mean and
 * CLS pooling accumulate per-token states chunk by chunk.
 *
 * Requests share the engine by tokens (fair queueing): sequences and each step's tokens go, a
 * quantum at a time, to the request that has been fed the fewest tokens, counted from the
 * engine's virtual time when it came (the tokens each busy request would have had from an equal
 * share). So a one-word request gets a sequence and its tokens in the next step even while
 * max-size inputs hold the engine, long inputs advance in bounded chunks beside it, and a request
 * part-way through is never passed for good by a stream of newer ones.
 */
import type { EmbeddingEngine } from "../types.ts";
import type { LlamaLibrary } from "./ffi.ts";
import { nativeView } from "./ffi.ts";
import { Batch, type FlashAttention, type ModelPlacement, NativeContext, NativeModel } from "./native.ts";
import { Markup } from "../markup.ts";
import type { ComputeClient } from "../compute_share.ts";

/** How to load a GGUF embedding model. */
export interface LlamaEmbeddingOptions {
  modelPath: string;
  gpuLayers: number;
  /** Tensor overrides and multi-GPU split (llama.cpp model parameters). */
  placement?: ModelPlacement;
  threads: number;
  /** Longest input in tokens. */
  maxInputTokens: number;
  /** Pooling; default: the GGUF's, else last. */
  pooling?: "last" | "mean" | "cls";
  /** Inputs in flight at once (sequences of the context). */
  sequences?: number;
  /** Tokens per decode. */
  batchTokens?: number;
  /** Largest step run as one decode with outputs for every token (default: from the model's shape). */
  onePassTokens?: number;
  /** llama.cpp's flash attention (default `auto`). */
  flashAttention?: FlashAttention;
  /** The model's turn on the machine's compute (see compute_share.ts). */
  compute?: ComputeClient;
  /**
   * Short steps of fresh inputs in a second, small context that computes only up to the embeddings
   * (`#shortPass`): `auto` (default) when a probe decode at load is short enough for the JavaScript
   * thread, `on`, `off`.
   */
  shortPass?: "auto" | "on" | "off";
}

/** Counters for metrics and tests. */
export interface EmbeddingStats {
  tokensEvaluated: number;
  decodes: number;
  inputsDone: number;
  inputsInFlight: number;
  inputsQueued: number;
}

/** One request: its inputs share the engine with other requests' by tokens. */
interface Job {
  /** Tokens fed for it, counted from the engine's virtual time when it came. */
  served: number;
  /** Arrival order (ties go to the earlier request). */
  order: number;
  /** Inputs not yet in a sequence, in order. */
  queued: Input[];
  /** Inputs in sequences. */
  inFlight: number;
  signal?: AbortSignal;
}

interface Input {
  ids: readonly number[];
  /** Tokens fed so far. */
  fed: number;
  seq: number;
  job: Job;
  /** Admitted past a larger input waiting for KV cells: counts against what that one leaves free. */
  bypass: boolean;
  sum?: Float64Array;
  resolve: (v: Float32Array) => void;
  reject: (e: unknown) => void;
}

/** Sequences one request may not take: they stay free for the next request. */
const RESERVED_SEQS = 4;
/**
 * Tokens per step while several requests (or another model) share the machine: shorter steps,
 * sooner turns. A step is shared between requests by tokens (see {@link allocate}).
 */
const SHARED_STEP_TOKENS = 128;
/**
 * Tokens a request gets at a time while a step's tokens are dealt out: enough to finish a
 * sentence-sized input in one go (requests of equal size then finish one after another, as first
 * come first served, instead of all together at the end).
 */
const QUANTUM = 64;
/** Most tokens a request may be owed: one that could not run for a while does not then take over. */
const MAX_CREDIT = 128;
/**
 * A step of at most this many times (other parameters / vocabulary projection) tokens may run as one
 * decode with embedding output on, which projects every token onto the vocabulary (llama.cpp outputs
 * every token of an embedding batch, as llama-server's pooled path does); a longer one runs its bodies
 * without outputs and then its last tokens. Which is cheaper depends on the hardware, not only the
 * shape: on the quiet AMX Xeon one pass won below ~16 tokens on a 0.6B shape, on the 2-vCPU EPYC
 * (AVX-512, no AMX) two decodes won at 9 tokens (151 against 220 ms of CPU, one thread), and a GPU
 * need agree with neither. So steps of up to {@link MEASURED_STEP} tokens choose by the decode times
 * measured on this machine (`#preferOnePass`); this rule bounds longer ones.
 */
const ONE_PASS_FACTOR = 5;
/** Steps of at most this many tokens choose one pass or two by measured decode times (exact kinds, pace.ts). */
const MEASURED_STEP = 16;
/** Samples of each path a step shape gets before the measured choice holds. */
const FIRST_SAMPLES = 2;
/** Then every this many-th step of a shape takes the other path, to renew its figure. */
const RECHECK_EVERY = 64;
/** Inputs at least this long always decode with every thread (see `#threadsFor`). */
const FEW_THREADS_TOKENS = 256;
/** Most tokens of a step run in the short context (`#shortPass`), and most inputs. */
const SHORT_PASS_TOKENS = MEASURED_STEP;
const SHORT_PASS_INPUTS = 16;
/** Probe decodes at load that decide whether the short context is made (`auto`). */
const SHORT_PASS_PROBES = 4;
/**
 * The short context is made when the probes' least is at most this many times the longest decode the
 * JavaScript thread takes (pace.ts, 6 ms): it tells a small model, or a GPU, slowed by a busy machine
 * (tiny-embed: 0.4-0.5 ms quiet, past 6 on a 2-core machine at load 5) from a large model on a CPU (tens
 * to thousands of ms). Its unmeasured shapes are tried when the least is within twice that time, else
 * once the main context's own decodes of the step are ({@link shortPassDue}), then go by their own medians.
 */
const SHORT_PASS_MADE = 10;
const SHORT_PASS_TRIED = 2;
/** Extra KV cells beyond the longest input, so short inputs are admitted beside a long one. */
const RESERVE = 2048;
const POOLING_IDS: Record<string, "mean" | "cls" | "last"> = { "1": "mean", "2": "cls", "3": "last" };

/** One context; inputs of all requests are interleaved in its sequences. */
export class LlamaEmbeddingEngine implements EmbeddingEngine {
  readonly nativeDims: number;
  readonly vocabSize: number;
  readonly pooling: "last" | "mean" | "cls";
  readonly #model: NativeModel;
  readonly #ctx: NativeContext;
  /** The short context (see `#shortPass`), if any. */
  readonly #short?: NativeContext;
  /** Its shapes not yet measured may be tried at once (the probes at load were short enough). */
  readonly #shortTried: boolean;
  /** Decodes in the short context. */
  #shortDecodes = 0;
  /** The context of the last decode (its threads are the ones to put to sleep when idle). */
  #last: NativeContext;
  readonly #batch: Batch;
  /** The vocabulary's markup: inputs are text, none of it becomes a special token. */
  readonly #markup: Markup;
  /** Steps of at most this many tokens, all finishing their inputs, may take one decode. */
  readonly #onePassTokens: number;
  /** One pass or two chosen by measured decode times (no `onePassTokens` given). */
  readonly #measured: boolean;
  /** Short steps taken so far, by shape (tokens, inputs). */
  readonly #shapes = new Map<string, number>();
  /** Requests with inputs queued or in flight, in arrival order. */
  #jobs: Job[] = [];
  #jobCount = 0;
  /** Tokens an equal share has given each busy request so far (grows by a step's tokens / requests). */
  #vclock = 0;
  readonly #active: Input[] = [];
  readonly #freeSeqs: number[];
  #kvUsed = 0;
  #running = false;
  readonly stats: EmbeddingStats = {
    tokensEvaluated: 0,
    decodes: 0,
    inputsDone: 0,
    inputsInFlight: 0,
    inputsQueued: 0,
  };

  private constructor(
    model: NativeModel,
    ctx: NativeContext,
    batch: Batch,
    pooling: "last" | "mean" | "cls",
    markup: Markup,
    onePassTokens?: number,
    short?: { ctx: NativeContext; probeMs: number },
  ) {
    this.#model = model;
    this.#ctx = ctx;
    this.#last = ctx;
    this.#short = short?.ctx;
    this.#shortTried = short !== undefined && short.probeMs <= SHORT_PASS_TRIED * short.ctx.syncDecodeMs;
    this.#batch = batch;
    this.#markup = markup;
    this.pooling = pooling;
    this.nativeDims = model.nEmbd;
    this.vocabSize = model.nVocab;
    this.#freeSeqs = Array.from({ length: ctx.nSeqMax }, (_, i) => i);
    const head = model.nVocab * model.nEmbd;
    // Parameters besides the token table (counted once: tied or not, it is the head's size).
    this.#measured = onePassTokens === undefined;
    this.#onePassTokens = onePassTokens ??
      Math.max(MEASURED_STEP, Math.floor(ONE_PASS_FACTOR * Math.max(0, model.nParams - head) / head));
    if (model.eos < 0) throw new Error("the embedding model has no end-of-text token");
  }

  /**
   * Loads the model and its context.
   *
   * @example
   * ```ts
   * import type { LlamaLibrary } from "./ffi.ts";
   * async function open(lib: LlamaLibrary, modelPath: string) {
   *   return await LlamaEmbeddingEngine.load(lib, { modelPath, gpuLayers: 0, threads: 2, maxInputTokens: 8192 });
   * }
   * ```
   */
  static async load(lib: LlamaLibrary, opts: LlamaEmbeddingOptions): Promise<LlamaEmbeddingEngine> {
    const model = await NativeModel.load(lib, opts.modelPath, opts.gpuLayers, opts.placement);
    try {
      const arch = model.meta("general.architecture");
      const pooling = opts.pooling ?? POOLING_IDS[model.meta(`${arch}.pooling_type`) ?? ""] ?? "last";
      // Mean and CLS pooling read every token's state: smaller chunks bound the outputs' memory.
      const batchTokens = opts.batchTokens ?? (pooling === "last" ? 1024 : 256);
      const sequences = opts.sequences ?? 64;
      const ctx = await NativeContext.create(model, {
        nCtx: opts.maxInputTokens + RESERVE,
        nBatch: batchTokens,
        nUbatch: batchTokens,
        nSeqMax: sequences,
        threads: opts.threads,
        flashAttention: opts.flashAttention,
        embeddings: false,
        pooling: "none",
        kvUnified: true,
        compute: opts.compute,
      });
      const batch = new Batch(lib, batchTokens);
      let short: { ctx: NativeContext; probeMs: number } | undefined;
      try {
        short = await LlamaEmbeddingEngine.#shortContext(model, ctx, batch, opts);
        const markup = new Markup((await model.scanVocabulary()).markup);
        return new LlamaEmbeddingEngine(model, ctx, batch, pooling, markup, opts.onePassTokens, short);
      } catch (e) {
        short?.ctx.free();
        batch.free();
        ctx.free();
        throw e;
      }
    } catch (e) {
      model.free();
      throw e;
    }
  }

  /**
   * The short context (see `#shortPass`) and the least of a few probe decodes of
   * {@link SHORT_PASS_TOKENS} tokens in the main context (off this thread, no outputs, all threads and
   * one in turn: about the short context's work), 0 with `on`. With `auto` it is made when that is
   * within {@link SHORT_PASS_MADE} times a decode on the JavaScript thread (pace.ts): a large model on
   * a CPU keeps the main context's path, off the thread. With `auto`, only for a model on the CPU: on a
   * GPU the projection of a step's last tokens is a sliver of the step, while the callback costs about
   * a microsecond per graph node (~1,100 on an 8B model) and syncs the device at the norm, and the
   * memory plan (src/plan/memory.ts), which matters there, does not count the second context.
   */
  static async #shortContext(
    model: NativeModel,
    ctx: NativeContext,
    batch: Batch,
    opts: LlamaEmbeddingOptions,
  ): Promise<{ ctx: NativeContext; probeMs: number } | undefined> {
    const mode = opts.shortPass ?? "auto";
    if (mode === "off" || ctx.syncDecodeMs <= 0 || (mode === "auto" && opts.gpuLayers !== 0)) {
      return undefined;
    }
    let probeMs = 0;
    if (mode === "auto") {
      probeMs = Infinity;
      for (let i = 0; i < SHORT_PASS_PROBES && probeMs > ctx.syncDecodeMs; i++) {
        batch.clear();
        for (let p = 0; p < SHORT_PASS_TOKENS; p++) batch.add(model.eos, p, 0, false);
        ctx.setEmbeddings(false);
        const start = performance.now();
        await ctx.decode(batch, i % 2 === 0 ? ctx.threads : 1);
        const ms = performance.now() - start;
        ctx.removeTokens(0, -1, -1);
        probeMs = Math.min(probeMs, ms);
        if (ms > 10 * SHORT_PASS_MADE * ctx.syncDecodeMs) break; // a large model: no need to ask again
      }
      batch.clear();
      if (probeMs > SHORT_PASS_MADE * ctx.syncDecodeMs) return undefined;
    }
    const short = await NativeContext.create(model, {
      nCtx: 256,
      nBatch: SHORT_PASS_TOKENS,
      nUbatch: SHORT_PASS_TOKENS,
      nSeqMax: SHORT_PASS_INPUTS,
      threads: opts.threads,
      flashAttention: opts.flashAttention,
      embeddings: true,
      pooling: "none",
      kvUnified: true,
      compute: opts.compute,
      stopAtEmbeddings: true,
    });
    try {
      batch.clear();
      for (let p = 0; p < SHORT_PASS_TOKENS; p++) batch.add(model.eos, p, 0, true);
      await short.warmUp(batch);
      short.clear();
      batch.clear();
    } catch (e) {
      short.free();
      throw e;
    }
    return { ctx: short, probeMs };
  }

  counters(): Record<string, number> {
    return {
      tokens_evaluated: this.stats.tokensEvaluated,
      decodes: this.stats.decodes,
      decodes_fewer_threads: this.#ctx.decodes.fewerThreads + (this.#short?.decodes.fewerThreads ?? 0),
      decodes_short_pass: this.#shortDecodes,
      inputs_embedded: this.stats.inputsDone,
    };
  }

  async tokenize(text: string, limit?: number): Promise<number[]> {
    // Long texts on a thread of their own (one input of 7.8 MB held the event loop for 3.5 s), many
    // fragments between turns of the event loop.
    const { tokens } = await this.#model.tokenizePieces(this.#markup.fragments(text), { limit });
    // The ids are this call's own: the end token goes on in place (a copy of a 7.8 MB text's 3.9 M
    // ids was one block of the event loop).
    return this.#appendEnd(tokens);
  }

  detokenize(ids: readonly number[], signal?: AbortSignal): Promise<string> {
    return this.#model.detokenizeInSlices(ids, signal);
  }

  completeTokens(ids: readonly number[]): number[] {
    return this.#appendEnd([...ids]);
  }

  /** `ids` with the end-of-text token whose hidden state Qwen3-Embedding reads (last-token pooling). */
  #appendEnd(ids: number[]): number[] {
    if (this.pooling === "last" && ids.at(-1) !== this.#model.eos) ids.push(this.#model.eos);
    return ids;
  }

  embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]> {
    signal?.throwIfAborted();
    const tooLong = sequences.find((s) => s.length > this.#ctx.nCtx - RESERVE + 1);
    if (tooLong) return Promise.reject(new Error(`an input of ${tooLong.length} tokens exceeds the context`));
    if (sequences.length === 0) return Promise.resolve([]);
    // A newcomer starts at the virtual time: ahead of requests that have had more than an equal
    // share, behind those that have had less.
    const job: Job = {
      served: this.#vclock,
      order: this.#jobCount++,
      queued: [],
      inFlight: 0,
      signal,
    };
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) =>
        job.queued.push({ ids, fed: 0, seq: -1, job, bypass: false, resolve, reject })
      )
    );
    // Shortest first: they free their sequences soonest.
    job.queued.sort((a, b) => a.ids.length - b.ids.length);
    this.#jobs.push(job);
    this.stats.inputsQueued += sequences.length;
    if (!this.#running) void this.#loop();
    return Promise.all(results);
  }

  async #loop(): Promise<void> {
    this.#running = true;
    // The flag is cleared in the same turn as the last check: an input queued after it starts a new loop.
    try {
      while (this.#jobs.length > 0) {
        this.#dropCancelled();
        this.#admit();
        if (this.#active.length === 0) continue;
        try {
          if (await this.#shortPass()) continue;
          if (this.pooling === "last") await this.#stepLast();
          else await this.#stepAll();
        } catch (e) {
          for (const input of [...this.#active]) this.#done(input, undefined, e);
        }
      }
    } finally {
      this.#running = false;
      this.#last.idle();
    }
  }

  /** Rejects the inputs of requests whose client left, queued or in flight. */
  #dropCancelled() {
    for (const job of this.#jobs) {
      if (!job.signal?.aborted) continue;
      for (const input of job.queued) input.reject(job.signal.reason);
      this.stats.inputsQueued -= job.queued.length;
      job.queued = [];
    }
    for (const input of [...this.#active]) {
      if (input.job.signal?.aborted) this.#done(input, undefined, input.job.signal.reason);
    }
    this.#jobs = this.#jobs.filter((j) => j.queued.length > 0 || j.inFlight > 0);
  }

  /**
   * Moves queued inputs into free sequences, each time from the request first in line (#owed),
   * while their tokens fit in the KV cache; 4 sequences stay free of any one request for the
   * next one. An input that does not fit yet does not hold up the others: smaller ones go past it,
   * but only into the cells it will leave free once the inputs before it finish, so it waits for
   * those alone, never for a stream of small ones.
   */
  #admit() {
    const nCtx = this.#ctx.nCtx;
    const skipped = new Set<Job>();
    let blocked: Input | undefined;
    let bypassKv = this.#active.reduce((n, i) => n + (i.bypass ? i.ids.length : 0), 0);
    while (this.#freeSeqs.length > 0) {
      let job: Job | undefined;
      for (const j of this.#jobs) {
        if (j.queued.length === 0 || skipped.has(j)) continue;
        const [a, b] = [this.#owed(j), job && this.#owed(job)];
        if (!job || a < b! || (a === b && j.order < job.order)) job = j;
      }
      if (!job) break;
      const next = job.queued[0];
      const len = next.ids.length;
      const fits = this.#active.length === 0 || this.#kvUsed + len <= nCtx;
      if (job.inFlight >= this.#ctx.nSeqMax - RESERVED_SEQS || !fits) {
        if (!fits) blocked ??= next;
        skipped.add(job);
        continue;
      }
      if (blocked) {
        if (bypassKv + len > nCtx - blocked.ids.length) {
          skipped.add(job);
          continue;
        }
        next.bypass = true;
        bypassKv += len;
      }
      job.queued.shift();
      job.inFlight++;
      next.seq = this.#freeSeqs.pop()!;
      this.#kvUsed += len;
      this.#active.push(next);
      this.stats.inputsQueued--;
    }
    this.stats.inputsInFlight = this.#active.length;
  }

  /** A request's place in line: its tokens fed, but never more than {@link MAX_CREDIT} behind. */
  #owed(job: Job): number {
    return Math.max(job.served, this.#vclock - MAX_CREDIT);
  }

  /** Charges a step's tokens to their requests and moves the virtual time on by an equal share. */
  #charge(tokens: Map<Job, number>) {
    let total = 0;
    for (const [job, n] of tokens) {
      job.served = this.#owed(job) + n;
      total += n;
    }
    if (this.#jobs.length > 0) this.#vclock += total / this.#jobs.length;
  }

  /** Step tokens while other requests or models wait: short steps, sooner turns. */
  #stepLimit(): number {
    const shared = this.#jobs.length > 1 || (this.#ctx.compute?.contended() ?? false);
    return shared ? Math.min(this.#batch.capacity, SHARED_STEP_TOKENS) : this.#batch.capacity;
  }

  /**
   * Body tokens without outputs, dealt out between requests by tokens, then the last tokens of
   * finished bodies with embeddings on (fewest-served requests first). Two decodes, not one: with
   * embeddings on llama.cpp sizes its buffers for a batch of outputs (measured: +890 MiB, kept, for
   * an 8192-token input in one pass).
   */
  async #stepLast() {
    if (await this.#onePass()) return;
    const batch = this.#batch;
    const limit = this.#stepLimit();
    const plan = allocate(this.#active, limit, (i) => i.ids.length - 1 - i.fed, (j) => this.#owed(j));
    batch.clear();
    for (const [input, n] of plan) {
      for (let i = input.fed; i < input.fed + n; i++) batch.add(input.ids[i], i, input.seq, false);
    }
    if (batch.size > 0) {
      this.#ctx.setEmbeddings(false);
      await this.#decode(this.#threadsFor(batch.size, false, plan.keys()));
      for (const [input, n] of plan) input.fed += n;
      this.#charge(perJob(plan));
      // A request gone during that decode gets no output decode: nothing starts for it after its client left.
      this.#dropCancelled();
    }
    const ready = this.#active.filter((i) => i.fed === i.ids.length - 1)
      .sort((a, b) => this.#owed(a.job) - this.#owed(b.job) || a.job.order - b.job.order)
      .slice(0, limit);
    if (ready.length === 0) return;
    batch.clear();
    const outs = ready.map((input) => batch.add(input.ids[input.fed], input.fed, input.seq, true));
    this.#ctx.setEmbeddings(true);
    await this.#decode(this.#threadsFor(batch.size, true, ready));
    this.#charge(perJob(new Map(ready.map((input) => [input, 1]))));
    ready.forEach((input, k) => {
      input.fed++;
      this.#done(input, this.#row(outs[k]).slice());
    });
  }

  /**
   * A short step of fresh inputs (at most {@link SHORT_PASS_TOKENS} tokens, nothing fed yet: a short
   * request alone, say) as one decode in the short context, on this thread: every token an output, and
   * the graph computed only up to the embeddings (native.ts, `stopAtEmbeddings`), so none of the
   * vocabulary projection the main context's output decodes pay. On tiny-embed (2-vCPU EPYC, one
   * thread) a 7-token input took 0.6-0.75 ms so, against 2.0 in two decodes (1.3 of it the projection of
   * its last token) and 5.3 in one; the vectors are the same bits. False when the step does not
   * qualify, or its decodes here were measured too long for this thread (then the main context's path).
   */
  async #shortPass(): Promise<boolean> {
    const short = this.#short;
    if (!short || this.#active.length > SHORT_PASS_INPUTS) return false;
    let tokens = 0;
    for (const input of this.#active) {
      if (input.fed !== 0) return false;
      tokens += input.ids.length;
    }
    if (tokens > SHORT_PASS_TOKENS) return false;
    const threads = this.#threadsFor(tokens, true, this.#active, short);
    const measured = short.expectedDecode(tokens, true, threads);
    const key = `short:${tokens}`;
    const n = (this.#shapes.get(key) ?? 0) + 1;
    this.#shapes.set(key, n);
    const due = shortPassDue({
      samples: measured.samples,
      median: measured.median,
      n,
      tried: this.#shortTried,
      mainMs: measured.samples < 2 ? this.#mainStepMs(tokens, this.#active.length) : NaN,
      limitMs: short.syncDecodeMs,
    });
    if (!due) return false;
    const inputs = [...this.#active];
    const batch = this.#batch;
    batch.clear();
    const at = inputs.map((input, k) => {
      const first = batch.size;
      for (let i = 0; i < input.ids.length; i++) batch.add(input.ids[i], i, k, true);
      return first;
    });
    this.stats.decodes++;
    this.stats.tokensEvaluated += batch.size;
    this.#shortDecodes++;
    this.#last = short;
    const vectors: Float32Array[] = [];
    try {
      await short.decode(batch, threads);
      inputs.forEach((input, k) => vectors.push(this.#pooled(short, at[k], input.ids.length)));
    } finally {
      short.clear();
    }
    this.#charge(perJob(new Map(inputs.map((input) => [input, input.ids.length]))));
    inputs.forEach((input, k) => {
      input.fed = input.ids.length;
      this.#done(input, vectors[k]);
    });
    return true;
  }

  /**
   * What a short step of `tokens` tokens finishing `inputs` inputs takes in the main context now (the
   * median of its recent decodes, NaN: not measured): its one-pass decode (with the projection: more
   * than the short context's work), or its bodies' decode without outputs scaled to `tokens` tokens,
   * whichever is less. The question of the probes at load, asked again with live figures.
   */
  #mainStepMs(tokens: number, inputs: number): number {
    const one = this.#bestDecode(tokens, true);
    const body = tokens - inputs;
    const bodies = body > 0 ? this.#bestDecode(body, false) : { median: NaN, samples: 0 };
    const ms = [
      one.samples > 0 ? one.median : NaN,
      bodies.samples > 0 ? bodies.median * tokens / body : NaN,
    ].filter((x) => !Number.isNaN(x));
    return ms.length > 0 ? Math.min(...ms) : NaN;
  }

  /** The pooled embedding of an input whose `n` token states start at output `first` of `ctx` (a copy). */
  #pooled(ctx: NativeContext, first: number, n: number): Float32Array {
    if (this.pooling === "last") return this.#row(first + n - 1, ctx).slice();
    if (this.pooling === "cls") return this.#row(first, ctx).slice();
    const sum = new Float64Array(this.nativeDims);
    for (let i = 0; i < n; i++) {
      const row = this.#row(first + i, ctx);
      for (let d = 0; d < row.length; d++) sum[d] += row[d];
    }
    return Float32Array.from(sum, (v) => v / n);
  }

  /**
   * Short work (a lone short input, say) in one decode with embedding output on: every token is
   * projected onto the vocabulary, which costs less than a second decode when the tokens are few.
   * False when the step is too large or an input would not finish in it.
   */
  async #onePass(): Promise<boolean> {
    const remaining = this.#active.reduce((n, i) => n + i.ids.length - i.fed, 0);
    if (remaining > this.#onePassTokens || remaining > this.#batch.capacity) return false;
    if (!this.#preferOnePass(remaining, this.#active.length)) return false;
    const batch = this.#batch;
    batch.clear();
    const outs = this.#active.map((input) => {
      let out = -1;
      for (let i = input.fed; i < input.ids.length; i++) {
        out = batch.add(input.ids[i], i, input.seq, i === input.ids.length - 1);
      }
      return { input, out };
    });
    this.#ctx.setEmbeddings(true);
    await this.#decode(this.#threadsFor(batch.size, true, this.#active));
    this.#charge(perJob(new Map(this.#active.map((input) => [input, input.ids.length - input.fed]))));
    for (const { input, out } of outs) {
      input.fed = input.ids.length;
      this.#done(input, this.#row(out).slice());
    }
    return true;
  }

  /**
   * Whether a short step of `tokens` tokens finishing `inputs` inputs runs as one decode: from the
   * measured times of this context's decodes (pace.ts: one pass = `tokens` with outputs; two = the
   * bodies without, then `inputs` with), each path tried {@link FIRST_SAMPLES} times first and the
   * other path again every {@link RECHECK_EVERY}-th step. The paths are compared by the median of each
   * kind's recent times (pace.ts), not their averages nor their least: on a shared 2-core machine a
   * decode's wall time swung 2-100× with the neighbours' load, and averages picked the one-pass path
   * for half the requests of a 7-token input on tiny-embed, which costs 3.5× the CPU of the two
   * decodes there (5.6 against 1.6 ms, one thread); the least of a kind's times made the choice swing
   * with one lucky sample. Longer steps, and engines given `onePassTokens`, keep the shape rule.
   */
  #preferOnePass(tokens: number, inputs: number): boolean {
    if (!this.#measured || tokens > MEASURED_STEP) return true;
    const body = tokens - inputs;
    if (body === 0) return true; // only last tokens: one decode either way
    const key = `${tokens}:${inputs}`;
    const n = (this.#shapes.get(key) ?? 0) + 1;
    this.#shapes.set(key, n);
    const one = this.#bestDecode(tokens, true);
    const split = [this.#bestDecode(body, false), this.#bestDecode(inputs, true)];
    if (one.samples < FIRST_SAMPLES) return true;
    if (split.some((s) => s.samples < FIRST_SAMPLES)) return false;
    const choice = one.median <= split[0].median + split[1].median;
    return n % RECHECK_EVERY === 0 ? !choice : choice;
  }

  /**
   * CPU threads for a decode of `tokens` tokens: all of the context's, or for a short one (at most
   * {@link MEASURED_STEP} tokens) one thread when its measured times are lower. A few-token decode of a
   * small model is a few hundred graph nodes of microseconds each, and every node ends at a barrier
   * of all threads: on the 2-vCPU EPYC a short tiny-embed embedding spent three quarters of its CPU
   * spinning at those barriers with two threads. Both counts are tried {@link FIRST_SAMPLES} times
   * first, the other one again every {@link RECHECK_EVERY}-th decode of the shape, and compared by the
   * median of their recent times (pace.ts: the least of them swung with one lucky sample). Only for inputs
   * under {@link FEW_THREADS_TOKENS} tokens: there both counts give the same bits (llama.cpp's CPU
   * flash attention splits a long KV range between its threads, which rounds differently).
   */
  #threadsFor(tokens: number, embeddings: boolean, inputs: Iterable<Input>, ctx = this.#ctx): number {
    const all = ctx.threads;
    if (!this.#measured || all === 1 || tokens > MEASURED_STEP) return all;
    for (const input of inputs) if (input.ids.length >= FEW_THREADS_TOKENS) return all;
    const key = `threads:${ctx === this.#ctx ? "" : "short:"}${tokens}:${embeddings}`;
    const n = (this.#shapes.get(key) ?? 0) + 1;
    this.#shapes.set(key, n);
    const many = ctx.expectedDecode(tokens, embeddings, all);
    const one = ctx.expectedDecode(tokens, embeddings, 1);
    if (many.samples < FIRST_SAMPLES) return all;
    if (one.samples < FIRST_SAMPLES) return 1;
    const choice = one.median < many.median ? 1 : all;
    return n % RECHECK_EVERY === 0 ? (choice === 1 ? all : 1) : choice;
  }

  /** The measured time of a short decode with the thread count {@link #threadsFor} prefers. */
  #bestDecode(tokens: number, embeddings: boolean): { median: number; samples: number } {
    const many = this.#ctx.expectedDecode(tokens, embeddings);
    const one = this.#ctx.expectedDecode(tokens, embeddings, 1);
    return one.samples >= FIRST_SAMPLES && one.median < many.median ? one : many;
  }

  /** Every token with its state (mean or CLS pooling), chunk by chunk, dealt out by tokens. */
  async #stepAll() {
    const batch = this.#batch;
    batch.clear();
    const plan = allocate(this.#active, this.#stepLimit(), (i) => i.ids.length - i.fed, (j) => this.#owed(j));
    const taken: { input: Input; from: number; to: number; at: number }[] = [];
    for (const [input, n] of plan) {
      const at = batch.size;
      for (let i = input.fed; i < input.fed + n; i++) batch.add(input.ids[i], i, input.seq, true);
      taken.push({ input, from: input.fed, to: input.fed + n, at });
    }
    this.#ctx.setEmbeddings(true);
    await this.#decode(this.#threadsFor(batch.size, true, plan.keys()));
    this.#charge(perJob(plan));
    for (const t of taken) {
      const input = t.input;
      input.sum ??= new Float64Array(this.nativeDims);
      for (let i = t.from; i < t.to; i++) {
        if (this.pooling === "cls" && i > 0) break;
        const row = this.#row(t.at + (i - t.from));
        for (let d = 0; d < row.length; d++) input.sum[d] += row[d];
      }
      input.fed = t.to;
      if (input.fed === input.ids.length) {
        const n = this.pooling === "cls" ? 1 : input.ids.length;
        this.#done(input, Float32Array.from(input.sum, (v) => v / n));
      }
    }
  }

  async #decode(threads: number) {
    this.stats.decodes++;
    this.stats.tokensEvaluated += this.#batch.size;
    this.#last = this.#ctx;
    await this.#ctx.decode(this.#batch, threads);
  }

  /** The output state of batch position `i` of `ctx` (a view). */
  #row(i: number, ctx = this.#ctx): Float32Array {
    const ptr = ctx.lib.symbols.llama_get_embeddings_ith(ctx.ptr, i);
    return nativeView(Float32Array, ptr, this.nativeDims);
  }

  #done(input: Input, vector?: Float32Array, error?: unknown) {
    const i = this.#active.indexOf(input);
    if (i >= 0) this.#active.splice(i, 1);
    this.#ctx.removeTokens(input.seq, -1, -1);
    this.#freeSeqs.push(input.seq);
    this.#kvUsed -= input.ids.length;
    input.job.inFlight--;
    this.stats.inputsInFlight = this.#active.length;
    if (vector) {
      this.stats.inputsDone++;
      input.resolve(vector);
    } else input.reject(error);
  }

  async dispose(): Promise<void> {
    while (this.#running) await new Promise((r) => setTimeout(r, 10));
    this.#batch.free();
    this.#short?.free();
    this.#ctx.free();
    this.#model.free();
  }
}

/**
 * Deals `limit` tokens out between the requests of `active` inputs: each time a quantum to the
 * request first in line (`owed`, counting this step's tokens), within it to its input with the
 * least work left (`remaining`). Returns the tokens per input, in sequence order.
 */
function allocate(
  active: readonly Input[],
  limit: number,
  remaining: (i: Input) => number,
  owed: (j: Job) => number,
): Map<Input, number> {
  const plan = new Map<Input, number>();
  const extra = new Map<Job, number>();
  const open = new Map<Job, Input[]>();
  for (const input of active) {
    if (remaining(input) <= 0) continue;
    const list = open.get(input.job) ?? [];
    list.push(input);
    open.set(input.job, list);
  }
  for (const list of open.values()) list.sort((a, b) => remaining(a) - remaining(b));
  let room = limit;
  while (room > 0 && open.size > 0) {
    let job: Job | undefined;
    let least = Infinity;
    for (const j of open.keys()) {
      const s = owed(j) + (extra.get(j) ?? 0);
      if (s < least || (s === least && j.order < job!.order)) [job, least] = [j, s];
    }
    const list = open.get(job!)!;
    const input = list[0];
    const take = Math.min(QUANTUM, room, remaining(input) - (plan.get(input) ?? 0));
    plan.set(input, (plan.get(input) ?? 0) + take);
    extra.set(job!, (extra.get(job!) ?? 0) + take);
    room -= take;
    if (plan.get(input) === remaining(input)) list.shift();
    if (list.length === 0) open.delete(job!);
  }
  return new Map([...plan].sort(([a], [b]) => a.seq - b.seq));
}

/** The tokens of a step's plan per request. */
function perJob(plan: Map<Input, number>): Map<Job, number> {
  const out = new Map<Job, number>();
  for (const [input, n] of plan) out.set(input.job, (out.get(input.job) ?? 0) + n);
  return out;
}

/** What decides whether a short step runs in the short context (see {@link shortPassDue}). */
export interface ShortPassFigures {
  /** Decodes of the step's shape measured in the short context, and their median (ms; pace.ts). */
  samples: number;
  median: number;
  /** The shape's short steps so far, this one included. */
  n: number;
  /** The probes at load were short enough to try unmeasured shapes at once. */
  tried: boolean;
  /** What the step takes in the main context now (ms, NaN: not measured; `#mainStepMs`). */
  mainMs: number;
  /** The longest decode for the JavaScript thread (pace.ts). */
  limitMs: number;
}

/**
 * Whether a short step runs in the short context, on the JavaScript thread. A shape measured there
 * (its first decode paid one-time costs: judged from the second on) goes by its median: too long for
 * this thread, the main context's path, tried here again every {@link RECHECK_EVERY}-th time. A shape
 * not measured yet is tried when the probes at load were within {@link SHORT_PASS_TRIED} times the
 * thread's limit, or else once the main context's live figures for the step are (a machine busy at
 * load: the spec-embed stand-in's probes took 8.6-13.3 ms against a 12 ms cut, and with the cut passed
 * its short context, made, was never used).
 *
 * @example
 * ```ts
 * shortPassDue({ samples: 0, median: NaN, n: 1, tried: false, mainMs: 3, limitMs: 6 }); // true
 * ```
 */
export function shortPassDue(f: ShortPassFigures): boolean {
  if (f.samples < 2) return f.tried || f.mainMs <= SHORT_PASS_TRIED * f.limitMs;
  return f.median <= f.limitMs || f.n % RECHECK_EVERY === 0;
}
