/**
 * `POST /v1/completions` (legacy text completions): a completions run as HTTP (a `text_completion`,
 * or an event stream of its chunks), from the local engine or relayed to the model's upstreams.
 */
import { jsonBody } from "../http/errors.ts";
import { SSE_HEADERS, sseStream } from "../http/sse.ts";
import { poolOf } from "../engines/upstream/load.ts";
import type { Logger } from "../log.ts";
import { CompletionRequestSchema } from "../protocol/completions.ts";
import { type CompletionRun, createCompletion, createRelayedCompletion } from "../services/completions.ts";
import type { Handler, RouteKit } from "./context.ts";

/**
 * The handler of `POST /v1/completions`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/v1/completions", auth: "v1", handler: postCompletions(kit) };
 * }
 * ```
 */
export function postCompletions(kit: RouteKit): Handler {
  const { deps } = kit;
  return async (req, ctx) => {
    const body = await kit.parse(req, CompletionRequestSchema);
    ctx.model = body.model;
    kit.allowedSlot(body.model, ctx.key);
    const { slot, engine } = deps.registry.engine(body.model, "chat");
    const prompts = typeof body.prompt === "string" || typeof body.prompt[0] === "number"
      ? 1
      : body.prompt.length;
    kit.admit(slot, ctx, prompts * (body.n ?? 1), (body.n ?? 1) > 1 ? "n" : "prompt");
    // The chat path's context: the same usage, fingerprint and queue wait (until every prompt started).
    const completionContext = kit.chatContext(slot, ctx);
    // A model served by upstreams relays the request: the prompt's tokens are the upstream's.
    const pool = poolOf(engine);
    const run = pool
      ? await createRelayedCompletion(body, pool, completionContext)
      : await createCompletion(body, engine, completionContext);
    return completionResponse(run, deps.log, ctx.id, ctx.signal);
  };
}

/** A completions run as HTTP: JSON, or an event stream of `text_completion` chunks. */
function completionResponse(
  run: CompletionRun,
  log: Logger,
  requestId: string,
  signal: AbortSignal,
): Response {
  if (run.kind === "completion") return jsonBody(run.completion, { signal });
  const body = sseStream(run.chunks, {
    pingMs: 15_000,
    onError: (e) => {
      const error = run.toError(e);
      log.warn("stream ended with an error", {
        request_id: requestId,
        status: error.status,
        code: error.code,
      });
      return error.toBody();
    },
  });
  return new Response(body, { headers: SSE_HEADERS });
}
