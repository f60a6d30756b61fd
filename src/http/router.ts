/**
 * The router: a request's method and path → one route of a table. A route has an exact path, or a
 * prefix ending in `/` whose remainder (a model id, a response id) the handler receives.
 */
import { ApiError } from "./errors.ts";

/** What the router matches a route by. */
export interface RoutePattern {
  method: string;
  /** Exact path, or a prefix ending in `/` whose remainder is passed as `match`. */
  path: string;
  prefix?: boolean;
}

/**
 * The route of `routes` for `method` and `path`, and the path's remainder after a prefix route.
 * Throws 404 `unknown_url` when no route has the path, 405 `method_not_allowed` (with `allow`)
 * when none of those has the method.
 *
 * @example
 * ```ts
 * const routes = [{ method: "GET", path: "/v1/models/", prefix: true }];
 * const { match } = matchRoute(routes, "GET", "/v1/models/tiny-chat"); // match: "tiny-chat"
 * ```
 */
export function matchRoute<R extends RoutePattern>(
  routes: readonly R[],
  method: string,
  path: string,
): { route: R; match: string } {
  const matching = routes.filter((r) =>
    r.prefix ? path.startsWith(r.path) && path.length > r.path.length : path === r.path
  );
  if (matching.length === 0) {
    throw new ApiError(
      404,
      "invalid_request_error",
      `Unknown path '${clip(path, 256)}'.`,
      null,
      "unknown_url",
    );
  }
  const hit = matching.find((r) => r.method === method);
  if (!hit) {
    const allowed = [...new Set(matching.map((r) => r.method))].join(", ");
    throw new ApiError(
      405,
      "invalid_request_error",
      `Method ${clip(method, 16)} is not allowed on '${clip(path, 256)}'; use ${allowed}.`,
      null,
      "method_not_allowed",
      { allow: allowed },
    );
  }
  return { route: hit, match: hit.prefix ? path.slice(hit.path.length) : "" };
}

/** At most `max` characters of a client-supplied string, for logs and error messages. */
export function clip(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max)}…(${text.length} chars)`;
}
