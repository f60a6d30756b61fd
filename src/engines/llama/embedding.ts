/**
 * GGUF embedding models: inputs from all requests share decodes as separate sequences of one
 * context. For last-token pooling (Qwen3-Embedding) only each input's last token has an output,
 * so the output buffer holds one row per input, not one per token, which bounds memory. Mean and CLS pooling accumulate per-token states chunk by chunk.
 */
import type { EmbeddingEngine } from "../types.ts";
import type { LlamaLibrary } from "./ffi.ts";
import { nativeView } from "./ffi.ts";
import { Batch, type FlashAttention, type ModelPlacement, NativeContext, NativeModel } from "./native.ts";
import { Markup } from "../markup.ts";

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
}

/** Counters for metrics and tests. */
export interface EmbeddingStats {
  tokensEvaluated: number;
  decodes: number;
  inputsDone: number;
  inputsInFlight: number;
  inputsQueued: number;
}

interface Input {
  ids: readonly number[];
  /** Tokens fed so far. */
  fed: number;
  seq: number;
  /** The request it belongs to: sequences are shared fairly between requests. */
  job: object;
  sum?: Float64Array;
  signal?: AbortSignal;
  resolve: (v: Float32Array) => void;
  reject: (e: unknown) => void;
}

/** Sequences one request may not take: they stay free for the next request. */
const RESERVED_SEQS = 4;
/** Body tokens per step while several requests share the engine: shorter steps, sooner turns. */
const SHARED_STEP_TOKENS = 128;
/**
 * A step of at most this many times (other parameters / vocabulary projection) tokens runs as one
 * decode with embedding output on, which projects every token onto the vocabulary; a longer one runs
 * its bodies without outputs and then its last tokens. Fitted on the bench and spec stand-ins: one
 * pass wins below ~16 tokens on a 0.6B shape (a second decode costs more than projecting a few
 * tokens) and never on a tiny model with a 4096-wide, 151,669-row head.
 */
const ONE_PASS_FACTOR = 5;
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
  readonly #batch: Batch;
  /** The vocabulary's markup: inputs are text, none of it becomes a special token. */
  readonly #markup: Markup;
  /** Steps of at most this many tokens, all finishing their inputs, take one decode. */
  readonly #onePassTokens: number;
  readonly #queue: Input[] = [];
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
  ) {
    this.#model = model;
    this.#ctx = ctx;
    this.#batch = batch;
    this.#markup = markup;
    this.pooling = pooling;
    this.nativeDims = model.nEmbd;
    this.vocabSize = model.nVocab;
    this.#freeSeqs = Array.from({ length: ctx.nSeqMax }, (_, i) => i);
    const head = model.nVocab * model.nEmbd;
    // Parameters besides the token table (counted once: tied or not, it is the head's size).
    this.#onePassTokens = onePassTokens ??
      Math.floor(ONE_PASS_FACTOR * Math.max(0, model.nParams - head) / head);
    if (model.eos < 0) throw new Error("the embedding model has no end-of-text token");
  }

  /**
   * Loads the model and its context.
   *
   * @example
   * ```ts
   * const engine = await LlamaEmbeddingEngine.load(lib, { modelPath, gpuLayers: 0, threads: 2, maxInputTokens: 8192 });
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
      });
      const markup = new Markup((await model.scanVocabulary()).markup);
      return new LlamaEmbeddingEngine(
        model,
        ctx,
        new Batch(lib, batchTokens),
        pooling,
        markup,
        opts.onePassTokens,
      );
    } catch (e) {
      model.free();
      throw e;
    }
  }

  counters(): Record<string, number> {
    return {
      tokens_evaluated: this.stats.tokensEvaluated,
      decodes: this.stats.decodes,
      inputs_embedded: this.stats.inputsDone,
    };
  }

  tokenize(text: string): Promise<number[]> {
    const ids = this.#markup.fragments(text).flatMap((f) => this.#model.tokenize(f, false));
    return Promise.resolve(this.completeTokens(ids));
  }

  detokenize(ids: readonly number[]): string {
    return this.#model.detokenize(ids, true);
  }

  completeTokens(ids: readonly number[]): number[] {
    // Qwen3-Embedding reads the hidden state of an appended end-of-text token (last-token pooling).
    if (this.pooling !== "last") return [...ids];
    return ids.at(-1) === this.#model.eos ? [...ids] : [...ids, this.#model.eos];
  }

  embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]> {
    signal?.throwIfAborted();
    const tooLong = sequences.find((s) => s.length > this.#ctx.nCtx - RESERVE + 1);
    if (tooLong) return Promise.reject(new Error(`an input of ${tooLong.length} tokens exceeds the context`));
    const job = {};
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) =>
        this.#queue.push({ ids, fed: 0, seq: -1, job, signal, resolve, reject })
      )
    );
    this.stats.inputsQueued = this.#queue.length;
    if (!this.#running) void this.#loop();
    return Promise.all(results);
  }

  async #loop(): Promise<void> {
    this.#running = true;
    // The flag is cleared in the same turn as the last check: an input queued after it starts a new loop.
    try {
      while (this.#queue.length > 0 || this.#active.length > 0) {
        this.#dropCancelled();
        this.#admit();
        if (this.#active.length === 0) continue;
        try {
          if (this.pooling === "last") await this.#stepLast();
          else await this.#stepAll();
        } catch (e) {
          for (const input of [...this.#active]) this.#done(input, undefined, e);
        }
      }
    } finally {
      this.#running = false;
      this.#ctx.idle();
    }
  }

  #dropCancelled() {
    for (const input of [...this.#queue]) {
      if (input.signal?.aborted) {
        this.#queue.splice(this.#queue.indexOf(input), 1);
        input.reject(input.signal.reason);
      }
    }
    for (const input of [...this.#active]) {
      if (input.signal?.aborted) this.#done(input, undefined, input.signal.reason);
    }
    this.stats.inputsQueued = this.#queue.length;
  }

  /**
   * Moves queued inputs into free sequences while their tokens fit in the KV cache, taking each
   * time from the request with the fewest inputs in flight: a one-input request queued behind a
   * thousand-input one gets the next free sequence.
   */
  #admit() {
    const perJob = new Map<object, number>();
    for (const a of this.#active) perJob.set(a.job, (perJob.get(a.job) ?? 0) + 1);
    while (this.#queue.length > 0 && this.#freeSeqs.length > 0) {
      let at = 0;
      let fewest = Infinity;
      for (let i = 0; i < this.#queue.length && fewest > 0; i++) {
        const n = perJob.get(this.#queue[i].job) ?? 0;
        if (n < fewest) [at, fewest] = [i, n];
      }
      const next = this.#queue[at];
      // Sequences kept free for other requests, so a newcomer joins the very next step.
      if (fewest >= this.#ctx.nSeqMax - RESERVED_SEQS) return;
      if (this.#kvUsed + next.ids.length > this.#ctx.nCtx && this.#active.length > 0) return;
      this.#queue.splice(at, 1);
      perJob.set(next.job, fewest + 1);
      next.seq = this.#freeSeqs.pop()!;
      this.#kvUsed += next.ids.length;
      this.#active.push(next);
    }
    this.stats.inputsQueued = this.#queue.length;
    this.stats.inputsInFlight = this.#active.length;
  }

  /**
   * Body tokens without outputs (shortest inputs first), then the last tokens of finished bodies
   * with embeddings on. Two decodes, not one: with embeddings on llama.cpp sizes its buffers for
   * a batch of outputs (measured: +890 MiB, kept, for an 8192-token input in one pass).
   */
  async #stepLast() {
    if (await this.#onePass()) return;
    const batch = this.#batch;
    batch.clear();
    const byRemaining = [...this.#active].sort((a, b) => (a.ids.length - a.fed) - (b.ids.length - b.fed));
    // While several requests share the engine, short steps let a newcomer's turn come sooner.
    const shared = new Set([...this.#active, ...this.#queue].map((i) => i.job)).size > 1;
    const limit = shared ? Math.min(batch.capacity, SHARED_STEP_TOKENS) : batch.capacity;
    const fedNow = new Map<Input, number>();
    for (const input of byRemaining) {
      const room = limit - batch.size;
      if (room <= 0) break;
      const end = Math.min(input.ids.length - 1, input.fed + room);
      for (let i = input.fed; i < end; i++) batch.add(input.ids[i], i, input.seq, false);
      if (end > input.fed) fedNow.set(input, end);
    }
    if (batch.size > 0) {
      this.#ctx.setEmbeddings(false);
      await this.#decode();
      for (const [input, end] of fedNow) input.fed = end;
      // A request gone during that decode gets no output decode: nothing starts for it after its client left.
      this.#dropCancelled();
    }
    const ready = this.#active.filter((i) => i.fed === i.ids.length - 1).slice(0, limit);
    if (ready.length === 0) return;
    batch.clear();
    const outs = ready.map((input) => batch.add(input.ids[input.fed], input.fed, input.seq, true));
    this.#ctx.setEmbeddings(true);
    await this.#decode();
    ready.forEach((input, k) => {
      input.fed++;
      this.#done(input, this.#row(outs[k]).slice());
    });
  }

  /**
   * Short work (a lone short input, say) in one decode with embedding output on: every token is
   * projected onto the vocabulary, which costs less than a second decode when the tokens are few.
   * False when the step is too large or an input would not finish in it.
   */
  async #onePass(): Promise<boolean> {
    const remaining = this.#active.reduce((n, i) => n + i.ids.length - i.fed, 0);
    if (remaining > this.#onePassTokens || remaining > this.#batch.capacity) return false;
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
    await this.#decode();
    for (const { input, out } of outs) {
      input.fed = input.ids.length;
      this.#done(input, this.#row(out).slice());
    }
    return true;
  }

  /** Every token with its state (mean or CLS pooling), chunk by chunk. */
  async #stepAll() {
    const batch = this.#batch;
    batch.clear();
    const taken: { input: Input; from: number; to: number; at: number }[] = [];
    const byRemaining = [...this.#active].sort((a, b) => (a.ids.length - a.fed) - (b.ids.length - b.fed));
    for (const input of byRemaining) {
      const to = Math.min(input.ids.length, input.fed + batch.room);
      if (to <= input.fed) break;
      const at = batch.size;
      for (let i = input.fed; i < to; i++) batch.add(input.ids[i], i, input.seq, true);
      taken.push({ input, from: input.fed, to, at });
    }
    this.#ctx.setEmbeddings(true);
    await this.#decode();
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

  async #decode() {
    this.stats.decodes++;
    this.stats.tokensEvaluated += this.#batch.size;
    await this.#ctx.decode(this.#batch);
  }

  /** The output state of batch position `i` (a view). */
  #row(i: number): Float32Array {
    const ptr = this.#ctx.lib.symbols.llama_get_embeddings_ith(this.#ctx.ptr, i);
    return nativeView(Float32Array, ptr, this.nativeDims);
  }

  #done(input: Input, vector?: Float32Array, error?: unknown) {
    const i = this.#active.indexOf(input);
    if (i >= 0) this.#active.splice(i, 1);
    this.#ctx.removeTokens(input.seq, -1, -1);
    this.#freeSeqs.push(input.seq);
    this.#kvUsed -= input.ids.length;
    this.stats.inputsInFlight = this.#active.length;
    if (vector) {
      this.stats.inputsDone++;
      input.resolve(vector);
    } else input.reject(error);
  }

  async dispose(): Promise<void> {
    while (this.#running) await new Promise((r) => setTimeout(r, 10));
    this.#batch.free();
    this.#ctx.free();
    this.#model.free();
  }
}
