/** ONNX embedding models through onnxruntime-node, with dynamic batching across requests. */
import * as ort from "onnxruntime-node";
import { createRequire } from "node:module";
import { Tokenizer } from "@huggingface/tokenizers";
import type { EmbeddingEngine } from "../types.ts";
import type { Logger } from "../../log.ts";

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

interface Pending {
  ids: readonly number[];
  resolve: (v: Float32Array) => void;
  reject: (e: unknown) => void;
}

/**
 * One session; queued sequences from all requests are run together in padded batches, so many
 * concurrent small requests cost about one run instead of many.
 */
export class OnnxEmbeddingEngine implements EmbeddingEngine {
  readonly nativeDims: number;
  readonly vocabSize: number;
  readonly #session: ort.InferenceSession;
  readonly #tokenizer: Tokenizer;
  readonly #opts: OnnxEmbeddingOptions;
  readonly #pad: number;
  readonly #eos: number;
  readonly #queue: Pending[] = [];
  #running = false;

  private constructor(
    session: ort.InferenceSession,
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
    const base = {
      intraOpNumThreads: opts.threads,
      interOpNumThreads: 1,
      graphOptimizationLevel: "all" as const,
    };
    let session: ort.InferenceSession | undefined;
    let provider = "cpu";
    if (opts.gpu === "cuda" || (opts.gpu === "auto" && cudaProviderInstalled())) {
      try {
        session = await ort.InferenceSession.create(opts.modelPath, {
          ...base,
          executionProviders: ["cuda", "cpu"],
        });
        provider = "cuda";
      } catch (e) {
        opts.log.warn("onnxruntime CUDA execution provider unavailable; falling back to CPU", {
          reason: (e as Error).message.split("\n")[0],
        });
      }
    }
    session ??= await ort.InferenceSession.create(opts.modelPath, { ...base, executionProviders: ["cpu"] });
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

  embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]> {
    signal?.throwIfAborted();
    const results = sequences.map((ids) =>
      new Promise<Float32Array>((resolve, reject) => this.#queue.push({ ids, resolve, reject }))
    );
    this.#drain();
    return Promise.all(results);
  }

  /** How many queued sequences the next run takes: padded to the longest, within the token budget. */
  #batchSize(): number {
    let longest = 0;
    let n = 0;
    for (const p of this.#queue) {
      const width = Math.max(longest, p.ids.length);
      if (n > 0 && (n >= this.#opts.maxBatch || (n + 1) * width > MAX_BATCH_TOKENS)) break;
      longest = width;
      n++;
    }
    return n;
  }

  async #drain() {
    if (this.#running) return;
    this.#running = true;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, this.#batchSize());
        try {
          const vectors = await this.#run(batch.map((p) => p.ids));
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
    const mask = new BigInt64Array(seqs.length * width);
    seqs.forEach((s, b) => {
      for (let t = 0; t < s.length; t++) {
        ids[b * width + t] = BigInt(s[t]);
        mask[b * width + t] = 1n;
      }
    });
    const shape = [seqs.length, width];
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor("int64", ids, shape),
      attention_mask: new ort.Tensor("int64", mask, shape),
    };
    if (this.#session.inputNames.includes("token_type_ids")) {
      feeds.token_type_ids = new ort.Tensor("int64", new BigInt64Array(ids.length), shape);
    }
    const out = await this.#session.run(feeds, ["last_hidden_state"]);
    const hidden = out.last_hidden_state;
    const dims = hidden.dims[2];
    const data = hidden.data as Float32Array;
    return seqs.map((s, b) => {
      const vec = new Float32Array(dims);
      const row = (t: number) => data.subarray((b * width + t) * dims, (b * width + t + 1) * dims);
      if (this.#opts.pooling === "cls") vec.set(row(0));
      else if (this.#opts.pooling === "last") vec.set(row(s.length - 1));
      else {
        for (let t = 0; t < s.length; t++) {
          const r = row(t);
          for (let d = 0; d < dims; d++) vec[d] += r[d];
        }
        for (let d = 0; d < dims; d++) vec[d] /= s.length;
      }
      return vec;
    });
  }

  async dispose(): Promise<void> {
    await this.#session.release();
  }
}
