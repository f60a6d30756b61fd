/**
 * Model ids and aliases → loaded engines, with load state. Ids resolve only through this table,
 * so a model name in a request never reaches the filesystem.
 */
import { z } from "zod";
import { ApiError, badRequest, formatPath, modelNotFound } from "./http/errors.ts";
import type { ChatEngine, EmbeddingEngine } from "./engines/types.ts";
import type { Logger } from "./log.ts";
import { type ModelSpec, ModelSpecSchema } from "./model_spec.ts";

/** The registry file: a list of model specs with unique ids and aliases. */
export const RegistryFileSchema = z.object({ models: z.array(ModelSpecSchema) }).superRefine((r, ctx) => {
  const seen = new Map<string, number>();
  r.models.forEach((m, i) => {
    for (const name of [m.id, ...m.aliases]) {
      if (seen.has(name)) {
        ctx.addIssue({
          code: "custom",
          path: ["models", i, "id"],
          message: `the name '${name}' is used by models[${seen.get(name)}] and models[${i}]`,
        });
      }
      seen.set(name, i);
    }
  });
});

/**
 * Validates registry JSON; the error names the entry and field.
 *
 * @example
 * ```ts
 * const specs = parseRegistry({ models: [{ id: "m", kind: "chat", source: "builtin:tiny-chat" }] }, "models.json");
 * specs[0].id; // "m"
 * ```
 */
export function parseRegistry(json: unknown, origin: string): ModelSpec[] {
  const r = RegistryFileSchema.safeParse(json);
  if (r.success) return r.data.models;
  const issue = r.error.issues[0];
  throw new Error(`${origin}: ${formatPath(issue.path) ?? "(top level)"}: ${issue.message}`);
}

/** Load state of a model. */
export type LoadState = "loading" | "loaded" | "failed";
type AnyEngine = ChatEngine | EmbeddingEngine;

/** One served model with its state. */
export interface ModelSlot {
  spec: ModelSpec;
  state: LoadState;
  error?: string;
  engine?: AnyEngine;
  loadSeconds?: number;
  /** Extra facts for /health (e.g. GPU in use). */
  details: Record<string, unknown>;
  created: number;
  /** Requests admitted and not yet finished (running or waiting for a slot). */
  inFlight: number;
  /** Requests the engine runs at once; more wait in its queue. */
  parallel: number;
  /** Tokens of admitted embedding requests not yet finished (the work budget). */
  tokensInFlight?: number;
}

/** Loads one spec into an engine. */
export type EngineLoader = (
  spec: ModelSpec,
  report: (details: Record<string, unknown>) => void,
) => Promise<AnyEngine>;

/** The served models. */
export class Registry {
  readonly #slots: ModelSlot[];
  readonly #byName = new Map<string, ModelSlot>();

  constructor(
    specs: readonly ModelSpec[],
    opts: { parallel?: number; created?: number } = {},
  ) {
    const created = opts.created ?? Math.floor(Date.now() / 1000);
    this.#slots = specs.map((spec) => ({
      spec,
      state: "loading",
      details: {},
      created,
      inFlight: 0,
      parallel: opts.parallel ?? spec.parallel,
    }));
    for (const slot of this.#slots) {
      for (const name of [slot.spec.id, ...slot.spec.aliases]) this.#byName.set(name, slot);
    }
  }

  /** Every model, in registry order. */
  get slots(): readonly ModelSlot[] {
    return this.#slots;
  }

  /** True when every model is loaded. */
  get ready(): boolean {
    // A model served by upstreams is ready while one of them can take requests.
    return this.#slots.every((s) =>
      s.state === "loaded" && (s.engine?.upstreams?.().some((u) => u.routable) ?? true)
    );
  }

  /** Loads every model (in order, to bound peak memory); failures are recorded, not thrown. */
  async loadAll(loader: EngineLoader, log: Logger): Promise<void> {
    for (const slot of this.#slots) {
      const started = performance.now();
      log.info("model loading", { model: slot.spec.id, source: slot.spec.source });
      try {
        slot.engine = await loader(slot.spec, (d) => Object.assign(slot.details, d));
        slot.state = "loaded";
        slot.loadSeconds = (performance.now() - started) / 1000;
        log.info("model loaded", {
          model: slot.spec.id,
          seconds: Number(slot.loadSeconds.toFixed(2)),
          ...slot.details,
        });
      } catch (e) {
        slot.state = "failed";
        slot.error = (e as Error).message;
        log.error("model failed to load", { model: slot.spec.id, reason: slot.error });
      }
    }
  }

  /** The slot for an id or alias; 404 when unknown. */
  find(name: string): ModelSlot {
    const slot = this.#byName.get(name);
    if (!slot) throw modelNotFound(name);
    return slot;
  }

  /** The loaded engine of a model of `kind`; 404 unknown, 400 wrong kind, 503 not ready. */
  engine<K extends "chat" | "embedding">(
    name: string,
    kind: K,
  ): { slot: ModelSlot; engine: K extends "chat" ? ChatEngine : EmbeddingEngine } {
    const slot = this.find(name);
    if (slot.spec.kind !== kind) {
      const endpoint = slot.spec.kind === "chat" ? "/v1/chat/completions" : "/v1/embeddings";
      throw badRequest(
        `The model '${name}' is a ${slot.spec.kind} model; use it with ${endpoint}.`,
        "model",
        "wrong_model_kind",
      );
    }
    if (slot.state === "loading") {
      throw new ApiError(
        503,
        "service_unavailable_error",
        `The model '${name}' is still loading; retry shortly.`,
        "model",
        "model_loading",
        { "retry-after": "5" },
      );
    }
    if (slot.state === "failed" || !slot.engine) {
      throw new ApiError(
        503,
        "service_unavailable_error",
        `The model '${name}' failed to load; the server log and /health give the reason.`,
        "model",
        "model_failed",
      );
    }
    return { slot, engine: slot.engine as K extends "chat" ? ChatEngine : EmbeddingEngine };
  }

  /**
   * Admits one request to `slot` or refuses it with 429 when its slots and queue are full; a request
   * needing several sequences (`n` choices) weighs that many, and one weighing more than the slots
   * and queue together is a 400 naming `param`. Returns the release function (idempotent).
   */
  /**
   * Charges `tokens` of work to the slot's budget: a request that would take it over `budget` is
   * refused with 429 while other work runs (a request larger than the whole budget runs alone).
   */
  admitTokens(slot: ModelSlot, tokens: number, budget: number): () => void {
    const used = slot.tokensInFlight ?? 0;
    if (used > 0 && used + tokens > budget) {
      throw new ApiError(
        429,
        "rate_limit_error",
        `The model '${slot.spec.id}' is busy: ${used} tokens are being embedded and this request adds ` +
          `${tokens}, over the budget of ${budget} (setting max-queued-embedding-tokens). Retry shortly.`,
        null,
        "token_budget_exceeded",
        { "retry-after": "1" },
      );
    }
    slot.tokensInFlight = used + tokens;
    let released = false;
    return () => {
      if (!released) slot.tokensInFlight = (slot.tokensInFlight ?? 0) - tokens;
      released = true;
    };
  }

  admit(slot: ModelSlot, maxQueue: number, weight = 1, param: string | null = null): () => void {
    if (weight > slot.parallel + maxQueue) {
      // Never admitted, however idle the model: a 429 would have the client retry for ever.
      throw new ApiError(
        400,
        "invalid_request_error",
        `This request needs ${weight} sequences (prompts × n); the model '${slot.spec.id}' runs ${slot.parallel} ` +
          `at once and queues ${maxQueue} more, so it could never start. Send fewer.`,
        param,
        "invalid_value",
      );
    }
    if (slot.inFlight + weight > slot.parallel + maxQueue) {
      throw new ApiError(
        429,
        "rate_limit_error",
        `The model '${slot.spec.id}' is busy: ${slot.parallel} requests are running and ${maxQueue} are ` +
          "waiting. Retry shortly.",
        null,
        "queue_full",
        { "retry-after": "1" },
      );
    }
    slot.inFlight += weight;
    let released = false;
    return () => {
      if (!released) slot.inFlight -= weight;
      released = true;
    };
  }

  /** Frees every engine. */
  async dispose(): Promise<void> {
    for (const slot of this.#slots) {
      await slot.engine?.dispose().catch(() => {});
      slot.engine = undefined;
    }
  }
}
