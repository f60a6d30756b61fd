/** Unit tests of pure logic: SSE encoding, vector maths, settings precedence, error paths. */
import assert from "node:assert/strict";
import { SSE_DONE, SSE_HEADERS, sseData, sseStream } from "../src/http/sse.ts";
import { EventLoopMonitor, Slicer, threadClock } from "../src/event_loop.ts";
import { ManualClock } from "./helpers/clock.ts";
import { base64ToFloat32, float32ToBase64, JsonFloats, truncateAndNormalize } from "../src/vectors.ts";
import { Counter } from "../src/metrics.ts";
import { V8_FLAGS_ARG } from "../src/v8_flags.ts";
import { ConfigError, loadApiKeys, loadConfig } from "../src/config.ts";
import { ApiError, formatPath, jsonBody, onSlicedJsonEnd, slicedJsonResponse } from "../src/http/errors.ts";
import { isSmallJson, jsonPieces } from "../src/http/json_writer.ts";
import { MAX_BODY_PIECES, readJsonBody } from "../src/http/body.ts";
import { JsonBodyError, MAX_OBJECT_MEMBERS, parseJsonInSlices } from "../src/http/json_slices.ts";
import { constantTimeEqual, KeyRing, RateLimiter } from "../src/http/auth.ts";
import { parseKeyFile, plainKey } from "../src/api_keys.ts";
import { createHash } from "node:crypto";
import { parseRegistry } from "../src/registry.ts";

const text = (b: Uint8Array) => new TextDecoder().decode(b);

Deno.test("SSE: an event is 'data: <json>' and a blank line", () => {
  assert.equal(text(sseData({ a: "é\n" })), 'data: {"a":"é\\n"}\n\n');
  assert.equal(text(SSE_DONE), "data: [DONE]\n\n");
});

Deno.test("SSE: a stream ends with [DONE] after its events", async () => {
  async function* src() {
    yield { n: 1 };
    yield { n: 2 };
  }
  const out = await new Response(sseStream(src())).text();
  assert.equal(out, 'data: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n');
});

Deno.test("SSE: an error after the first event becomes an error event, then [DONE]", async () => {
  async function* src() {
    yield { n: 1 };
    throw new Error("boom");
  }
  const out = await new Response(sseStream(src(), { onError: () => ({ error: { message: "x" } }) })).text();
  assert.equal(out, 'data: {"n":1}\n\ndata: {"error":{"message":"x"}}\n\ndata: [DONE]\n\n');
});

Deno.test("SSE: cancelling the body runs the source's finally block", async () => {
  let cleaned = false;
  async function* src() {
    try {
      while (true) yield { tick: true };
    } finally {
      cleaned = true;
    }
  }
  const reader = sseStream(src()).getReader();
  await reader.read();
  await reader.cancel();
  assert.equal(cleaned, true);
});

Deno.test("truncateAndNormalize keeps the first N components at unit length", () => {
  const v = truncateAndNormalize(new Float32Array([3, 4, 12]), 2);
  assert.deepEqual(Array.from(v).map((x) => Number(x.toFixed(6))), [0.6, 0.8]);
});

Deno.test("base64 embeddings are little-endian float32 and round-trip", () => {
  assert.equal(float32ToBase64(new Float32Array([1])), "AACAPw==");
  const v = new Float32Array([0.1, -2.5, 3e-8]);
  assert.deepEqual(base64ToFloat32(float32ToBase64(v)), v);
  // A view into a larger buffer encodes only its own components.
  assert.equal(float32ToBase64(new Float32Array([9, 2, 3]).subarray(1)), "AAAAQAAAQEA=");
  assert.throws(() => base64ToFloat32("AACA"), RangeError, "3 bytes are not whole float32 values");
  assert.throws(() => base64ToFloat32("not base64!"));
});

Deno.test("metric series: labels in name order, values escaped", () => {
  const c = new Counter("x_total", "");
  c.inc({ status: "200", route: "/a" });
  c.inc({ route: "/a", status: "200" }, 2);
  c.inc({ model: 'a"b\\c\nd' });
  assert.deepEqual(c.render(), ['x_total{route="/a",status="200"} 3', 'x_total{model="a\\"b\\\\c\\nd"} 1']);
});

Deno.test("formatPath writes JSON paths as OpenAI reports param", () => {
  assert.equal(formatPath(["messages", 2, "role"]), "messages[2].role");
  assert.equal(formatPath([]), null);
});

Deno.test("settings: flags beat env, env beats the config file", async () => {
  const file = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(file, JSON.stringify({ port: 1111, host: "127.0.0.2", threads: 1 }));
  const { config } = await loadConfig(["--config", file, "--port", "3333"], {
    VSERVE_PORT: "2222",
    VSERVE_HOST: "127.0.0.3",
  });
  assert.equal(config.port, 3333);
  assert.equal(config.host, "127.0.0.3");
  assert.equal(config.threads, 1);
  await Deno.remove(file);
});

Deno.test("settings: flash attention is auto unless set; a value outside auto|on|off names the setting", async () => {
  assert.equal((await loadConfig([], {})).config.flashAttn, "auto");
  assert.equal((await loadConfig(["--flash-attn", "off"], {})).config.flashAttn, "off");
  assert.equal((await loadConfig([], { VSERVE_FLASH_ATTN: "on" })).config.flashAttn, "on");
  await assert.rejects(
    loadConfig(["--flash-attn", "maybe"], {}),
    (e: Error) => e instanceof ConfigError && /flash/i.test(e.message),
  );
});

Deno.test("settings: an unknown key in the config file is an error naming it", async () => {
  const file = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(file, JSON.stringify({ prot: 1 }));
  await assert.rejects(
    loadConfig(["--config", file], {}),
    (e: Error) => e instanceof ConfigError && /prot/.test(e.message),
  );
  await Deno.remove(file);
});

Deno.test("settings: keys come from flags, env and a key file together", async () => {
  const file = await Deno.makeTempFile();
  await Deno.writeTextFile(file, "# ops keys\nk-file name=ops\n\n");
  const { config } = await loadConfig(["--api-key", "k-flag", "--api-key-file", file], {});
  const keys = await loadApiKeys(config);
  assert.deepEqual(keys.map((k) => k.name), [plainKey("k-flag").name, "ops"]);
  const ring = new KeyRing(keys);
  assert.equal(ring.authorize("Bearer k-file")?.name, "ops");
  const env = await loadConfig([], { VSERVE_API_KEY: "a,b" });
  assert.deepEqual(env.config.apiKeys, ["a", "b"]);
  await Deno.remove(file);
});

Deno.test("auth: constant-time comparison and bearer parsing", () => {
  assert.equal(constantTimeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 2])), true);
  assert.equal(constantTimeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 3])), false);
  const ring = new KeyRing([plainKey("k")]);
  ring.authorize("Bearer k");
  ring.authorize("bearer   k");
  assert.throws(() => ring.authorize("Bearer x"));
  assert.throws(() => ring.authorize(null));
});

Deno.test("key file: sha256 entries, names, models and limits; bad lines name the line", () => {
  const hash = createHash("sha256").update("s3cret").digest("hex");
  const [k] = parseKeyFile(`sha256:${hash} name=ci models=a,b rpm=60 tpm=1000`, "keys");
  assert.deepEqual([k.name, [...k.models!], k.rpm, k.tpm], ["ci", ["a", "b"], 60, 1000]);
  assert.equal(new KeyRing([k]).authorize("Bearer s3cret")?.name, "ci");
  assert.throws(() => parseKeyFile("ok\nsha256:zz", "keys"), /keys line 2: sha256: needs 64 hex digits/);
  assert.throws(() => parseKeyFile("k colour=red", "keys"), /line 1: unknown field 'colour'/);
  assert.throws(() => parseKeyFile("k rpm=0", "keys"), /rpm must be a positive integer/);
});

Deno.test("rate limiter: requests and tokens per minute refill over time", () => {
  let now = 0;
  const limiter = new RateLimiter(() => now);
  const key = { ...plainKey("k"), rpm: 2, tpm: 100 };
  assert.equal(limiter.admit(key)["x-ratelimit-remaining-requests"], "1");
  limiter.admit(key);
  assert.throws(
    () => limiter.admit(key),
    (e: Error & { status: number; headers: Record<string, string> }) =>
      e.status === 429 && Number(e.headers["retry-after"]) === 30,
  );
  now += 30_000;
  limiter.admit(key);
  now += 60_000;
  limiter.charge(key, 150);
  assert.throws(() => limiter.admit(key), /tokens per minute/);
  now += 60_000;
  assert.equal(limiter.admit(key)["x-ratelimit-limit-tokens"], "100");
  assert.deepEqual(limiter.admit(undefined), {});
});

Deno.test("registry: a duplicate name and a missing field are clear errors", () => {
  assert.throws(
    () =>
      parseRegistry({
        models: [
          { id: "a", kind: "chat", source: "x.gguf" },
          { id: "b", aliases: ["a"], kind: "chat", source: "y.gguf" },
        ],
      }, "models.json"),
    /models\[1\]\.id: the name 'a' is used by models\[0\] and models\[1\]/,
  );
  assert.throws(
    () => parseRegistry({ models: [{ id: "a", source: "x" }] }, "models.json"),
    /models\[0\]\.kind/,
  );
});

Deno.test("embeddings: a model without Matryoshka support refuses other dimensions, naming the field", async () => {
  const { createEmbeddings } = await import("../src/services/embeddings.ts");
  const engine = {
    nativeDims: 64,
    vocabSize: 100,
    tokenize: (t: string) => Promise.resolve(Array.from(t, (_, i) => i % 100)),
    completeTokens: (ids: readonly number[]) => [...ids],
    embed: (seqs: readonly (readonly number[])[]) =>
      Promise.resolve(seqs.map(() => new Float32Array(64).fill(1))),
    dispose: () => Promise.resolve(),
  };
  const limits = { maxInputTokens: 10, maxEntries: 4, matryoshka: false, minDims: 32 };
  await assert.rejects(
    createEmbeddings({ model: "m", input: "abc", dimensions: 32 }, engine, limits),
    (e: Error & { param: string; status: number }) =>
      e.status === 400 && e.param === "dimensions" && /native 64/.test(e.message),
  );
  const native = await createEmbeddings({ model: "m", input: "abc", dimensions: 64 }, engine, limits);
  assert.equal((native.data[0].embedding as Float32Array).length, 64);
});

Deno.test("event-loop monitor: a block is a stall; short tasks spread over an idle-rate window are not", () => {
  const clock = new ManualClock();
  const samples: { stall: number; lag: number }[] = [];
  const monitor = new EventLoopMonitor((stall, lag) => samples.push({ stall, lag }), 10, 300, clock);
  monitor.start();
  clock.idle(10);
  assert.deepEqual(clock.scheduled, [10, 300], "an idle first window: long ticks");
  // 12 slices of 5 ms, 20 ms apart: 60 ms of CPU in one long window, none of it a block.
  for (let i = 0; i < 12; i++) {
    clock.run(5);
    clock.idle(15);
  }
  clock.idle(60);
  assert.deepEqual(samples, [{ stall: 0, lag: 0 }, { stall: 0, lag: 0 }], "spread work is no stall");
  assert.equal(clock.scheduled.at(-1), 10, "a fifth of the window busy: short ticks again");
  // One 120 ms block: the short tick fires 110 ms late, after 120 ms of CPU.
  clock.run(120);
  assert.deepEqual(samples.at(-1), { stall: 0.12, lag: 0.11 });
  monitor.stop();
  assert.equal(clock.pending, 0, "stop cancels the timer");
});

Deno.test("event-loop monitor: a request ends an idle-rate window, so a block it brings is a stall", () => {
  const clock = new ManualClock();
  const samples: { stall: number; lag: number }[] = [];
  const monitor = new EventLoopMonitor((stall, lag) => samples.push({ stall, lag }), 10, 300, clock);
  monitor.start();
  clock.idle(100);
  assert.equal(clock.scheduled.at(-1), 300, "idle: a long tick is due");
  // Without wake(), a 120 ms block early in a long window ends before its tick is due: no lag, so
  // the long window reports no stall (it cannot tell a block from spread work).
  clock.run(120);
  clock.idle(90);
  assert.deepEqual(samples.at(-1), { stall: 0, lag: 0 }, "the long tick came on time");
  assert.equal(clock.scheduled.at(-1), 10, "its window was busy");
  clock.idle(20);
  assert.equal(clock.scheduled.at(-1), 300, "idle again");
  const before = samples.length;
  monitor.wake();
  assert.equal(samples.length, before + 1, "wake() closes the long window at once");
  assert.deepEqual(clock.scheduled.slice(-2), [300, 10], "and the next tick is a short one");
  clock.run(120);
  assert.deepEqual(samples.at(-1), { stall: 0.12, lag: 0.11 }, "the block is a stall");
  const ticks = clock.scheduled.length;
  monitor.wake();
  assert.equal(clock.scheduled.length, ticks, "wake() while the ticks are short changes nothing");
  monitor.stop();
});

Deno.test("event-loop monitor: short ticks while the thread works, long ones while it idles", () => {
  const clock = new ManualClock();
  const monitor = new EventLoopMonitor(() => {}, 10, 100, clock);
  monitor.start();
  // Busy: 60% of the time on the thread, in 6 ms slices, for 300 ms.
  for (let i = 0; i < 30; i++) {
    clock.run(6);
    clock.idle(4);
  }
  const busy = clock.scheduled.length;
  assert.ok(busy >= 29, `${busy} ticks in 300 ms of work`);
  assert.ok(clock.scheduled.every((ms) => ms === 10), "every tick short while the thread works");
  // Idle: the first window that finds the thread asleep makes the ticks long (10 ms apart: 60).
  clock.idle(600);
  assert.deepEqual(clock.scheduled.slice(busy), [100, 100, 100, 100, 100, 100]);
  monitor.stop();
});

Deno.test("event-loop monitor: without the thread's CPU time a stall is the lag, and ticks stay short", () => {
  const clock = new ManualClock({ cpu: false });
  const samples: { stall: number; lag: number }[] = [];
  const monitor = new EventLoopMonitor((stall, lag) => samples.push({ stall, lag }), 10, 100, clock);
  monitor.start();
  clock.idle(50);
  clock.run(40);
  assert.deepEqual(samples.at(-1), { stall: 0.03, lag: 0.03 });
  assert.ok(clock.scheduled.every((ms) => ms === 10));
  monitor.stop();
});

Deno.test("threadClock: the thread's CPU time grows as it works; its timers fire and can be cancelled", async () => {
  const clock = threadClock();
  try {
    const start = clock.cpuNs();
    if (start !== undefined) {
      let now = start;
      for (let spins = 0; now === start && spins < 1e6; spins++) {
        for (let i = 0; i < 1000; i++) Math.sqrt(i);
        now = clock.cpuNs()!;
      }
      assert.ok(now > start, "the CPU time grew");
    }
    const order: string[] = [];
    const cancelled = clock.schedule(() => order.push("cancelled"), 0);
    cancelled();
    // (Its timers do not keep the process alive: this one does, meanwhile.)
    const alive = setTimeout(() => {}, 60_000);
    await new Promise<void>((r) => clock.schedule(() => (order.push("fired"), r()), 1));
    clearTimeout(alive);
    assert.deepEqual(order, ["fired"]);
  } finally {
    clock.close();
  }
});

Deno.test("slicedJsonResponse: the text of JSON.stringify, in several chunks when slices are short", async () => {
  const body = {
    object: "list",
    data: Array.from({ length: 50 }, (_, i) => ({ index: i, embedding: [i / 3, -i, 1e-7 * i] })),
    model: 'a "model" \u2028 id',
    usage: { prompt_tokens: 5 },
  };
  const holes = { data: [1, undefined, () => 2, null], object: "list", gone: undefined };
  // Large: many small items, a large item among them, strings past a run with a surrogate pair
  // across each run's end, a toJSON.
  const pair = "\u{1F600}";
  const large = {
    tokens: Array.from({ length: 30_000 }, (_, i) => i),
    nested: [1, { inner: Array.from({ length: 20_000 }, (_, i) => ({ i, s: `${i}` })) }, "x", undefined],
    text: "a".repeat((1 << 16) - 1) + pair + 'b\n"'.repeat(70_000) + "\ud800",
    when: new Date(0),
  };
  for (
    const [value, sliceMs] of [[body, 0], [body, 1000], [{ ...body, data: [] }, 0], [holes, 0], [
      large,
      0,
    ]] as const
  ) {
    const res = slicedJsonResponse(value, { sliceMs });
    assert.equal(res.headers.get("content-type"), "application/json");
    let chunks = 0;
    let text = "";
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) {
      chunks++;
      text += decoder.decode(chunk, { stream: true });
    }
    assert.equal(text, JSON.stringify(value));
    if (value === large) assert.ok(chunks >= 10, `${chunks} chunks`);
  }
  assert.ok([...jsonPieces(large)].length > 20, "a large value is written in many pieces");
  assert.equal([...jsonPieces(body)].length, 1, "a small one in one");
});

Deno.test("JsonFloats: float32 vectors written as the arrays of numbers JSON.stringify gives, counted unmade", () => {
  const values = Array.from({ length: 3000 }, (_, i) => Math.fround(Math.sin(i) / 7));
  const vectors = [0, 1, 2].map(() => new JsonFloats(values));
  const body = { data: vectors.map((embedding, index) => ({ index, embedding })), n: 3 };
  const plain = JSON.stringify({
    data: vectors.map((v, index) => ({ index, embedding: Array.from(v) })),
    n: 3,
  });
  assert.equal(JSON.stringify(body), plain);
  assert.equal([...jsonPieces(body)].join(""), plain);
  // Counting a vector's size must not make its array (the point of keeping it float32).
  let made = 0;
  class Counted extends JsonFloats {
    override toJSON(): number[] {
      made++;
      return super.toJSON();
    }
  }
  assert.equal(isSmallJson({ v: new Counted(values) }, 2000), false);
  assert.equal(isSmallJson({ v: new Counted(10) }, 2000), true);
  assert.equal(made, 0);
});

Deno.test("jsonBody: a small body is one string with its length; a large one is written in slices", async () => {
  const small = jsonBody({ a: 1 }, { status: 201, headers: { "x-a": "b" } });
  assert.equal(small.status, 201);
  assert.equal(small.headers.get("x-a"), "b");
  assert.equal(await small.text(), '{"a":1}');
  assert.equal(onSlicedJsonEnd(small, () => {}), false);
  const large = jsonBody({ tokens: Array.from({ length: 100_000 }, (_, i) => i) });
  assert.equal(onSlicedJsonEnd(large, () => {}), true);
  assert.equal((await large.json()).tokens.length, 100_000);
});

Deno.test("Slicer: due once a slice is used up; a pause lets timers run and throws once the signal aborts", async () => {
  const controller = new AbortController();
  let now = 1000;
  const slices = new Slicer(5, controller.signal, () => now);
  assert.equal(slices.due, false);
  now += 4.9;
  assert.equal(slices.due, false);
  now += 0.1;
  assert.equal(slices.due, true);
  let fired = false;
  setTimeout(() => (fired = true), 0);
  await slices.pause();
  assert.ok(fired, "a timer ran during the pause");
  assert.equal(slices.due, false, "a new slice");
  setTimeout(() => controller.abort(new Error("client left")), 0);
  await assert.rejects(slices.pause(), /client left/);
});

Deno.test("slicedJsonResponse: an aborted signal ends the request at once and writes nothing more", async () => {
  const controller = new AbortController();
  const body = { data: Array.from({ length: 100 }, (_, i) => i), object: "list" };
  const res = slicedJsonResponse(body, { signal: controller.signal, sliceMs: 0 });
  const ends: boolean[] = [];
  assert.ok(onSlicedJsonEnd(res, (cut) => ends.push(cut)));
  const reader = res.body!.getReader();
  await reader.read();
  assert.deepEqual(ends, [], "not ended while it is being read");
  controller.abort(new Error("drain time is over"));
  assert.deepEqual(ends, [true], "ended, cut, as the signal aborts");
  const next = await Promise.race([
    reader.read().then(() => "more"),
    new Promise((r) => setTimeout(() => r("nothing"), 50)),
  ]);
  assert.equal(next, "nothing", "no more of the body after the abort");
  await reader.cancel();
  assert.deepEqual(ends, [true], "told once");
});

Deno.test("a gzip bomb is a 413, and the event loop gets turns while it inflates", async () => {
  // 64 MB of zeros is 64 KB of gzip. It was inflated in one step, all in promise jobs: 170 ms of
  // the event loop per 64 KB received (ten at once: 1.5 s, /health unanswered) and 64 MB of memory
  // before the limit was checked. A timer set before the read must fire before the 413 (order).
  const zeros = new Blob([new Uint8Array(64 << 20)]).stream().pipeThrough(new CompressionStream("gzip"));
  const bomb = new Uint8Array(await new Response(zeros).arrayBuffer());
  const req = new Request("http://localhost/v1/embeddings", {
    method: "POST",
    headers: { "content-type": "application/json", "content-encoding": "gzip" },
    body: bomb,
  });
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  const error = await readJsonBody(req, 8 << 20).then(() => undefined, (e) => e);
  const firedBeforeRefusal = fired;
  clearTimeout(timer);
  assert.ok(error instanceof ApiError && error.status === 413, String(error));
  assert.ok(firedBeforeRefusal, "a timer set before the read fired before the 413");
});

Deno.test("a body in more than MAX_BODY_PIECES pieces is a 400, and the event loop gets turns while it is read", async () => {
  // 8 MB in 16-byte chunks held the event loop (and /health) for 57 s: pieces sent ahead are read in
  // promise jobs. Now the read gives the loop a turn every 10 ms and every 4,096 reads (a timer set
  // before fires first, whatever the machine's speed) and stops at the cap; a body under the cap in
  // small pieces still reads whole.
  const piecesOf = (n: number, text: string) =>
    new ReadableStream<Uint8Array>({
      start(controller) {
        const bytes = new TextEncoder().encode(text);
        const size = Math.ceil(bytes.length / n);
        for (let at = 0; at < bytes.length; at += size) controller.enqueue(bytes.slice(at, at + size));
        controller.close();
      },
    });
  const post = (body: ReadableStream<Uint8Array>) =>
    new Request("http://localhost/v1/embeddings", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
  const text = JSON.stringify({ input: "x".repeat(2 * MAX_BODY_PIECES) });
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  const error = await readJsonBody(post(piecesOf(text.length, text)), 8 << 20).then(
    () => undefined,
    (e) => e,
  );
  const firedBeforeRefusal = fired;
  clearTimeout(timer);
  assert.ok(
    error instanceof ApiError && error.status === 400 && error.code === "body_too_fragmented",
    String(error),
  );
  assert.ok(firedBeforeRefusal, "a timer set before the read fired before the 400");
  const ok = await readJsonBody(post(piecesOf(MAX_BODY_PIECES, text)), 8 << 20);
  assert.deepEqual(ok, JSON.parse(text), "the same body in fewer pieces reads whole");
});

Deno.test("sseStream: a large event is written in slices, whole, with no ping inside it", async () => {
  const big = {
    choices: [{
      logprobs: { content: Array.from({ length: 30_000 }, (_, i) => ({ token: `t${i}`, logprob: -i })) },
    }],
  };
  async function* source() {
    yield big;
    yield { n: 2 };
  }
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  // (Slices of 0 ms: a turn after every piece, whatever the machine's speed.)
  const res = new Response(sseStream(source(), { pingMs: 1, event: () => "chunk", sliceMs: 0 }), {
    headers: SSE_HEADERS,
  });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let reads = 0;
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    reads++;
    text += decoder.decode(r.value, { stream: true });
  }
  clearInterval(timer);
  const events = text.split("\n\n").filter((e) => e !== "" && !e.startsWith(": ping"));
  assert.deepEqual(events, [
    `event: chunk\ndata: ${JSON.stringify(big)}`,
    `event: chunk\ndata: {"n":2}`,
    "data: [DONE]",
  ]);
  assert.ok(reads > 3, `${reads} reads`);
  assert.ok(ticks > 0, "timers ran while the event was written");
});

Deno.test("deno task start runs the server with the V8 flags of the compiled binary and the tests' servers", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
  assert.ok(config.tasks.start.split(/\s+/).includes(V8_FLAGS_ARG), config.tasks.start);
});

Deno.test("a body parsed in slices keeps `__proto__` and prototype names as own keys, as JSON.parse does", async () => {
  // Over a piece (32 KB): the object's members are parsed in runs and copied into one object.
  const members = Array.from({ length: 20_000 }, (_, i) => `"k${i}":${i}`);
  members.splice(5000, 0, `"__proto__":{"polluted":true}`, `"constructor":1`, `"toString":"x"`);
  const text = `{"metadata":{${members.join(",")}},"model":"m"}`;
  assert.ok(text.length > 200_000);
  const parsed = await parseJsonInSlices(text, new Slicer(10)) as { metadata: Record<string, unknown> };
  assert.deepEqual(parsed, JSON.parse(text));
  const own = Object.getOwnPropertyDescriptor(parsed.metadata, "__proto__");
  assert.deepEqual(own?.value, { polluted: true });
  assert.equal(Object.getPrototypeOf(parsed.metadata), Object.prototype);
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
  assert.equal(parsed.metadata.constructor, 1);
  assert.equal(Object.keys(parsed.metadata).length, 20_003);
});

Deno.test("an object of more members than a whole vocabulary's logit_bias is refused before it is built", async () => {
  const object = (n: number) =>
    `{"logit_bias":{${Array.from({ length: n }, (_, i) => `"${i}":1`).join(",")}}}`;
  const at = await parseJsonInSlices(object(MAX_OBJECT_MEMBERS), new Slicer(10)) as {
    logit_bias: Record<string, number>;
  };
  assert.equal(Object.keys(at.logit_bias).length, MAX_OBJECT_MEMBERS);
  await assert.rejects(
    parseJsonInSlices(object(MAX_OBJECT_MEMBERS + 1), new Slicer(10)),
    (e: Error) =>
      e instanceof JsonBodyError && e.limit === "members" && /more than 262144 members/.test(e.message) &&
      e.path === "logit_bias",
  );
  // The field is named through arrays, odd keys and keys after nested values.
  const members = Array.from({ length: MAX_OBJECT_MEMBERS + 1 }, (_, i) => `"${i}":1`).join(",");
  const deep = `{"a":1,"x":{"y":[0,[],{"z\\"q":{}, "w" : [5, {"n":{"m":2}, "k" : {${members}}}]}]}}`;
  await assert.rejects(
    parseJsonInSlices(deep, new Slicer(10)),
    (e: Error) => e instanceof JsonBodyError && e.path === "x.y[2].w[1].k",
  );
  const top = `{${members}}`;
  await assert.rejects(
    parseJsonInSlices(top, new Slicer(10)),
    (e: Error) => e instanceof JsonBodyError && e.path === undefined && /the body itself/.test(e.message),
  );
  const odd = `{"b\\"c":[{"":{${members}}}]}`;
  await assert.rejects(
    parseJsonInSlices(odd, new Slicer(10)),
    (e: Error) => e instanceof JsonBodyError && e.path === '["b\\"c"][0][""]',
  );
  // Arrays are not objects: as many elements are fine (no property per element).
  const array = `{"stop":[${Array.from({ length: MAX_OBJECT_MEMBERS + 5 }, () => "1").join(",")}]}`;
  assert.equal(
    (await parseJsonInSlices(array, new Slicer(10)) as { stop: number[] }).stop.length,
    MAX_OBJECT_MEMBERS + 5,
  );
});
