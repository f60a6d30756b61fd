/**
 * What every route module works with: the server's dependencies, the per-request context the
 * middleware fills in (for the access log and metrics), and the steps routes share (reading a
 * body under its limit, the key's models, admission, a chat request's context).
 */
import type { z } from "zod";
import type { ApiKey } from "../api_keys.ts";
import type { KeyRing, RateLimiter } from "../http/auth.ts";
import { readJsonBody } from "../http/body.ts";
import { turnIfHeld } from "../event_loop.ts";
import type { ConnectionWatch } from "../http/connections.ts";
import { type ApiError, fromZodError, modelNotFound } from "../http/errors.ts";
import type { RoutePattern } from "../http/router.ts";
import type { Logger } from "../log.ts";
import type { Metrics } from "../metrics.ts";
import type { ModelSlot, Registry } from "../registry.ts";
import type { ChatContext } from "../services/chat.ts";
import type { ResponsesOptions } from "../services/responses.ts";
import { ReasoningSealer } from "../services/reasoning_seal.ts";

/** Shutdown state shared with `main.ts`. */
export interface Lifecycle {
  /** True once shutdown began: new requests get 503. */
  draining: boolean;
  /** Aborts every in-flight request when the drain time is over. */
  shutdown: AbortSignal;
  /** API requests past the drain check whose answers have not ended. */
  inFlight: number;
  /**
   * Of those, the ones whose handlers have neither read their bodies nor finished: the drain and a
   * TLS reload close a listener only when there are none (`Deno.serve`'s shutdown makes a request
   * body not read yet unreadable).
   */
  unread: number;
  /** Called each time {@link unread} drops to 0. */
  onRead?: () => void;
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

/** Per-request facts for the access log and metrics. */
export interface RequestContext {
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

/** A route's handler: the request, its context, and the path's remainder after a prefix route. */
export type Handler = (req: Request, ctx: RequestContext, match: string) => Promise<Response> | Response;

/** One entry of the route table. */
export interface Route extends RoutePattern {
  /** `v1`: a key always; `ops`: per --ops-auth; `open`: never. */
  auth: "v1" | "ops" | "open";
  handler: Handler;
  /** The route's error body, when it is not OpenAI's. */
  errors?: (e: ApiError, requestId: string) => Response;
}

/**
 * Request bodies are checked up to their first fault, the one the error names: zod otherwise goes
 * on to collect an issue per invalid item (300,000 bad content parts: 0.8-1.4 s on the event loop).
 */
const FIRST_ISSUE: z.core.ParseContextInternal<z.core.$ZodIssue> = { abortEarly: true };

/** The steps routes share, bound to the server's dependencies. */
export type RouteKit = ReturnType<typeof routeKit>;

/**
 * The shared steps of the routes over `deps`.
 *
 * @example
 * ```ts
 * import { ChatRequestSchema } from "../protocol/chat.ts";
 * async function chatBody(deps: ServerDeps, req: Request) {
 *   const kit = routeKit(deps);
 *   return await kit.parse(req, ChatRequestSchema); // 413 over the body limit, 400 naming the field
 * }
 * ```
 */
export function routeKit(deps: ServerDeps) {
  const now = deps.now ?? (() => Math.floor(Date.now() / 1000));
  /** The request body read under the body limit and time, parsed by `schema`. */
  const parse = async <S extends z.ZodType>(req: Request, schema: S): Promise<z.infer<S>> => {
    const body = await readJsonBody(req, deps.bodyLimitBytes, deps.bodyTimeoutMs ?? 0);
    // The parse's last slice and the validation (50,000 content blocks: 5-30 ms) are not one block,
    await turnIfHeld();
    const r = schema.safeParse(body, FIRST_ISSUE);
    // nor a long validation (10,000 tools: 11-17 ms) and the request's next synchronous steps.
    await turnIfHeld();
    if (!r.success) throw fromZodError(r.error);
    return r.data;
  };
  /**
   * Admits the request to `slot` (429 when its slots and queue are full, 400 naming `param` when it
   * weighs more than both); released when the body ends.
   */
  const admit = (slot: ModelSlot, ctx: RequestContext, weight = 1, param: string | null = null) => {
    try {
      ctx.onDone.push(deps.registry.admit(slot, deps.maxQueue, weight, param));
    } catch (e) {
      if ((e as ApiError).status === 429) deps.metrics.rejected.inc({ model: slot.spec.id });
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

  /** The chat engine for `model`, checked against the key and admitted with `weight` sequences. */
  const chatEngine = (model: string, ctx: RequestContext, weight = 1) => {
    ctx.model = model;
    allowedSlot(model, ctx.key);
    const { slot, engine } = deps.registry.engine(model, "chat");
    admit(slot, ctx, weight, "n");
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

  /** The hosted-tool policy and the seal, one for the Responses and Anthropic routes. */
  const responsesOptions: Promise<ResponsesOptions> = deps.responses
    ? Promise.resolve(deps.responses)
    : ReasoningSealer.create().then((sealer) => ({ hostedTools: "ignore", sealer }));

  return { deps, now, parse, admit, allowedSlot, chatEngine, chatContext, responsesOptions };
}
