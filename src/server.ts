/**
 * The HTTP surface: route table and middleware (request id, CORS, auth, body limit, admission,
 * time limit, error mapping, access log, metrics). Knows nothing about tokens; services do the
 * OpenAI semantics.
 */
import {
  abortedError,
  ApiError,
  errorResponse,
  fromZodError,
  jsonResponse,
  modelNotFound,
  onSlicedJsonEnd,
  slicedJsonResponse,
} from "./http/errors.ts";
import { readJsonBody } from "./http/body.ts";
import type { ApiKey, KeyRing, RateLimiter } from "./http/auth.ts";
import type { Logger } from "./log.ts";
import type { ModelSlot, Registry } from "./registry.ts";
import type { Metrics } from "./metrics.ts";
import { EmbeddingsRequestSchema } from "./protocol/embeddings.ts";
import { ChatRequestSchema } from "./protocol/chat.ts";
import type { ModelList, ModelObject } from "./protocol/models.ts";
import { createEmbeddings, type EmbeddingLimits } from "./services/embeddings.ts";
import { createEntryEmbeddings } from "./services/upstream_embeddings.ts";
import { modelStatus } from "./upstream/status.ts";
import { relayCompletion } from "./upstream/completions.ts";
import { poolOf } from "./upstream/load.ts";
import { openApiDocument, type RouteInfo } from "./http/openapi.ts";
import { type ChatContext, createChatCompletion } from "./services/chat.ts";
import { createResponse, IGNORED_TOOLS_HEADER, type ResponsesOptions } from "./services/responses.ts";
import { ReasoningSealer } from "./services/reasoning_seal.ts";
import { ResponsesRequestSchema } from "./protocol/responses.ts";
import { createCompletion } from "./services/completions.ts";
import { detokenize, tokenize } from "./services/tokens.ts";
import {
  CompletionRequestSchema,
  DetokenizeRequestSchema,
  TokenizeRequestSchema,
} from "./protocol/completions.ts";
import { VERSION_INFO } from "./version.ts";
import type { z } from "zod";
import type { ConnectionWatch } from "./http/connections.ts";
import { CountTokensRequestSchema, MessagesRequestSchema } from "./protocol/anthropic.ts";
import { anthropicErrorResponse, postCountTokens, postMessages } from "./routes/messages.ts";

/** Shutdown state shared with `main.ts`. */
export interface Lifecycle {
  /** True once shutdown began: new requests get 503. */
  draining: boolean;
  /** Aborts every in-flight request when the drain time is over. */
  shutdown: AbortSignal;
}

/** Everything the server needs, passed in. */
export interface ServerDeps {
  registry: Registry;
  keys: KeyRing;
  limiter: RateLimiter;
  /** Whether /metrics and /health/ready need a key. */
  opsNeedKey: boolean;
  log: Logger;
  metrics: Metrics;
  lifecycle: Lifecycle;
  bodyLimitBytes: number;
  maxEmbeddingInputs: number;
  maxQueue: number;
  requestTimeoutMs: number;
  /** Time to receive a request body (0 = none). */
  bodyTimeoutMs?: number;
  /** Per embedding model: tokens admitted at once. */
  maxQueuedEmbeddingTokens?: number;
  corsOrigins: readonly string[];
  /** The connection watch (client-gone detection, idle timeout), once listening. */
  connections?: () => ConnectionWatch | null;
  /** Called as each request arrives (the event-loop monitor goes back to short ticks). */
  onRequest?: () => void;
  /** Seconds since the epoch; injectable for tests. */
  now?: () => number;
  /**
   * Hosted-tool policy of `/v1/responses` and `/v1/messages`, and the sealing of reasoning and
   * thinking signatures (default: ignore, a key made here).
   */
  responses?: ResponsesOptions;
  /** Each local model's weight, share and compute seconds in the compute arbiter, for /health. */
  computeUsage?: () => readonly { model: string; weight: number; share: number; seconds: number }[];
}

/** The request handler for `Deno.serve`, with the route table it serves. */
export type ServerHandler =
  & ((req: Request, info?: Deno.ServeHandlerInfo<Deno.Addr>) => Promise<Response>)
  & { readonly routes: readonly RouteInfo[] };

/** Per-request facts for the access log and metrics. */
interface RequestContext {
  id: string;
  route: string;
  signal: AbortSignal;
  key?: ApiKey;
  model?: string;
  promptTokens?: number;
  completionTokens?: number;
  queueWaitMs?: number;
  /** Runs when the response body has been sent or abandoned. */
  onDone: (() => void)[];
}

type Handler = (req: Request, ctx: RequestContext, match: string) => Promise<Response> | Response;
interface Route {
  method: string;
  /** Exact path, or a prefix ending in `/` whose remainder is passed as `match`. */
  path: string;
  prefix?: boolean;
  /** `v1`: a key always; `ops`: per --ops-auth; `open`: never. */
  auth: "v1" | "ops" | "open";
  handler: Handler;
  /** The route's error body, when it is not OpenAI's. */
  errors?: (e: ApiError, requestId: string) => Response;
}

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
  const now = deps.now ?? (() => Math.floor(Date.now() / 1000));
  const parse = async <S extends z.ZodType>(req: Request, schema: S): Promise<z.infer<S>> => {
    const body = await readJsonBody(req, deps.bodyLimitBytes, deps.bodyTimeoutMs ?? 0);
    const r = schema.safeParse(body);
    if (!r.success) throw fromZodError(r.error);
    return r.data;
  };
  const admit = (slot: ModelSlot, ctx: RequestContext, weight = 1) => {
    try {
      ctx.onDone.push(deps.registry.admit(slot, deps.maxQueue, weight));
    } catch (e) {
      deps.metrics.rejected.inc({ model: slot.spec.id });
      throw e;
    }
  };

  /** The slot of `name` if this key may use it; otherwise 404, as for an unknown model. */
  const allowedSlot = (name: string, key: ApiKey | undefined): ModelSlot => {
    const slot = deps.registry.find(name);
    if (key?.models && ![slot.spec.id, ...slot.spec.aliases].some((n) => key.models!.has(n))) {
      throw modelNotFound(name);
    }
    return slot;
  };

  const modelObject = (name: string): ModelObject => {
    const slot = deps.registry.find(name);
    return {
      id: name,
      object: "model",
      created: slot.created,
      owned_by: slot.spec.owned_by,
      kind: slot.spec.kind,
      status: modelStatus(slot.state, slot.engine?.upstreams?.()),
      ...(name !== slot.spec.id ? { alias_of: slot.spec.id } : {}),
      ...(slot.engine?.upstreams
        ? { upstreams: slot.engine.upstreams().map((u) => ({ name: u.name, state: u.state })) }
        : {}),
    };
  };

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
  const healthBody = () => ({
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
  });

  /** The chat engine for `model`, checked against the key and admitted with `weight` sequences. */
  const chatEngine = (model: string, ctx: RequestContext, weight = 1) => {
    ctx.model = model;
    allowedSlot(model, ctx.key);
    const { slot, engine } = deps.registry.engine(model, "chat");
    admit(slot, ctx, weight);
    return { slot, engine };
  };

  /** What the chat engine path needs from one request (shared by chat completions and responses). */
  const chatContext = (slot: ModelSlot, ctx: RequestContext): ChatContext => {
    const started = performance.now();
    return {
      defaultThinking: slot.spec.thinking,
      systemFingerprint: slot.details.system_fingerprint as string | undefined,
      created: now(),
      signal: ctx.signal,
      log: deps.log,
      requestId: ctx.id,
      // The wait ends when the engine starts the job: it got its sequences (or was sent upstream).
      onStarted: (at = performance.now()) => (ctx.queueWaitMs = Math.max(0, at - started)),
      onFirstToken: () =>
        deps.metrics.ttft.observe({ model: slot.spec.id }, (performance.now() - started) / 1000),
      onUsage: (u) => {
        ctx.promptTokens = u.prompt_tokens;
        ctx.completionTokens = u.completion_tokens;
      },
    };
  };

  const responsesOptions: Promise<ResponsesOptions> = deps.responses
    ? Promise.resolve(deps.responses)
    : ReasoningSealer.create().then((sealer) => ({ hostedTools: "ignore", sealer }));

  const routes: Route[] = [
    {
      method: "POST",
      path: "/v1/embeddings",
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, EmbeddingsRequestSchema);
        ctx.model = body.model;
        allowedSlot(body.model, ctx.key);
        const { slot, engine } = deps.registry.engine(body.model, "embedding");
        admit(slot, ctx);
        // A model served by upstreams reads the entries itself (its tokenizer is theirs).
        const limits: EmbeddingLimits = {
          maxInputTokens: slot.spec.maxInputTokens ?? 8192,
          maxEntries: deps.maxEmbeddingInputs,
          matryoshka: slot.spec.matryoshka,
          minDims: slot.spec.minDims,
          queryInstruction: slot.spec.queryInstruction,
          queryFormat: slot.spec.queryFormat,
          admitTokens: (tokens) => {
            try {
              return deps.registry.admitTokens(slot, tokens, deps.maxQueuedEmbeddingTokens ?? 262_144);
            } catch (e) {
              deps.metrics.rejected.inc({ model: slot.spec.id });
              throw e;
            }
          },
        };
        // The request id travels to upstreams, so their logs name the same request.
        const res = engine.embedEntries
          ? await createEntryEmbeddings(body, engine, limits, ctx.signal, ctx.id)
          : await createEmbeddings(body, engine, limits, ctx.signal);
        ctx.promptTokens = res.usage.prompt_tokens;
        // Past a few dozen vectors the JSON text is serialised in slices (see slicedJsonResponse).
        if (res.data.length <= 16) return jsonResponse(res);
        // (A request already cut off gets its error, not a status line and a broken body.)
        ctx.signal.throwIfAborted();
        return slicedJsonResponse(res, "data", { signal: ctx.signal });
      },
    },
    {
      method: "POST",
      path: "/v1/chat/completions",
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, ChatRequestSchema);
        // n choices hold n sequences.
        const { slot, engine } = chatEngine(body.model, ctx, body.n ?? 1);
        return await createChatCompletion(body, engine, chatContext(slot, ctx));
      },
    },
    {
      method: "POST",
      path: "/v1/responses",
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, ResponsesRequestSchema);
        const { slot, engine } = chatEngine(body.model, ctx);
        return await createResponse(body, engine, chatContext(slot, ctx), await responsesOptions);
      },
    },
    {
      method: "POST",
      path: "/v1/messages",
      auth: "v1",
      errors: anthropicErrorResponse,
      handler: async (req, ctx) => {
        const body = await parse(req, MessagesRequestSchema);
        const { slot, engine } = chatEngine(body.model, ctx);
        return await postMessages(body, engine, chatContext(slot, ctx), await responsesOptions);
      },
    },
    {
      method: "POST",
      path: "/v1/messages/count_tokens",
      auth: "v1",
      errors: anthropicErrorResponse,
      handler: async (req, ctx) => {
        const body = await parse(req, CountTokensRequestSchema);
        ctx.model = body.model;
        allowedSlot(body.model, ctx.key);
        const { slot, engine } = deps.registry.engine(body.model, "chat");
        const options = await responsesOptions;
        return await postCountTokens(body, engine, slot.spec.thinking, ctx.id, options, ctx.signal);
      },
    },
    ...["GET", "DELETE"].map((method): Route => ({
      method,
      path: "/v1/responses/",
      prefix: true,
      auth: "v1",
      handler: () => {
        throw new ApiError(
          404,
          "not_found_error",
          "This server is stateless: it stores no responses, so none can be retrieved or deleted.",
          "response_id",
          "not_found",
        );
      },
    })),
    {
      method: "POST",
      path: "/v1/completions",
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, CompletionRequestSchema);
        ctx.model = body.model;
        allowedSlot(body.model, ctx.key);
        const { slot, engine } = deps.registry.engine(body.model, "chat");
        const prompts = typeof body.prompt === "string" || typeof body.prompt[0] === "number"
          ? 1
          : body.prompt.length;
        admit(slot, ctx, prompts * (body.n ?? 1));
        // The chat path's context: the same usage, fingerprint and queue wait (until every prompt started).
        const completionContext = chatContext(slot, ctx);
        // A model served by upstreams relays the request: the prompt's tokens are the upstream's.
        const pool = poolOf(engine);
        if (pool) return await relayCompletion(body, pool, completionContext);
        return await createCompletion(body, engine, completionContext);
      },
    },
    ...["/tokenize", "/v1/tokenize"].map((path): Route => ({
      method: "POST",
      path,
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, TokenizeRequestSchema);
        ctx.model = body.model;
        allowedSlot(body.model, ctx.key);
        const slot = deps.registry.find(body.model);
        const { engine } = deps.registry.engine(body.model, slot.spec.kind);
        return jsonResponse(
          await tokenize(
            body,
            engine,
            slot.spec.kind === "chat" ? slot.spec.thinking : undefined,
            ctx.signal,
          ),
        );
      },
    })),
    ...["/detokenize", "/v1/detokenize"].map((path): Route => ({
      method: "POST",
      path,
      auth: "v1",
      handler: async (req, ctx) => {
        const body = await parse(req, DetokenizeRequestSchema);
        ctx.model = body.model;
        allowedSlot(body.model, ctx.key);
        const slot = deps.registry.find(body.model);
        const { engine } = deps.registry.engine(body.model, slot.spec.kind);
        return jsonResponse(detokenize(body, engine));
      },
    })),
    {
      method: "GET",
      path: "/version",
      auth: "open",
      handler: () => jsonResponse(VERSION_INFO),
    },
    // Clients probe the base URL (Claude Code sends `HEAD /` first).
    {
      method: "GET",
      path: "/",
      auth: "open",
      handler: () =>
        jsonResponse({ name: VERSION_INFO.name, version: VERSION_INFO.version, openapi: "/openapi.json" }),
    },
    {
      method: "HEAD",
      path: "/",
      auth: "open",
      handler: () => new Response(null, { headers: { "content-type": "application/json" } }),
    },
    {
      method: "GET",
      path: "/v1/models",
      auth: "v1",
      handler: (_req, ctx) => {
        const names = deps.registry.slots.flatMap((s) => [s.spec.id, ...s.spec.aliases])
          .filter((n) => !ctx.key?.models || allowed(n));
        function allowed(n: string) {
          try {
            allowedSlot(n, ctx.key);
            return true;
          } catch {
            return false;
          }
        }
        const list: ModelList = { object: "list", data: names.map(modelObject) };
        return jsonResponse(list);
      },
    },
    {
      method: "GET",
      path: "/v1/models/",
      prefix: true,
      auth: "v1",
      handler: (_req, ctx, name) => {
        let id: string;
        try {
          id = decodeURIComponent(name);
        } catch {
          throw new ApiError(
            400,
            "invalid_request_error",
            "The model id in the path is not valid percent-encoding.",
            "model",
            "invalid_path",
          );
        }
        allowedSlot(id, ctx.key);
        return jsonResponse(modelObject(id));
      },
    },
    { method: "GET", path: "/health", auth: "open", handler: () => jsonResponse(healthBody()) },
    {
      method: "GET",
      path: "/health/ready",
      auth: "ops",
      handler: () => {
        const body = healthBody();
        return jsonResponse(body, body.ready ? 200 : 503, body.ready ? {} : { "retry-after": "5" });
      },
    },
    {
      method: "GET",
      path: "/metrics",
      auth: "ops",
      handler: () =>
        new Response(deps.metrics.render(), {
          headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
        }),
    },
    {
      method: "GET",
      path: "/openapi.json",
      auth: "open",
      handler: () => jsonResponse(openApi ??= openApiDocument(routeTable)),
    },
  ];
  /** The route table as `/openapi.json` and tests see it. */
  const routeTable: RouteInfo[] = routes.map((r) => ({
    method: r.method,
    path: r.prefix ? `${r.path}{id}` : r.path,
    auth: r.auth,
  }));
  let openApi: Record<string, unknown> | undefined;

  const route = (method: string, path: string): { route: Route; match: string } => {
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
  };

  const handler = async (req: Request, info?: Deno.ServeHandlerInfo<Deno.Addr>): Promise<Response> => {
    const started = performance.now();
    deps.onRequest?.();
    const url = new URL(req.url);
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
    let res: Response;
    let rateHeaders: Record<string, string> = {};
    try {
      if (req.method === "OPTIONS" && deps.corsOrigins.length > 0) {
        ctx.route = "preflight";
        res = new Response(null, { status: 204 });
      } else {
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
        const { route: r, match } = route(req.method, url.pathname);
        ctx.route = r.prefix ? `${r.path}{id}` : r.path;
        if (deps.lifecycle.draining && r.auth === "v1") {
          throw abortedError(new DOMException("shutting down", "ShutdownError"));
        }
        if (r.auth === "v1" || (r.auth === "ops" && deps.opsNeedKey)) {
          ctx.key = deps.keys.authorize(req.headers.get("authorization"), req.headers.get("x-api-key"));
        }
        if (r.auth === "v1") rateHeaders = deps.limiter.admit(ctx.key);
        res = await r.handler(req, ctx, match);
      }
    } catch (e) {
      const error = toApiError(e, signal, ctx, deps.log);
      const shape = routes.find((r) => r.errors && r.path === url.pathname)?.errors;
      res = shape ? shape(error, ctx.id) : errorResponse(error);
    }
    res.headers.set("x-request-id", ctx.id);
    res.headers.set("x-content-type-options", "nosniff");
    for (const [k, v] of Object.entries(rateHeaders)) if (!res.headers.has(k)) res.headers.set(k, v);
    applyCors(req, res, deps.corsOrigins);
    /** `cut`: the body ended before its end (the client left, or it failed). */
    const finish = (cut = false) => {
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
    // Streams end later: their last byte ends the request. A sliced JSON body says when it ends; an
    // event stream passes through a stage that notices it. Every other body is one string sent at once
    // with a content-length, which it keeps only while nobody reads `res.body` (the getter turns a
    // string body into a stream, sent chunked): look at the content type first.
    if (onSlicedJsonEnd(res, finish)) return res;
    const streaming = res.headers.get("content-type")?.startsWith("text/event-stream") && res.body !== null;
    return streaming ? withBodyEnd(res, finish) : (finish(), res);
  };
  return Object.assign(handler, { routes: routeTable });
}

function toApiError(e: unknown, signal: AbortSignal, ctx: RequestContext, log: Logger): ApiError {
  if (e instanceof ApiError) return e;
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

/** At most `max` characters of a client-supplied string, for logs and error messages. */
export function clip(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max)}…(${text.length} chars)`;
}

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
