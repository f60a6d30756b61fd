/**
 * The upstream servers of one model: their health (active checks, passive ejection with back-off,
 * readmission on trial), the choice of an upstream per request (least outstanding requests, prefix
 * affinity by rendezvous hashing with a load cap), and one request's attempts (retry on another
 * upstream before the first byte). Knows HTTP only as far as health checks go; the wire format is
 * in `wire.ts`.
 */
import type { Logger } from "../../log.ts";
import { Counter, Histogram } from "../../metrics.ts";
import type { UpstreamStatus } from "../types.ts";
import type { Routing, UpstreamSpec } from "../../model_spec.ts";
import { type Outcome, UpstreamFailure } from "./failure.ts";

/** One upstream server and what the pool knows about it. */
export class Upstream {
  /** The API base, e.g. `http://10.0.0.5:8000/v1`. */
  readonly base: string;
  readonly healthUrl: string;
  readonly key?: string;
  /** The upstream's name of the model. */
  readonly model: string;
  state: UpstreamStatus["state"] = "unknown";
  outstanding = 0;
  /** Failed requests in a row. */
  failures = 0;
  /** Ejections in a row: the back-off doubles with each. */
  ejections = 0;
  ejectedUntil = 0;
  /**
   * Readmitted after an ejection and not yet proven: it takes one request at a time (while another
   * upstream can take the rest) until one succeeds; a failure ejects it again at once.
   */
  trial = false;
  /** What readmitted it (a passing health check, or the probe at the end of its back-off). */
  readmittedBy?: "health" | "probe";
  /**
   * Whether a passing health check may end an ejection early. False once a trial that a health
   * check granted failed (its checks pass while its requests fail), true again once a check fails
   * (it went down: its next passing check means it came back) or a request succeeds.
   */
  healthVouches = true;
  /** Counts ejections (never reset): a health check that began before one ignores its result. */
  epoch = 0;
  /** When it was last picked (a sequence number): ties go to the least recently used. */
  lastPick = 0;
  /** Hash of the name, for rendezvous hashing. */
  readonly seed: number;

  constructor(readonly name: string, spec: UpstreamSpec, modelId: string, env: Record<string, string>) {
    const url = new URL(spec.url);
    const path = url.pathname.replace(/\/+$/, "");
    this.base = `${url.origin}${path === "" ? "/v1" : path}`;
    const health = spec.health ?? "/health";
    this.healthUrl = /^https?:\/\//.test(health)
      ? health
      : `${url.origin}${health.startsWith("/") ? "" : "/"}${health}`;
    const key = spec.key ?? (spec.keyEnv ? env[spec.keyEnv] : undefined);
    if (spec.keyEnv && !key) {
      throw new Error(`upstream '${name}': the environment variable ${spec.keyEnv} is not set`);
    }
    this.key = key;
    this.model = spec.model ?? modelId;
    this.seed = hash32(name);
  }

  /** Whether new requests may go to it. */
  get routable(): boolean {
    return this.state === "healthy" || this.state === "unknown";
  }

  /** Request headers: JSON, the key, the request id. */
  headers(requestId?: string): Record<string, string> {
    return {
      "content-type": "application/json",
      ...(this.key ? { authorization: `Bearer ${this.key}` } : {}),
      ...(requestId ? { "x-request-id": requestId } : {}),
    };
  }
}

/** One request's hold on an upstream: ends once, with its outcome. */
export interface Lease {
  readonly upstream: Upstream;
  /** The first byte of the answer arrived (for the time-to-first-byte histogram). */
  firstByte(): void;
  end(outcome: Outcome, reason?: string): void;
}

/** Per-upstream counters of one pool; `metrics.ts` renders those of every pool under one name. */
export interface PoolStats {
  requests: Counter;
  firstByte: Histogram;
  duration: Histogram;
  ejections: Counter;
  retries: Counter;
}

const SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/** Everything a pool needs from outside. */
export interface PoolDeps {
  log: Logger;
  /** Where upstream keys named by `keyEnv` are read. */
  env?: Record<string, string>;
  /** Milliseconds; injectable for tests. */
  now?: () => number;
}

/**
 * The upstreams of one model id.
 *
 * @example
 * ```ts
 * import { RoutingSchema } from "../../model_spec.ts";
 * import type { Logger } from "../../log.ts";
 * async function once(log: Logger, signal: AbortSignal, send: (u: Upstream, signal: AbortSignal) => Promise<Response>) {
 *   const pool = new UpstreamPool("m", [{ url: "http://10.0.0.5:8000/v1" }], RoutingSchema.parse({}), { log });
 *   pool.start();
 *   const { value, lease } = await pool.dispatch({ signal }, (u, signal) => send(u, signal));
 *   lease.end("ok");
 *   return value;
 * }
 * ```
 */
export class UpstreamPool {
  readonly upstreams: Upstream[];
  readonly stats: PoolStats;
  readonly #log: Logger;
  readonly #now: () => number;
  #picks = 0;
  #timer?: ReturnType<typeof setTimeout>;
  readonly #probes = new Map<Upstream, ReturnType<typeof setTimeout>>();
  #disposed = false;

  constructor(
    readonly model: string,
    specs: readonly UpstreamSpec[],
    readonly routing: Routing,
    deps: PoolDeps,
  ) {
    this.#log = deps.log;
    this.#now = deps.now ?? (() => Date.now());
    const env = deps.env ?? {};
    this.upstreams = specs.map((s, i) => new Upstream(s.name ?? `upstream-${i}`, s, model, env));
    this.stats = {
      requests: new Counter("vserve_upstream_requests_total", ""),
      firstByte: new Histogram("vserve_upstream_first_byte_seconds", "", SECONDS),
      duration: new Histogram("vserve_upstream_request_duration_seconds", "", SECONDS),
      ejections: new Counter("vserve_upstream_ejections_total", ""),
      retries: new Counter("vserve_upstream_retries_total", ""),
    };
  }

  /** Starts the periodic health checks (each round also runs at once). */
  start(): void {
    if (this.routing.healthIntervalMs === 0 || this.#disposed) return;
    const round = async () => {
      await this.checkAll();
      if (this.#disposed) return;
      Deno.unrefTimer(this.#timer = setTimeout(round, this.routing.healthIntervalMs));
    };
    Deno.unrefTimer(this.#timer = setTimeout(round, this.routing.healthIntervalMs));
  }

  /** Stops checks and probes. */
  dispose(): void {
    this.#disposed = true;
    clearTimeout(this.#timer);
    for (const t of this.#probes.values()) clearTimeout(t);
    this.#probes.clear();
  }

  /** One health check of every upstream (a passing one can readmit an ejected upstream on trial). */
  async checkAll(): Promise<void> {
    await Promise.all(this.upstreams.map((u) => this.#check(u)));
  }

  /** Each upstream's state, in configuration order. */
  statuses(): UpstreamStatus[] {
    return this.upstreams.map((u) => ({
      name: u.name,
      state: u.state,
      routable: u.routable,
      inFlight: u.outstanding,
      failures: u.failures,
    }));
  }

  /**
   * The upstream for the next request, or undefined when none is routable. With an affinity key
   * the rendezvous-hashing order of the key decides, skipping upstreams at the load cap; without
   * one (or when all are at the cap) the least loaded, ties to the least recently picked.
   */
  pick(affinity?: number, exclude?: ReadonlySet<Upstream>): Upstream | undefined {
    const chosen = this.#choose(affinity, exclude);
    if (chosen) chosen.lastPick = ++this.#picks;
    return chosen;
  }

  #choose(affinity?: number, exclude?: ReadonlySet<Upstream>): Upstream | undefined {
    const open = this.upstreams.filter((u) => u.routable && !exclude?.has(u));
    // An upstream on trial holds one request at a time, unless nothing else can take this one.
    const proven = open.filter((u) => !u.trial || u.outstanding === 0);
    const candidates = proven.length > 0 ? proven : open;
    if (candidates.length === 0) return undefined;
    let chosen: Upstream | undefined;
    if (affinity !== undefined && candidates.length > 1) {
      const total = candidates.reduce((n, u) => n + u.outstanding, 0);
      const cap = Math.max(2, Math.ceil(this.routing.affinityLoadFactor * (total + 1) / candidates.length));
      const order = candidates.map((u) => ({ u, score: mix32(affinity ^ u.seed) }))
        .sort((a, b) => b.score - a.score);
      chosen = order.find((o) => o.u.outstanding < cap)?.u;
    } else if (affinity !== undefined) chosen = candidates[0];
    return chosen ??
      candidates.reduce((best, u) =>
        u.outstanding < best.outstanding || (u.outstanding === best.outstanding && u.lastPick < best.lastPick)
          ? u
          : best
      );
  }

  /**
   * Runs `send` on an upstream, and again on another one (up to `routing.retries` times) when it
   * fails before its first byte: a connection error, a timeout, a 5xx or a 429. Returns the value
   * with the lease still held (the caller ends it when the answer is consumed); throws the last
   * failure, or 503 `no_upstream` when no upstream is routable.
   */
  async dispatch<T>(
    opts: { signal: AbortSignal; affinity?: number; requestId?: string },
    send: (u: Upstream, signal: AbortSignal, firstByte: () => void) => Promise<T>,
  ): Promise<{ value: T; lease: Lease }> {
    const tried = new Set<Upstream>();
    let last: UpstreamFailure | undefined;
    for (let attempt = 0; attempt <= this.routing.retries; attempt++) {
      const u = this.pick(opts.affinity, tried);
      if (!u) break;
      tried.add(u);
      if (attempt > 0) this.stats.retries.inc({ model: this.model });
      const lease = this.lease(u, opts.requestId);
      try {
        const value = await send(u, opts.signal, lease.firstByte);
        lease.firstByte();
        return { value, lease };
      } catch (e) {
        if (opts.signal.aborted) {
          lease.end("cancelled");
          throw opts.signal.reason ?? e;
        }
        if (!(e instanceof UpstreamFailure)) {
          lease.end("failed", String(e));
          throw e;
        }
        lease.end(e.outcome, e.message);
        if (!e.retryable) throw e;
        last = e;
        const next = this.routing.retries > attempt ? this.#choose(opts.affinity, tried) : undefined;
        this.#log.warn(next ? "upstream failed before its first byte; retrying" : "upstream failed", {
          request_id: opts.requestId,
          model: this.model,
          upstream: u.name,
          url: u.base,
          reason: e.message,
          ...(next ? { retry_on: next.name } : {}),
        });
      }
    }
    if (last) throw last;
    throw UpstreamFailure.noUpstream(this.model);
  }

  /** Takes a hold on `u` for one request (outstanding count, metrics, passive health). */
  lease(u: Upstream, requestId?: string): Lease {
    u.outstanding++;
    const started = performance.now();
    const labels = { model: this.model, upstream: u.name };
    let ended = false;
    let answered = false;
    return {
      upstream: u,
      firstByte: () => {
        if (!answered) this.stats.firstByte.observe(labels, (performance.now() - started) / 1000);
        answered = true;
      },
      end: (outcome, reason) => {
        if (ended) return;
        ended = true;
        u.outstanding--;
        this.stats.requests.inc({ ...labels, outcome });
        this.stats.duration.observe(labels, (performance.now() - started) / 1000);
        // A 4xx answer is the client's fault from a working upstream.
        if (outcome === "ok" || outcome === "rejected") this.#succeeded(u);
        else if (outcome === "failed") this.#failed(u, reason ?? "failed", requestId);
      },
    };
  }

  #succeeded(u: Upstream): void {
    u.failures = 0;
    u.ejections = 0;
    u.healthVouches = true;
    if (u.trial && u.state !== "ejected") {
      u.trial = false;
      this.#log.info("upstream passed its trial", { model: this.model, upstream: u.name, url: u.base });
    }
    if (u.state === "unknown") u.state = "healthy";
  }

  #failed(u: Upstream, reason: string, requestId?: string): void {
    u.failures++;
    if (u.state === "ejected") return;
    if (u.trial) {
      // Its health check passes while its requests fail: only its back-off brings it back now.
      if (u.readmittedBy === "health") u.healthVouches = false;
      this.#eject(u, `its trial request failed: ${reason}`, requestId);
    } else if (u.failures >= this.routing.failures) this.#eject(u, reason, requestId);
  }

  /** Back in rotation on trial: the next request decides. */
  #readmit(u: Upstream, by: "health" | "probe"): void {
    clearTimeout(this.#probes.get(u));
    this.#probes.delete(u);
    u.state = "healthy";
    u.trial = true;
    u.readmittedBy = by;
    u.failures = 0;
    this.#log.info(
      by === "health"
        ? "upstream readmitted on trial by its health check"
        : "upstream back after its probe, on trial",
      {
        model: this.model,
        upstream: u.name,
        url: u.base,
      },
    );
  }

  #eject(u: Upstream, reason: string, requestId?: string): void {
    u.ejections++;
    u.epoch++;
    u.trial = false;
    const backOff = Math.min(this.routing.ejectMs * 2 ** (u.ejections - 1), this.routing.maxEjectMs);
    u.state = "ejected";
    u.ejectedUntil = this.#now() + backOff;
    this.stats.ejections.inc({ model: this.model, upstream: u.name });
    this.#log.warn("upstream ejected", {
      ...(requestId ? { request_id: requestId } : {}),
      model: this.model,
      upstream: u.name,
      url: u.base,
      failures: u.failures,
      back_off_ms: backOff,
      reason,
    });
    clearTimeout(this.#probes.get(u));
    if (this.#disposed) return;
    const epoch = u.epoch;
    const timer = setTimeout(async () => {
      this.#probes.delete(u);
      if (this.#disposed) return;
      const ok = await this.#probe(u);
      if (this.#disposed || u.epoch !== epoch || u.state !== "ejected") return; // readmitted meanwhile
      if (ok) this.#readmit(u, "probe");
      else this.#eject(u, "its probe after the back-off failed");
    }, backOff);
    Deno.unrefTimer(timer);
    this.#probes.set(u, timer);
  }

  async #check(u: Upstream): Promise<void> {
    const epoch = u.epoch;
    const ok = await this.#probe(u);
    if (this.#disposed || u.epoch !== epoch) return; // ejected meanwhile: the next check decides
    if (!ok) u.healthVouches = true;
    if (u.state === "ejected") {
      if (ok && u.healthVouches) this.#readmit(u, "health");
      return;
    }
    const next = ok ? "healthy" : "unhealthy";
    if (next !== u.state && u.state !== "unknown") {
      const log = ok ? this.#log.info : this.#log.warn;
      log(ok ? "upstream healthy again" : "upstream health check failed", {
        model: this.model,
        upstream: u.name,
        url: u.healthUrl,
      });
    } else if (!ok && u.state === "unknown") {
      this.#log.warn("upstream health check failed", {
        model: this.model,
        upstream: u.name,
        url: u.healthUrl,
      });
    }
    // Back after an outage: request failures from before it are stale. (A passing check does not
    // otherwise reset them: they count requests that failed in a row, whatever its checks say.)
    if (ok && u.state === "unhealthy") u.failures = 0;
    u.state = next;
  }

  /**
   * One health request: 200 and, when the body is JSON with a `ready` field (vserve's /health),
   * ready. Anything else, or no answer within the health timeout, is a failure.
   */
  async #probe(u: Upstream): Promise<boolean> {
    try {
      const res = await fetch(u.healthUrl, {
        headers: u.key ? { authorization: `Bearer ${u.key}` } : {},
        signal: AbortSignal.timeout(this.routing.healthTimeoutMs),
      });
      const text = await res.text();
      if (res.status !== 200) return false;
      try {
        const body = JSON.parse(text);
        return !(body && typeof body === "object" && body.ready === false);
      } catch {
        return true;
      }
    } catch {
      return false;
    }
  }
}

/**
 * The affinity key of a prompt: a hash of its first `chars` characters, or undefined when it is
 * shorter (a short prompt gains little from a cached prefix, and must not pin every request that
 * starts the same way).
 *
 * @example
 * ```ts
 * affinityKey("system: you are…\nuser: hi", 1024); // undefined: shorter than 1024
 * ```
 */
export function affinityKey(rendered: string, chars: number): number | undefined {
  if (chars <= 0 || rendered.length < chars) return undefined;
  return hash32(rendered.slice(0, chars));
}

/** FNV-1a over UTF-16 code units, finished with a 32-bit mix. */
export function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return mix32(h);
}

/** murmur3's finaliser: every input bit affects every output bit. */
function mix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
