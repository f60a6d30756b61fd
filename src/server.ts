/**
 * The HTTP surface: `Deno.serve`'s handler. A request passes, in order: its id and signal (client
 * gone, time limit, shutdown), CORS preflight, the target's length, the router, the drain check,
 * auth and the key's rate limit, then its route (`routes/`: body limit, admission, the service);
 * any error becomes its API error body; every answer gets the request id, `nosniff`, the rate
 * headers and CORS; the access log and metrics are written when the body ends. Knows nothing
 * about tokens; services do the OpenAI semantics.
 */
import {
  abortedError,
  ApiError,
  badRequest,
  errorResponse,
  fromUpstreamError,
  onSlicedJsonEnd,
} from "./http/errors.ts";
import { clip, matchRoute } from "./http/router.ts";
import { whenBodyRead } from "./http/body.ts";
import type { RouteInfo } from "./http/openapi.ts";
import { EngineInputError, EngineUpstreamError } from "./engines/types.ts";
import type { Logger } from "./log.ts";
import { type RequestContext, type Route, routeKit, type ServerDeps } from "./routes/context.ts";
import { routeInfo, routeLabel, routeTable } from "./routes/index.ts";
import { onSseEnd } from "./http/sse.ts";
import { IngressPacer } from "./event_loop.ts";
import { IGNORED_TOOLS_HEADER } from "./routes/responses.ts";

export type { Lifecycle, ServerDeps } from "./routes/context.ts";

/** The request handler for `Deno.serve`, with the route table it serves. */
export type ServerHandler =
  & ((req: Request, info?: Deno.ServeHandlerInfo<Deno.Addr>) => Promise<Response>)
  & { readonly routes: readonly RouteInfo[] };

/**
 * Builds the request handler for `Deno.serve`.
 *
 * @example
 * ```ts
 * function serve(deps: ServerDeps) {
 *   return Deno.serve({ port: 8080 }, createServer(deps));
 * }
 * ```
 */
export function createServer(deps: ServerDeps): ServerHandler {
  const routes = routeTable(routeKit(deps));
  const ingress = new IngressPacer();
  const handler = async (req: Request, info?: Deno.ServeHandlerInfo<Deno.Addr>): Promise<Response> => {
    const started = performance.now();
    deps.onRequest?.();
    const url = new URL(req.url);
    const { ctx, untrack } = startRequest(req, info, deps);
    // API requests are counted from the drain check to the answer's end, and as unread until their
    // handler has read the body or finished: the listener closes only when none is unread.
    let counted = false;
    let unread = false;
    const read = () => {
      if (!unread) return;
      unread = false;
      if (--deps.lifecycle.unread === 0) deps.lifecycle.onRead?.();
    };
    let res: Response;
    let rateHeaders: Record<string, string> = {};
    try {
      if (req.method === "OPTIONS" && deps.corsOrigins.length > 0) {
        ctx.route = "preflight";
        res = new Response(null, { status: 204 });
      } else {
        checkTarget(url);
        const { route, match } = matchRoute(routes, req.method, url.pathname);
        ctx.route = routeLabel(route);
        refuseWhileDraining(route, deps);
        if (route.auth === "v1") {
          deps.lifecycle.inFlight++;
          deps.lifecycle.unread++;
          counted = unread = true;
          whenBodyRead(req, read);
        }
        // A request to a model waits its turn in a burst (event_loop.ts); `/health` never does.
        const turn = route.auth === "v1" ? ingress.admit() : undefined;
        if (turn) await turn;
        rateHeaders = authenticate(req, route, ctx, deps);
        res = await route.handler(req, ctx, match);
      }
    } catch (e) {
      const error = toApiError(e, ctx.signal, ctx, deps.log);
      const shape = routes.find((r) => r.errors && r.path === url.pathname)?.errors;
      res = shape ? shape(error, ctx.id) : errorResponse(error);
    }
    // A handler that returned has read what body it needed.
    read();
    addHeaders(req, res, ctx, rateHeaders, deps.corsOrigins);
    const done = accessLog(req, url, res, ctx, started, untrack, deps);
    if (!counted) return untilBodyEnds(res, done);
    return untilBodyEnds(res, (cut) => {
      deps.lifecycle.inFlight--;
      done(cut);
    });
  };
  return Object.assign(handler, { routes: routeInfo(routes) });
}

/**
 * The request's context: its id (the client's `x-request-id` when well formed) and its signal,
 * which aborts when the client goes away, the time limit passes or the drain time is over.
 */
function startRequest(
  req: Request,
  info: Deno.ServeHandlerInfo<Deno.Addr> | undefined,
  deps: ServerDeps,
): { ctx: RequestContext; untrack?: () => void } {
  // Deno.serve misses the disconnect of a client whose body was over ~1 KB: the kernel's view does not.
  const gone = new AbortController();
  const remote = info?.remoteAddr;
  const untrack = remote?.transport === "tcp"
    ? deps.connections?.()?.track(
      remote,
      () => gone.abort(new DOMException("the client closed the connection", "AbortError")),
    )
    : undefined;
  const signal = AbortSignal.any([
    req.signal,
    gone.signal,
    AbortSignal.timeout(deps.requestTimeoutMs),
    deps.lifecycle.shutdown,
  ]);
  const ctx: RequestContext = {
    id: requestId(req.headers.get("x-request-id")),
    // Fixed labels only: an unknown path must not become a metrics series.
    route: "unmatched",
    signal,
    onDone: [],
  };
  return { ctx, untrack };
}

/** 414 for a request path and query over {@link MAX_TARGET_CHARS}. */
function checkTarget(url: URL): void {
  // (Past 65,534 bytes Deno's HTTP parser refuses the request line itself: an empty 400.)
  const target = url.pathname.length + url.search.length;
  if (target > MAX_TARGET_CHARS) {
    throw new ApiError(
      414,
      "invalid_request_error",
      `The request path and query are ${target} characters long; at most ${MAX_TARGET_CHARS} are accepted.`,
      null,
      "uri_too_long",
    );
  }
}

/** 503 `shutting_down` for API routes once shutdown began. */
function refuseWhileDraining(route: Route, deps: ServerDeps): void {
  if (deps.lifecycle.draining && route.auth === "v1") {
    throw abortedError(new DOMException("shutting down", "ShutdownError"));
  }
}

/** The request's key (401 without a valid one where the route needs it), and its rate-limit headers (or 429). */
function authenticate(
  req: Request,
  route: Route,
  ctx: RequestContext,
  deps: ServerDeps,
): Record<string, string> {
  if (route.auth === "v1" || (route.auth === "ops" && deps.opsNeedKey)) {
    ctx.key = deps.keys.authorize(req.headers.get("authorization"), req.headers.get("x-api-key"));
  }
  return route.auth === "v1" ? deps.limiter.admit(ctx.key) : {};
}

/** The headers of every answer: the request id, `nosniff`, the key's rate limits, CORS. */
function addHeaders(
  req: Request,
  res: Response,
  ctx: RequestContext,
  rateHeaders: Record<string, string>,
  corsOrigins: readonly string[],
): void {
  res.headers.set("x-request-id", ctx.id);
  res.headers.set("x-content-type-options", "nosniff");
  for (const [k, v] of Object.entries(rateHeaders)) if (!res.headers.has(k)) res.headers.set(k, v);
  applyCors(req, res, corsOrigins);
}

/**
 * What runs once the answer's body has ended (`cut`: before its end, the client left or it
 * failed): the stream's engine slots and admission released, the key charged, metrics, the access
 * log line.
 */
function accessLog(
  req: Request,
  url: URL,
  res: Response,
  ctx: RequestContext,
  started: number,
  untrack: (() => void) | undefined,
  deps: ServerDeps,
): (cut?: boolean) => void {
  return (cut = false) => {
    untrack?.();
    for (const f of ctx.onDone) f();
    const seconds = (performance.now() - started) / 1000;
    deps.limiter.charge(ctx.key, (ctx.promptTokens ?? 0) + (ctx.completionTokens ?? 0));
    deps.metrics.requests.inc({
      route: ctx.route,
      status: String(res.status),
      ...(ctx.key ? { key: ctx.key.name } : {}),
    });
    deps.metrics.duration.observe({ route: ctx.route }, seconds);
    if (ctx.model && ctx.queueWaitMs !== undefined) {
      deps.metrics.queueWait.observe({ model: ctx.model }, ctx.queueWaitMs / 1000);
    }
    if (ctx.model && ctx.promptTokens) {
      deps.metrics.promptTokens.inc({ model: ctx.model }, ctx.promptTokens);
    }
    if (ctx.model && ctx.completionTokens) {
      deps.metrics.completionTokens.inc({ model: ctx.model }, ctx.completionTokens);
    }
    deps.log.info("request", {
      request_id: ctx.id,
      method: req.method,
      route: clip(url.pathname, 256),
      status: res.status,
      ...(ctx.key ? { key: ctx.key.name } : {}),
      ...(ctx.model ? { model: clip(ctx.model, 256) } : {}),
      ...(ctx.promptTokens !== undefined ? { prompt_tokens: ctx.promptTokens } : {}),
      ...(ctx.completionTokens !== undefined ? { completion_tokens: ctx.completionTokens } : {}),
      ...(ctx.queueWaitMs !== undefined ? { queue_wait_ms: Number(ctx.queueWaitMs.toFixed(2)) } : {}),
      ...(cut ? { body: "cut" } : {}),
      ms: Number((seconds * 1000).toFixed(2)),
    });
  };
}

/** `res`, with `finish` called when its body ends: at once for a body sent whole, later for streams. */
function untilBodyEnds(res: Response, finish: (cut?: boolean) => void): Response {
  // Streams end later: their last byte ends the request. A sliced JSON body says when it ends; an
  // event stream passes through a stage that notices it. Every other body is one string sent at once
  // with a content-length, which it keeps only while nobody reads `res.body` (the getter turns a
  // string body into a stream, sent chunked): look at the content type first.
  if (onSlicedJsonEnd(res, finish)) return res;
  const streaming = res.headers.get("content-type")?.startsWith("text/event-stream") && res.body !== null;
  // Our own event streams say when they end; others (a remote engine's, passed on) get a stage that sees it.
  if (streaming && onSseEnd(res.body, finish)) return res;
  return streaming ? withBodyEnd(res, finish) : (finish(), res);
}

function toApiError(e: unknown, signal: AbortSignal, ctx: RequestContext, log: Logger): ApiError {
  if (e instanceof ApiError) return e;
  // A remote engine's refusal or failure where no service shaped it (tokenize, embeddings).
  if (e instanceof EngineUpstreamError) return fromUpstreamError(e);
  // Bad input an engine found where no service mapped it (e.g. /tokenize of messages the template refuses).
  if (e instanceof EngineInputError) return badRequest(e.message, e.param, e.code);
  if (signal.aborted) return abortedError(signal.reason);
  log.error("unexpected error", { request_id: ctx.id, error: String((e as Error)?.stack ?? e) });
  return new ApiError(
    500,
    "server_error",
    `Internal server error (request id ${ctx.id}).`,
    null,
    "internal_error",
  );
}

/** The same response whose body calls `done` once, when it ends (`cut`: when it fails or is cancelled). */
function withBodyEnd(res: Response, done: (cut: boolean) => void): Response {
  const reader = res.body!.getReader();
  let called = false;
  const once = (cut: boolean) => {
    if (!called) done(cut);
    called = true;
  };
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done: end } = await reader.read();
        if (end) {
          controller.close();
          once(false);
        } else controller.enqueue(value);
      } catch (e) {
        controller.error(e);
        once(true);
      }
    },
    async cancel(reason) {
      await reader.cancel(reason).catch(() => {});
      once(true);
    },
  });
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
}

/** Longest request path and query (as llama-server's HTTP library): a longer one is a 414. */
const MAX_TARGET_CHARS = 8192;

function requestId(given: string | null): string {
  if (given && /^[\w.:-]{1,128}$/.test(given)) return given;
  return `req-${crypto.randomUUID()}`;
}

function applyCors(req: Request, res: Response, origins: readonly string[]): void {
  const origin = req.headers.get("origin");
  if (!origin || origins.length === 0) return;
  if (!origins.includes("*") && !origins.includes(origin)) return;
  res.headers.set("access-control-allow-origin", origins.includes("*") ? "*" : origin);
  res.headers.set("vary", "origin");
  // Browsers ask for what they will send (the official SDK adds its x-stainless-* headers): allow
  // exactly that, as long as it is a list of header names.
  const asked = req.headers.get("access-control-request-headers");
  res.headers.set(
    "access-control-allow-headers",
    asked && /^[\w-]+(\s*,\s*[\w-]+)*$/.test(asked.trim()) && asked.length <= 2048
      ? asked
      : "authorization, content-type, x-request-id",
  );
  res.headers.set("access-control-allow-methods", "GET, POST, OPTIONS");
  res.headers.set("access-control-expose-headers", `x-request-id, ${IGNORED_TOOLS_HEADER}`);
  res.headers.set("access-control-max-age", "600");
}
