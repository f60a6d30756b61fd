/**
 * Watches the event loop: a timer every 25 ms notes how late it fires (lag: what a
 * client waits) and how much CPU the JavaScript thread used since the previous tick (a stall: work
 * of ours that kept the loop from other requests). Lag also grows when the machine has no free
 * core; a stall does not, so it measures our own blocking, on a busy host too.
 */

/** Receives one tick's stall and lag, in seconds. */
export type TickObserver = (stallSeconds: number, lagSeconds: number) => void;

/**
 * Samples the loop every `intervalMs` until {@link stop}. Where the kernel does not report the
 * thread's CPU time (no `/proc`), a stall is taken to be the lag.
 *
 * @example
 * ```ts
 * const monitor = new EventLoopMonitor((stall, lag) => console.log(stall, lag));
 * monitor.start();
 * ```
 */
export class EventLoopMonitor {
  readonly #observe: TickObserver;
  readonly #intervalMs: number;
  readonly #buffer = new Uint8Array(64);
  #file: Deno.FsFile | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(observe: TickObserver, intervalMs = 25) {
    this.#observe = observe;
    this.#intervalMs = intervalMs;
    try {
      // Deno runs JavaScript on the process's main thread, whose thread id is the process id. The
      // file stays open: a tick costs two system calls, a wake-up of its own on a busy host.
      this.#file = Deno.openSync(`/proc/self/task/${Deno.pid}/schedstat`);
    } catch {
      this.#file = undefined;
    }
  }

  start(): void {
    if (this.#timer !== undefined) return;
    let last = performance.now();
    let lastCpu = this.#cpuNs();
    this.#timer = setInterval(() => {
      const now = performance.now();
      const cpu = this.#cpuNs();
      const lag = Math.max(0, now - last - this.#intervalMs) / 1000;
      this.#observe(cpu === undefined || lastCpu === undefined ? lag : (cpu - lastCpu) / 1e9, lag);
      last = now;
      lastCpu = cpu;
    }, this.#intervalMs);
    Deno.unrefTimer(this.#timer);
  }

  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#file?.close();
    this.#file = undefined;
  }

  /** CPU time of the JavaScript thread so far (ns): the first field of its scheduler statistics. */
  #cpuNs(): number | undefined {
    if (!this.#file) return undefined;
    try {
      this.#file.seekSync(0, Deno.SeekMode.Start);
      const n = this.#file.readSync(this.#buffer) ?? 0;
      let ns = 0;
      for (let i = 0; i < n; i++) {
        const digit = this.#buffer[i] - 48;
        if (digit < 0 || digit > 9) break;
        ns = ns * 10 + digit;
      }
      return ns;
    } catch {
      return undefined;
    }
  }
}
