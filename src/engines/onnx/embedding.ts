/** ONNX embedding models through onnxruntime-node, with dynamic batching across requests. */
import { createRequire } from "node:module";
import type { EmbeddingEngine } from "../types.ts";
import type { Logger } from "../../log.ts";
import type { SessionReply, SessionRequest } from "./session_worker.ts";
import type { ComputeClient } from "../compute_share.ts";
import type { TokenizerFacts, TokenizerReply, TokenizerRequest } from "./tokenizer_worker.ts";
import { loopTurn, Slicer } from "../../event_loop.ts";

/** True when onnxruntime-node's CUDA provider libraries are installed beside its binding. */
export function cudaProviderInstalled(): boolean {
  try {
    const binding = createRequire(import.meta.url).resolve("onnxruntime-node");
    const dir = binding.replace(
      /dist\/.*$/,
      `bin/napi-v6/${Deno.build.os}/${Deno.build.arch === "x86_64" ? "x64" : "arm64"}`,
    );
    return Deno.statSync(`${dir}/libonnxruntime_providers_cuda.so`).isFile;
  } catch {
    return false;
  }
}

/** How to load an ONNX embedding model. */
export interface OnnxEmbeddingOptions {
  modelPath: string;
  /** `tokenizer.json`; a `tokenizer_config.json` beside it is read when present. */
  tokenizerPath: string;
  pooling: "mean" | "cls" | "last";
  threads: number;
  /** `cuda`: use the CUDA execution provider (warn when missing); `auto`: use it when installed. */
  gpu: "auto" | "cuda" | "cpu";
  /** Most sequences in one run. */
  maxBatch: number;
  /** The model's turn on the machine's compute (see compute_share.ts). */
  compute?: ComputeClient;
  log: Logger;
}

/** Most padded tokens in one run: bounds activation memory when long and short inputs meet. */
const MAX_BATCH_TOKENS = 16_384;
/** Most tokens a request may be owed: one that could not run for a while does not then take over. */
const MAX_CREDIT = 2048;

/**
 * The tokenizer, on a worker thread (see `tokenizer_worker.ts`): built there, it never holds this
 * thread; requests are answered one at a time, in order.
 */
class TokenizerClient {
  readonly #worker: Worker;
  readonly #waiting = new Map<
    number,
    { resolve: (reply: IdsReply | string | TokenizerFacts) => void; reject: (e: Error) => void }
  >();
  #next = 0;
  #failed?: Error;
  /** The tokenizer's facts, once the worker has built it. */
  readonly loaded: Promise<TokenizerFacts>;

  /** `tokenizerPath`: the worker reads `tokenizer.json` itself (posting its 11 MB took this thread 23-70 ms). */
  constructor(tokenizerPath: string) {
    this.#worker = new Worker(new URL("./tokenizer_worker.ts", import.meta.url), { type: "module" });
    this.#worker.onmessage = (e: MessageEvent<TokenizerReply>) => {
      const reply = e.data;
      const waiter = this.#waiting.get(reply.id);
      this.#waiting.delete(reply.id);
      if (reply.type === "error") waiter?.reject(new Error(reply.message));
      else if (reply.type === "text") waiter?.resolve(reply.text);
      else if (reply.type === "loaded") waiter?.resolve(reply.facts);
      else waiter?.resolve(reply);
    };
    this.#worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      this.#fail(new Error(`the tokenizer worker failed: ${e.message}`));
    };
    this.loaded = new Promise<TokenizerFacts>((resolve, reject) => {
      this.#waiting.set(-1, { resolve: (f) => resolve(f as TokenizerFacts), reject });
      this.#worker.postMessage({ type: "load", tokenizerPath } satisfies TokenizerRequest);
    });
  }

  #fail(error: Error) {
    this.#failed ??= error;
    for (const w of this.#waiting.values()) w.reject(error);
    this.#waiting.clear();
  }

  /** The ids of each client text (see the worker's `tokenize`), all in one array. */
  tokenize(texts: string[], limit?: number): Promise<IdsReply> {
    return this.#ask({ type: "tokenize", id: 0, texts, limit }) as Promise<IdsReply>;
  }

  /** The text of `ids`, as `Tokenizer.decode` gives it (special tokens kept). */
  decode(ids: readonly number[]): Promise<string> {
    const array = Int32Array.from(ids);
    return this.#ask({ type: "decode", id: 0, ids: array }, [array.buffer]) as Promise<string>;
  }

  #ask(req: TokenizerRequest & { type: "tokenize" | "decode" }, transfer: Transferable[] = []) {
    if (this.#failed) return Promise.reject(this.#failed);
    const id = this.#next++;
    return new Promise<IdsReply | string>((resolve, reject) => {
      this.#waiting.set(id, { resolve: (reply) => resolve(reply as IdsReply | string), reject });
      this.#worker.postMessage({ ...req, id } satisfies TokenizerRequest, transfer);
    });
  }

  close() {
    this.#fail(new Error("the model is unloaded"));
    this.#worker.terminate();
  }
}

/**
 * The onnxruntime session in its worker (see `session_worker.ts`): one run at a time, answered in
 * order.
 */
class SessionClient {
  readonly #worker: Worker;
  readonly #waiting = new Map<number, { resolve: (r: SessionReply) => void; reject: (e: Error) => void }>();
  #next = 0;
  #failed?: Error;

  constructor() {
    this.#worker = new Worker(new URL("./session_worker.ts", import.meta.url), { type: "module" });
    this.#worker.onmessage = (e: MessageEvent<SessionReply>) => {
      const reply = e.data;
      const id = reply.type === "result" || reply.type === "error" ? reply.id : -1;
      const waiter = this.#waiting.get(id);
      this.#waiting.delete(id);
      if (reply.type === "error") waiter?.reject(new Error(reply.message));
      else waiter?.resolve(reply);
    };
    // A worker whose error went uncaught answers nothing more (every reply is sent from a try).
    this.#worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      this.#fail(new Error(`the onnxruntime worker failed: ${e.message}`));
    };
  }

  /** Rejects what waits and every later request with `error`. */
  #fail(error: Error) {
    this.#failed ??= error;
    for (const w of this.#waiting.values()) w.reject(error);
    this.#waiting.clear();
  }

  /** Sends `req`; resolves with the answer to it. */
  ask(req: SessionRequest, transfer: Transferable[] = []): Promise<SessionReply> {
    if (this.#failed) return Promise.reject(this.#failed);
    const id = req.type === "run" ? (req.id = this.#next++) : -1;
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
      this.#worker.postMessage(req, transfer);
    });
  }

  /** Frees the session and ends the worker; later requests are refused, not left waiting. */
  async close(): Promise<void> {
    await this.ask({ type: "release" }).catch(() => {});
    this.#fail(new Error("the model is unloaded"));
    this.#worker.terminate();
  }
}

interface Pending {
  ids: readonly number[];
  resolve: (v: Float32Array) => void;
  reject: (e: unknown) => void;
}

/** One request's inputs; those from `next` on are still to run. */
interface Job {
  inputs: Pending[];
  next: number;
  /** Tokens run for it, counted from the engine's virtual time when it came. */
  served: number;
  /** Tokens actually run for it (ties of `served` go to the request that has had fewer). */
  received: number;
  signal?: AbortSignal;
}

/**
 * One session; queued sequences from all requests are run together in padded batches, so many
 * concurrent small requests cost about one run instead of many. Requests share the runs by tokens
 * (fair queueing): each run is led by the next input of the request that has had the fewest tokens
 * run, counted from the engine's virtual time when it came (the tokens each waiting request would
 * have had from an equal share), and filled, fewest-served first, with inputs of a similar length
 * (the longest at most twice the shortest: padding at most doubles a run's work). A one-word
 * request queued behind max-size inputs leads the run after the one running, and a request part-way
 * through is never passed for good by a stream of newer ones; the inputs of a request whose client
 * left are dropped before each run.
 */
export class OnnxEmbeddingEngine implements EmbeddingEngine {
  readonly nativeDims: number;
  readonly vocabSize: number;
  readonly #session: SessionClient;
  readonly #tokenizer: TokenizerClient;
  readonly #opts: OnnxEmbeddingOptions;
  readonly #pad: number;
  readonly #eos: number;
  /** Requests with inputs still to run, in arrival order. */
  #jobs: Job[] = [];
  #running = false;
  /** Tokens an equal share has given each waiting request so far (grows by a run's tokens / requests). */
  #vclock = 0;
  readonly #stats = { tokensEvaluated: 0, runs: 0, inputsDone: 0 };

  private constructor(
    session: SessionClient,
    tokenizer: TokenizerClient,
    facts: TokenizerFacts,
    opts: OnnxEmbeddingOptions,
  ) {
    this.#session = session;
    this.#tokenizer = tokenizer;
    this.#opts = opts;
    this.nativeDims = 0;
    this.vocabSize = facts.vocabSize;
    this.#pad = facts.pad;
    this.#eos = facts.pad;
  }

  /**
   * Creates the session (CUDA first when asked, else CPU) and the tokenizer, each on its worker,
   * together.
   */
  static async load(opts: OnnxEmbeddingOptions): Promise<{ engine: OnnxEmbeddingEngine; provider: string }> {
    const tokenizer = new TokenizerClient(opts.tokenizerPath);
    // `new Worker` holds this thread while the runtime builds the worker's isolate (13-20 ms here):
    // the second worker is made a turn later, so requests are served between the two.
    tokenizer.loaded.catch(() => {});
    await loopTurn();
    const session = new SessionClient();
    let loaded: SessionReply;
    let facts: TokenizerFacts;
    try {
      [loaded, facts] = await Promise.all([
        session.ask({
          type: "load",
          modelPath: opts.modelPath,
          threads: opts.threads,
          cuda: opts.gpu === "cuda" || (opts.gpu === "auto" && cudaProviderInstalled()),
        }),
        tokenizer.loaded,
      ]);
    } catch (e) {
      tokenizer.close();
      await session.close();
      throw e;
    }
    if (loaded.type !== "loaded") throw new Error("the onnxruntime worker did not load the model");
    if (loaded.cudaError) {
      opts.log.warn("onnxruntime CUDA execution provider unavailable; falling back to CPU", {
        reason: loaded.cudaError,
      });
    }
    const provider = loaded.provider;
    const engine = new OnnxEmbeddingEngine(session, tokenizer, facts, opts);
    let probe: Float32Array[];
    try {
      probe = await engine.#run([[facts.pad]]);
    } catch (e) {
      tokenizer.close();
      await session.close();
      throw e;
    }
    (engine as { nativeDims: number }).nativeDims = probe[0].length;
    return { engine, provider };
  }

  async tokenize(text: string, limit?: number): Promise<number[]> {
    return (await this.tokenizeMany([text], limit))[0];
  }

  /**
   * On the tokenizer's worker, in one message. Client text holding markup strings is cut into
   * fragments, each tokenized without special tokens (a text cut into 800,000 of them is many
   * seconds of the tokenizer). The ids come back in one typed array and are copied out in slices:
   * `/tokenize` of a 7.8 MB text is ~2 M ids, copied twice in one block before.
   */
  async tokenizeMany(texts: readonly string[], limit?: number): Promise<number[][]> {
    const { ids, lengths } = await this.#tokenizer.tokenize([...texts], limit);
    const lists = await idLists(ids, lengths, new Slicer(10));
    // The lists are this call's own: the end token goes on in place.
    for (const list of lists) this.#appendEnd(list);
    return lists;
  }

  detokenize(ids: readonly number[]): Promise<string> {
    return this.#tokenizer.decode(ids);
  }

  completeTokens(ids: readonly number[]): number[] {
    return this.#appendEnd([...ids]);
  }

  /** `ids` with the end-of-text token that last-token pooling (Qwen3-Embedding style) reads. */
  #appendEnd(ids: number[]): number[] {
    if (this.#opts.pooling === "last" && ids.at(-1) !== this.#eos) ids.push(this.#eos);
    return ids;
  }

  counters(): Record<string, number> {
    return {
      tokens_evaluated: this.#stats.tokensEvaluated,
      decodes: this.#stats.runs,
      inputs_embedded: this.#stats.inputsDone,
    };
  }

  embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]> {
    signal?.throwIfAborted();
    // A newcomer starts at the virtual time: ahead of requests that have had more than an equal
    // share, behind those that have had less.
    const job: Job = { inputs: [], next: 0, served: this.#vclock, received: 0, signal };
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) => job.inputs.push({ ids, resolve, reject }))
    );
    // Shortest first: neighbours are alike in length, so runs fill within the padding bound.
    job.inputs.sort((a, b) => a.ids.length - b.ids.length);
    if (job.inputs.length > 0) this.#jobs.push(job);
    this.#drain();
    return Promise.all(results);
  }

  /**
   * The next run's inputs: the next input of the request with the fewest tokens run first, then,
   * each time from the request fewest-served counting this run, inputs while the longest is at
   * most twice the shortest (padding at most doubles the work) and the size and token budgets
   * allow. Costs the batch's size times the number of requests, not the number of queued inputs.
   * Returns the run's tokens per request, charged when it has run: a request that comes meanwhile
   * starts level with the others as they were before it, so it leads the next run.
   */
  #nextBatch(): { batch: Pending[]; tokens: Map<Job, number> } {
    const extra = new Map<Job, number>();
    const taken = new Map<Job, number>();
    const skipped = new Set<Job>();
    const batch: Pending[] = [];
    let width = 0;
    let shortest = Infinity;
    while (batch.length < this.#opts.maxBatch) {
      let job: Job | undefined;
      let least = Infinity;
      for (const j of this.#jobs) {
        if (skipped.has(j) || j.next + (taken.get(j) ?? 0) >= j.inputs.length) continue;
        const s = this.#owed(j) + (extra.get(j) ?? 0);
        if (!job || s < least || (s === least && j.received < job.received)) [job, least] = [j, s];
      }
      if (!job) break;
      const input = job.inputs[job.next + (taken.get(job) ?? 0)];
      const length = Math.max(1, input.ids.length);
      const [w, low] = [Math.max(width, length), Math.min(shortest, length)];
      if (batch.length > 0 && (2 * low < w || (batch.length + 1) * w > MAX_BATCH_TOKENS)) {
        // (Its turn comes in a later run: it leads one when it is the least served.)
        skipped.add(job);
        continue;
      }
      [width, shortest] = [w, low];
      batch.push(input);
      taken.set(job, (taken.get(job) ?? 0) + 1);
      extra.set(job, (extra.get(job) ?? 0) + input.ids.length);
    }
    for (const [job, n] of taken) job.next += n;
    return { batch, tokens: extra };
  }

  /** A request's place in line: its tokens run, but never more than {@link MAX_CREDIT} behind. */
  #owed(job: Job): number {
    return Math.max(job.served, this.#vclock - MAX_CREDIT);
  }

  /** Drops requests with nothing left to run. */
  #removeDone() {
    this.#jobs = this.#jobs.filter((j) => j.next < j.inputs.length);
  }

  /** Rejects the inputs still to run of requests whose client left. */
  #dropCancelled() {
    for (const job of this.#jobs) if (job.signal?.aborted) rejectRest(job, job.signal.reason);
    this.#removeDone();
  }

  async #drain() {
    if (this.#running) return;
    this.#running = true;
    try {
      for (this.#dropCancelled(); this.#jobs.length > 0; this.#dropCancelled()) {
        const waiting = this.#jobs.length;
        const { batch, tokens } = this.#nextBatch();
        try {
          this.#stats.runs++;
          this.#stats.tokensEvaluated += batch.reduce((n, p) => n + p.ids.length, 0);
          const vectors = await this.#run(batch.map((p) => p.ids));
          this.#stats.inputsDone += batch.length;
          batch.forEach((p, i) => p.resolve(vectors[i]));
        } catch (e) {
          batch.forEach((p) => p.reject(e));
        }
        let total = 0;
        for (const [job, n] of tokens) {
          job.served = this.#owed(job) + n;
          job.received += n;
          total += n;
        }
        this.#vclock += total / waiting;
      }
    } finally {
      this.#running = false;
      this.#opts.compute?.idle();
    }
  }

  async #run(seqs: readonly (readonly number[])[]): Promise<Float32Array[]> {
    const width = seqs.reduce((m, s) => Math.max(m, s.length), 1);
    const ids = new BigInt64Array(seqs.length * width).fill(BigInt(this.#pad));
    seqs.forEach((s, b) => {
      for (let t = 0; t < s.length; t++) ids[b * width + t] = BigInt(s[t]);
    });
    const lengths = Int32Array.from(seqs, (s) => s.length);
    const ask = () =>
      this.#session.ask(
        { type: "run", id: 0, ids, lengths, width, pooling: this.#opts.pooling },
        [ids.buffer, lengths.buffer],
      );
    const reply = await (this.#opts.compute ? this.#opts.compute.run(ask) : ask());
    if (reply.type !== "result") throw new Error("the onnxruntime worker answered out of turn");
    const { vectors, dims } = reply;
    return seqs.map((_, b) => vectors.subarray(b * dims, (b + 1) * dims));
  }

  /** Rejects the queued inputs, waits for the run in flight, then frees the session. */
  async dispose(): Promise<void> {
    for (const job of this.#jobs) rejectRest(job, new Error("the model is unloading"));
    this.#jobs = [];
    while (this.#running) await new Promise((r) => setTimeout(r, 10));
    this.#tokenizer.close();
    await this.#session.close();
  }
}

/** The tokenizer worker's answer: every text's ids one after another, and each text's count. */
type IdsReply = { ids: Int32Array; lengths: Int32Array };

/** Ids copied at once between two looks at the clock. */
const ID_RUN = 16_384;

/**
 * `ids` cut into one array per text (`lengths`), copied a run at a time with turns of the event
 * loop between `slices` (2 M ids copied whole: a block of tens of milliseconds).
 *
 * @example
 * ```ts
 * import { loopTurn, Slicer } from "../../event_loop.ts";
 * await idLists(new Int32Array([5, 6, 7]), new Int32Array([2, 1]), new Slicer(10)); // [[5, 6], [7]]
 * ```
 */
export async function idLists(ids: Int32Array, lengths: Int32Array, slices: Slicer): Promise<number[][]> {
  const out: number[][] = [];
  let at = 0;
  for (const n of lengths) {
    const list: number[] = [];
    for (let from = at; from < at + n; from += ID_RUN) {
      if (slices.due) await slices.pause();
      const end = Math.min(at + n, from + ID_RUN);
      for (let i = from; i < end; i++) list.push(ids[i]);
    }
    out.push(list);
    at += n;
  }
  return out;
}

/** Rejects `job`'s inputs still to run with `reason`; it has none left then. */
function rejectRest(job: Job, reason: unknown) {
  for (const p of job.inputs.slice(job.next)) p.reject(reason);
  job.next = job.inputs.length;
}
