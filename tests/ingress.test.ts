/**
 * Bursts of arriving requests (issue 26, adversarial pass): 300 requests at once started in one turn
 * of the event loop and held it (and `/health`) 60-130 ms. The ingress pacer gives each request past
 * a busy slice a turn of its own. No wall-clock assertions: the order in which a probe is answered.
 */
import assert from "node:assert/strict";
import { enableLoopTurns, IngressPacer, type LoopClock } from "../src/event_loop.ts";

/** Busy work of about `ms` on this thread (a request's start: key, body, prompt). */
function work(ms: number) {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* spin */ }
}

/**
 * Starts `n` requests in one turn, each doing ~0.5 ms of work after `admit`, while a server of this
 * process is asked once; returns how many requests had done their work when the answer came.
 */
async function burst(n: number, admit: () => Promise<void> | undefined): Promise<number> {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => new Response("ok"));
  try {
    // A connection made and used once, so that the probe below needs only a poll of the sockets.
    const url = `http://127.0.0.1:${server.addr.port}/`;
    await (await fetch(url)).text();
    let done = 0;
    let answeredAt = -1;
    const probe = fetch(url).then(async (r) => {
      await r.text();
      answeredAt = done;
    });
    await Promise.all(Array.from({ length: n }, async () => {
      const turn = admit();
      if (turn) await turn;
      work(0.5);
      done++;
    }));
    await probe;
    return answeredAt;
  } finally {
    await server.shutdown();
  }
}

Deno.test({
  name: "ingress: a burst of requests lets the sockets be polled between its slices",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    assert.ok(await enableLoopTurns());
    // Without pacing, all 300 start in one turn: the probe is answered after the last.
    assert.equal(await burst(300, () => undefined), 300);
    const pacer = new IngressPacer(10);
    const answeredAt = await burst(300, () => pacer.admit());
    assert.ok(answeredAt < 300, `the probe waited for all ${answeredAt} requests`);
    assert.equal(pacer.waiting, 0);
  },
});

Deno.test("ingress: a request after an idle spell, or in a burst's first slice, starts at once", () => {
  let now = 0;
  let cpu = 0;
  const clock: LoopClock = {
    now: () => now,
    cpuNs: () => cpu * 1e6,
    schedule: () => () => {},
    close: () => {},
  };
  const pacer = new IngressPacer(10, clock);
  assert.equal(pacer.admit(), undefined, "the first request of a burst");
  now = cpu = 8;
  assert.equal(pacer.admit(), undefined, "8 ms busy: within the slice");
  now = 1000;
  cpu = 9;
  assert.equal(pacer.admit(), undefined, "after an idle second: a new burst");
  now += 12;
  cpu += 12;
  const turn = pacer.admit();
  assert.ok(turn instanceof Promise, "12 ms busy: a turn first");
  assert.equal(pacer.waiting, 1);
  const blind = new IngressPacer(10, { ...clock, cpuNs: () => undefined });
  now += 100;
  assert.equal(blind.admit(), undefined, "no CPU time: never spread");
  return turn!.then(() => assert.equal(pacer.waiting, 0));
});
