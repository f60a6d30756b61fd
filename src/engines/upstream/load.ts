/** Opens the engine of a registry entry whose `backend` is `openai`. */
import type { Logger } from "../../log.ts";
import { type ModelSpec, RoutingSchema } from "../../model_spec.ts";
import type { ChatEngine, EmbeddingEngine } from "../types.ts";
import { UpstreamPool } from "./pool.ts";
import { UpstreamChatEngine } from "./chat.ts";
import { UpstreamEmbeddingEngine } from "./embeddings.ts";

/**
 * The pool of `spec.upstreams` with one round of health checks done (so /health/ready tells the
 * truth at once), its periodic checks started, and the engine of the model's kind on top.
 * Unreachable upstreams do not fail the load: they are reported, and used once they answer.
 *
 * @example
 * ```ts
 * import type { ModelSpec } from "../../model_spec.ts";
 * import type { Logger } from "../../log.ts";
 * async function open(spec: ModelSpec, log: Logger) {
 *   const details: Record<string, unknown> = {};
 *   return await openUpstreamEngine(spec, log, (d) => Object.assign(details, d), Deno.env.toObject());
 * }
 * ```
 */
export async function openUpstreamEngine(
  spec: ModelSpec,
  log: Logger,
  report: (details: Record<string, unknown>) => void,
  env: Record<string, string>,
): Promise<ChatEngine | EmbeddingEngine> {
  const routing = RoutingSchema.parse(spec.routing ?? {});
  const pool = new UpstreamPool(spec.id, spec.upstreams ?? [], routing, { log, env });
  await pool.checkAll();
  pool.start();
  report({ backend: "openai", upstreams: pool.upstreams.length });
  const healthy = pool.upstreams.filter((u) => u.state === "healthy").map((u) => u.name);
  log.info("upstreams checked", { model: spec.id, healthy, of: pool.upstreams.length });
  if (spec.kind === "chat") return new UpstreamChatEngine(pool, { log, contextSize: spec.contextSize });
  return new UpstreamEmbeddingEngine(pool, {
    nativeDims: spec.nativeDims,
    maxInputTokens: spec.maxInputTokens,
  });
}

/** The upstream pool behind an engine, if it has one (for metrics). */
export function poolOf(engine: unknown): UpstreamPool | undefined {
  return engine instanceof UpstreamChatEngine || engine instanceof UpstreamEmbeddingEngine
    ? engine.pool
    : undefined;
}
