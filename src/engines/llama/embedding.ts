/** GGUF embedding models through node-llama-cpp. */
import type { Llama, LlamaEmbeddingContext, LlamaModel } from "node-llama-cpp";
import type { EmbeddingEngine } from "../types.ts";

/** How to load a GGUF embedding model. */
export interface LlamaEmbeddingOptions {
  modelPath: string;
  gpuLayers?: number | "auto" | "max";
  threads: number;
  /** Contexts that embed concurrently; the threads are split between them. */
  parallel: number;
  maxInputTokens: number;
}

/**
 * A pool of embedding contexts over one model. node-llama-cpp's embedding context reads the
 * pooled vector of sequence 0 only, so concurrency comes from several contexts, not sequences.
 */
export class LlamaEmbeddingEngine implements EmbeddingEngine {
  readonly nativeDims: number;
  readonly vocabSize: number;
  readonly #model: LlamaModel;
  readonly #idle: LlamaEmbeddingContext[];
  readonly #waiting: ((ctx: LlamaEmbeddingContext) => void)[] = [];
  readonly #eos: number;

  private constructor(model: LlamaModel, contexts: LlamaEmbeddingContext[]) {
    this.#model = model;
    this.#idle = contexts;
    this.nativeDims = model.embeddingVectorSize;
    this.vocabSize = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
    const eos = model.tokens.eos;
    if (eos == null) throw new Error("the embedding model has no end-of-text token");
    this.#eos = eos;
  }

  /** Loads the model and creates the context pool. */
  static async load(llama: Llama, opts: LlamaEmbeddingOptions): Promise<LlamaEmbeddingEngine> {
    const model = await llama.loadModel({ modelPath: opts.modelPath, gpuLayers: opts.gpuLayers });
    const parallel = Math.max(1, opts.parallel);
    const threads = Math.max(1, Math.floor(opts.threads / parallel));
    const contextSize = opts.maxInputTokens + 1;
    const contexts: LlamaEmbeddingContext[] = [];
    try {
      for (let i = 0; i < parallel; i++) {
        contexts.push(await model.createEmbeddingContext({ contextSize, batchSize: contextSize, threads }));
      }
    } catch (e) {
      for (const c of contexts) await c.dispose();
      await model.dispose();
      throw e;
    }
    return new LlamaEmbeddingEngine(model, contexts);
  }

  tokenize(text: string): Promise<number[]> {
    return Promise.resolve(this.completeTokens(this.#model.tokenize(text, false)));
  }

  completeTokens(ids: readonly number[]): number[] {
    // Qwen3-Embedding reads the hidden state of an appended end-of-text token (last-token pooling).
    return ids.at(-1) === this.#eos ? [...ids] : [...ids, this.#eos];
  }

  async embed(sequences: readonly (readonly number[])[], signal?: AbortSignal): Promise<Float32Array[]> {
    return await Promise.all(sequences.map(async (tokens) => {
      const ctx = await this.#acquire();
      try {
        signal?.throwIfAborted();
        const { vector } = await ctx.getEmbeddingFor([...tokens] as never);
        return Float32Array.from(vector);
      } finally {
        this.#release(ctx);
      }
    }));
  }

  #acquire(): Promise<LlamaEmbeddingContext> {
    const ctx = this.#idle.pop();
    if (ctx) return Promise.resolve(ctx);
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  #release(ctx: LlamaEmbeddingContext) {
    const next = this.#waiting.shift();
    if (next) next(ctx);
    else this.#idle.push(ctx);
  }

  async dispose(): Promise<void> {
    for (const c of this.#idle) await c.dispose();
    await this.#model.dispose();
  }
}
