/** `POST /v1/chat/completions`: a chat run as HTTP (a `chat.completion`, or an event stream of chunks). */
import { jsonBody } from "../http/errors.ts";
import { SSE_HEADERS, sseStream } from "../http/sse.ts";
import { ChatRequestSchema } from "../protocol/chat.ts";
import { type ChatRun, runChat } from "../services/chat.ts";
import type { Handler, RouteKit } from "./context.ts";

/**
 * The handler of `POST /v1/chat/completions`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/v1/chat/completions", auth: "v1", handler: postChatCompletions(kit) };
 * }
 * ```
 */
export function postChatCompletions(kit: RouteKit): Handler {
  return async (req, ctx) => {
    const body = await kit.parse(req, ChatRequestSchema);
    // n choices hold n sequences.
    const { slot, engine } = kit.chatEngine(body.model, ctx, body.n ?? 1);
    return chatResponse(await runChat(body, engine, kit.chatContext(slot, ctx)), ctx.signal);
  };
}

/**
 * A chat run as HTTP: JSON, or an SSE stream. Errors found before the first token were thrown (a
 * normal HTTP error); later ones become an error event.
 */
export function chatResponse(run: ChatRun, signal?: AbortSignal): Response {
  if (run.kind === "completion") return jsonBody(run.completion, { signal });
  const body = sseStream(run.chunks, {
    pingMs: 15_000,
    onError: (e) => run.toError(e).toBody(),
  });
  return new Response(body, { headers: SSE_HEADERS });
}
