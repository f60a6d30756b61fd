/** ONNX embedding models through onnxruntime-node, with dynamic batching across requests. */
import { createRequire } from "node:module";
import { Tokenizer } from "@huggingface/tokenizers";
import { Markup, type MarkupToken } from "../markup.ts";
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
  signal?: AbortSignal;
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
  /** The tokenizer's added tokens: inputs are text, none of it becomes one of them. */
  readonly #markup: Markup;
  /** What the tokenizer's post-processor puts around a text (e.g. BERT's [CLS] … [SEP]). */
  readonly #wrap: { before: number[]; after: number[] };
  readonly #opts: OnnxEmbeddingOptions;
  readonly #pad: number;
  readonly #eos: number;
  /** Requests with inputs still to run, in arrival order. */
  #jobs: Job[] = [];
  /** The request the next batch starts with (round-robin over requests). */
  #cursor = 0;
  #running = false;
  readonly #stats = { tokensEvaluated: 0, runs: 0, inputsDone: 0 };

  private constructor(
    session: SessionClient,
    tokenizer: Tokenizer,
    opts: OnnxEmbeddingOptions,
    dims: number,
    vocabSize: number,
    pad: number,
    markup: MarkupToken[],
  ) {
    this.#session = session;
    this.#tokenizer = tokenizer;
    this.#markup = new Markup(markup);
    this.#wrap = postProcessorWrap(tokenizer);
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
    // The tokenizer matches every added token in text, special or not.
    const markup = added.map((a) => ({ id: a.id, text: a.content, matchedInText: true }));
    const engine = new OnnxEmbeddingEngine(session, tokenizer, opts, 0, vocabSize, pad, markup);
    let probe: Float32Array[];
    try {
      probe = await engine.#run([[pad]]);
    } catch (e) {
      await session.close();
      throw e;
    }
    (engine as { nativeDims: number }).nativeDims = probe[0].length;
    return { engine, provider };
  }

  tokenize(text: string): Promise<number[]> {
    const fragments = this.#markup.fragments(text);
    if (fragments.length === 1) return Promise.resolve(this.completeTokens(this.#tokenizer.encode(text).ids));
    const ids = [...this.#wrap.before];
    for (const f of fragments) ids.push(...this.#tokenizer.encode(f, { add_special_tokens: false }).ids);
    ids.push(...this.#wrap.after);
    return Promise.resolve(this.completeTokens(ids));
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
    const job: Job = { inputs: [], next: 0, signal };
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) => job.inputs.push({ ids, resolve, reject }))
    );
    if (job.inputs.length > 0) this.#jobs.push(job);
    this.#drain();
    return Promise.all(results);
  }

  /**
   * The next run's inputs: one from each waiting request in turn, the turn starting after the
   * request served last, padded to the longest, within the size and token budgets. Costs the
   * batch's size and the number of requests, not the number of queued inputs.
   */
  #nextBatch(): Pending[] {
    const batch: Pending[] = [];
    let longest = 0;
    let k = this.#cursor % this.#jobs.length;
    for (
      let idle = 0;
      batch.length < this.#opts.maxBatch && idle < this.#jobs.length;
      k = (k + 1) % this.#jobs.length
    ) {
      const job = this.#jobs[k];
      if (job.next === job.inputs.length) {
        idle++;
        continue;
      }
      const input = job.inputs[job.next];
      const width = Math.max(longest, input.ids.length);
      if (batch.length > 0 && (batch.length + 1) * width > MAX_BATCH_TOKENS) break;
      idle = 0;
      longest = width;
      batch.push(input);
      job.next++;
    }
    this.#cursor = k; // (requests now done leave the list in #dropCancelled, before the next batch)
    return batch;
  }

  /** Drops requests with nothing left to run, keeping the cursor on the same request. */
  #removeDone() {
    const before = this.#jobs.slice(0, this.#cursor).filter((j) => j.next < j.inputs.length).length;
    this.#jobs = this.#jobs.filter((j) => j.next < j.inputs.length);
    this.#cursor = this.#jobs.length === 0 ? 0 : before % this.#jobs.length;
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
    for (const job of this.#jobs) rejectRest(job, new Error("the model is unloading"));
    this.#jobs = [];
    while (this.#running) await new Promise((r) => setTimeout(r, 10));
    await this.#session.close();
  }
}

/** The ids the tokenizer's post-processor adds before and after a text's own. */
function postProcessorWrap(tokenizer: Tokenizer): { before: number[]; after: number[] } {
  const full = tokenizer.encode("a").ids;
  const bare = tokenizer.encode("a", { add_special_tokens: false }).ids;
  const at = full.findIndex((_, i) => bare.every((id, k) => full[i + k] === id));
  if (at < 0) return { before: [], after: [] };
  return { before: full.slice(0, at), after: full.slice(at + bare.length) };
}

/** Rejects `job`'s inputs still to run with `reason`; it has none left then. */
function rejectRest(job: Job, reason: unknown) {
  for (const p of job.inputs.slice(job.next)) p.reject(reason);
  job.next = job.inputs.length;
}
