/**
 * Compute threads below the event loop (Linux). The process's compute threads (ggml's persistent
 * pool, Deno's blocking-pool threads that run non-blocking FFI decodes, onnxruntime's, the workers')
 * and the JavaScript thread share the same cores; at the same priority a socket event (a request,
 * `/health`) can wait for a core behind our own compute. Every thread of the process except the
 * JavaScript thread and V8's helpers is set `N` nice levels below it (`setpriority(2)` on the thread
 * id: raising a nice value needs no privilege), so the scheduler runs the event loop first and the
 * compute gets the rest.
 *
 * Threads appear over time (the pool at load, blocking-pool threads on demand, which exit after
 * 10 s idle), so the process's threads are looked at again: {@link noticeThreads} compares the
 * thread count (the link count of `/proc/self/task`, one `stat`) with the last sweep's and lists
 * the threads only when it changed or a second has passed. A thread made by a thread already
 * lowered inherits its nice value.
 */

const PRIO_PROCESS = 0;
/**
 * V8's helper threads ("V8 DefaultWorker") keep the JavaScript thread's priority. Without
 * `--single-threaded-gc` (v8_flags.ts) it waits for them (a garbage collection's parallel tasks,
 * which it joins): lowered, another process on the host took their core and the event loop waited
 * 100-470 ms with none of its own CPU spent, beside one busy loop. With it, as the server runs, they
 * only compile code in the background.
 */
const V8_HELPER = "V8 ";
/** Longest time between two full listings of the threads (a thread that ends while another starts
 * leaves the count unchanged). */
const FULL_SWEEP_MS = 1000;

/** What the priority keeper asks the kernel (a test may pass its own). */
export interface ThreadSystem {
  /** A number that changes when the process's thread count does (undefined: unknown). */
  count(): number | undefined;
  /** The ids of the process's threads. */
  list(): number[];
  /** Sets a thread's nice value; false if it could not (the thread ended meanwhile). */
  setNice(tid: number, nice: number): boolean;
  /** A thread's nice value. */
  niceOf(tid: number): number;
  /** The id of the thread running this JavaScript. */
  self(): number;
  /** A thread's name (`comm`); undefined when it cannot be read. */
  name?(tid: number): string | undefined;
  now(): number;
}

const LIBC = {
  setpriority: { parameters: ["i32", "u32", "i32"], result: "i32" },
  getpriority: { parameters: ["i32", "u32"], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** The kernel's threads of this process (Linux `/proc` and libc); null elsewhere. */
export function linuxThreads(): ThreadSystem | null {
  if (Deno.build.os !== "linux") return null;
  try {
    const libc = Deno.dlopen("libc.so.6", LIBC).symbols;
    // "<pid>/task/<tid>"
    const self = Number(Deno.readLinkSync("/proc/thread-self").split("/").pop());
    if (!Number.isInteger(self) || self <= 0) return null;
    Deno.statSync("/proc/self/task");
    return {
      count: () => {
        try {
          return Deno.statSync("/proc/self/task").nlink ?? undefined;
        } catch {
          return undefined;
        }
      },
      list: () => {
        const out: number[] = [];
        for (const e of Deno.readDirSync("/proc/self/task")) out.push(Number(e.name));
        return out;
      },
      setNice: (tid, nice) => libc.setpriority(PRIO_PROCESS, tid, nice) === 0,
      niceOf: (tid) => libc.getpriority(PRIO_PROCESS, tid),
      name: (tid) => {
        try {
          return Deno.readTextFileSync(`/proc/self/task/${tid}/comm`).trimEnd();
        } catch {
          return undefined;
        }
      },
      self: () => self,
      now: () => performance.now(),
    };
  } catch {
    return null;
  }
}

/**
 * Keeps every thread of the process except the JavaScript one and V8's helpers `levels` nice levels
 * below it.
 *
 * @example
 * ```ts
 * const keeper = ComputePriority.start(10);
 * keeper?.check(); // cheap: lists the threads only if their count changed or a second passed
 * ```
 */
export class ComputePriority {
  readonly levels: number;
  /** The nice value given to compute threads. */
  readonly target: number;
  readonly #sys: ThreadSystem;
  readonly #main: number;
  /** Threads already set, as the last listing found them. */
  readonly #done = new Set<number>();
  #lastCount: number | undefined;
  #lastSweep = -Infinity;
  /** Threads set to {@link target} so far. */
  reniced = 0;
  /** Listings of the threads so far. */
  sweeps = 0;

  constructor(levels: number, sys: ThreadSystem) {
    this.levels = levels;
    this.#sys = sys;
    this.#main = sys.self();
    this.target = Math.min(19, sys.niceOf(this.#main) + levels);
  }

  /**
   * Starts keeping the process's compute threads `levels` below the JavaScript thread, and makes it
   * the keeper {@link noticeThreads} reaches; undefined when `levels` is 0 or the system has no
   * per-thread priorities (not Linux).
   */
  static start(levels: number, sys: ThreadSystem | null = linuxThreads()): ComputePriority | undefined {
    if (levels <= 0 || !sys) return undefined;
    const keeper = new ComputePriority(levels, sys);
    current = keeper;
    keeper.sweep();
    return keeper;
  }

  /** Lists the threads if their count changed since the last listing or a second passed. */
  check(): void {
    if (this.#sys.count() !== this.#lastCount || this.#sys.now() - this.#lastSweep >= FULL_SWEEP_MS) {
      this.sweep();
    }
  }

  /** Lists the threads now and sets each new one (not the JavaScript thread). */
  sweep(): void {
    this.#lastCount = this.#sys.count();
    this.#lastSweep = this.#sys.now();
    this.sweeps++;
    let tids: number[];
    try {
      tids = this.#sys.list();
    } catch {
      return;
    }
    const alive = new Set(tids);
    for (const tid of this.#done) if (!alive.has(tid)) this.#done.delete(tid);
    for (const tid of tids) {
      if (tid === this.#main || this.#done.has(tid)) continue;
      if (this.#sys.name?.(tid)?.startsWith(V8_HELPER)) {
        this.#done.add(tid);
        continue;
      }
      // A thread that ended meanwhile is simply not there next time.
      if (this.#sys.setNice(tid, this.target)) {
        this.#done.add(tid);
        this.reniced++;
      }
    }
  }

  /** Stops being the keeper {@link noticeThreads} reaches. */
  stop(): void {
    if (current === this) current = undefined;
  }
}

let current: ComputePriority | undefined;

/**
 * Called where threads may just have been made (a thread pool created, work handed to the blocking
 * pool): sets new ones below the JavaScript thread; one `stat` when none was made. Nothing unless
 * {@link ComputePriority.start} ran (tests and tools).
 */
export function noticeThreads(): void {
  current?.check();
}
