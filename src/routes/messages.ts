/**
 * The Anthropic Messages routes: a service result as HTTP (a JSON message, or an event stream of
 * `event: <type>` + `data: <json>` frames with `ping` events and no `[DONE]`), and any error as
 * Anthropic's `{"type":"error","error":{type,message},"request_id"}` body.
 */
import { type ApiError, jsonResponse } from "../http/errors.ts";
import { SSE_HEADERS, sseData, sseStream } from "../http/sse.ts";
import type { AnthropicError, CountTokensRequest, MessagesRequest } from "../protocol/anthropic.ts";
import type { ChatEngine } from "../engines/types.ts";
import type { ChatContext } from "../services/chat.ts";
import { IGNORED_TOOLS_HEADER } from "../services/responses.ts";
import { anthropicError, countTokens, createMessage, type MessagesOptions } from "../services/messages.ts";

/** Keep-alive while the model is silent, as Anthropic sends it. */
const PING = sseData({ type: "ping" }, "ping");

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
  if (run.kind === "message") return jsonResponse(run.message, 200, headers);
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
