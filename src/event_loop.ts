/**
 * Watches the event loop: a timer notes how late it fires (lag: what a client waits) and how much CPU
 * the JavaScript thread used since the previous tick (a stall: work of ours that kept the loop from
 * other requests). Lag also grows when the machine has no free core; a stall does not, so it measures
 * our own blocking, on a busy host too.
 *
 * The timer ticks every 25 ms while the thread works (a window's CPU above a tenth of it), and every
 * 250 ms while it is nearly idle: 40 wake-ups a second cost an idle or streaming server measurable CPU
 * (0.2–0.3 ms each on a VM whose idle vCPUs halt: a third of a gateway's CPU per relayed token).
 * A request's arrival ({@link EventLoopMonitor.wake}) ends a slow window at once, so the work it
 * brings is sampled in short windows. A slow window's CPU may be short tasks spread over it (a
 * stream's tokens, a prompt's continuations: 50 ms of them in 250 ms is no stall), so it reports as
 * its stall only how late its own tick came (the block that held it), and a busy one returns the
 * monitor to short ticks.
 */

/** Receives one tick's stall and lag, in seconds. */
export type TickObserver = (stallSeconds: number, lagSeconds: number) => void;

/**
 * What the monitor reads and schedules with: the JavaScript thread's own clock, CPU time and timers
 * ({@link threadClock}), or a test's, which moves time by hand.
 */
export interface LoopClock {
  /** Monotonic time, in milliseconds. */
  now(): number;
  /** CPU time the JavaScript thread has used so far, in nanoseconds; undefined where it is not known. */
  cpuNs(): number | undefined;
  /** Runs `fn` once, `ms` from now, without keeping the process alive; returns what cancels it. */
  schedule(fn: () => void, ms: number): () => void;
  /** Releases what reading the clock holds open. */
  close(): void;
}

/**
 * The clock of the thread that runs this JavaScript: `performance.now()`, unref'd timers and the CPU
 * time from `/proc/thread-self/schedstat` (none where there is no `/proc`).
 *
 * @example
 * ```ts
 * const clock = threadClock();
 * const cancel = clock.schedule(() => console.log(clock.now(), clock.cpuNs()), 10);
 * cancel();
 * clock.close();
 * ```
 */
export function threadClock(): LoopClock {
  const buffer = new Uint8Array(64);
  let file: Deno.FsFile | undefined;
  try {
    // The thread that runs this JavaScript (the process's main thread for the server; a worker's
    // own thread elsewhere). The file stays open: a reading costs two system calls.
    file = Deno.openSync("/proc/thread-self/schedstat");
  } catch {
    file = undefined;
  }
  return {
    now: () => performance.now(),
    cpuNs() {
      // The first field of the thread's scheduler statistics.
      if (!file) return undefined;
      try {
        file.seekSync(0, Deno.SeekMode.Start);
        const n = file.readSync(buffer) ?? 0;
        let ns = 0;
        for (let i = 0; i < n; i++) {
          const digit = buffer[i] - 48;
          if (digit < 0 || digit > 9) break;
          ns = ns * 10 + digit;
        }
        return ns;
      } catch {
        return undefined;
      }
    },
    schedule(fn, ms) {
      const timer = setTimeout(fn, ms);
      Deno.unrefTimer(timer);
      return () => clearTimeout(timer);
    },
    close() {
      file?.close();
      file = undefined;
    },
  };
}

/**
 * Samples the loop every `intervalMs`, or every `idleIntervalMs` after a window in which the thread
 * worked under a tenth of the time, until {@link stop}. Where the kernel does not report the
 * thread's CPU time (no `/proc`), a stall is taken to be the lag and the tick stays short.
 *
 * @example
 * ```ts
 * const monitor = new EventLoopMonitor((stall, lag) => console.log(stall, lag));
 * monitor.start();
 * monitor.stop();
 * ```
 */
export class EventLoopMonitor {
  readonly #observe: TickObserver;
  readonly #intervalMs: number;
  readonly #idleIntervalMs: number;
  readonly #clock: LoopClock;
  #cancel: (() => void) | undefined;
  #running = false;
  /** Whether the current tick is a long one (the thread was nearly idle). */
  #slow = false;
  /** When the current window began, and the thread's CPU time then. */
  #last = 0;
  #lastCpu: number | undefined;

  /** `idleIntervalMs`: the tick while the thread used under a tenth of the last window. */
  constructor(
    observe: TickObserver,
    intervalMs = 25,
    idleIntervalMs = 250,
    clock: LoopClock = threadClock(),
  ) {
    this.#observe = observe;
    this.#intervalMs = intervalMs;
    this.#idleIntervalMs = Math.max(intervalMs, idleIntervalMs);
    this.#clock = clock;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#last = this.#clock.now();
    this.#lastCpu = this.#clock.cpuNs();
    this.#tick(this.#intervalMs);
  }

  /**
   * Work is coming (a request arrived): back to short ticks at once, so that a long window of an idle
   * spell does not add the work about to start into one sample, which would read as a stall.
   */
  wake(): void {
    if (!this.#running || !this.#slow) return;
    this.#cancel?.();
    this.#close(undefined);
    this.#tick(this.#intervalMs);
  }

  #tick(interval: number) {
    this.#slow = interval > this.#intervalMs;
    this.#cancel = this.#clock.schedule(() => {
      const busy = this.#close(interval);
      if (this.#running) this.#tick(busy ? this.#intervalMs : this.#idleIntervalMs);
    }, interval);
  }

  /**
   * Ends the current window, meant to last `interval` ms (undefined: ended early by {@link wake}, no
   * lag), and records it; returns whether the thread worked a tenth of it or more (always true
   * without its CPU time: no telling idle from busy).
   */
  #close(interval: number | undefined): boolean {
    const now = this.#clock.now();
    const cpu = this.#clock.cpuNs();
    const lag = interval === undefined ? 0 : Math.max(0, now - this.#last - interval) / 1000;
    const used = cpu === undefined || this.#lastCpu === undefined ? undefined : (cpu - this.#lastCpu) / 1e9;
    // A long window's CPU may be many short tasks spread over it (50 ms of them in 250 ms is no
    // stall): all it proves is the block its own tick waited for, its lateness. A short window
    // cannot hide spread work: its CPU can pass its length only if the tick itself waited.
    this.#observe(used === undefined ? lag : this.#slow ? Math.min(used, lag) : used, lag);
    const busy = used === undefined || used * 1000 >= (now - this.#last) / 10;
    this.#last = now;
    this.#lastCpu = cpu;
    return busy;
  }

  stop(): void {
    this.#running = false;
    this.#cancel?.();
    this.#cancel = undefined;
    this.#clock.close();
  }
}

/** The loopback pair of {@link enableLoopTurns}: one byte written to `a` wakes a read of `b`. */
let turnPair:
  | { a: Deno.Conn; b: Deno.Conn; byte: Uint8Array<ArrayBuffer>; sink: Uint8Array<ArrayBuffer> }
  | undefined;
/** The last turn asked for: turns run one after another (one read of `b` at a time). */
let lastTurn: Promise<void> = Promise.resolve();

/**
 * Makes {@link loopTurn} wait for a socket instead of a timer: a connected pair of loopback TCP
 * sockets of this process. A read that only the runtime's poll of its sockets can complete makes one
 * turn of the event loop (timers, ready tasks, and every socket: new requests, reads, writes of the
 * streams) in ~35 µs, with no other thread woken; a `setTimeout(0)` costs 1-3 ms of waiting (its
 * clamp), and a message port or `setImmediate` (7 µs) polls the sockets only every few dozen turns
 * (a client waited 300 ms at the median behind 50 µs blocks). False when no loopback pair can be
 * made (no network permission): turns stay timers. Called once by the server at start; tests and
 * tools keep the timers, so no socket outlives them.
 *
 * @example
 * ```ts
 * async function start() {
 *   await enableLoopTurns(); // then a loopTurn() costs ~35 µs instead of 1-3 ms
 * }
 * ```
 */
export async function enableLoopTurns(): Promise<boolean> {
  if (turnPair) return true;
  let listener: Deno.Listener | undefined;
  try {
    listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (listener.addr as Deno.NetAddr).port;
    const [a, b] = await Promise.all([Deno.connect({ hostname: "127.0.0.1", port }), listener.accept()]);
    // Another local process could have connected first: the accepted end must be our own socket.
    if ((b.remoteAddr as Deno.NetAddr).port !== (a.localAddr as Deno.NetAddr).port) {
      a.close();
      b.close();
      return false;
    }
    a.setNoDelay(true);
    turnPair = { a, b, byte: new Uint8Array([1]), sink: new Uint8Array(64) };
    return true;
  } catch {
    return false;
  } finally {
    listener?.close();
  }
}

/** Whether {@link loopTurn} takes the socket path (see {@link enableLoopTurns}). */
export function loopTurnsEnabled(): boolean {
  return turnPair !== undefined;
}

/**
 * One turn of the event loop in which the runtime also polls its sockets: through the loopback pair
 * when {@link enableLoopTurns} made one, else a `setTimeout(0)`.
 */
export function loopTurn(): Promise<void> {
  const pair = turnPair;
  if (!pair) {
    return new Promise((resolve) =>
      setTimeout(() => {
        turnSeenAt = performance.now();
        resolve();
      }, 0)
    );
  }
  // Concurrent callers (two requests' slices, a decode) each get a turn of their own, in order: what
  // one runs after its turn is followed by a poll of the sockets before the next one's.
  return lastTurn = lastTurn.then(() => socketTurn(pair));
}

async function socketTurn(pair: NonNullable<typeof turnPair>): Promise<void> {
  try {
    // The read first: it waits for the poll, which the write then makes ready.
    const read = pair.b.read(pair.sink);
    await pair.a.write(pair.byte);
    if (await read === null) throw new Error("the loopback pair closed");
    turnSeenAt = performance.now();
  } catch {
    // Gone (the process is closing its resources): timers from now on.
    if (turnPair === pair) turnPair = undefined;
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
}

/** When the event loop was last seen to turn: a {@link loopTurn} ended, or the sentinel timer ran. */
let turnSeenAt = -Infinity;
/** When the sentinel timer was set (undefined: none is waiting), and whether it was asked for since. */
let sentinelSetAt: number | undefined;
let sentinelWanted = false;

/** A zero-delay timer that notes when the loop ran timers; set again while {@link heldMs} is asked. */
function setSentinel(now: number): void {
  sentinelSetAt = now;
  sentinelWanted = false;
  const timer = setTimeout(() => {
    turnSeenAt = performance.now();
    if (sentinelWanted) setSentinel(turnSeenAt);
    else sentinelSetAt = undefined;
  }, 0);
  Deno.unrefTimer(timer);
}

/**
 * How long the event loop has been held, in milliseconds, as far as this can tell: the time since
 * it was last seen to turn while a sentinel timer was waiting (one runs at each turn from the first
 * call on, while calls keep coming). With none waiting (the first call after an idle spell) it is 0:
 * nothing is known of what ran before, and a turn taken for nothing would cost every small request.
 *
 * @example
 * ```ts
 * heldMs(); // 0: the watch starts
 * const end = performance.now() + 6;
 * while (performance.now() < end) {
 *   // six milliseconds of synchronous work
 * }
 * heldMs(); // >= 6
 * ```
 */
export function heldMs(): number {
  const now = performance.now();
  if (sentinelSetAt === undefined) {
    setSentinel(now);
    return 0;
  }
  sentinelWanted = true;
  return now - Math.max(turnSeenAt, sentinelSetAt);
}

/**
 * A turn of the event loop ({@link loopTurn}) if it has been held `ms` or more ({@link heldMs}), so
 * that the steps of one request (a body parsed in slices, its validation, the conversion of its
 * messages, the render of its prompt) do not add up to one block: each step's own slices start
 * afresh, and 10,000 history calls' steps held the loop 40-55 ms between two of its turns. Throws
 * the signal's reason if it aborted meanwhile.
 *
 * @example
 * ```ts
 * async function steps(parse: () => unknown, validate: (v: unknown) => unknown) {
 *   const value = await parse();
 *   await turnIfHeld(5); // the parse's last slice and the validation are not one block
 *   return validate(value);
 * }
 * ```
 */
export async function turnIfHeld(ms = 5, signal?: AbortSignal): Promise<void> {
  if (heldMs() < ms) return;
  await loopTurn();
  signal?.throwIfAborted();
}

/** Helper threads of ours at work now (see {@link helperWork}). */
let helpersAtWork = 0;

/**
 * Notes that a helper thread of ours (a worker loading, checking or rendering) is at work until the
 * returned function is called (once; later calls do nothing). While one is, {@link helpersBusy}:
 * native compute that would run on the event loop's thread runs off it instead, as it may not get
 * all its cores (ggml's threads wait for each other at every step, spinning): a one-token decode
 * on the event loop took 0.8-2.8 s of its CPU while the output check's worker started (2 cores).
 *
 * @example
 * ```ts
 * const done = helperWork();
 * helpersBusy(); // true
 * done();
 * helpersBusy(); // false (unless another is at work)
 * ```
 */
export function helperWork(): () => void {
  helpersAtWork++;
  let ended = false;
  return () => {
    if (ended) return;
    ended = true;
    helpersAtWork--;
  };
}

/** Whether a helper thread of ours is at work ({@link helperWork}). */
export function helpersBusy(): boolean {
  return helpersAtWork > 0;
}

/**
 * Cuts a long run of synchronous work into slices of about `sliceMs`: once {@link due} says a slice
 * is used up, {@link pause} lets the event loop run (other requests, `/health`, streams) and throws
 * the signal's reason if it aborted meanwhile. (`due` is a clock read, so a loop of a million cheap
 * steps does not pay an await for each.)
 *
 * The turn is {@link loopTurn}: in the server ~35 µs; elsewhere a `setTimeout(0)`, about 2 ms here
 * (the timer's clamp), so 10 ms slices make such work ~15% slower and 4 ms slices ~30%. Cheaper turns
 * of the runtime's own do not serve the network: with `setImmediate` or a message port (7-22 µs),
 * the runtime polls its sockets only every few dozen turns, and `/health` waited 140 ms at a time
 * behind a tokenization cut into 4 ms slices.
 *
 * @example
 * ```ts
 * const slices = new Slicer(10);
 * const lengths: number[] = [];
 * for (const text of ["many", "texts"]) {
 *   if (slices.due) await slices.pause();
 *   lengths.push(text.length);
 * }
 * ```
 */
export class Slicer {
  readonly #sliceMs: number;
  readonly #signal?: AbortSignal;
  readonly #now: () => number;
  #since: number;

  /** `now`: the clock slices are measured with (milliseconds; a test may pass its own). */
  constructor(sliceMs = 10, signal?: AbortSignal, now: () => number = () => performance.now()) {
    this.#sliceMs = sliceMs;
    this.#signal = signal;
    this.#now = now;
    this.#since = now();
  }

  /** Starts a new slice now (one slicer reused for many runs of work). */
  restart(): void {
    this.#since = this.#now();
  }

  /** Whether the current slice is used up. */
  get due(): boolean {
    return this.#now() - this.#since >= this.#sliceMs;
  }

  /** A turn of the event loop (timers, network, other requests); starts the next slice. */
  async pause(): Promise<void> {
    await loopTurn();
    this.#signal?.throwIfAborted();
    this.#since = this.#now();
  }
}

/**
 * Spreads a burst of arriving requests over turns of the event loop. Each request's own start is
 * short (a key checked, a body read, a prompt rendered and tokenized: 0.3-0.5 ms), but requests
 * that arrive together start in one turn of the loop: 300 at once held it 60-130 ms, `/health`
 * with it. Once requests have kept the thread busy for `sliceMs` since the sockets were last
 * polled, each further one starts after a turn of its own ({@link loopTurn}), so the sockets are
 * polled between them. Busy means the thread's CPU time since the burst began is at least a
 * quarter of the wall time (an idle spell in between starts a new burst); without the thread's CPU
 * time nothing is spread.
 *
 * @example
 * ```ts
 * const ingress = new IngressPacer();
 * async function handle() {
 *   await ingress.admit(); // undefined (no wait) unless a burst has used its slice
 * }
 * ```
 */
export class IngressPacer {
  readonly #sliceMs: number;
  readonly #clock: LoopClock;
  /** When the current burst began (undefined: the sockets were polled since), and the CPU time then. */
  #since: number | undefined;
  #sinceCpu = 0;
  /** Requests waiting for their turn. */
  waiting = 0;

  constructor(sliceMs = 10, clock: LoopClock = threadClock()) {
    this.#sliceMs = sliceMs;
    this.#clock = clock;
  }

  /** A turn to wait for before a request starts its work, or undefined: start now. */
  admit(): Promise<void> | undefined {
    const now = this.#clock.now();
    const cpu = this.#clock.cpuNs();
    if (cpu === undefined) return undefined;
    if (this.#since === undefined || (cpu - this.#sinceCpu) / 1e6 < (now - this.#since) / 4) {
      this.#since = now;
      this.#sinceCpu = cpu;
      return undefined;
    }
    if (now - this.#since < this.#sliceMs) return undefined;
    this.waiting++;
    return loopTurn().then(() => {
      this.waiting--;
      this.#since = undefined;
    });
  }
}
