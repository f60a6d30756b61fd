/** ONNX embedding models through onnxruntime-node, with dynamic batching across requests. */
import { createRequire } from "node:module";
import { Tokenizer } from "@huggingface/tokenizers";
import type { EmbeddingEngine } from "../types.ts";
import type { Logger } from "../../log.ts";
import type { SessionReply, SessionRequest } from "./session_worker.ts";

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
  log: Logger;
}

/** Most padded tokens in one run: bounds activation memory when long and short inputs meet. */
const MAX_BATCH_TOKENS = 16_384;

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
    this.#worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      this.#failed = new Error(`the onnxruntime worker failed: ${e.message}`);
      for (const w of this.#waiting.values()) w.reject(this.#failed);
      this.#waiting.clear();
    };
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

  async close(): Promise<void> {
    await this.ask({ type: "release" }).catch(() => {});
    this.#worker.terminate();
  }
}

interface Pending {
  ids: readonly number[];
  /** The request it belongs to. */
  job: object;
  signal?: AbortSignal;
  resolve: (v: Float32Array) => void;
  reject: (e: unknown) => void;
}

/**
 * One session; queued sequences from all requests are run together in padded batches, so many
 * concurrent small requests cost about one run instead of many. A batch takes inputs from the
 * waiting requests in turn (a one-input request queued behind a thousand-input one is in the next
 * run), and the inputs of a request whose client left are dropped before each run.
 */
export class OnnxEmbeddingEngine implements EmbeddingEngine {
  readonly nativeDims: number;
  readonly vocabSize: number;
  readonly #session: SessionClient;
  readonly #tokenizer: Tokenizer;
  readonly #opts: OnnxEmbeddingOptions;
  readonly #pad: number;
  readonly #eos: number;
  readonly #queue: Pending[] = [];
  #running = false;
  readonly #stats = { tokensEvaluated: 0, runs: 0, inputsDone: 0 };

  private constructor(
    session: SessionClient,
    tokenizer: Tokenizer,
    opts: OnnxEmbeddingOptions,
    dims: number,
    vocabSize: number,
    pad: number,
  ) {
    this.#session = session;
    this.#tokenizer = tokenizer;
    this.#opts = opts;
    this.nativeDims = dims;
    this.vocabSize = vocabSize;
    this.#pad = pad;
    this.#eos = pad;
  }

  /** Creates the session (CUDA first when asked, else CPU) and reads the tokenizer. */
  static async load(opts: OnnxEmbeddingOptions): Promise<{ engine: OnnxEmbeddingEngine; provider: string }> {
    const tokenizerJson = JSON.parse(await Deno.readTextFile(opts.tokenizerPath));
    const configPath = opts.tokenizerPath.replace(/tokenizer\.json$/, "tokenizer_config.json");
    const tokenizerConfig = await Deno.readTextFile(configPath).then(JSON.parse).catch(() => ({}));
    const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
    const session = new SessionClient();
    let loaded: SessionReply;
    try {
      loaded = await session.ask({
        type: "load",
        modelPath: opts.modelPath,
        threads: opts.threads,
        cuda: opts.gpu === "cuda" || (opts.gpu === "auto" && cudaProviderInstalled()),
      });
    } catch (e) {
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
    const vocab: Record<string, number> = tokenizerJson.model?.vocab ?? {};
    const added: { id: number; content: string }[] = tokenizerJson.added_tokens ?? [];
    const vocabSize =
      [...Object.values(vocab), ...added.map((a) => a.id)].reduce((m, id) => Math.max(m, id), -1) + 1;
    const padName = tokenizerConfig.pad_token ?? "<|endoftext|>";
    const pad =
      added.find((a) => a.content === (typeof padName === "string" ? padName : padName.content))?.id ?? 0;
    const engine = new OnnxEmbeddingEngine(session, tokenizer, opts, 0, vocabSize, pad);
    const probe = await engine.#run([[pad]]);
    (engine as { nativeDims: number }).nativeDims = probe[0].length;
    return { engine, provider };
  }

  tokenize(text: string): Promise<number[]> {
    return Promise.resolve(this.completeTokens(this.#tokenizer.encode(text).ids));
  }

  detokenize(ids: readonly number[]): string {
    return this.#tokenizer.decode([...ids], { skip_special_tokens: false });
  }

  completeTokens(ids: readonly number[]): number[] {
    // Last-token pooling (Qwen3-Embedding style) reads an appended end-of-text token.
    if (this.#opts.pooling === "last" && ids.at(-1) !== this.#eos) return [...ids, this.#eos];
    return [...ids];
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
    const job = {};
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) => this.#queue.push({ ids, job, signal, resolve, reject }))
    );
    this.#drain();
    return Promise.all(results);
  }

  /**
   * The next run's inputs: the waiting requests' inputs in turn (the first of each request in
   * arrival order, then the second, ...), padded to the longest, within the size and token budgets.
   */
  #nextBatch(): Pending[] {
    const byJob = new Map<object, Pending[]>();
    for (const p of this.#queue) {
      const list = byJob.get(p.job);
      if (list) list.push(p);
      else byJob.set(p.job, [p]);
    }
    const lists = [...byJob.values()];
    const batch: Pending[] = [];
    let longest = 0;
    for (let k = 0; batch.length < this.#opts.maxBatch; k++) {
      let any = false;
      for (const list of lists) {
        if (k >= list.length) continue;
        any = true;
        const width = Math.max(longest, list[k].ids.length);
        if (batch.length > 0 && (batch.length + 1) * width > MAX_BATCH_TOKENS) return this.#take(batch);
        longest = width;
        batch.push(list[k]);
        if (batch.length === this.#opts.maxBatch) break;
      }
      if (!any) break;
    }
    return this.#take(batch);
  }

  /** Removes `batch` from the queue. */
  #take(batch: Pending[]): Pending[] {
    const taken = new Set(batch);
    const rest = this.#queue.filter((p) => !taken.has(p));
    this.#queue.length = 0;
    this.#queue.push(...rest);
    return batch;
  }

  /** Rejects the queued inputs of requests whose client left. */
  #dropCancelled() {
    if (!this.#queue.some((p) => p.signal?.aborted)) return;
    const rest = this.#queue.filter((p) => {
      if (!p.signal?.aborted) return true;
      p.reject(p.signal.reason);
      return false;
    });
    this.#queue.length = 0;
    this.#queue.push(...rest);
  }

  async #drain() {
    if (this.#running) return;
    this.#running = true;
    try {
      for (this.#dropCancelled(); this.#queue.length > 0; this.#dropCancelled()) {
        const batch = this.#nextBatch();
        try {
          this.#stats.runs++;
          this.#stats.tokensEvaluated += batch.reduce((n, p) => n + p.ids.length, 0);
          const vectors = await this.#run(batch.map((p) => p.ids));
          this.#stats.inputsDone += batch.length;
          batch.forEach((p, i) => p.resolve(vectors[i]));
        } catch (e) {
          batch.forEach((p) => p.reject(e));
        }
      }
    } finally {
      this.#running = false;
    }
  }

  async #run(seqs: readonly (readonly number[])[]): Promise<Float32Array[]> {
    const width = seqs.reduce((m, s) => Math.max(m, s.length), 1);
    const ids = new BigInt64Array(seqs.length * width).fill(BigInt(this.#pad));
    seqs.forEach((s, b) => {
      for (let t = 0; t < s.length; t++) ids[b * width + t] = BigInt(s[t]);
    });
    const lengths = Int32Array.from(seqs, (s) => s.length);
    const reply = await this.#session.ask(
      { type: "run", id: 0, ids, lengths, width, pooling: this.#opts.pooling },
      [ids.buffer, lengths.buffer],
    );
    if (reply.type !== "result") throw new Error("the onnxruntime worker answered out of turn");
    const { vectors, dims } = reply;
    return seqs.map((_, b) => vectors.subarray(b * dims, (b + 1) * dims));
  }

  /** Rejects the queued inputs, waits for the run in flight, then frees the session. */
  async dispose(): Promise<void> {
    for (const p of this.#queue.splice(0)) p.reject(new Error("the model is unloading"));
    while (this.#running) await new Promise((r) => setTimeout(r, 10));
    await this.#session.close();
  }
}
