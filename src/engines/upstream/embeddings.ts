/**
 * An embedding model served by remote OpenAI-compatible servers (vLLM, TEI, llama-server, another
 * vserve). It always asks for the native vector: `dimensions` (truncation and renormalisation)
 * and the client's encoding are the service's job, so every upstream behaves the same, whether
 * it honours `dimensions` or not.
 */
import type { EmbeddingEngine, UpstreamStatus } from "../types.ts";
import { base64ToFloat32 } from "../../vectors.ts";
import { unsupported } from "./chat.ts";
import type { UpstreamPool } from "./pool.ts";
import { UpstreamFailure } from "./failure.ts";
import { post } from "./wire.ts";

interface WireEmbeddings {
  data?: { index?: number; embedding?: number[] | string }[];
  usage?: { prompt_tokens?: number };
}

/**
 * The embedding engine of a model whose `backend` is `openai`.
 *
 * @example
 * ```ts
 * import type { UpstreamPool } from "./pool.ts";
 * async function embed(pool: UpstreamPool) {
 *   const engine = new UpstreamEmbeddingEngine(pool, { nativeDims: 4096 });
 *   const { vectors } = await engine.embedEntries(["hello"], { truncate: false });
 *   return vectors;
 * }
 * ```
 */
export class UpstreamEmbeddingEngine implements EmbeddingEngine {
  readonly vocabSize = 0;
  #nativeDims: number;
  readonly #maxInputTokens?: number;

  constructor(readonly pool: UpstreamPool, opts: { nativeDims?: number; maxInputTokens?: number } = {}) {
    this.#nativeDims = opts.nativeDims ?? 0;
    this.#maxInputTokens = opts.maxInputTokens;
  }

  /** The configured size, else the length of the vectors seen (0 before the first). */
  get nativeDims(): number {
    return this.#nativeDims;
  }

  upstreams(): UpstreamStatus[] {
    return this.pool.statuses();
  }

  async embedEntries(
    entries: readonly (string | readonly number[])[],
    opts: { truncate: boolean; signal?: AbortSignal; requestId?: string },
  ): Promise<{ vectors: Float32Array[]; promptTokens: number }> {
    const model = this.pool.model;
    const routing = this.pool.routing;
    const signal = opts.signal ?? new AbortController().signal;
    const body: Record<string, unknown> = { input: entries, encoding_format: routing.embeddingEncoding };
    if (opts.truncate) {
      // TEI and vserve read `truncate`, vLLM `truncate_prompt_tokens`.
      body.truncate = true;
      if (this.#maxInputTokens) body.truncate_prompt_tokens = this.#maxInputTokens;
    }
    try {
      const { value, lease } = await this.pool.dispatch(
        { signal, requestId: opts.requestId },
        async (u, sig) => {
          const ex = await post(u, "/embeddings", { ...body, model: u.model }, {
            signal: sig,
            routing,
            model,
            requestId: opts.requestId,
          });
          let json: WireEmbeddings;
          try {
            json = await ex.res.json();
          } catch (e) {
            throw ex.failure(e);
          }
          ex.settle();
          return readVectors(json, entries.length);
        },
      );
      lease.end("ok");
      if (this.#nativeDims === 0) this.#nativeDims = value.vectors[0]?.length ?? 0;
      return value;
    } catch (e) {
      if (signal.aborted) throw e;
      if (e instanceof UpstreamFailure) throw e.toEngineError(model);
      throw e;
    }
  }

  tokenize(): Promise<number[]> {
    return Promise.reject(unsupported(this.pool.model, "/tokenize"));
  }

  detokenize(): Promise<string> {
    return Promise.reject(unsupported(this.pool.model, "/detokenize"));
  }

  completeTokens(): number[] {
    throw unsupported(this.pool.model, "token input");
  }

  embed(): Promise<Float32Array[]> {
    return Promise.reject(unsupported(this.pool.model, "token input"));
  }

  dispose(): Promise<void> {
    this.pool.dispose();
    return Promise.resolve();
  }
}

/** The vectors of an upstream answer, in input order; a malformed answer is a broken upstream. */
function readVectors(json: WireEmbeddings, count: number): { vectors: Float32Array[]; promptTokens: number } {
  const data = Array.isArray(json?.data) ? json.data : [];
  const vectors = new Array<Float32Array>(count);
  for (const [i, d] of data.entries()) {
    const index = d.index ?? i;
    const e = d.embedding;
    if (index < 0 || index >= count) break;
    vectors[index] = typeof e === "string"
      ? base64ToFloat32(e)
      : Array.isArray(e)
      ? Float32Array.from(e)
      : vectors[index];
  }
  const dims = vectors[0]?.length;
  if (data.length !== count || vectors.some((v) => !v || v.length !== dims || dims === 0)) {
    throw UpstreamFailure.broken(
      `the embeddings answer holds ${data.length} usable vectors for ${count} inputs, or vectors of different lengths`,
    );
  }
  return { vectors, promptTokens: json.usage?.prompt_tokens ?? 0 };
}
