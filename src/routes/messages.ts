/**
 * The Anthropic Messages routes: a service result as HTTP (a JSON message, or an event stream of
 * `event: <type>` + `data: <json>` frames with `ping` events and no `[DONE]`), and any error as
 * Anthropic's `{"type":"error","error":{type,message},"request_id"}` body.
 */
import { type ApiError, jsonBody, jsonResponse } from "../http/errors.ts";
import { SSE_HEADERS, sseData, sseStream } from "../http/sse.ts";
import {
  type AnthropicError,
  type CountTokensRequest,
  CountTokensRequestSchema,
  type MessagesRequest,
  MessagesRequestSchema,
} from "../protocol/anthropic.ts";
import type { ChatEngine } from "../engines/types.ts";
import type { ChatContext } from "../services/chat.ts";
import { anthropicError, countTokens, createMessage, type MessagesOptions } from "../services/messages.ts";
import type { Handler, RouteKit } from "./context.ts";
import { IGNORED_TOOLS_HEADER } from "./responses.ts";

/** Keep-alive while the model is silent, as Anthropic sends it. */
const PING = sseData({ type: "ping" }, "ping");

/**
 * The handler of `POST /v1/messages` (its errors in Anthropic's shape: {@link anthropicErrorResponse}).
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/v1/messages", auth: "v1", handler: messagesRoute(kit), errors: anthropicErrorResponse };
 * }
 * ```
 */
export function messagesRoute(kit: RouteKit): Handler {
  return async (req, ctx) => {
    const body = await kit.parse(req, MessagesRequestSchema);
    const { slot, engine } = kit.chatEngine(body.model, ctx);
    return await postMessages(body, engine, kit.chatContext(slot, ctx), await kit.responsesOptions);
  };
}

/** The handler of `POST /v1/messages/count_tokens`. */
export function countTokensRoute(kit: RouteKit): Handler {
  const { deps } = kit;
  return async (req, ctx) => {
    const body = await kit.parse(req, CountTokensRequestSchema);
    ctx.model = body.model;
    kit.allowedSlot(body.model, ctx.key);
    const { slot, engine } = deps.registry.engine(body.model, "chat");
    const options = await kit.responsesOptions;
    return await postCountTokens(body, engine, slot.spec.thinking, ctx.id, options, ctx.signal);
  };
}

/**
 * `POST /v1/messages`.
 *
 * @example
 * ```ts
 * import type { MessagesRequest } from "../protocol/anthropic.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { ChatContext } from "../services/chat.ts";
 * import type { ReasoningSealer } from "../services/reasoning_seal.ts";
 * async function answer(body: MessagesRequest, engine: ChatEngine, ctx: ChatContext, sealer: ReasoningSealer) {
 *   return await postMessages(body, engine, ctx, { hostedTools: "ignore", sealer });
 * }
 * ```
 */
export async function postMessages(
  req: MessagesRequest,
  engine: ChatEngine,
  ctx: ChatContext,
  opts: MessagesOptions,
): Promise<Response> {
  const run = await createMessage(req, engine, ctx, opts);
  const headers: Record<string, string> = { "request-id": ctx.requestId };
  if (run.ignored.length > 0) {
    headers[IGNORED_TOOLS_HEADER] = run.ignored.join(", ");
    ctx.log.warn("tools this server cannot run were left out of the prompt", {
      request_id: ctx.requestId,
      tools: run.ignored,
    });
  }
  if (run.kind === "message") return jsonBody(run.message, { headers, signal: ctx.signal });
  const body = sseStream(run.events, { pingMs: 15_000, ping: PING, done: false, event: (e) => e.type });
  return new Response(body, { headers: { ...SSE_HEADERS, ...headers } });
}

/**
 * `POST /v1/messages/count_tokens`.
 *
 * @example
 * ```ts
 * import type { CountTokensRequest } from "../protocol/anthropic.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { ReasoningSealer } from "../services/reasoning_seal.ts";
 * async function count(body: CountTokensRequest, engine: ChatEngine, sealer: ReasoningSealer, signal: AbortSignal) {
 *   return await postCountTokens(body, engine, undefined, "req-1", { hostedTools: "ignore", sealer }, signal);
 * }
 * ```
 */
export async function postCountTokens(
  req: CountTokensRequest,
  engine: ChatEngine,
  defaultThinking: boolean | undefined,
  requestId: string,
  opts: MessagesOptions,
  signal?: AbortSignal,
): Promise<Response> {
  const count = await countTokens(req, engine, defaultThinking, opts, signal);
  return jsonResponse(count, 200, { "request-id": requestId });
}

/**
 * The response for an error on these routes.
 *
 * @example
 * ```ts
 * import { ApiError } from "../http/errors.ts";
 * anthropicErrorResponse(new ApiError(401, "authentication_error", "No API key"), "req-1").status; // 401
 * ```
 */
export function anthropicErrorResponse(e: ApiError, requestId: string): Response {
  const { status, error } = anthropicError(e);
  const body: AnthropicError = { type: "error", error, request_id: requestId };
  return jsonResponse(body, status, { ...e.headers, "request-id": requestId });
}
