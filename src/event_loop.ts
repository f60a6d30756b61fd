/**
 * Watches the event loop: a timer every few milliseconds notes how late it fires (lag: what a
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
  readonly #path: string;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(observe: TickObserver, intervalMs = 10) {
    this.#observe = observe;
    this.#intervalMs = intervalMs;
    // Deno runs JavaScript on the process's main thread, whose thread id is the process id.
    this.#path = `/proc/self/task/${Deno.pid}/schedstat`;
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
  }

  /** CPU time of the JavaScript thread so far (ns), from the kernel's scheduler statistics. */
  #cpuNs(): number | undefined {
    try {
      return Number(Deno.readTextFileSync(this.#path).split(" ")[0]);
    } catch {
      return undefined;
    }
  }
}
