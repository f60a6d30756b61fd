/** Unit tests of pure logic: SSE encoding, vector maths, settings precedence, error paths. */
import assert from "node:assert/strict";
import { SSE_DONE, sseData, sseStream } from "../src/http/sse.ts";
import { EventLoopMonitor, Slicer } from "../src/event_loop.ts";
import { base64ToFloat32, float32ToBase64, truncateAndNormalize } from "../src/vectors.ts";
import { Counter } from "../src/metrics.ts";
import { ConfigError, loadApiKeys, loadConfig } from "../src/config.ts";
import { formatPath, onSlicedJsonEnd, slicedJsonResponse } from "../src/http/errors.ts";
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
  assert.equal((native.data[0].embedding as number[]).length, 64);
});

Deno.test("event-loop monitor: a block is a stall; short tasks spread over an idle-rate window are not", async () => {
  const samples: { stall: number; lag: number; at: number }[] = [];
  const monitor = new EventLoopMonitor(
    (stall, lag) => samples.push({ stall, lag, at: performance.now() }),
    10,
    300,
  );
  const spin = (ms: number) => {
    const end = performance.now() + ms;
    while (performance.now() < end) { /* work */ }
  };
  monitor.start();
  try {
    // Idle until the ticks are long (300 ms), then 12 slices of 5 ms, 20 ms apart: 60 ms of CPU in
    // one long window, none of it a block.
    await new Promise((r) => setTimeout(r, 120));
    const spreadFrom = performance.now();
    for (let i = 0; i < 12; i++) {
      spin(5);
      await new Promise((r) => setTimeout(r, 15));
    }
    await new Promise((r) => setTimeout(r, 350));
    // The long windows that held the slices (short ones that follow report each slice, a true block).
    const long = samples.filter((s, i) => s.at > spreadFrom && i > 0 && s.at - samples[i - 1].at > 200);
    assert.ok(long.length > 0, "a long window closed over the slices");
    for (const s of long) {
      assert.ok(s.stall <= s.lag + 0.001, `spread work read as a ${(s.stall * 1000).toFixed(0)} ms stall`);
    }
    // A request arrives, then one 120 ms block: a stall of about that, whatever the tick rate.
    monitor.wake();
    const blockFrom = performance.now();
    spin(120);
    await new Promise((r) => setTimeout(r, 30));
    const block = Math.max(...samples.filter((s) => s.at > blockFrom).map((s) => s.stall));
    assert.ok(block >= 0.05, `a 120 ms block read as a ${(block * 1000).toFixed(0)} ms stall`);
  } finally {
    monitor.stop();
  }
});

Deno.test("event-loop monitor: short ticks while the thread works, long ones while it idles", async () => {
  const ticks: number[] = [];
  const monitor = new EventLoopMonitor(() => ticks.push(performance.now()), 10, 100);
  monitor.start();
  try {
    // Busy: about 60% of the time on the thread, in 6 ms slices.
    const busyEnd = performance.now() + 300;
    while (performance.now() < busyEnd) {
      const sliceEnd = performance.now() + 6;
      while (performance.now() < sliceEnd) { /* work */ }
      await new Promise((r) => setTimeout(r, 4));
    }
    const busyTicks = ticks.length;
    // Idle: 600 ms asleep.
    await new Promise((r) => setTimeout(r, 600));
    const idleTicks = ticks.length - busyTicks;
    assert.ok(busyTicks >= 8, `${busyTicks} ticks in 300 ms of work (10 ms apart: ~30)`);
    assert.ok(idleTicks <= 12, `${idleTicks} ticks in 600 ms idle (100 ms apart: ~6; 10 ms apart: ~60)`);
    // A request arrives: the idle window ends at once and short ticks resume.
    const before = ticks.length;
    monitor.wake();
    assert.equal(ticks.length, before + 1, "the idle window is closed by wake()");
    await new Promise((r) => setTimeout(r, 40));
    assert.ok(ticks.length - before >= 2, "a short tick after wake() (a long one would come 100 ms later)");
  } finally {
    monitor.stop();
  }
});

Deno.test("slicedJsonResponse: the text of JSON.stringify, in several chunks when slices are short", async () => {
  const body = {
    object: "list",
    data: Array.from({ length: 50 }, (_, i) => ({ index: i, embedding: [i / 3, -i, 1e-7 * i] })),
    model: 'a "model" \u2028 id',
    usage: { prompt_tokens: 5 },
  };
  const holes = { data: [1, undefined, () => 2, null], object: "list" };
  for (const [value, sliceMs] of [[body, 0], [body, 1000], [{ ...body, data: [] }, 0], [holes, 0]] as const) {
    const res = slicedJsonResponse(value, "data", { sliceMs });
    assert.equal(res.headers.get("content-type"), "application/json");
    let chunks = 0;
    let text = "";
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) {
      chunks++;
      text += decoder.decode(chunk, { stream: true });
    }
    assert.equal(text, JSON.stringify(value));
    if (sliceMs === 0) assert.ok(chunks >= value.data.length, `${chunks} chunks`);
  }
});

Deno.test("Slicer: due once a slice is used up; a pause lets timers run and throws once the signal aborts", async () => {
  const controller = new AbortController();
  const slices = new Slicer(5, controller.signal);
  assert.equal(slices.due, false);
  const end = performance.now() + 6;
  while (performance.now() < end) { /* a slice of work */ }
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
  const res = slicedJsonResponse(body, "data", { signal: controller.signal, sliceMs: 0 });
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
