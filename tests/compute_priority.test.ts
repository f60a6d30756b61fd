/**
 * `--compute-nice`: every thread of the server process except the request (JavaScript) thread runs
 * below it. Read from the kernel (`/proc/<pid>/task/<tid>/stat`, the nice field) of a real server
 * after it has computed (the ggml pool, Deno's blocking-pool threads, onnxruntime's, the workers',
 * V8's), and off with 0. The keeper's bookkeeping is tested on a fake thread list.
 */
import assert from "node:assert/strict";
import { ComputePriority, type ThreadSystem } from "../src/compute_priority.ts";
import { postJson, startServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { poll } from "./helpers/poll.ts";

const KEY = "k";

/** tid → nice value of each thread of `pid`, and their names. */
function threads(pid: number): { tid: number; nice: number; name: string }[] {
  const out = [];
  for (const e of Deno.readDirSync(`/proc/${pid}/task`)) {
    let stat: string;
    try {
      stat = Deno.readTextFileSync(`/proc/${pid}/task/${e.name}/stat`);
    } catch {
      continue; // ended meanwhile
    }
    const close = stat.lastIndexOf(")");
    // Field 19 (nice); the fields after the name start at field 3.
    const fields = stat.slice(close + 2).split(" ");
    out.push({
      tid: Number(e.name),
      nice: Number(fields[19 - 3]),
      name: stat.slice(stat.indexOf("(") + 1, close),
    });
  }
  return out;
}

const registry = await writeJsonFile({
  models: [
    { id: "chat", kind: "chat", source: "builtin:tiny-chat", contextSize: 1024, parallel: 2 },
    {
      id: "embed",
      kind: "embedding",
      backend: "onnx",
      source: "builtin:tiny-embed-onnx",
      tokenizer: "builtin:qwen3",
      pooling: "mean",
    },
  ],
});

/** A server that has computed: a chat (every decode handed to the blocking pool) and an ONNX embedding. */
async function computedServer(nice: string) {
  const server = await startServer(
    ["--api-key", KEY, "--models", registry, "--threads", "2", "--compute-nice", nice],
    { waitReady: true, env: { VSERVE_SYNC_DECODE_MS: "0" } },
  );
  const chat = await postJson(`${server.url}/v1/chat/completions`, {
    model: "chat",
    messages: [{ role: "user", content: "hello there" }],
    max_tokens: 4,
  }, KEY);
  assert.equal(chat.status, 200);
  const embed = await postJson(`${server.url}/v1/embeddings`, { model: "embed", input: "one word" }, KEY);
  assert.equal(embed.status, 200);
  return server;
}

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, "m"));
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
}

serverTest(
  "--compute-nice 7: every thread but the request thread and V8's helpers runs 7 nice levels below it",
  async () => {
    const server = await computedServer("7");
    try {
      const main = () => threads(server.pid).find((t) => t.tid === server.pid)!;
      const base = main().nice;
      const v8 = (t: { name: string }) => t.name.startsWith("V8");
      // New threads are set where they are made and by the next look (within a second).
      const others = await poll("every other thread is set", () => {
        const rest = threads(server.pid).filter((t) => t.tid !== server.pid && !v8(t));
        return rest.every((t) => t.nice === Math.min(19, base + 7)) && rest;
      });
      assert.equal(main().nice, base, "the request thread keeps its priority");
      // ggml's pool worker and the blocking pool's decode thread (named after their creators).
      assert.ok(others.length >= 4, `threads set: ${others.map((t) => t.name).join(", ")}`);
      // V8's helpers keep its priority (without --single-threaded-gc, it waits for them in a collection).
      const helpers = threads(server.pid).filter(v8);
      assert.ok(helpers.length >= 1, "V8's helpers are there");
      assert.deepEqual(helpers.map((t) => t.nice), helpers.map(() => base));
      assert.equal(await metric(server.url, "vserve_compute_nice"), 7);
      assert.ok(await metric(server.url, "vserve_compute_threads_reniced_total") >= others.length);
    } finally {
      await server.stop();
    }
  },
);

serverTest("--compute-nice 0: no thread is set below the request thread", async () => {
  const server = await computedServer("0");
  try {
    const all = threads(server.pid);
    const base = all.find((t) => t.tid === server.pid)!.nice;
    assert.ok(all.length >= 5);
    assert.deepEqual(all.filter((t) => t.nice !== base), []);
    assert.equal(await metric(server.url, "vserve_compute_nice"), 0);
    assert.equal(await metric(server.url, "vserve_compute_threads_reniced_total"), 0);
  } finally {
    await server.stop();
  }
});

/** A process of fake threads: ids, nice values, and the system calls made. */
function fakeThreads(self = 100, base = 0) {
  const nice = new Map<number, number>([[self, base]]);
  const names = new Map<number, string>();
  let clock = 0;
  const calls = { list: 0, set: 0 };
  const sys: ThreadSystem = {
    count: () => nice.size,
    list: () => (calls.list++, [...nice.keys()]),
    setNice: (tid, value) => {
      calls.set++;
      if (!nice.has(tid)) return false;
      nice.set(tid, value);
      return true;
    },
    niceOf: (tid) => nice.get(tid)!,
    self: () => self,
    now: () => clock,
    name: (tid) => names.get(tid) ?? "worker",
  };
  return {
    sys,
    nice,
    calls,
    spawn: (tid: number, value = base, name?: string) => {
      if (name) names.set(tid, name);
      return nice.set(tid, value);
    },
    end: (tid: number) => nice.delete(tid),
    advance: (ms: number) => clock += ms,
  };
}

Deno.test("ComputePriority sets new threads once, not the JavaScript thread, and lists only on a change or each second", () => {
  const f = fakeThreads(100, 2);
  f.spawn(101);
  f.spawn(102);
  const keeper = ComputePriority.start(10, f.sys)!;
  try {
    assert.equal(keeper.target, 12, "relative to the JavaScript thread's nice value");
    assert.deepEqual([...f.nice], [[100, 2], [101, 12], [102, 12]]);
    assert.equal(keeper.reniced, 2);
    // Nothing changed: a check does not list.
    keeper.check();
    assert.equal(f.calls.list, 1);
    // A new thread changes the count: set at the next check, the others not again.
    f.spawn(103);
    keeper.check();
    assert.deepEqual([f.calls.list, f.calls.set, f.nice.get(103)], [2, 3, 12]);
    // One ends while another starts (same count): found by the listing a second later.
    f.end(101);
    f.spawn(104);
    keeper.check();
    assert.equal(f.nice.get(104), 2);
    f.advance(1000);
    keeper.check();
    assert.equal(f.nice.get(104), 12);
    assert.equal(keeper.reniced, 4);
  } finally {
    keeper.stop();
  }
});

Deno.test("ComputePriority leaves V8's helper threads at the JavaScript thread's priority", () => {
  const f = fakeThreads(100, 0);
  f.spawn(101, 0, "V8 DefaultWorke");
  f.spawn(102, 0, "tokio-runtime-w");
  const keeper = ComputePriority.start(10, f.sys)!;
  try {
    assert.deepEqual([...f.nice], [[100, 0], [101, 0], [102, 10]]);
    assert.equal(keeper.reniced, 1);
    f.advance(1000);
    keeper.check();
    assert.equal(f.nice.get(101), 0, "not set at a later listing either");
    assert.equal(f.calls.set, 1);
  } finally {
    keeper.stop();
  }
});

Deno.test("ComputePriority: 0 is off, and the target stops at 19", () => {
  const f = fakeThreads(100, 15);
  f.spawn(101);
  assert.equal(ComputePriority.start(0, f.sys), undefined);
  assert.equal(f.nice.get(101), 15);
  assert.equal(ComputePriority.start(10, null), undefined, "no per-thread priorities: off");
  const keeper = ComputePriority.start(10, f.sys)!;
  assert.equal(f.nice.get(101), 19);
  keeper.stop();
});
