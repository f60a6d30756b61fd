/**
 * Whether other processes keep this host's cores busy (Linux), for where a decode runs.
 *
 * A decode on the JavaScript thread makes that thread ggml's thread 0: it spins at every graph node
 * until the pool's other threads, `--compute-nice` levels below it, have done their part. When
 * another process wants a core, the scheduler gives it before a lowered pool thread, and the
 * JavaScript thread spins meanwhile, holding the event loop: beside two busy loops on the 2-vCPU
 * EPYC, 1 request in 5 held `/health` 170-300 ms (a 128-token request took 9-20 s instead of 0.2).
 * Off the thread the same decode is as slow, but the loop keeps serving. So while others are busy,
 * multi-threaded decodes stay off the JavaScript thread.
 *
 * "Busy" starts with a decode on the thread that took far longer than its kind's usual time
 * ({@link HostLoad.stalled}), and lasts while others keep using the cores: the host's busy CPU time
 * (`/proc/stat`) less this process's (`/proc/self/stat`), over windows of at least {@link WINDOW_MS}
 * read when a decode asks ({@link HostLoad.busy}), no timer of its own. It ends after
 * {@link CALM_WINDOWS} windows in a row in which others used under {@link BUSY_CORES} of a core. Others'
 * use alone does not start it: a client on the same host reading a fast stream used about half a core
 * without ever holding a decode up, and taking its decodes off the thread halved its speed.
 */

/** Shortest window of the counters (USER_HZ is 100: a window of 200 ms has 20 ticks a core). */
export const WINDOW_MS = 200;
/** A window longer than this (the engine was idle) is only a new start, not a reading. */
const STALE_MS = 1000;
/** Cores others use in a window that keep the host busy once a stall made it so. */
export const BUSY_CORES = 0.8;
/** Windows in a row under {@link BUSY_CORES} before the host counts as calm again. */
export const CALM_WINDOWS = 5;

/** One reading of the counters, in clock ticks. */
export interface CpuCounters {
  /** Busy ticks of every CPU of the host (user, nice, system, irq, softirq). */
  host: number;
  /** Ticks of this process (user and system, all its threads). */
  self: number;
}

/** What the load reader asks the kernel (a test passes its own). */
export interface LoadSource {
  /** The counters now; undefined when they cannot be read (not Linux, no `/proc`). */
  read(): CpuCounters | undefined;
  /** Clock ticks a second (USER_HZ). */
  ticksPerSecond: number;
  now(): number;
}

/**
 * Others' CPU use on this host, read when asked.
 *
 * @example
 * ```ts
 * let t = 0;
 * const counters = { host: 0, self: 0 };
 * const load = new HostLoad({ read: () => ({ ...counters }), ticksPerSecond: 100, now: () => t });
 * load.busy(); // false: the first reading
 * load.stalled(); // a decode on the thread was held up
 * t = 200;
 * counters.host = 30; // 30 ticks in 200 ms: 1.5 cores busy, ours 10 of them
 * counters.self = 10;
 * load.busy(); // true: others used a core
 * ```
 */
export class HostLoad {
  readonly #source: LoadSource;
  #last?: CpuCounters & { at: number };
  #calm = CALM_WINDOWS;
  /** Readings taken (windows measured). */
  windows = 0;
  /** Times the host turned busy. */
  turnedBusy = 0;

  constructor(source: LoadSource) {
    this.#source = source;
  }

  /** Whether others keep the cores busy; takes a reading when the last one is a window old. */
  busy(): boolean {
    const now = this.#source.now();
    const last = this.#last;
    if (last && now - last.at < WINDOW_MS) return this.#calm < CALM_WINDOWS;
    const c = this.#source.read();
    if (!c) return this.#calm < CALM_WINDOWS;
    this.#last = { ...c, at: now };
    if (!last || now - last.at > STALE_MS) return this.#calm < CALM_WINDOWS;
    this.windows++;
    const others = ((c.host - last.host) - (c.self - last.self)) / ((now - last.at) / 1000) /
      this.#source.ticksPerSecond;
    if (this.#calm >= CALM_WINDOWS) return false;
    if (others >= BUSY_CORES) this.#calm = 0;
    else this.#calm++;
    return this.#calm < CALM_WINDOWS;
  }

  /** A decode on the JavaScript thread took far longer than usual: the host is busy. */
  stalled(): void {
    if (this.#calm >= CALM_WINDOWS) this.turnedBusy++;
    this.#calm = 0;
  }
}

/** The counters of this Linux host and process; undefined elsewhere. */
export function linuxLoadSource(): LoadSource | undefined {
  if (Deno.build.os !== "linux") return undefined;
  const read = (): CpuCounters | undefined => {
    try {
      // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
      const stat = Deno.readTextFileSync("/proc/stat");
      const cpu = stat.slice(0, stat.indexOf("\n")).trim().split(/\s+/).map(Number);
      const host = cpu[1] + cpu[2] + cpu[3] + cpu[6] + cpu[7];
      // After the command's closing parenthesis: state is field 3; utime and stime fields 14 and 15.
      const self = Deno.readTextFileSync("/proc/self/stat");
      const f = self.slice(self.lastIndexOf(")") + 2).split(" ");
      const counters = { host, self: Number(f[11]) + Number(f[12]) };
      return Number.isFinite(counters.host) && Number.isFinite(counters.self) ? counters : undefined;
    } catch {
      return undefined;
    }
  };
  if (!read()) return undefined;
  return { read, ticksPerSecond: 100, now: () => performance.now() };
}

let shared: HostLoad | null | undefined;

/**
 * The process's {@link HostLoad} (null where the counters cannot be read: then the host never counts
 * as busy).
 */
export function hostLoad(): HostLoad | null {
  if (shared === undefined) {
    const source = linuxLoadSource();
    shared = source ? new HostLoad(source) : null;
  }
  return shared;
}
