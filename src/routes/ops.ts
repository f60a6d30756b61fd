/**
 * The operational routes: `/health` and `/health/ready`, `/metrics`, `/version`, the base URL
 * (`GET` and `HEAD /`, which clients probe) and `/openapi.json`.
 */
import { jsonResponse } from "../http/errors.ts";
import { openApiDocument, type RouteInfo } from "../http/openapi.ts";
import { VERSION_INFO } from "../version.ts";
import type { Handler, RouteKit } from "./context.ts";
import { modelStatus } from "./model_status.ts";

/** The `/health` body: the server's state and each model's. */
function healthBody(kit: RouteKit) {
  const { deps } = kit;
  const computeOf = (model: string) => {
    const u = deps.computeUsage?.().find((u) => u.model === model);
    return u
      ? {
        compute: {
          weight: u.weight,
          share: Number(u.share.toFixed(4)),
          seconds: Number(u.seconds.toFixed(3)),
        },
      }
      : {};
  };
  return {
    status: deps.lifecycle.draining ? "draining" : "ok",
    ready: deps.registry.ready && !deps.lifecycle.draining,
    models: deps.registry.slots.map((s) => ({
      id: s.spec.id,
      kind: s.spec.kind,
      status: modelStatus(s.state, s.engine?.upstreams?.()),
      // The reason without file system paths: this body needs no key.
      ...(s.error ? { error: s.error.replace(/(?:\/[^\s'"/]+)+\/([^\s'"/]+)/g, "…/$1") } : {}),
      ...(s.loadSeconds !== undefined ? { load_seconds: Number(s.loadSeconds.toFixed(2)) } : {}),
      in_flight: s.inFlight,
      ...s.details,
      ...computeOf(s.spec.id),
      ...(s.engine?.upstreams
        ? {
          upstreams: s.engine.upstreams().map((u) => ({
            name: u.name,
            state: u.state,
            in_flight: u.inFlight,
            failures: u.failures,
          })),
        }
        : {}),
    })),
  };
}

/**
 * `GET /health`: always 200 while the process serves.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "GET", path: "/health", auth: "open", handler: getHealth(kit) };
 * }
 * ```
 */
export function getHealth(kit: RouteKit): Handler {
  return () => jsonResponse(healthBody(kit));
}

/** `GET /health/ready`: 503 with `retry-after` until every model is loaded, and while draining. */
export function getReady(kit: RouteKit): Handler {
  return () => {
    const body = healthBody(kit);
    return jsonResponse(body, body.ready ? 200 : 503, body.ready ? {} : { "retry-after": "5" });
  };
}

/** `GET /metrics`: the Prometheus text format. */
export function getMetrics(kit: RouteKit): Handler {
  return () =>
    new Response(kit.deps.metrics.render(), {
      headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
    });
}

/** `GET /version`. */
export const getVersion: Handler = () => jsonResponse(VERSION_INFO);

/** `GET /`: what answers at the base URL (Claude Code sends `HEAD /` first). */
export const getRoot: Handler = () =>
  jsonResponse({ name: VERSION_INFO.name, version: VERSION_INFO.version, openapi: "/openapi.json" });

/** `HEAD /`. */
export const headRoot: Handler = () =>
  new Response(null, { headers: { "content-type": "application/json" } });

/** `GET /openapi.json`, generated once from the route table `routes()` returns. */
export function getOpenApi(routes: () => readonly RouteInfo[]): Handler {
  let openApi: Record<string, unknown> | undefined;
  return () => jsonResponse(openApi ??= openApiDocument(routes()));
}
