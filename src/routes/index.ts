/** The route table: method and path → handler, who may call it, and the error shape of its answers. */
import type { RouteInfo } from "../http/openapi.ts";
import { postChatCompletions } from "./chat.ts";
import { postCompletions } from "./completions.ts";
import type { Handler, Route, RouteKit } from "./context.ts";
import { postEmbeddings } from "./embeddings.ts";
import { anthropicErrorResponse, countTokensRoute, messagesRoute } from "./messages.ts";
import { getModel, listModels } from "./models.ts";
import { getHealth, getMetrics, getOpenApi, getReady, getRoot, getVersion, headRoot } from "./ops.ts";
import { postResponses, responseNotStored } from "./responses.ts";
import { postDetokenize, postTokenize } from "./tokenize.ts";

/**
 * Every route, in the order `/openapi.json` lists them. `auth`: `v1` a key always, `ops` per
 * --ops-auth, `open` never; a path ending in `/` with `prefix` takes an id after it.
 *
 * @example
 * ```ts
 * import { routeKit, type ServerDeps } from "./context.ts";
 * function routesOf(deps: ServerDeps) {
 *   return routeTable(routeKit(deps));
 * }
 * ```
 */
export function routeTable(kit: RouteKit): Route[] {
  const anthropic = { errors: anthropicErrorResponse };
  const prefix = { prefix: true };
  const table: Route[] = [
    route("POST", "/v1/embeddings", "v1", postEmbeddings(kit)),
    route("POST", "/v1/chat/completions", "v1", postChatCompletions(kit)),
    route("POST", "/v1/responses", "v1", postResponses(kit)),
    route("POST", "/v1/messages", "v1", messagesRoute(kit), anthropic),
    route("POST", "/v1/messages/count_tokens", "v1", countTokensRoute(kit), anthropic),
    route("GET", "/v1/responses/", "v1", responseNotStored, prefix),
    route("DELETE", "/v1/responses/", "v1", responseNotStored, prefix),
    route("POST", "/v1/completions", "v1", postCompletions(kit)),
    route("POST", "/tokenize", "v1", postTokenize(kit)),
    route("POST", "/v1/tokenize", "v1", postTokenize(kit)),
    route("POST", "/detokenize", "v1", postDetokenize(kit)),
    route("POST", "/v1/detokenize", "v1", postDetokenize(kit)),
    route("GET", "/version", "open", getVersion),
    route("GET", "/", "open", getRoot),
    route("HEAD", "/", "open", headRoot),
    route("GET", "/v1/models", "v1", listModels(kit)),
    route("GET", "/v1/models/", "v1", getModel(kit), prefix),
    route("GET", "/health", "open", getHealth(kit)),
    route("GET", "/health/ready", "ops", getReady(kit)),
    route("GET", "/metrics", "ops", getMetrics(kit)),
    route("GET", "/openapi.json", "open", getOpenApi(() => routeInfo(table))),
  ];
  return table;
}

/** The route table as `/openapi.json` and tests see it (a prefix route's id written `{id}`). */
export function routeInfo(routes: readonly Route[]): RouteInfo[] {
  return routes.map((r) => ({ method: r.method, path: routeLabel(r), auth: r.auth }));
}

/** A route's path as logs, metrics and `/openapi.json` name it. */
export function routeLabel(r: Route): string {
  return r.prefix ? `${r.path}{id}` : r.path;
}

function route(
  method: string,
  path: string,
  auth: Route["auth"],
  handler: Handler,
  extra: Pick<Route, "prefix" | "errors"> = {},
): Route {
  return { method, path, auth, handler, ...extra };
}
