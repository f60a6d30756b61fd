/**
 * The compute arbiter: models on one machine share its cores (or GPU) by weighted fair share of
 * measured compute time. Every compute step of every engine (a llama_decode, an ONNX run) asks
 * for a turn here; one step runs at a time (two at once would oversubscribe the cores: ggml's
 * workers spin on barriers), and the next turn goes to the model that has used the least compute
 * per unit of weight (start-time fair queueing by seconds, as a CPU scheduler shares cores).
 *
 * A model's clock only runs while it has work: one that comes back after a pause starts level
 * with the others, with no credit saved up. Between two of its steps a model runs JavaScript
 * (sampling, batch building) for a few milliseconds; were the turn handed on at once, a model
 * with cheap steps (chat) would find every turn taken by one with costly steps (embeddings) and
 * get a step in for each of theirs. So after a step of a model that is still owed compute, when
 * another busy model's steps are longer than this one's usual gap, the arbiter holds the next turn
 * for it for a short while (about three of its usual gaps, at most
 * {@link ComputeShareOptions.maxHoldMs}); that wait is charged to it like compute. With equal
 * weights, each of two busy models thus keeps at least about half the speed it has alone. (Steps
 * shorter than the gap run in it: the gap then overlaps compute, as without an arbiter.)
 */

/** Settings of the arbiter; times in milliseconds. */
export interface ComputeShareOptions {
  /** The clock (default: `performance.now`). */
  now?: () => number;
  /** Longest time the next turn is held for a model between two of its steps. */
  maxHoldMs?: number;
  /** Timers (default: the global ones); injected by unit tests. */
  setTimer?: (fn: () => void, ms: number) => unknown;
  clearTimer?: (id: unknown) => void;
}

/** One model's use of compute, for /health and /metrics. */
export interface ComputeUse {
  model: string;
  weight: number;
  /** Its weight over the weights of all models sharing the machine. */
  share: number;
  /** Seconds in its compute steps. */
  seconds: number;
  /** Seconds the machine was held for it between its steps. */
  heldSeconds: number;
  steps: number;
}

const DEFAULT_MAX_HOLD_MS = 20;
/** The hold before a model's gaps are known. */
const FIRST_HOLD_MS = 5;
/** A model that asked for no step for this long since its last one is idle (ms). */
const BUSY_GAP_MS = 100;
/** Most compute seconds (over weight) a busy model may be behind the others. */
const MAX_CREDIT_SECONDS = 0.25;
/** Fewest milliseconds held (timers are not finer). */
const MIN_HOLD_MS = 1;

/** One model's handle on the arbiter: its steps go through {@link ComputeClient.run}. */
export class ComputeClient {
  /** Charged seconds over weight: who is owed the next turn. */
  vtime = 0;
  /** Its virtual time when its last step began. */
  stepStart = 0;
  seconds = 0;
  heldSeconds = 0;
  steps = 0;
  /** Steps waiting for their turn, in order. */
  readonly queue: { start: () => void; since: number }[] = [];
  /** When its last step ended (-1: it has been idle since). */
  releasedAt = -1;
  /** Mean milliseconds between the end of one of its steps and its next request. */
  gapMs?: number;
  /** Mean milliseconds of its steps. */
  stepMs?: number;

  constructor(readonly arbiter: ComputeShare, readonly name: string, readonly weight: number) {}

  /**
   * Runs `work` (one compute step) in this model's turn; resolves or rejects as `work` does.
   *
   * @example
   * ```ts
   * const client = new ComputeShare().client("chat", 1);
   * await client.run(async () => 42); // 42, once it is this model's turn
   * ```
   */
  run<T>(work: () => Promise<T>): Promise<T> {
    return this.arbiter.run(this, work);
  }

  /**
   * Runs `work` (one synchronous compute step) at once, charged as {@link run} charges, when the turn
   * can be this model's now (nothing running, no other model's step waiting, no hold for another);
   * undefined otherwise (then {@link run} it).
   */
  runNow<T>(work: () => T): { result: T } | undefined {
    return this.arbiter.runNow(this, work);
  }

  /** The model has no more work for now: its turn is not held and its gaps stop counting. */
  idle(): void {
    this.arbiter.idle(this);
  }

  /** Whether another model is busy now (then steps should be short). */
  contended(): boolean {
    return this.arbiter.contended(this);
  }
}

/**
 * Grants compute steps one at a time by weighted fair share.
 *
 * @example
 * ```ts
 * const share = new ComputeShare();
 * const chat = share.client("chat", 1);
 * const embed = share.client("embed", 1);
 * const step = (name: string) => async () => name; // a decode
 * await Promise.all([chat.run(step("chat")), embed.run(step("embed"))]);
 * ```
 */
export class ComputeShare {
  readonly #clients: ComputeClient[] = [];
  readonly #now: () => number;
  readonly #maxHoldMs: number;
  readonly #setTimer: (fn: () => void, ms: number) => unknown;
  readonly #clearTimer: (id: unknown) => void;
  #running: ComputeClient | undefined;
  #held: { client: ComputeClient; since: number; timer: unknown } | undefined;

  constructor(opts: ComputeShareOptions = {}) {
    this.#now = opts.now ?? (() => performance.now());
    this.#maxHoldMs = opts.maxHoldMs ?? DEFAULT_MAX_HOLD_MS;
    this.#setTimer = opts.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
    this.#clearTimer = opts.clearTimer ?? ((id) => clearTimeout(id as ReturnType<typeof setTimeout>));
  }

  /** A new model's handle; `weight` > 0 (default 1). */
  client(name: string, weight = 1): ComputeClient {
    if (!(weight > 0) || !Number.isFinite(weight)) {
      throw new Error(`compute weight must be positive: ${weight}`);
    }
    const client = new ComputeClient(this, name, weight);
    this.#clients.push(client);
    return client;
  }

  /** Drops the handle of `name` (a model that failed to load): its weight no longer counts. */
  forget(name: string): void {
    const i = this.#clients.findIndex((c) => c.name === name);
    if (i >= 0 && this.#clients[i].queue.length === 0 && this.#running !== this.#clients[i]) {
      if (this.#held?.client === this.#clients[i]) this.#endHold();
      this.#clients.splice(i, 1);
    }
  }

  /** Each model's use of compute so far. */
  usage(): ComputeUse[] {
    const total = this.#clients.reduce((n, c) => n + c.weight, 0);
    return this.#clients.map((c) => ({
      model: c.name,
      weight: c.weight,
      share: c.weight / total,
      seconds: c.seconds,
      heldSeconds: c.heldSeconds,
      steps: c.steps,
    }));
  }

  /** See {@link ComputeClient.run}. */
  run<T>(client: ComputeClient, work: () => Promise<T>): Promise<T> {
    const now = this.#arrive(client);
    return new Promise<T>((resolve, reject) => {
      const start = () => {
        const began = this.#now();
        let result: Promise<T>;
        try {
          result = work();
        } catch (e) {
          result = Promise.reject(e);
        }
        result.finally(() => this.#release(client, began)).then(resolve, reject);
      };
      client.queue.push({ start, since: now });
      this.#dispatch();
    });
  }

  /** See {@link ComputeClient.runNow}. */
  runNow<T>(client: ComputeClient, work: () => T): { result: T } | undefined {
    if (this.#running || client.queue.length > 0) return undefined;
    if (this.#held && this.#held.client !== client) return undefined;
    if (this.#clients.some((c) => c !== client && c.queue.length > 0)) return undefined;
    this.#arrive(client);
    if (this.#held) this.#endHold(); // held for this model: its step takes the turn, as in #dispatch
    this.#running = client;
    const began = this.#now();
    try {
      return { result: work() };
    } finally {
      this.#release(client, began);
    }
  }

  /** A step of `client` asks for a turn now: its gap and virtual time; returns the time. */
  #arrive(client: ComputeClient): number {
    const now = this.#now();
    const gap = now - client.releasedAt;
    if (client.releasedAt >= 0 && gap <= BUSY_GAP_MS) {
      client.gapMs = client.gapMs === undefined ? gap : 0.8 * client.gapMs + 0.2 * gap;
    }
    // Idle models start level with the busy ones. A busy one that used less than its share (long
    // gaps between steps) keeps at most a little credit beyond the others' last steps (counted
    // from where those began: a step longer than the credit is still owed back in full).
    client.vtime = this.#busy(client)
      ? Math.max(client.vtime, this.#floor(client, (c) => c.stepStart) - MAX_CREDIT_SECONDS)
      : Math.max(client.vtime, this.#floor(client, (c) => c.vtime));
    return now;
  }

  /** See {@link ComputeClient.idle}. */
  idle(client: ComputeClient): void {
    client.releasedAt = -1;
    if (this.#held?.client === client) {
      this.#endHold();
      this.#dispatch();
    }
  }

  /** See {@link ComputeClient.contended}. */
  contended(client: ComputeClient): boolean {
    return this.#clients.some((c) => c !== client && this.#busy(c));
  }

  /**
   * Has work: a step queued or running, or between two steps (its last one ended lately and it
   * has not said it is idle).
   */
  #busy(c: ComputeClient): boolean {
    return c.queue.length > 0 || this.#running === c ||
      (c.releasedAt >= 0 && this.#now() - c.releasedAt <= BUSY_GAP_MS);
  }

  /** The least `at` of the other busy models (`client`'s own virtual time when there are none). */
  #floor(client: ComputeClient, at: (c: ComputeClient) => number): number {
    let floor = Infinity;
    for (const c of this.#clients) if (c !== client && this.#busy(c)) floor = Math.min(floor, at(c));
    return floor === Infinity ? client.vtime : floor;
  }

  #dispatch() {
    if (this.#running) return;
    if (this.#held) {
      if (this.#held.client.queue.length === 0) return;
      const client = this.#held.client;
      this.#endHold();
      return this.#grant(client);
    }
    let next: ComputeClient | undefined;
    for (const c of this.#clients) {
      if (c.queue.length === 0) continue;
      // Least virtual time first; on a tie, the one waiting longest.
      if (
        !next || c.vtime < next.vtime || (c.vtime === next.vtime && c.queue[0].since < next.queue[0].since)
      ) {
        next = c;
      }
    }
    if (next) this.#grant(next);
  }

  #grant(client: ComputeClient) {
    this.#running = client;
    client.queue.shift()!.start();
  }

  #release(client: ComputeClient, began: number) {
    const now = this.#now();
    const seconds = (now - began) / 1000;
    client.seconds += seconds;
    client.steps++;
    client.stepStart = client.vtime;
    client.vtime += seconds / client.weight;
    client.releasedAt = now;
    this.#running = undefined;
    client.stepMs = client.stepMs === undefined ? now - began : 0.8 * client.stepMs + 0.2 * (now - began);
    // Still owed compute (no one busy is further behind) and likely back within a few ms: hold.
    if (client.queue.length === 0 && this.#owed(client)) {
      const ms = Math.min(this.#maxHoldMs, Math.max(MIN_HOLD_MS, 3 * (client.gapMs ?? FIRST_HOLD_MS / 3)));
      const timer = this.#setTimer(() => {
        if (this.#held?.timer !== timer) return;
        this.#endHold();
        this.#dispatch();
      }, ms);
      this.#held = { client, since: now, timer };
    }
    this.#dispatch();
  }

  /**
   * True when none of the other busy models is further behind than `client`, and one of them
   * takes steps longer than `client`'s usual gap: then waiting out the gap costs less than the
   * delay such a step would cause it. (Steps shorter than the gap run in it: both gain.)
   */
  #owed(client: ComputeClient): boolean {
    let longest = 0;
    for (const c of this.#clients) {
      if (c === client || !this.#busy(c)) continue;
      if (c.vtime < client.vtime) return false;
      longest = Math.max(longest, c.stepMs ?? Infinity);
    }
    return longest > (client.gapMs ?? FIRST_HOLD_MS / 3);
  }

  /** Ends the hold, charging its time to the model held for. */
  #endHold() {
    const held = this.#held!;
    this.#held = undefined;
    this.#clearTimer(held.timer);
    const seconds = (this.#now() - held.since) / 1000;
    held.client.heldSeconds += seconds;
    held.client.vtime += seconds / held.client.weight;
  }
}
