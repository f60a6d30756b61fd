/**
 * `POST /v1/responses`: a Responses run as HTTP (a `response` object, or an event stream of typed
 * events with no `[DONE]`), naming the tool types left out of the prompt in a header; and the
 * answer of this stateless server to `GET` / `DELETE /v1/responses/{id}`.
 */
import { ApiError, jsonBody } from "../http/errors.ts";
import { SSE_HEADERS, sseStream } from "../http/sse.ts";
import { ResponsesRequestSchema } from "../protocol/responses.ts";
import { createResponse, type ResponsesRun } from "../services/responses.ts";
import type { Handler, RouteKit } from "./context.ts";

/** The response header naming the tool types left out of the prompt. */
export const IGNORED_TOOLS_HEADER = "x-vserve-ignored-tools";

/**
 * The handler of `POST /v1/responses`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "POST", path: "/v1/responses", auth: "v1", handler: postResponses(kit) };
 * }
 * ```
 */
export function postResponses(kit: RouteKit): Handler {
  return async (req, ctx) => {
    const body = await kit.parse(req, ResponsesRequestSchema);
    const { slot, engine } = kit.chatEngine(body.model, ctx);
    return responsesResponse(
      await createResponse(body, engine, kit.chatContext(slot, ctx), await kit.responsesOptions),
      ctx.signal,
    );
  };
}

/** A Responses run as HTTP. */
function responsesResponse(run: ResponsesRun, signal: AbortSignal): Response {
  const headers: Record<string, string> = {};
  if (run.ignored.length > 0) headers[IGNORED_TOOLS_HEADER] = run.ignored.join(", ");
  if (run.kind === "response") return jsonBody(run.response, { headers, signal });
  return new Response(sseStream(run.events, { pingMs: 15_000, done: false, event: (e) => e.type }), {
    headers: { ...SSE_HEADERS, ...headers },
  });
}

/** `GET` and `DELETE /v1/responses/{id}`: this server stores no responses. */
export const responseNotStored: Handler = () => {
  throw new ApiError(
    404,
    "not_found_error",
    "This server is stateless: it stores no responses, so none can be retrieved or deleted.",
    "response_id",
    "not_found",
  );
};
