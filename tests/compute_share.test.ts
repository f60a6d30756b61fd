/**
 * The compute arbiter's policy on a simulated clock: models with steps of very different costs
 * share compute time by weight, a model coming back from idle has no credit saved up, a model's
 * turn is held between its steps only briefly, and failures pass through.
 */
import assert from "node:assert/strict";
import { ComputeShare } from "../src/engines/compute_share.ts";

/** A discrete-event clock: timers and step ends fire in time order; microtasks run between them. */
class SimClock {
  now = 0;
  #events: { at: number; seq: number; fn: () => void }[] = [];
  #seq = 0;
  #cancelled = new Set<number>();

  at(ms: number, fn: () => void): number {
    const seq = this.#seq++;
    this.#events.push({ at: this.now + ms, seq, fn });
    this.#events.sort((a, b) => a.at - b.at || a.seq - b.seq);
    return seq;
  }

  cancel(id: unknown) {
    this.#cancelled.add(id as number);
  }

  sleep(ms: number): Promise<void> {
    return new Promise((r) => this.at(ms, r));
  }

  /** Runs events until `until` (ms). */
  async run(until: number) {
    await settle();
    while (this.#events.length > 0 && this.#events[0].at <= until) {
      const e = this.#events.shift()!;
      this.now = e.at;
      if (!this.#cancelled.has(e.seq)) e.fn();
      await settle();
    }
    this.now = until;
  }
}

async function settle() {
  for (let i = 0; i < 40; i++) await Promise.resolve();
}

function setup(maxHoldMs?: number) {
  const clock = new SimClock();
  const share = new ComputeShare({
    now: () => clock.now,
    maxHoldMs,
    setTimer: (fn, ms) => clock.at(ms, fn),
    clearTimer: (id) => clock.cancel(id),
  });
  return { clock, share };
}

/** A model's loop: steps of `stepMs` of compute with `gapMs` of its own work between them. */
function busyLoop(
  clock: SimClock,
  run: (w: () => Promise<void>) => Promise<void>,
  stepMs: number,
  gapMs: number,
) {
  let stop = false;
  let steps = 0;
  const done = (async () => {
    while (!stop) {
      await run(() => clock.sleep(stepMs));
      steps++;
      if (gapMs > 0) await clock.sleep(gapMs);
    }
  })();
  return {
    get steps() {
      return steps;
    },
    stop: () => (stop = true, done),
  };
}

/** Each model's charged seconds (compute and held) between two snapshots. */
function charged(share: ComputeShare) {
  return Object.fromEntries(share.usage().map((u) => [u.model, u.seconds + u.heldSeconds]));
}

Deno.test("compute share: cheap 1 ms steps keep half the compute beside costly 50 ms steps", async () => {
  const { clock, share } = setup();
  const chat = share.client("chat");
  const embed = share.client("embed");
  const a = busyLoop(clock, (w) => chat.run(w), 1, 0.5);
  const b = busyLoop(clock, (w) => embed.run(w), 50, 0.2);
  await clock.run(5000);
  const c = charged(share);
  const part = c.chat / (c.chat + c.embed);
  assert.ok(part > 0.45 && part < 0.55, `chat's part ${part.toFixed(3)}`);
  // First come, first served would give one chat step per embedding step: ~100 of them in 5 s.
  assert.ok(a.steps > 1000, `chat steps ${a.steps}, embedding steps ${b.steps}`);
  a.stop();
  b.stop();
  await clock.run(6000);
});

Deno.test("compute share: weights 3:1 split the compute 3:1", async () => {
  const { clock, share } = setup();
  const heavy = share.client("heavy", 3);
  const light = share.client("light", 1);
  const a = busyLoop(clock, (w) => heavy.run(w), 4, 0.5);
  const b = busyLoop(clock, (w) => light.run(w), 30, 0.5);
  await clock.run(6000);
  const c = charged(share);
  const part = c.heavy / (c.heavy + c.light);
  assert.ok(part > 0.7 && part < 0.8, `heavy's part ${part.toFixed(3)}`);
  assert.deepEqual(share.usage().map((u) => u.share), [0.75, 0.25]);
  a.stop();
  b.stop();
  await clock.run(7000);
});

Deno.test("compute share: a model back from idle gets no credit for the time it was away", async () => {
  const { clock, share } = setup();
  const early = share.client("early");
  const late = share.client("late");
  const a = busyLoop(clock, (w) => early.run(w), 5, 0.5);
  await clock.run(2000); // `early` alone for 2 s
  const before = charged(share);
  const b = busyLoop(clock, (w) => late.run(w), 5, 0.5);
  await clock.run(2400);
  const after = charged(share);
  const earlyPart = (after.early - before.early) / (after.early - before.early + after.late - before.late);
  // Without the lift to the busy models' level, `late` would run alone for 2 s.
  assert.ok(earlyPart > 0.4, `early's part after late came: ${earlyPart.toFixed(3)}`);
  a.stop();
  b.stop();
  await clock.run(3000);
});

Deno.test("compute share: the turn is held between a model's steps only briefly, then handed on", async () => {
  const { clock, share } = setup(20);
  const slow = share.client("slow");
  const other = share.client("other");
  const starts: string[] = [];
  const step = (name: string, ms: number) => () => (starts.push(`${name}@${clock.now}`), clock.sleep(ms));
  // `other` takes a 10 ms step, then `slow` (owed compute) a 1 ms one and thinks for 200 ms.
  const o = other.run(step("other", 10)).then(() => other.run(step("other", 10)));
  const s = slow.run(step("slow", 1)).then(() => clock.sleep(200)).then(() => slow.run(step("slow", 1)));
  await clock.run(1000);
  await Promise.all([o, s]);
  // Held for `slow` after its step (its gaps not known yet: 5 ms), then handed to `other`.
  assert.deepEqual(starts, ["other@0", "slow@10", "other@16", "slow@211"]);
  const held = share.usage().find((u) => u.model === "slow")!.heldSeconds;
  assert.ok(Math.abs(held - 0.005) < 1e-9, `the hold is charged to the model held for (${held})`);
});

Deno.test("compute share: a model that says it is idle is not held for, and a failed step passes through", async () => {
  const { clock, share } = setup(20);
  const a = share.client("a");
  const b = share.client("b");
  const first = a.run(() => clock.sleep(1));
  await clock.run(1);
  await first;
  let bAt = -1;
  const bDone = b.run(() => {
    bAt = clock.now;
    return Promise.reject(new Error("decode failed"));
  });
  a.idle();
  await clock.run(100);
  await assert.rejects(bDone, /decode failed/);
  assert.equal(bAt, 1, "b started at once");
  assert.equal(await a.run(() => Promise.resolve(7)), 7, "the arbiter goes on after a failure");
});

Deno.test("compute share: steps shorter than a model's gaps run in them: nothing is held", async () => {
  const { clock, share } = setup();
  const a = share.client("a");
  const b = share.client("b");
  // `a` computes 1 ms and thinks 4 ms; `b`'s 1 ms steps fit in those gaps, so both run nearly as alone.
  const la = busyLoop(clock, (w) => a.run(w), 1, 4);
  const lb = busyLoop(clock, (w) => b.run(w), 1, 0.1);
  await clock.run(1000);
  assert.equal(share.usage().reduce((n, u) => n + u.heldSeconds, 0), 0);
  assert.ok(la.steps > 180, `a: ${la.steps} steps (alone: 200)`);
  assert.ok(lb.steps > 700, `b: ${lb.steps} steps`);
  la.stop();
  lb.stop();
  await clock.run(1100);
});

Deno.test("compute share: a step longer than the credit limit (1 s) is owed back in full", async () => {
  const { clock, share } = setup();
  const chat = share.client("chat");
  const embed = share.client("embed");
  // Chat thinks 10 ms between 35 ms steps; embedding steps take a second (a slow CPU, a big batch).
  const a = busyLoop(clock, (w) => chat.run(w), 35, 10);
  const b = busyLoop(clock, (w) => embed.run(w), 1000, 1);
  await clock.run(30_000);
  const c = charged(share);
  const part = c.chat / (c.chat + c.embed);
  // Capping chat's credit at 0.25 s behind the end of the embedding step gave it 1/5.
  assert.ok(part > 0.45 && part < 0.55, `chat's part ${part.toFixed(3)}`);
  a.stop();
  b.stop();
  await clock.run(32_000);
});
