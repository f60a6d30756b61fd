/**
 * The HTTP surface: route table and middleware (request id, CORS, auth, body limit, error
 * mapping, access log). Knows nothing about tokens; services do the OpenAI semantics.
 */
import { ApiError, errorResponse, fromZodError, jsonResponse } from "./http/errors.ts";
import { readJsonBody } from "./http/body.ts";
import type { KeyRing } from "./http/auth.ts";
import type { Logger } from "./log.ts";
import type { Registry } from "./registry.ts";
import { EmbeddingsRequestSchema } from "./protocol/embeddings.ts";
import { ChatRequestSchema } from "./protocol/chat.ts";
import type { ModelList, ModelObject } from "./protocol/models.ts";
import { createEmbeddings } from "./services/embeddings.ts";
import { createChatCompletion } from "./services/chat.ts";
import type { z } from "zod";

/** Everything the server needs, passed in. */
export interface ServerDeps {
  registry: Registry;
  keys: KeyRing;
  log: Logger;
  bodyLimitBytes: number;
  maxEmbeddingInputs: number;
  corsOrigins: readonly string[];
  /** Seconds since the epoch; injectable for tests. */
  now?: () => number;
}

/** Per-request facts the access log reports. */
interface RequestContext {
  id: string;
  model?: string;
  promptTokens?: number;
  completionTokens?: number;
}

type Handler = (req: Request, ctx: RequestContext, match: string) => Promise<Response> | Response;
interface Route {
  method: string;
  /** Exact path, or a prefix ending in `/` whose remainder is passed as `match`. */
  path: string;
  prefix?: boolean;
  auth: boolean;
  handler: Handler;
}

/**
 * Builds the request handler for `Deno.serve`.
 *
 * @example
 * ```ts
 * Deno.serve({ port: 8080 }, createServer(deps));
 * ```
 */
export function createServer(deps: ServerDeps): (req: Request) => Promise<Response> {
  const now = deps.now ?? (() => Math.floor(Date.now() / 1000));
  const parse = async <S extends z.ZodType>(req: Request, schema: S): Promise<z.infer<S>> => {
    const body = await readJsonBody(req, deps.bodyLimitBytes);
    const r = schema.safeParse(body);
    if (!r.success) throw fromZodError(r.error);
    return r.data;
  };

  const modelObject = (name: string): ModelObject => {
    const slot = deps.registry.find(name);
    return {
      id: name,
      object: "model",
      created: slot.created,
      owned_by: slot.spec.owned_by,
      kind: slot.spec.kind,
      status: slot.state,
      ...(name !== slot.spec.id ? { alias_of: slot.spec.id } : {}),
    };
  };

  const routes: Route[] = [
    {
      method: "POST",
      path: "/v1/embeddings",
      auth: true,
      handler: async (req, ctx) => {
        const body = await parse(req, EmbeddingsRequestSchema);
        ctx.model = body.model;
        const { slot, engine } = deps.registry.engine(body.model, "embedding");
        const res = await createEmbeddings(body, engine, {
          maxInputTokens: slot.spec.maxInputTokens ?? 8192,
          maxEntries: deps.maxEmbeddingInputs,
          matryoshka: slot.spec.matryoshka,
          minDims: slot.spec.minDims,
        }, req.signal);
        ctx.promptTokens = res.usage.prompt_tokens;
        return jsonResponse(res);
      },
    },
    {
      method: "POST",
      path: "/v1/chat/completions",
      auth: true,
      handler: async (req, ctx) => {
        const body = await parse(req, ChatRequestSchema);
        ctx.model = body.model;
        const { slot, engine } = deps.registry.engine(body.model, "chat");
        return createChatCompletion(body, engine, {
          defaultThinking: slot.spec.thinking,
          created: now(),
          signal: req.signal,
          log: deps.log,
          requestId: ctx.id,
          onUsage: (u) => {
            ctx.promptTokens = u.prompt_tokens;
            ctx.completionTokens = u.completion_tokens;
          },
        });
      },
    },
    {
      method: "GET",
      path: "/v1/models",
      auth: true,
      handler: () => {
        const names = deps.registry.slots.flatMap((s) => [s.spec.id, ...s.spec.aliases]);
        const list: ModelList = { object: "list", data: names.map(modelObject) };
        return jsonResponse(list);
      },
    },
    {
      method: "GET",
      path: "/v1/models/",
      prefix: true,
      auth: true,
      handler: (_req, _ctx, name) => jsonResponse(modelObject(decodeURIComponent(name))),
    },
    {
      method: "GET",
      path: "/health",
      auth: false,
      handler: () => {
        const models = deps.registry.slots.map((s) => ({
          id: s.spec.id,
          kind: s.spec.kind,
          status: s.state,
          ...(s.error ? { error: s.error } : {}),
          ...s.details,
        }));
        return jsonResponse({ status: "ok", ready: deps.registry.ready, models });
      },
    },
  ];

  const route = (method: string, path: string): { route: Route; match: string } => {
    const matching = routes.filter((r) =>
      r.prefix ? path.startsWith(r.path) && path.length > r.path.length : path === r.path
    );
    if (matching.length === 0) {
      throw new ApiError(404, "invalid_request_error", `Unknown path '${path}'.`, null, "unknown_url");
    }
    const hit = matching.find((r) => r.method === method);
    if (!hit) {
      const allowed = [...new Set(matching.map((r) => r.method))].join(", ");
      throw new ApiError(
        405,
        "invalid_request_error",
        `Method ${method} is not allowed on '${path}'; use ${allowed}.`,
        null,
        "method_not_allowed",
        { allow: allowed },
      );
    }
    return { route: hit, match: hit.prefix ? path.slice(hit.path.length) : "" };
  };

  return async (req: Request): Promise<Response> => {
    const started = performance.now();
    const url = new URL(req.url);
    const ctx: RequestContext = { id: requestId(req.headers.get("x-request-id")) };
    let res: Response;
    try {
      if (req.method === "OPTIONS" && deps.corsOrigins.length > 0) {
        res = new Response(null, { status: 204 });
      } else {
        const { route: r, match } = route(req.method, url.pathname);
        if (r.auth) deps.keys.authorize(req.headers.get("authorization"));
        res = await r.handler(req, ctx, match);
      }
    } catch (e) {
      if (e instanceof ApiError) {
        res = errorResponse(e);
      } else {
        deps.log.error("unexpected error", { request_id: ctx.id, error: String((e as Error)?.stack ?? e) });
        res = errorResponse(
          new ApiError(
            500,
            "server_error",
            `Internal server error (request id ${ctx.id}).`,
            null,
            "internal_error",
          ),
        );
      }
    }
    res.headers.set("x-request-id", ctx.id);
    res.headers.set("x-content-type-options", "nosniff");
    applyCors(req, res, deps.corsOrigins);
    deps.log.info("request", {
      request_id: ctx.id,
      method: req.method,
      route: url.pathname,
      status: res.status,
      ...(ctx.model ? { model: ctx.model } : {}),
      ...(ctx.promptTokens !== undefined ? { prompt_tokens: ctx.promptTokens } : {}),
      ...(ctx.completionTokens !== undefined ? { completion_tokens: ctx.completionTokens } : {}),
      ms: Number((performance.now() - started).toFixed(2)),
    });
    return res;
  };
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
  res.headers.set("access-control-allow-headers", "authorization, content-type, x-request-id");
  res.headers.set("access-control-allow-methods", "GET, POST, OPTIONS");
  res.headers.set("access-control-expose-headers", "x-request-id");
}
