/**
 * Where a decode runs: on the JavaScript thread (a synchronous FFI call, which makes that thread
 * ggml's thread 0, as llama-server's loop thread is) or on a thread of Deno's blocking pool (a
 * non-blocking call, which leaves the event loop free meanwhile).
 *
 * A non-blocking call costs a hand-off each way: measured on the tiny stand-ins, ~30 µs of the
 * JavaScript thread to submit the call, 50–150 µs of CPU on the pool thread (a different one nearly
 * every call, its caches cold) and two thread wake-ups, which on a VM whose idle vCPUs halt cost tens
 * of microseconds each. Against a 35 ms decode that is noise; against the 1–4 ms steps of a small
 * model, or of a large one on a GPU, it is a tenth of every token. So a decode expected to take at
 * most 6 ms (a step of one stream of a tiny stand-in takes 1-2 ms on two cores; one of bench-chat 35)
 * runs on the JavaScript thread, holding the event loop, in bursts of at most 6 ms. Between two bursts
 * the loop takes one turn in which it polls its sockets (new requests, `/health`, disconnects) and
 * sends what the streams wrote (a fast stream's tokens of the burst go out in one write): a
 * `loopTurn` (event_loop.ts), ~35 µs of this thread and no other thread woken; where loop turns are
 * not enabled (tests, tools) the decode that would pass the burst runs non-blocking instead, and the
 * loop waits meanwhile. Longer decodes (prompt chunks, many sequences, a slow machine) stay
 * non-blocking.
 *
 * Why so short: the runtime polls its sockets when the loop has nothing ready, else only every few
 * dozen turns, so while other work keeps the loop busy (a grammar compiled in 10 ms slices, say) each
 * turn's length multiplies the wait of a new request. With 12 ms bursts a `/health` probe beside two
 * schema compilations and a long prompt waited 1 s; with 6 ms (no longer than those slices) it did not.
 */

/** Recent durations kept per kind for {@link DecodePace.least}. */
const RECENT = 8;

/** Decode durations by kind (batch shape) and the current burst of synchronous decodes. */
export class DecodePace {
  readonly #expected = new Map<string, number>();
  readonly #samples = new Map<string, number>();
  readonly #recent = new Map<string, number[]>();
  #spent = 0;

  /**
   * `maxStepMs`: the longest expected decode run synchronously; `burstMs`: synchronous compute
   * between two waits of the event loop.
   */
  constructor(readonly maxStepMs = 6, readonly burstMs = Math.max(6, maxStepMs)) {}

  /** Whether a decode of `kind` may run on the JavaScript thread now. */
  onThread(kind: string): boolean {
    return this.short(kind) && this.#spent + this.#expected.get(kind)! <= this.burstMs;
  }

  /** Whether a decode of `kind` is short enough for the JavaScript thread (in a burst of its own). */
  short(kind: string): boolean {
    const expected = this.#expected.get(kind);
    return expected !== undefined && expected <= this.maxStepMs && expected <= this.burstMs;
  }

  /** A decode of `kind` took `ms` (`onThread`: synchronously; else the event loop waited meanwhile). */
  record(kind: string, ms: number, onThread: boolean): void {
    const expected = this.#expected.get(kind);
    const samples = this.samples(kind);
    // The first decodes of a kind pay one-time costs (weights paged in, buffers sized): the least of
    // the first three counts; then a moving average, which one slow step (the thread preempted) moves
    // a quarter of the way.
    this.#expected.set(
      kind,
      expected === undefined ? ms : samples < 3 ? Math.min(expected, ms) : expected + (ms - expected) / 4,
    );
    this.#samples.set(kind, samples + 1);
    const recent = this.#recent.get(kind) ?? [];
    recent.push(ms);
    if (recent.length > RECENT) recent.shift();
    this.#recent.set(kind, recent);
    this.#spent = onThread ? this.#spent + ms : 0;
  }

  /** Ends the burst: the next decode lets the event loop wait (something written should go out now). */
  endBurst(): void {
    this.#spent = Infinity;
  }

  /** The event loop is free to wait (the engine ran out of work): the next burst starts afresh. */
  rest(): void {
    this.#spent = 0;
  }

  /** The expected duration of a decode of `kind`, if one was measured. */
  expected(kind: string): number | undefined {
    return this.#expected.get(kind);
  }

  /**
   * The least of the last few durations of `kind` (undefined: none measured): what a decode of it
   * costs the machine when nothing else slows it down. Other processes, and a compute thread that
   * loses its core (its partners then wait at ggml's barriers), only ever add time, and on a shared
   * machine they added 2-100 times the decode's own; so a cost compared between kinds is taken as
   * this, not as the average.
   */
  least(kind: string): number | undefined {
    const recent = this.#recent.get(kind);
    return recent?.length ? Math.min(...recent) : undefined;
  }

  /**
   * The median of the last few durations of `kind` (undefined: none measured), leaving out its very
   * first one while later ones are kept (that one paid one-time costs): what a decode of it usually
   * takes here. Choices between kinds go by this, not by {@link least}: on the 2-vCPU EPYC a 1-token
   * decode with outputs on two threads took 7.4 ms at the median but now and then 1.2, and the least of
   * its recent times chose it over one thread (1.3-1.5 ms every time) for every other run of requests.
   */
  median(kind: string): number | undefined {
    const recent = this.#recent.get(kind);
    if (!recent?.length) return undefined;
    const first = this.samples(kind) <= RECENT && recent.length > 1 ? 1 : 0;
    const sorted = recent.slice(first).sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  }

  /** Decodes of `kind` measured so far. */
  samples(kind: string): number {
    return this.#samples.get(kind) ?? 0;
  }
}

/** Cells a generation decode may attend over and still share its kind with one at the start of the context. */
export const SHORT_CONTEXT = 1024;

/**
 * The batch shape a duration is kept for: token count (exact up to 16, then by powers of two), mode,
 * and for generation the context it attends over (`cells`: the highest position in the batch plus
 * one) past {@link SHORT_CONTEXT}, by powers of two. A decode's attention grows with the cells
 * before it: on tiny-moe, 11 tokens at position 32,070 took 202 ms where 11 at the start took 1.8,
 * so a kind measured at the start must not send a long-context decode to the JavaScript thread.
 * (An embedding input starts at position 0: its size says its context.)
 */
export function decodeKind(tokens: number, embeddings: boolean, cells = 0): string {
  const bucket = tokens <= 16 ? tokens : 2 ** Math.ceil(Math.log2(tokens));
  if (embeddings) return `e${bucket}`;
  return cells <= SHORT_CONTEXT ? `g${bucket}` : `g${bucket}@${2 ** Math.ceil(Math.log2(cells))}`;
}
