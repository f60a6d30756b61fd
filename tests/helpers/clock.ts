/** A clock that a test moves by hand, for code that takes its clock as a dependency. */
import type { LoopClock } from "../../src/event_loop.ts";

/**
 * Time that passes only when the test says: {@link idle} (the thread waits; timers fire when due)
 * or {@link run} (the thread works without a turn of the event loop: wall and CPU time pass
 * together, and timers that fall due meanwhile fire only after it, late).
 *
 * @example
 * ```ts
 * const clock = new ManualClock();
 * const fired: number[] = [];
 * clock.schedule(() => fired.push(clock.now()), 10);
 * clock.run(25); // a 25 ms block: the 10 ms timer fires at its end
 * // fired: [25]
 * ```
 */
export class ManualClock implements LoopClock {
  #now = 0;
  #cpuNs: number | undefined;
  #seq = 0;
  #timers: { at: number; seq: number; fn: () => void }[] = [];
  /** Every delay asked of {@link schedule}, in order. */
  readonly scheduled: number[] = [];

  /** `cpu: false`: a clock that cannot tell the thread's CPU time (no `/proc`). */
  constructor(opts: { cpu?: boolean } = {}) {
    this.#cpuNs = opts.cpu === false ? undefined : 0;
  }

  now = (): number => this.#now;

  cpuNs = (): number | undefined => this.#cpuNs;

  schedule(fn: () => void, ms: number): () => void {
    this.scheduled.push(ms);
    const timer = { at: this.#now + ms, seq: this.#seq++, fn };
    this.#timers.push(timer);
    return () => {
      this.#timers = this.#timers.filter((t) => t !== timer);
    };
  }

  close(): void {}

  /** Timers not yet fired. */
  get pending(): number {
    return this.#timers.length;
  }

  /** The thread waits `ms`: timers fire at their due times, in order. */
  idle(ms: number): void {
    const end = this.#now + ms;
    for (let t = this.#nextDue(end); t; t = this.#nextDue(end)) {
      this.#now = Math.max(this.#now, t.at);
      t.fn();
    }
    this.#now = end;
  }

  /** The thread runs `ms` without yielding; timers that fell due meanwhile fire after it. */
  run(ms: number): void {
    this.#now += ms;
    if (this.#cpuNs !== undefined) this.#cpuNs += ms * 1e6;
    const end = this.#now;
    for (let t = this.#nextDue(end); t; t = this.#nextDue(end)) t.fn();
  }

  #nextDue(end: number) {
    let next: { at: number; seq: number; fn: () => void } | undefined;
    for (const t of this.#timers) {
      if (t.at <= end && (!next || t.at < next.at || (t.at === next.at && t.seq < next.seq))) next = t;
    }
    if (next) this.#timers = this.#timers.filter((t) => t !== next);
    return next;
  }
}
