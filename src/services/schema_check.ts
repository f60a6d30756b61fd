/**
 * The last line of the structured-output guarantee: finished JSON is checked against the client's
 * schema, so keywords no grammar can express (`uniqueItems`, `not`, …) still hold; and the bounds a
 * client schema must keep before anything compiles or checks with it ({@link checkSchemaLimits}).
 * The check runs on a worker thread (Ajv: schema_ajv.ts), cut off after a time limit.
 */
import { badRequest } from "../http/errors.ts";
import { Budget, GrammarError, measureSchema } from "../grammar/mod.ts";
import type { CheckResult } from "./schema_ajv.ts";
import { helperWork } from "../event_loop.ts";
import type { CheckReply, CheckRequest } from "./schema_worker.ts";

export type { CheckResult };

/** How long one check may take before it is cut off (Ajv compiling 10,000 schema nodes takes ~2 s). */
const CHECK_TIMEOUT_MS = 10_000;
/** Time past a check's own limit after which its worker is given up on. */
const BACKSTOP_MS = 5_000;
/**
 * Schemas whose check ran out of time are remembered (at most this many, for {@link CUT_OFF_MS}):
 * a later check of the same schema is answered as cut off at once, so a client that repeats one
 * costly schema costs the one worker its limit once, not on every request.
 */
const CUT_OFF_KEYS = 256;
const CUT_OFF_MS = 10 * 60_000;

/**
 * How long an idle worker is kept, its compiled validators with it (starting one takes about 200 ms:
 * Ajv is loaded anew).
 */
const IDLE_MS = 5 * 60_000;

interface Queued {
  key: string;
  value: unknown;
  resolve: (r: CheckResult) => void;
}

/** The answer for a check whose request ended while it waited. */
const GONE: CheckResult = { ok: false, reason: "the request ended before the check" };

/** The answer for a check cut off after `ms`, or (`why`) when its pattern work ran out. */
function cutOff(ms: number, why?: string): CheckResult {
  return {
    ok: false,
    reason: `checking the output against the schema ${
      why ? `took too long: ${why}` : `took longer than ${ms / 1000} s`
    }`,
    timedOut: true,
  };
}

/**
 * Checks values against schemas on a worker thread (Ajv; see schema_ajv.ts), one at a time in
 * order. A check that takes longer than `timeoutMs` is stopped by the worker itself (`timedOut`; see
 * schema_worker.ts), which goes on with the next; a worker that does not answer
 * {@link BACKSTOP_MS} later is replaced (its thread may run on: `terminate()` does not stop running
 * JavaScript in Deno 2.9).
 * An idle worker ends after `idleMs` (while it lives, it keeps a process that has nothing else to
 * do alive: a web worker, which `new Worker` makes in 9-11 ms of this thread where a Node worker
 * took 24-53).
 *
 * @example
 * ```ts
 * const checker = new SchemaChecker();
 * await checker.check({ type: "array", uniqueItems: true }, [1, 1]); // { ok: false, reason: "…" }
 * checker.close();
 * ```
 */
export class SchemaChecker {
  readonly #timeoutMs: number;
  readonly #idleMs: number;
  readonly #queue: Queued[] = [];
  #worker?: Worker;
  /** Whether the worker has loaded (a check's time limit starts when it is sent to a ready worker). */
  #ready = false;
  #running?: { id: number; job: Queued; deadline: ReturnType<typeof setTimeout>; since: number };
  #idle?: ReturnType<typeof setTimeout>;
  /** The turn that will start the worker ({@link warm}). */
  #warming?: ReturnType<typeof setTimeout>;
  #next = 0;
  /** Ends the note that the worker is at work (loading or checking): see {@link helperWork}. */
  #busy?: () => void;
  /** Schemas whose check ran out of time, with when (shared by the checkers of one server). */
  readonly #cutOff: Map<string, number>;
  /** Checks cut off so far (by their time limit, or answered so for a schema that was). */
  timedOut = 0;
  /** Workers started so far. */
  started = 0;

  constructor(opts: { timeoutMs?: number; idleMs?: number; cutOff?: Map<string, number> } = {}) {
    this.#timeoutMs = opts.timeoutMs ?? CHECK_TIMEOUT_MS;
    this.#idleMs = opts.idleMs ?? IDLE_MS;
    this.#cutOff = opts.cutOff ?? new Map();
  }

  /** How long the check in progress has run, ms (0: none); see {@link checkAgainstSchema}. */
  busyMs(): number {
    return this.#running ? performance.now() - this.#running.since : 0;
  }

  /** Checks waiting for the one in progress. */
  get waiting(): number {
    return this.#queue.length;
  }

  /**
   * Whether `value` satisfies `schema`; the reason when it does not (or could not be checked). A
   * check still waiting when `signal` aborts (its client went away) is dropped from the queue.
   */
  check(schema: unknown, value: unknown, signal?: AbortSignal): Promise<CheckResult> {
    const key = JSON.stringify(schema);
    const cut = this.#cutOff.get(key);
    if (cut !== undefined && performance.now() - cut < CUT_OFF_MS) {
      this.timedOut++;
      return Promise.resolve(cutOff(this.#timeoutMs));
    }
    return new Promise((resolve) => {
      if (signal?.aborted) return resolve(GONE);
      const job: Queued = { key, value, resolve };
      const drop = () => {
        const at = this.#queue.indexOf(job);
        if (at < 0) return;
        this.#queue.splice(at, 1);
        resolve(GONE);
      };
      signal?.addEventListener("abort", drop, { once: true });
      job.resolve = (r) => {
        signal?.removeEventListener("abort", drop);
        resolve(r);
      };
      this.#queue.push(job);
      this.#pump();
    });
  }

  /**
   * Answers `job`, whose check ran out of time, and the checks of its schema that wait meanwhile, as
   * cut off; remembers the schema (see {@link CUT_OFF_KEYS}).
   */
  #cutOffJob(job: Queued, why?: string): void {
    this.#cutOff.delete(job.key);
    this.#cutOff.set(job.key, performance.now());
    if (this.#cutOff.size > CUT_OFF_KEYS) this.#cutOff.delete(this.#cutOff.keys().next().value!);
    const same = [job, ...this.#queue.filter((j) => j.key === job.key)];
    if (same.length > 1) {
      this.#queue.splice(
        0,
        this.#queue.length,
        ...this.#queue.filter((j) => j.key !== job.key),
      );
    }
    for (const j of same) {
      this.timedOut++;
      j.resolve(cutOff(this.#timeoutMs, why));
    }
  }

  /**
   * Starts the worker, if it is not running, so that a check soon does not wait for it to load: in
   * a turn of the event loop of its own, as `new Worker` holds this thread while the runtime builds
   * the worker's isolate (9-11 ms here, more on a busy host), which must not add to the request's own
   * work of this turn.
   */
  warm(): void {
    clearTimeout(this.#idle);
    if (!this.#worker && this.#warming === undefined) {
      this.#warming = setTimeout(() => {
        this.#warming = undefined;
        this.#start();
      }, 0);
      Deno.unrefTimer(this.#warming);
    }
    if (!this.#running && this.#queue.length === 0) {
      this.#idle = setTimeout(() => this.#stop(), this.#idleMs);
      Deno.unrefTimer(this.#idle);
    }
  }

  /** Ends the worker; checks waiting or running are answered as cut off. */
  close(): void {
    clearTimeout(this.#idle);
    clearTimeout(this.#warming);
    this.#warming = undefined;
    const waiting = [...(this.#running ? [this.#running.job] : []), ...this.#queue.splice(0)];
    if (this.#running) clearTimeout(this.#running.deadline);
    this.#running = undefined;
    this.#stop();
    for (const job of waiting) job.resolve({ ok: false, reason: "the checker was closed", timedOut: true });
  }

  #pump(): void {
    if (this.#running || this.#queue.length === 0) return;
    clearTimeout(this.#idle);
    const worker = this.#start();
    if (!this.#ready) return;
    const job = this.#queue.shift()!;
    const id = this.#next++;
    const deadline = setTimeout(() => {
      // The worker did not stop the check itself: it is given up on, the next check gets a new one.
      this.#running = undefined;
      this.#stop();
      this.#cutOffJob(job);
      this.#pump();
    }, this.#timeoutMs + BACKSTOP_MS);
    this.#running = { id, job, deadline, since: performance.now() };
    this.#setBusy(true);
    worker.postMessage(
      { id, key: job.key, value: job.value, timeoutMs: this.#timeoutMs } satisfies CheckRequest,
    );
  }

  #start(): Worker {
    if (this.#worker) return this.#worker;
    const worker = new Worker(new URL("./schema_worker.ts", import.meta.url), { type: "module" });
    this.started++;
    worker.onmessage = ({ data: reply }: MessageEvent<CheckReply>) => {
      if ("ready" in reply) {
        this.#ready = true;
        this.#setBusy(false);
        return this.#pump();
      }
      const running = this.#running;
      if (!running || running.id !== reply.id) return;
      clearTimeout(running.deadline);
      this.#running = undefined;
      this.#setBusy(false);
      if (!reply.result.ok && reply.result.timedOut) {
        // The worker's own time limit ("timed out"), or its patterns' work allowance (its reason).
        this.#cutOffJob(running.job, reply.result.reason === "timed out" ? undefined : reply.result.reason);
      } else running.job.resolve(reply.result);
      if (this.#queue.length > 0) this.#pump();
      else {
        this.#idle = setTimeout(() => this.#stop(), this.#idleMs);
        Deno.unrefTimer(this.#idle);
      }
    };
    worker.onerror = (e: ErrorEvent) => {
      // Not passed on to this thread (where an uncaught worker error ends the process).
      e.preventDefault();
      // Every check is answered from a try: an error here ended the worker (out of memory, say), or
      // it could not load; what waits fails (a worker that cannot load is not restarted in a loop).
      if (this.#worker !== worker) return;
      const loaded = this.#ready;
      const running = this.#running;
      if (running) clearTimeout(running.deadline);
      this.#running = undefined;
      this.#stop();
      const failed = { ok: false as const, reason: `the check failed: ${e.message}` };
      running?.job.resolve(failed);
      if (!loaded) { for (const job of this.#queue.splice(0)) job.resolve(failed); }
      this.#pump();
    };
    this.#worker = worker;
    // Loading (Ajv anew: ~200 ms of a core) is work.
    this.#setBusy(true);
    return worker;
  }

  #stop(): void {
    this.#worker?.terminate();
    this.#worker = undefined;
    this.#ready = false;
    this.#setBusy(false);
  }

  #setBusy(busy: boolean): void {
    if (busy) this.#busy ??= helperWork();
    else {
      this.#busy?.();
      this.#busy = undefined;
    }
  }
}

/**
 * A check in progress for longer than this sends later checks to a second worker (started on
 * demand), so that one costly check (up to its 10 s) holds no other request's: a drill's plain
 * check waited 29 s behind three costly ones.
 */
export const SPILL_MS = 250;
const cutOffShared = new Map<string, number>();
const checkers = [new SchemaChecker({ cutOff: cutOffShared }), new SchemaChecker({ cutOff: cutOffShared })];

/**
 * The checker a new check goes to: the first one not held by a check for over {@link SPILL_MS},
 * else the one with the fewest waiting.
 *
 * @example
 * ```ts
 * function route(checkers: SchemaChecker[]) {
 *   return pickChecker(checkers).check({ type: "integer" }, 3);
 * }
 * ```
 */
export function pickChecker(checkers: readonly SchemaChecker[]): SchemaChecker {
  const free = checkers.find((c) => c.busyMs() <= SPILL_MS);
  if (free) return free;
  return checkers.reduce((a, b) => (b.waiting < a.waiting ? b : a));
}

/**
 * Whether `value` satisfies `schema`, checked off the server's thread ({@link SchemaChecker}); the
 * reason when it does not, `timedOut` when the check was cut off.
 *
 * @example
 * ```ts
 * await checkAgainstSchema({ type: "array", uniqueItems: true }, [1, 1]); // { ok: false, reason: "…" }
 * ```
 */
export function checkAgainstSchema(
  schema: unknown,
  value: unknown,
  signal?: AbortSignal,
): Promise<CheckResult> {
  return pickChecker(checkers).check(schema, value, signal);
}

/** Loads the output check's worker ahead of a check (a request that will need one has arrived). */
export function warmSchemaCheck(): void {
  checkers[0].warm();
}

/** Bounds on a schema a request may carry (OpenAI's own are lower: 5 levels, 1,000 enum values). */
export const SCHEMA_LIMITS = { maxDepth: 64, maxNodes: 10_000, maxEnumValues: 1_000, maxBytes: 256 * 1024 };

/**
 * Refuses a schema over the size limits with a 400 naming the limit, before any recursive work
 * (conversion to a grammar, compilation) can overflow the stack or stall the event loop.
 * Iterative, so a schema nested 100,000 levels deep is measured, not recursed into. Then the work
 * of checking values against it is measured with `$ref`s and `allOf`/`anyOf`/`oneOf` expanded
 * (charged to `budget`, one per request), and loops of them with no property or item between are
 * refused: see the grammar package's `measureSchema`.
 */
export function checkSchemaLimits(schema: unknown, param: string, budget = new Budget()): void {
  const fail = (what: string) => {
    throw badRequest(`The JSON schema at ${param} is too large: ${what}.`, param, "schema_too_large");
  };
  const stack: [unknown, number][] = [[schema, 0]];
  let nodes = 0;
  let enumValues = 0;
  let bytes = 0;
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (++nodes > SCHEMA_LIMITS.maxNodes) fail(`more than ${SCHEMA_LIMITS.maxNodes} values`);
    if (depth > SCHEMA_LIMITS.maxDepth) fail(`nested deeper than ${SCHEMA_LIMITS.maxDepth} levels`);
    if (typeof node === "string") bytes += node.length;
    if (bytes > SCHEMA_LIMITS.maxBytes) fail(`more than ${SCHEMA_LIMITS.maxBytes} characters of strings`);
    if (typeof node !== "object" || node === null) continue;
    // Each value pushed is a value counted: past the limit before pushing (an `examples` list of
    // 2,000,000 numbers was pushed whole, 250-330 ms, to fail at its 10,001st).
    const keys = Array.isArray(node) ? undefined : Object.keys(node);
    if (nodes + stack.length + (keys ?? node as unknown[]).length > SCHEMA_LIMITS.maxNodes) {
      fail(`more than ${SCHEMA_LIMITS.maxNodes} values`);
    }
    if (!keys) {
      for (const v of node as unknown[]) stack.push([v, depth + 1]);
      continue;
    }
    for (const k of keys) {
      const v = (node as Record<string, unknown>)[k];
      bytes += k.length;
      if (k === "enum" && Array.isArray(v)) {
        enumValues += v.length;
        if (enumValues > SCHEMA_LIMITS.maxEnumValues) {
          fail(`more than ${SCHEMA_LIMITS.maxEnumValues} enum values in all`);
        }
      }
      stack.push([v, depth + 1]);
    }
  }
  try {
    measureSchema(schema, param, budget);
  } catch (e) {
    if (e instanceof GrammarError) throw badRequest(e.message, param, e.code);
    throw e;
  }
}
