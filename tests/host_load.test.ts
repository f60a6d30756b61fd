/**
 * While other processes keep the host's cores busy, short multi-threaded decodes stay off the
 * request thread (src/host_load.ts): there its lowered partner threads would lose their cores and
 * leave it spinning. The reader's bookkeeping on fake counters; a real server beside real busy
 * processes.
 */
import assert from "node:assert/strict";
import { BUSY_CORES, CALM_WINDOWS, type CpuCounters, HostLoad, WINDOW_MS } from "../src/host_load.ts";
import { postJson, startServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

/** A host whose counters and clock the test moves. */
function fakeHost() {
  let t = 0;
  const c: CpuCounters = { host: 0, self: 0 };
  let reads = 0;
  const load = new HostLoad({ read: () => (reads++, { ...c }), ticksPerSecond: 100, now: () => t });
  /** A window of `ms` in which others used `others` cores and this process `self` cores. */
  const window = (ms: number, others: number, self = 0) => {
    t += ms;
    c.host += Math.round((others + self) * ms / 10);
    c.self += Math.round(self * ms / 10);
    return load.busy();
  };
  return { load, window, reads: () => reads };
}

Deno.test("HostLoad: a stall makes the host busy; others' use keeps it so; five calm windows end it", () => {
  const h = fakeHost();
  assert.equal(h.load.busy(), false, "the first reading only starts a window");
  assert.equal(
    h.window(WINDOW_MS, 1.5),
    false,
    "others' use alone (a client reading a stream) does not start it",
  );
  h.load.stalled();
  assert.equal(h.load.busy(), true, "a decode held up: at once, without a new reading");
  assert.equal(h.window(WINDOW_MS, 0, 2), true, "this process's own use does not count");
  assert.equal(h.window(WINDOW_MS, 1.5, 0.5), true, "others used 1.5 cores: busy again from here");
  for (let i = 1; i < CALM_WINDOWS; i++) {
    assert.equal(h.window(WINDOW_MS, BUSY_CORES - 0.1), true, `calm ${i}`);
  }
  assert.equal(h.window(WINDOW_MS, 0), false, "calm again");
  assert.equal(h.window(WINDOW_MS, 2), false, "and others' use alone does not make it busy");
  h.load.stalled();
  h.load.stalled();
  assert.equal(h.load.turnedBusy, 2);
});

Deno.test("HostLoad: a window shorter than 200 ms is not read; after a long idle gap the reading only starts anew", () => {
  const h = fakeHost();
  h.load.busy();
  h.load.stalled();
  assert.equal(h.window(WINDOW_MS, 2), true);
  const reads = h.reads();
  assert.equal(h.window(WINDOW_MS / 4, 0), true, "too short: the state as it was, nothing read");
  assert.equal(h.reads(), reads);
  // Idle for 5 s: no reading over the gap, the state kept.
  for (let i = 0; i < CALM_WINDOWS; i++) assert.equal(h.window(5000, 0), true);
  assert.equal(h.load.windows, 1);
  assert.equal(h.window(WINDOW_MS, 0), true);
  assert.equal(h.load.windows, 2);
});

async function counter(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = text.match(new RegExp(`^vserve_engine_${name}_total\\{model="chat"\\} (\\S+)$`, "m"));
  return m ? Number(m[1]) : 0;
}

serverTest(
  "beside a busy process per core, short two-thread decodes run off the request thread (decodes_host_busy)",
  async () => {
    // Every decode is short enough for the request thread (VSERVE_SYNC_DECODE_MS): where each one
    // runs is then up to the host's load alone.
    const registry = await writeJsonFile({
      models: [{ id: "chat", kind: "chat", source: "builtin:tiny-chat", contextSize: 1024, parallel: 1 }],
    });
    const server = await startServer(["--models", registry, "--threads", "2"], {
      waitReady: true,
      env: { VSERVE_SYNC_DECODE_MS: "100000" },
    });
    const busy: Deno.ChildProcess[] = [];
    try {
      const body = {
        model: "chat",
        messages: [{ role: "user", content: "count" }],
        max_tokens: 12,
        logit_bias: { "151643": -100, "151645": -100 },
      };
      assert.equal((await postJson(`${server.url}/v1/chat/completions`, body)).status, 200);
      // One per core, so that the pool's lowered thread loses its core on any machine.
      for (let i = 0; i < Math.max(2, navigator.hardwareConcurrency); i++) {
        busy.push(
          new Deno.Command("sh", { args: ["-c", "while :; do :; done"], stdout: "null", stderr: "null" })
            .spawn(),
        );
      }
      const before = await counter(server.url, "decodes_host_busy");
      // Requests until a decode found the host busy: at most 20 (each reads the counters a few times).
      for (let i = 0; i < 20 && await counter(server.url, "decodes_host_busy") === before; i++) {
        assert.equal((await postJson(`${server.url}/v1/chat/completions`, body)).status, 200);
      }
      assert.ok(await counter(server.url, "decodes_host_busy") > before, "some decode found the host busy");
    } finally {
      for (const p of busy) {
        p.kill("SIGKILL");
        await p.status;
      }
      await server.stop();
    }
  },
);
