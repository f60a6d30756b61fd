/** `POST /tokenize` and `/detokenize` (also under `/v1/`), in llama-server's and vLLM's shapes. */
import { jsonBody } from "../http/errors.ts";
import { DetokenizeRequestSchema, TokenizeRequestSchema } from "../protocol/completions.ts";
import { detokenize, tokenize } from "../services/tokens.ts";
import type { Handler, RouteKit } from "./context.ts";

/**
 * The handler of `POST /tokenize`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/tokenize", auth: "v1", handler: postTokenize(kit) };
 * }
 * ```
 */
export function postTokenize(kit: RouteKit): Handler {
  const { deps } = kit;
  return async (req, ctx) => {
    const body = await kit.parse(req, TokenizeRequestSchema);
    ctx.model = body.model;
    kit.allowedSlot(body.model, ctx.key);
    const slot = deps.registry.find(body.model);
    const { engine } = deps.registry.engine(body.model, slot.spec.kind);
    return jsonBody(
      await tokenize(
        body,
        engine,
        slot.spec.kind === "chat" ? slot.spec.thinking : undefined,
        ctx.signal,
      ),
      { signal: ctx.signal },
    );
  };
}

/** The handler of `POST /detokenize`. */
export function postDetokenize(kit: RouteKit): Handler {
  const { deps } = kit;
  return async (req, ctx) => {
    const body = await kit.parse(req, DetokenizeRequestSchema);
    ctx.model = body.model;
    kit.allowedSlot(body.model, ctx.key);
    const slot = deps.registry.find(body.model);
    const { engine } = deps.registry.engine(body.model, slot.spec.kind);
    return jsonBody(await detokenize(body, engine, ctx.signal), { signal: ctx.signal });
  };
}
