/**
 * `POST /v1/embeddings`: an embeddings result as HTTP; past a few dozen vectors the JSON text is
 * serialised in slices, so a large body never holds the event loop.
 */
import { jsonBody } from "../http/errors.ts";
import { EmbeddingsRequestSchema } from "../protocol/embeddings.ts";
import { createEmbeddings, type EmbeddingLimits } from "../services/embeddings.ts";
import { createEntryEmbeddings } from "../services/upstream_embeddings.ts";
import type { Handler, RouteKit } from "./context.ts";

/**
 * The handler of `POST /v1/embeddings`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/v1/embeddings", auth: "v1", handler: postEmbeddings(kit) };
 * }
 * ```
 */
export function postEmbeddings(kit: RouteKit): Handler {
  const { deps } = kit;
  return async (req, ctx) => {
    const body = await kit.parse(req, EmbeddingsRequestSchema);
    ctx.model = body.model;
    kit.allowedSlot(body.model, ctx.key);
    const { slot, engine } = deps.registry.engine(body.model, "embedding");
    kit.admit(slot, ctx);
    // A model served by upstreams reads the entries itself (its tokenizer is theirs).
    const limits: EmbeddingLimits = {
      maxInputTokens: slot.spec.maxInputTokens ?? 8192,
      maxEntries: deps.maxEmbeddingInputs,
      matryoshka: slot.spec.matryoshka,
      minDims: slot.spec.minDims,
      queryInstruction: slot.spec.queryInstruction,
      queryFormat: slot.spec.queryFormat,
      admitTokens: (tokens) => {
        try {
          return deps.registry.admitTokens(slot, tokens, deps.maxQueuedEmbeddingTokens ?? 262_144);
        } catch (e) {
          deps.metrics.rejected.inc({ model: slot.spec.id });
          throw e;
        }
      },
    };
    // The request id travels to upstreams, so their logs name the same request.
    const res = engine.embedEntries
      ? await createEntryEmbeddings(body, engine, limits, ctx.signal, ctx.id)
      : await createEmbeddings(body, engine, limits, ctx.signal);
    ctx.promptTokens = res.usage.prompt_tokens;
    // (A request already cut off gets its error, not a status line and a broken body.)
    ctx.signal.throwIfAborted();
    // Past a few thousand values the JSON text is written in slices (see jsonBody).
    return jsonBody(res, { signal: ctx.signal });
  };
}
