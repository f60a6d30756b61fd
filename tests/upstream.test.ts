/**
 * Models served by upstream OpenAI-compatible servers (`backend: "openai"`): a gateway process in
 * front of real vserve processes and fault-injecting stand-ins, all on loopback.
 */
import assert from "node:assert/strict";
import { type Json, postJson, startServer, type TestServer, writeJsonFile } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { standInVector, startBlackHole, startStandIn } from "./helpers/standin.ts";
import { postStream } from "./helpers/sse.ts";
import { scrapeMetrics } from "./helpers/metrics.ts";
import { poll, settles } from "./helpers/poll.ts";
import { base64ToFloat32, truncateAndNormalize } from "../src/vectors.ts";

const KEY = "gw-key";
const UP_KEY = "up-key";
const user = [{ role: "user", content: "Say something" }];

// ---- the upstreams: two vserve processes on the built-in tiny models, four stand-ins ----

const upstreamRegistry = (embed: boolean) =>
  writeJsonFile({
    models: [
      { id: "vserve/tiny-chat", kind: "chat", source: "builtin:tiny-chat", contextSize: 4096, parallel: 4 },
      ...(embed ? [{ id: "vserve/tiny-embed", kind: "embedding", source: "builtin:tiny-embed" }] : []),
    ],
  });
const u2Args = ["--models", await upstreamRegistry(false), "--api-key", UP_KEY];
const [u1, firstU2] = await Promise.all([
  startServer(["--models", await upstreamRegistry(true), "--api-key", UP_KEY], { waitReady: true }),
  startServer(u2Args, { waitReady: true }),
]);
let u2: TestServer = firstU2;
const u2Port = new URL(u2.url).port;
const [s1, s2, s3, s4, s5] = [startStandIn(), startStandIn(), startStandIn(), startStandIn(), startStandIn()];
const hole = await startBlackHole();

const fast = { connectTimeoutMs: 200, firstByteTimeoutMs: 400 };
const gatewayRegistry = await writeJsonFile({
  models: [
    {
      id: "gw/chat",
      aliases: ["gw-chat"],
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: `${u1.url}/v1`, key: UP_KEY, model: "vserve/tiny-chat", name: "vserve-1" }],
    },
    {
      id: "gw/embed",
      kind: "embedding",
      backend: "openai",
      upstreams: [{ url: u1.url, key: UP_KEY, model: "vserve/tiny-embed" }],
      routing: { embeddingEncoding: "base64" },
    },
    {
      id: "gw/embed-ignore",
      kind: "embedding",
      backend: "openai",
      upstreams: [{ url: s1.url, model: "ok" }],
    },
    { id: "gw/think", kind: "chat", backend: "openai", upstreams: [{ url: s1.url, model: "think" }] },
    { id: "gw/fail", kind: "chat", backend: "openai", upstreams: [{ url: s1.url, model: "fail500" }] },
    ...["vllm400", "tei413", "fastapi422", "text400", "busy"].map((m) => ({
      id: `gw/${m}`,
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s1.url, model: m }],
    })),
    {
      id: "gw/retry",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s1.url, model: "hang", name: "hangs" }, {
        url: s2.url,
        model: "ok",
        name: "answers",
      }],
      routing: { ...fast, failures: 100 },
    },
    ...[true, false].map((withSpare) => ({
      id: withSpare ? "gw/noconnect" : "gw/noconnect-only",
      kind: "chat",
      backend: "openai",
      upstreams: [
        // Its health check answers (elsewhere), so it is routable: only its request port is silent.
        { url: hole.url, model: "ok", name: "silent", health: `${s2.url}/health` },
        ...(withSpare ? [{ url: s2.url, model: "ok", name: "answers" }] : []),
      ],
      // The first-byte limit is far away: only the connect timeout can answer in time.
      routing: { connectTimeoutMs: 300, firstByteTimeoutMs: 30_000, healthIntervalMs: 0, failures: 100 },
    })),
    { id: "gw/cut", kind: "chat", backend: "openai", upstreams: [{ url: s1.url, model: "cut" }] },
    { id: "gw/slow", kind: "chat", backend: "openai", upstreams: [{ url: s1.url, model: "slow" }] },
    { id: "gw/delay", kind: "chat", backend: "openai", upstreams: [{ url: s1.url, model: "delay" }] },
    {
      id: "gw/stall",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s1.url, model: "stall", name: "stalls" }],
      routing: { streamIdleTimeoutMs: 300, healthIntervalMs: 0, failures: 100 },
    },
    {
      id: "gw/readmit",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s5.url, model: "ok", name: "back" }, { url: s2.url, model: "ok", name: "spare" }],
      // A back-off far longer than the test: only the health checks can bring "back" back in time.
      routing: {
        ...fast,
        healthIntervalMs: 100,
        failures: 1,
        ejectMs: 600_000,
        maxEjectMs: 600_000,
        affinityPrefixChars: 0,
      },
    },
    {
      id: "gw/spread",
      kind: "chat",
      backend: "openai",
      parallel: 16,
      upstreams: [{ url: s1.url, model: "delay" }, { url: s2.url, model: "delay" }],
      routing: { affinityPrefixChars: 0 },
    },
    {
      id: "gw/affinity",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s1.url, model: "ok" }, { url: s2.url, model: "ok" }],
      routing: { affinityPrefixChars: 200 },
    },
    {
      id: "gw/eject",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s2.url, model: "ok", name: "steady" }, { url: s3.url, model: "ok", name: "flaky" }],
      routing: { ...fast, healthIntervalMs: 0, failures: 2, ejectMs: 300, maxEjectMs: 600 },
    },
    {
      id: "gw/health",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s4.url, model: "ok", name: "checked" }],
      routing: { healthIntervalMs: 150 },
    },
    {
      id: "gw/fleet",
      kind: "chat",
      backend: "openai",
      parallel: 32,
      upstreams: [
        { url: u1.url, key: UP_KEY, model: "vserve/tiny-chat", name: "a" },
        { url: u2.url, keyEnv: "UP_KEY", model: "vserve/tiny-chat", name: "b" },
        { url: s2.url, model: "delay", name: "c" },
      ],
      routing: {
        healthIntervalMs: 200,
        failures: 2,
        ejectMs: 300,
        maxEjectMs: 1000,
        firstByteTimeoutMs: 10_000,
      },
    },
  ],
});
const gw = await startServer(["--models", gatewayRegistry, "--api-key", KEY], {
  waitReady: true,
  env: { UP_KEY },
});
globalThis.addEventListener("unload", () => {
  for (const s of [gw, u1, u2]) void s.stop();
  for (const s of [s1, s2, s3, s4, s5]) void s.stop().catch(() => {});
  hole.close();
});

const chatUrl = `${gw.url}/v1/chat/completions`;
const post = (body: unknown, headers: Record<string, string> = {}) => postJson(chatUrl, body, KEY, headers);

/** The events of a streamed request (which must answer 200), `[DONE]` kept as the string. */
async function streamEvents(url: string, key: string, body: unknown): Promise<Json[]> {
  const res = await postStream(url, body as Record<string, unknown>, { key });
  assert.equal(res.status, 200, res.text);
  return res.data;
}

const health = async () => await (await fetch(`${gw.url}/health`)).json();
const upstreamState = async (model: string, name: string) =>
  (await health()).models.find((m: Json) => m.id === model).upstreams.find((u: Json) => u.name === name)
    .state;
const metrics = () => scrapeMetrics(gw.url);
const modelStatus = async (id: string) =>
  (await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } })).json())
    .data.find((m: Json) => m.id === id).status;

// ---- pass-through ----

const deterministic = { max_tokens: 12, temperature: 0, seed: 7, cache_prompt: false };

serverTest(
  "a chat model served by an upstream answers as the upstream does, under our model id",
  async () => {
    const body = { messages: user, ...deterministic };
    const direct = await postJson(
      `${u1.url}/v1/chat/completions`,
      { ...body, model: "vserve/tiny-chat" },
      UP_KEY,
    );
    const viaAlias = await post({ ...body, model: "gw-chat" });
    const via = await post({ ...body, model: "gw/chat" });
    assert.equal(direct.status, 200);
    assert.equal(via.status, 200, JSON.stringify(via.body));
    assert.equal(via.body.model, "gw/chat");
    assert.equal(viaAlias.body.model, "gw-chat");
    assert.match(via.body.id, /^chatcmpl-/);
    assert.deepEqual(via.body.choices, direct.body.choices);
    assert.ok(direct.body.system_fingerprint, "the upstream vserve gives its fingerprint");
    assert.equal(via.body.system_fingerprint, direct.body.system_fingerprint, "the upstream's fingerprint");
    assert.equal(via.body.usage.prompt_tokens, direct.body.usage.prompt_tokens);
    assert.equal(via.body.usage.completion_tokens, direct.body.usage.completion_tokens);
  },
);

serverTest(
  "streaming through the gateway gives the same chunks as direct, with one id and our model",
  async () => {
    const body = { messages: user, ...deterministic, stream_options: { include_usage: true } };
    const direct = await streamEvents(`${u1.url}/v1/chat/completions`, UP_KEY, {
      ...body,
      model: "vserve/tiny-chat",
    });
    const via = await streamEvents(chatUrl, KEY, { ...body, model: "gw/chat" });
    const shape = (events: Json[]) =>
      events.map((e) =>
        e === "[DONE]" ? e : {
          choices: e.choices.map((c: Json) => ({ delta: c.delta, finish_reason: c.finish_reason })),
          usage: e.usage && { prompt: e.usage.prompt_tokens, completion: e.usage.completion_tokens },
        }
      );
    assert.deepEqual(shape(via), shape(direct));
    assert.equal(via.at(-1), "[DONE]");
    const chunks = via.slice(0, -1);
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one id for the whole stream");
    assert.ok(chunks.every((c) => c.model === "gw/chat"));
    assert.equal(chunks[0].choices[0].delta.role, "assistant", "the role comes first");
  },
);

serverTest("reasoning from an upstream is returned as both reasoning_content and reasoning", async () => {
  const events = await streamEvents(chatUrl, KEY, { model: "gw/think", messages: user });
  const delta = events.find((e) => e !== "[DONE]" && e.choices[0]?.delta.reasoning)?.choices[0].delta;
  assert.deepEqual(delta, { reasoning_content: "Let me think.", reasoning: "Let me think." });
  const whole = await post({ model: "gw/think", messages: user });
  assert.equal(whole.body.choices[0].message.reasoning_content, "Let me think.");
  assert.equal(whole.body.choices[0].message.reasoning, "Let me think.");
  assert.equal(whole.body.choices[0].message.content, "Hello world");
});

serverTest("embeddings through the gateway equal direct ones, for dimensions and base64", async () => {
  const input = ["hello", "hola"];
  const url = `${gw.url}/v1/embeddings`;
  for (const dimensions of [undefined, 32]) {
    const direct = await postJson(`${u1.url}/v1/embeddings`, {
      model: "vserve/tiny-embed",
      input,
      dimensions,
    }, UP_KEY);
    const via = await postJson(url, { model: "gw/embed", input, dimensions }, KEY);
    const via64 = await postJson(
      url,
      { model: "gw/embed", input, dimensions, encoding_format: "base64" },
      KEY,
    );
    assert.equal(via.status, 200, JSON.stringify(via.body));
    assert.equal(via.body.model, "gw/embed");
    assert.deepEqual(via.body.usage, direct.body.usage);
    for (const i of [0, 1]) {
      const want: number[] = direct.body.data[i].embedding;
      const got: number[] = via.body.data[i].embedding;
      assert.equal(got.length, dimensions ?? want.length);
      got.forEach((x, k) => assert.ok(Math.abs(x - want[k]) < 1e-6, `component ${k}`));
      assert.deepEqual([...base64ToFloat32(via64.body.data[i].embedding)], got);
    }
  }
});

serverTest("dimensions and base64 behave the same against an upstream that ignores dimensions", async () => {
  const url = `${gw.url}/v1/embeddings`;
  s1.requests.length = 0;
  const res = await postJson(url, { model: "gw/embed-ignore", input: ["a", "b"], dimensions: 32 }, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  for (const i of [0, 1]) {
    const v: number[] = res.body.data[i].embedding;
    assert.equal(v.length, 32);
    const want = truncateAndNormalize(Float32Array.from(standInVector(i)), 32);
    v.forEach((x, k) => assert.ok(Math.abs(x - want[k]) < 1e-6));
    assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5, "unit length");
  }
  assert.equal(s1.requests.at(-1)!.body.dimensions, undefined, "the full vector is asked for");
  const b64 = await postJson(url, {
    model: "gw/embed-ignore",
    input: "a",
    dimensions: 48,
    encoding_format: "base64",
  }, KEY);
  const decoded = base64ToFloat32(b64.body.data[0].embedding);
  assert.equal(decoded.length, 48);
  assert.ok(Math.abs(Math.hypot(...decoded) - 1) < 1e-5);
  const full = await postJson(url, { model: "gw/embed-ignore", input: "a" }, KEY);
  assert.equal(full.body.data[0].embedding.length, 64, "the native size, normalised");
  assert.ok(Math.abs(Math.hypot(...full.body.data[0].embedding) - 1) < 1e-5);
  assertApiError(await postJson(url, { model: "gw/embed-ignore", input: "a", dimensions: 65 }, KEY), 400, {
    param: "dimensions",
  });
  assertApiError(await postJson(url, { model: "gw/embed-ignore", input: "a", dimensions: 16 }, KEY), 400, {
    param: "dimensions",
  });
  assertApiError(await postJson(url, { model: "gw/embed-ignore", input: ["a", ""] }, KEY), 400, {
    param: "input[1]",
  });
});

// ---- errors ----

serverTest("an upstream 5xx is a 502 that names neither the upstream nor its details", async () => {
  const res = await post({ model: "gw/fail", messages: user });
  assertApiError(res, 502, { type: "server_error", code: "upstream_error" });
  const text = JSON.stringify(res.body);
  for (const secret of [String(s1.port), "127.0.0.1", "gpu-node", "CUDA", "fail500", "upstream-0"]) {
    assert.ok(!text.includes(secret), `the body does not mention ${secret}: ${text}`);
  }
  assert.ok(
    gw.logs.some((l) =>
      l.includes('"model":"gw/fail"') && l.includes(`127.0.0.1:${s1.port}`) && l.includes("CUDA")
    ),
    "the log names the upstream and its answer",
  );
});

serverTest("upstream error bodies of any shape become OpenAI errors with our model id", async () => {
  const vllm = await post({ model: "gw/vllm400", messages: user });
  assertApiError(vllm, 400, { type: "invalid_request_error", code: "context_length_exceeded" });
  assert.match(vllm.body.error.message, /maximum context length is 10 tokens/);
  assert.ok(!/(?<!gw\/)vllm400/.test(vllm.body.error.message), "the upstream's model name is replaced");
  assert.ok(vllm.body.error.message.includes("gw/vllm400"));
  assertApiError(await post({ model: "gw/tei413", messages: user }), 413, { type: "invalid_request_error" });
  assertApiError(await post({ model: "gw/fastapi422", messages: user }), 400, { param: "messages[0].role" });
  const text = await post({ model: "gw/text400", messages: user });
  assertApiError(text, 400);
  assert.match(text.body.error.message, /bad things happened/);
  const busy = await post({ model: "gw/busy", messages: user });
  assertApiError(busy, 429, { type: "rate_limit_error", code: "upstream_busy" });
  assert.equal(busy.headers.get("retry-after"), "7");
  // The streaming form fails before its first byte: a plain HTTP error too.
  const res = await fetch(chatUrl, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: "gw/vllm400", messages: user, stream: true }),
  });
  assert.equal(res.status, 400);
  await res.body?.cancel();
});

serverTest("a request that fails before its first byte is retried once on another upstream", async () => {
  s1.requests.length = 0;
  const before = (await metrics()).counter("vserve_upstream_retries_total", { model: "gw/retry" });
  const results = [
    await post({ model: "gw/retry", messages: user }),
    await post({ model: "gw/retry", messages: user }),
  ];
  for (const r of results) assert.equal(r.status, 200, JSON.stringify(r.body));
  const streamed = await streamEvents(chatUrl, KEY, { model: "gw/retry", messages: user });
  assert.equal(streamed.at(-1), "[DONE]");
  assert.ok(!streamed.some((e) => e.error), "no error event");
  const hung = s1.requests.filter((r) => r.model === "hang");
  assert.ok(hung.length >= 2, `the hanging upstream was tried (${hung.length})`);
  await poll("the hanging requests were aborted", () => hung.every((r) => r.aborted));
  const after = (await metrics()).counter("vserve_upstream_retries_total", { model: "gw/retry" });
  assert.ok(after - before >= 2, `retries counted: ${before} → ${after}`);
});

serverTest(
  "an upstream that takes no TCP connection within connectTimeoutMs fails before its first byte: retried elsewhere, or 502 at once",
  async () => {
    const silentFailures = async (model: string) =>
      (await metrics()).counter("vserve_upstream_requests_total", {
        model,
        upstream: "silent",
        outcome: "failed",
      });
    const before = await silentFailures("gw/noconnect");
    // The connect timeout (300 ms) gives the upstream up, not the 30 s first-byte limit: the log
    // names the cause (how long it takes is the benchmark's business).
    const gaveUp = (model: string) =>
      gw.logs.filter((l) =>
        l.includes(`"model":"${model}"`) && l.includes('"upstream":"silent"') &&
        l.includes("(connect timeout)")
      );
    for (const stream of [false, true]) {
      if (stream) {
        const events = await streamEvents(chatUrl, KEY, { model: "gw/noconnect", messages: user });
        assert.equal(events.at(-1), "[DONE]");
        assert.ok(!events.some((e) => e.error), "no error event");
      } else {
        const r = await post({ model: "gw/noconnect", messages: user });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(r.body.choices[0].message.content, "Hello world");
      }
    }
    assert.ok(await silentFailures("gw/noconnect") - before >= 2, "the silent upstream was tried first");
    assert.ok(
      gaveUp("gw/noconnect").filter((l) => l.includes('"retry_on":"answers"')).length >= 2,
      "the log says why it was given up, and where the request went",
    );

    const alone = await post({ model: "gw/noconnect-only", messages: user });
    assertApiError(alone, 502, { type: "server_error", code: "upstream_error" });
    assert.ok(!JSON.stringify(alone.body).includes(String(hole.port)), "the body does not name the upstream");
    assert.ok(
      gaveUp("gw/noconnect-only").length >= 1,
      gw.logs.filter((l) => l.includes("noconnect-only")).join("\n"),
    );
  },
);

serverTest("a failure after the first byte ends the stream with an error event and [DONE]", async () => {
  const events = await streamEvents(chatUrl, KEY, { model: "gw/cut", messages: user });
  assert.equal(events.at(-1), "[DONE]");
  const error = events.at(-2);
  assert.equal(error.error.code, "upstream_error");
  assert.equal(error.error.type, "server_error");
  assert.equal(events[0].choices[0].delta.role, "assistant");
  assert.ok(events.some((e) => e.choices?.[0]?.delta.content === "Hello"), "what came before is kept");
  // Without streaming nothing was sent yet: a plain 502 (after the one retry, here on the same pool).
  assertApiError(await post({ model: "gw/cut", messages: user }), 502, { code: "upstream_error" });
});

serverTest("a client disconnect cancels the upstream request at once", async () => {
  s1.requests.length = 0;
  const controller = new AbortController();
  const res = await fetch(chatUrl, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: "gw/slow", messages: user, stream: true }),
    signal: controller.signal,
  });
  const reader = res.body!.getReader();
  for (let got = 0; got < 3;) if ((await reader.read()).value) got++;
  controller.abort();
  await reader.cancel().catch(() => {});
  await poll("the upstream saw the stream's abort", () => s1.requests.at(-1)?.aborted === true);

  const again = new AbortController();
  const pending = fetch(chatUrl, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: "gw/slow", messages: user }),
    signal: again.signal,
  }).catch(() => null);
  await poll("the upstream got the request", () => s1.requests.length === 2);
  again.abort();
  await pending;
  await poll("the upstream saw the non-streamed request's abort", () => s1.requests[1].aborted);
  await poll(
    "the in-flight gauge is back to 0",
    async () => (await metrics()).value("vserve_upstream_in_flight", { model: "gw/slow" }) === 0,
  );
});

// ---- routing ----

serverTest("legacy completions with a long shared prompt start keep to one upstream", async () => {
  s1.requests.length = 0;
  s2.requests.length = 0;
  const prompts = Array.from({ length: 7 }, (_, i) => `Document ${i}. ${"Few-shot example. ".repeat(20)}`);
  for (let turn = 0; turn < 3; turn++) {
    for (const prompt of prompts) {
      // The stand-ins have no /v1/completions: each answer is a 400, but where it went is recorded.
      const r = await postJson(`${gw.url}/v1/completions`, { model: "gw/affinity", prompt }, KEY);
      assert.equal(r.status, 400);
    }
  }
  const where = prompts.map((p) =>
    [s1, s2].map((s) => s.requests.filter((r) => r.body.prompt === p).length).join("/")
  );
  assert.ok(where.every((w) => w === "3/0" || w === "0/3"), where.join(" "));
  assert.ok(where.includes("3/0") && where.includes("0/3"), `different prompts spread: ${where.join(" ")}`);
});

serverTest("least-outstanding routing spreads concurrent requests evenly", async () => {
  s1.requests.length = 0;
  s2.requests.length = 0;
  const results = await Promise.all(
    Array.from({ length: 10 }, () => post({ model: "gw/spread", messages: user })),
  );
  assert.deepEqual(results.map((r) => r.status), Array(10).fill(200));
  const spread = [s1, s2].map((s) => s.requests.filter((r) => r.model === "delay").length);
  console.log(`least-outstanding spread of 10 concurrent requests over 2 upstreams: ${spread.join(" / ")}`);
  assert.ok(Math.abs(spread[0] - spread[1]) <= 1, `spread ${spread}`);
});

serverTest("prefix affinity keeps each conversation on one upstream and spreads different ones", async () => {
  s1.requests.length = 0;
  s2.requests.length = 0;
  const conversations = 12;
  for (let turn = 0; turn < 3; turn++) {
    for (let c = 0; c < conversations; c++) {
      const messages: Json[] = [{
        role: "system",
        content: `Conversation ${c}. ${"You are a helpful agent. ".repeat(10)}`,
      }];
      for (let t = 0; t <= turn; t++) {
        messages.push({ role: "user", content: `question ${t}` });
        if (t < turn) messages.push({ role: "assistant", content: "Hello world" });
      }
      assert.equal((await post({ model: "gw/affinity", messages })).status, 200);
    }
  }
  const where = new Map<string, Set<number>>();
  [s1, s2].forEach((s, i) => {
    for (const r of s.requests) {
      const key = r.body.messages[0].content.split(".")[0];
      where.set(key, (where.get(key) ?? new Set()).add(i));
    }
  });
  assert.equal(where.size, conversations);
  for (const [key, upstreams] of where) assert.equal(upstreams.size, 1, `${key} stayed on one upstream`);
  const perUpstream = [0, 1].map((i) => [...where.values()].filter((s) => s.has(i)).length);
  console.log(
    `prefix affinity: ${conversations} conversations × 3 turns → ${perUpstream.join(" / ")} conversations`,
  );
  assert.ok(perUpstream.every((n) => n > 0), `different conversations spread: ${perUpstream}`);
});

serverTest(
  "an upstream that fails in a row is ejected, probed after its back-off, and comes back",
  async () => {
    await s3.stop();
    for (let i = 0; i < 6; i++) {
      const r = await post({ model: "gw/eject", messages: user });
      assert.equal(r.status, 200, "retried on the steady upstream");
    }
    assert.equal(await upstreamState("gw/eject", "flaky"), "ejected");
    const text = await metrics();
    assert.ok(text.counter("vserve_upstream_ejections_total", { model: "gw/eject", upstream: "flaky" }) >= 1);
    assert.equal(text.value("vserve_upstream_state", { model: "gw/eject", upstream: "flaky" }), -2);
    assert.ok(
      gw.logs.some((l) => l.includes('"msg":"upstream ejected"') && l.includes('"upstream":"flaky"')),
    );
    s3.requests.length = 0;
    s3.restart();
    await poll(
      "the flaky upstream is back",
      async () => await upstreamState("gw/eject", "flaky") === "healthy",
    );
    for (let i = 0; i < 4; i++) {
      assert.equal((await post({ model: "gw/eject", messages: user })).status, 200);
    }
    assert.ok(s3.requests.length > 0, "it takes requests again");
  },
);

serverTest(
  "a failing health check takes an upstream out; /health/ready, /v1/models and /metrics say so",
  async () => {
    s4.healthy = false;
    try {
      await poll(
        "the upstream is unhealthy",
        async () => await upstreamState("gw/health", "checked") === "unhealthy",
      );
      const ready = await fetch(`${gw.url}/health/ready`);
      assert.equal(ready.status, 503);
      await ready.body?.cancel();
      const models =
        await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } })).json();
      const listed = models.data.find((m: Json) => m.id === "gw/health");
      assert.deepEqual(listed.upstreams, [{ name: "checked", state: "unhealthy" }]);
      assert.equal(listed.status, "unavailable", "not 'loaded' while no upstream can answer");
      const one = await (await fetch(`${gw.url}/v1/models/gw%2Fhealth`, {
        headers: { authorization: `Bearer ${KEY}` },
      })).json();
      assert.equal(one.status, "unavailable");
      assert.equal((await health()).models.find((m: Json) => m.id === "gw/health").status, "unavailable");
      assert.equal((await metrics()).value("vserve_upstream_state", { model: "gw/health" }), -1);
      assertApiError(await post({ model: "gw/health", messages: user }), 503, {
        code: "no_upstream_available",
      });
    } finally {
      s4.healthy = true;
    }
    await poll("ready again", async () => {
      const r = await fetch(`${gw.url}/health/ready`);
      await r.body?.cancel();
      return r.status === 200;
    });
    assert.equal((await post({ model: "gw/health", messages: user })).status, 200);
    assert.equal(await modelStatus("gw/health"), "loaded");
  },
);

serverTest(
  "an ejected upstream whose health check passes is readmitted on trial at once, not after its back-off",
  async () => {
    const ejections = async () =>
      (await metrics()).counter("vserve_upstream_ejections_total", { model: "gw/readmit", upstream: "back" });
    const served = () => s5.requests.length;
    /** Posts (each answered, by the spare if need be) until `done` holds; at most `max` requests. */
    const postUntil = async (what: string, done: () => Promise<boolean> | boolean, max = 10) => {
      for (let i = 0; !(await done()); i++) {
        if (i === max) throw new Error(`${max} requests and still not ${what}`);
        const r = await post({ model: "gw/readmit", messages: user });
        assert.equal(r.status, 200, JSON.stringify(r.body));
      }
    };
    const start = await ejections();
    s5.failing = true;
    try {
      await postUntil("ejected", async () => await ejections() === start + 1);
      // Its health check passes: readmitted long before the 600 s back-off ends.
      await poll("readmitted", async () => await upstreamState("gw/readmit", "back") === "healthy");
      // On trial: the first request it takes fails, and it is ejected again at once.
      const before = served();
      await postUntil("ejected again", async () => await ejections() === start + 2);
      assert.equal(served(), before + 1, "one trial request");
      // Its checks pass while its requests fail: they no longer readmit it.
      const checks = s5.healthChecks;
      await poll("five more health checks", () => s5.healthChecks >= checks + 5);
      assert.equal(await upstreamState("gw/readmit", "back"), "ejected");
      assert.equal(await modelStatus("gw/readmit"), "degraded");
      for (let i = 0; i < 4; i++) {
        assert.equal((await post({ model: "gw/readmit", messages: user })).status, 200);
      }
      assert.equal(served(), before + 1, "no request reached it");
      // It goes down (a failing check) and comes back: its next passing check readmits it.
      s5.healthy = false;
      const down = s5.healthChecks;
      await poll("two failing health checks", () => s5.healthChecks >= down + 2);
    } finally {
      s5.failing = false;
      s5.healthy = true;
    }
    await poll("readmitted again", async () => await upstreamState("gw/readmit", "back") === "healthy");
    const okBefore = (await metrics()).counter("vserve_upstream_requests_total", {
      model: "gw/readmit",
      upstream: "back",
      outcome: "ok",
    });
    const before = served();
    await postUntil("served by it", () => served() > before);
    const okAfter = (await metrics()).counter("vserve_upstream_requests_total", {
      model: "gw/readmit",
      upstream: "back",
      outcome: "ok",
    });
    assert.equal(okAfter, okBefore + 1, "its trial request succeeded");
    assert.equal(await ejections(), start + 2, "and it stays in");
    assert.equal(await upstreamState("gw/readmit", "back"), "healthy");
    assert.equal(await modelStatus("gw/readmit"), "loaded");
    assert.ok(
      gw.logs.some((l) => l.includes("upstream readmitted on trial") && l.includes('"upstream":"back"')),
    );
    assert.ok(
      gw.logs.some((l) => l.includes("upstream passed its trial") && l.includes('"upstream":"back"')),
    );
  },
);

serverTest(
  "200 requests over 3 upstreams while one is killed and restarted: every one gets an answer",
  async () => {
    const total = 200;
    const outcomes: string[] = [];
    let next = 0;
    let killed = false;
    let restarting: Promise<void> | undefined;
    const one = async (i: number) => {
      const body = {
        model: "gw/fleet",
        messages: [{ role: "user", content: `request ${i}` }],
        max_tokens: 6,
      };
      if (i % 2 === 0) {
        const r = await postJson(chatUrl, body, KEY, {}, undefined);
        return r.status === 200 || r.status === 429
          ? String(r.status)
          : `bad ${r.status} ${JSON.stringify(r.body)}`;
      }
      const events = await streamEvents(chatUrl, KEY, body);
      if (events.at(-1) !== "[DONE]") return "stream without [DONE]";
      return events.some((e) => e.error) ? "error event" : "200";
    };
    const worker = async () => {
      while (next < total) {
        const i = next++;
        if (i === 40 && !killed) {
          killed = true;
          u2.signal("SIGKILL");
        }
        if (i === 110 && !restarting) {
          restarting = startServer([...u2Args, "--port", u2Port], { waitReady: true }).then((s) =>
            void (u2 = s)
          );
        }
        outcomes.push(await settles(`request ${i} was answered`, one(i)));
      }
    };
    await Promise.all(Array.from({ length: 12 }, worker));
    await restarting;
    const counts = Object.fromEntries(
      [...new Set(outcomes)].map((o) => [o, outcomes.filter((x) => x === o).length]),
    );
    assert.equal(outcomes.length, total);
    assert.ok(
      outcomes.every((o) => o === "200" || o === "429" || o === "error event"),
      JSON.stringify(counts),
    );
    assert.ok(
      gw.logs.some((l) =>
        /"upstream ejected"|"upstream health check failed"/.test(l) && l.includes('"upstream":"b"')
      ),
      "the killed upstream was taken out",
    );
    await poll(
      "the killed upstream is back",
      async () => await upstreamState("gw/fleet", "b") === "healthy",
    );
    const before = (await metrics()).counter("vserve_upstream_requests_total", {
      model: "gw/fleet",
      upstream: "b",
      outcome: "ok",
    });
    await Promise.all(
      Array.from(
        { length: 9 },
        (_, i) => post({ model: "gw/fleet", messages: user, max_tokens: 4, seed: i }),
      ),
    );
    const text = await metrics();
    const after = text.counter("vserve_upstream_requests_total", {
      model: "gw/fleet",
      upstream: "b",
      outcome: "ok",
    });
    assert.ok(after > before, "the restarted upstream serves again");
    const spread = ["a", "b", "c"].map((u) =>
      `${u}: ${
        text.counter("vserve_upstream_requests_total", { model: "gw/fleet", upstream: u, outcome: "ok" })
      } ok, ${
        text.counter("vserve_upstream_requests_total", { model: "gw/fleet", upstream: u, outcome: "failed" })
      } failed`
    );
    console.log(`kill/restart run: ${JSON.stringify(counts)}; per upstream: ${spread.join("; ")}`);
  },
);

// ---- operations and the rest of the surface ----

serverTest("/v1/models and /metrics report each upstream", async () => {
  const models = await (await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } }))
    .json();
  const chat = models.data.find((m: Json) => m.id === "gw/chat");
  assert.deepEqual(chat.upstreams, [{ name: "vserve-1", state: "healthy" }]);
  const h = await health();
  const entry = h.models.find((m: Json) => m.id === "gw/chat");
  assert.equal(entry.backend, "openai");
  assert.deepEqual(entry.upstreams, [{ name: "vserve-1", state: "healthy", in_flight: 0, failures: 0 }]);
  const text = await metrics();
  assert.ok(
    text.counter("vserve_upstream_requests_total", {
      model: "gw/chat",
      upstream: "vserve-1",
      outcome: "ok",
    }) >= 2,
  );
  const series = { model: "gw/chat", upstream: "vserve-1" };
  assert.notEqual(
    text.find("vserve_upstream_first_byte_seconds_bucket", { ...series, le: "0.5" }),
    undefined,
  );
  assert.ok(text.value("vserve_upstream_request_duration_seconds_count", series) >= 2);
  assert.equal(text.value("vserve_upstream_in_flight", series), 0);
  assert.ok(!text.text.includes(u1.url), "no upstream URL in the metrics");
});

serverTest(
  "the upstream gets our request id, its own model name, and the gateway's rules apply first",
  async () => {
    s1.requests.length = 0;
    await post({ model: "gw/think", messages: user }, { "x-request-id": "trace-123" });
    assert.equal(s1.requests.at(-1)!.headers.get("x-request-id"), "trace-123");
    assert.equal(s1.requests.at(-1)!.model, "think");
    assertApiError(await postJson(chatUrl, { model: "gw/think", messages: user }, null), 401);
    assertApiError(await post({ model: "gw/think", messages: [] }), 400, { param: "messages" });
    assertApiError(await post({ model: "gw/think", messages: user, temperature: 9 }), 400, {
      param: "temperature",
    });
    assert.equal(s1.requests.length, 1, "invalid requests never reach the upstream");
  },
);

serverTest(
  "tokenize and detokenize answer 400 unsupported_for_upstream_model for a model served by upstreams",
  async () => {
    for (const model of ["gw/chat", "gw/embed"]) {
      const tok = await postJson(`${gw.url}/tokenize`, { model, content: "hi" }, KEY);
      assertApiError(tok, 400, { code: "unsupported_for_upstream_model", param: "model" });
      assert.match(tok.body.error.message, /\/tokenize is not available/);
      for (const path of ["/detokenize", "/v1/detokenize"]) {
        const detok = await postJson(`${gw.url}${path}`, { model, tokens: [1, 2, 3] }, KEY);
        assertApiError(detok, 400, { code: "unsupported_for_upstream_model", param: "model" });
        assert.match(detok.body.error.message, /\/detokenize is not available/);
        assert.doesNotMatch(detok.body.error.message, /0\.\.-1/);
      }
    }
  },
);

// ---- legacy completions: relayed to the upstream's /v1/completions ----

serverTest("legacy completions through the gateway equal direct ones, under our id and model", async () => {
  const url = `${gw.url}/v1/completions`;
  const directUrl = `${u1.url}/v1/completions`;
  const cases = [
    { prompt: "Once upon a time", max_tokens: 8, temperature: 0, cache_prompt: false },
    { prompt: [1, 2, 3, 4], max_tokens: 4, temperature: 0, cache_prompt: false },
    { prompt: ["One", "Two"], n: 2, max_tokens: 4, temperature: 0, seed: 3, cache_prompt: false },
    { prompt: "Echo me", echo: true, logprobs: 2, max_tokens: 3, temperature: 0, cache_prompt: false },
  ];
  for (const c of cases) {
    const direct = await postJson(directUrl, { ...c, model: "vserve/tiny-chat" }, UP_KEY);
    const via = await postJson(url, { ...c, model: "gw/chat" }, KEY);
    assert.equal(direct.status, 200, JSON.stringify(direct.body));
    assert.equal(via.status, 200, JSON.stringify(via.body));
    assert.equal(via.body.object, "text_completion");
    assert.equal(via.body.model, "gw/chat");
    assert.match(via.body.id, /^cmpl-/);
    assert.notEqual(via.body.id, direct.body.id);
    assert.equal(via.body.system_fingerprint, direct.body.system_fingerprint);
    assert.deepEqual(via.body.choices, direct.body.choices, JSON.stringify(c));
    assert.equal(via.body.usage.prompt_tokens, direct.body.usage.prompt_tokens);
    assert.equal(via.body.usage.completion_tokens, direct.body.usage.completion_tokens);
  }
  // A token id beyond the vocabulary: the upstream's own range check, with its real range.
  const bad = await postJson(url, { model: "gw/chat", prompt: [1, 99_999_999], max_tokens: 2 }, KEY);
  assertApiError(bad, 400, { type: "invalid_request_error" });
  assert.match(bad.body.error.message, /99999999/);
  assert.doesNotMatch(bad.body.error.message, /0\.\.-1/);
  // The gateway's own checks come first.
  assertApiError(await postJson(url, { model: "gw/chat", prompt: "" }, KEY), 400, { param: "prompt" });
  assertApiError(await postJson(url, { model: "gw/chat", prompt: "x", n: 2, best_of: 3 }, KEY), 400, {
    param: "best_of",
  });
  const streamBody = { prompt: "Once upon a time", max_tokens: 8, temperature: 0, cache_prompt: false };
  const direct = await streamEvents(directUrl, UP_KEY, {
    ...streamBody,
    model: "vserve/tiny-chat",
    stream_options: { include_usage: true },
  });
  const via = await streamEvents(url, KEY, {
    ...streamBody,
    model: "gw/chat",
    stream_options: { include_usage: true },
  });
  const shape = (events: Json[]) =>
    events.map((e) =>
      e === "[DONE]" ? e : {
        choices: e.choices.map((c: Json) => ({ text: c.text, index: c.index, finish: c.finish_reason })),
        usage: e.usage && { prompt: e.usage.prompt_tokens, completion: e.usage.completion_tokens },
      }
    );
  assert.deepEqual(shape(via), shape(direct));
  const chunks = via.slice(0, -1);
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one id for the whole stream");
  assert.ok(chunks.every((c) => c.model === "gw/chat" && c.object === "text_completion"));
  const plain = await streamEvents(url, KEY, { ...streamBody, model: "gw/chat" });
  assert.ok(plain.slice(0, -1).every((c) => c.usage === undefined), "usage only when asked for");
});

serverTest(
  "legacy completions to upstreams that do not serve them: 400 unsupported_for_upstream_model, the upstream not failed",
  async () => {
    const count = async (outcome: string) =>
      (await metrics()).counter("vserve_upstream_requests_total", { model: "gw/think", outcome });
    const [failed, rejected] = [await count("failed"), await count("rejected")];
    for (const stream of [false, true]) {
      const res = await postJson(`${gw.url}/v1/completions`, {
        model: "gw/think",
        prompt: "hi",
        stream,
        repeat_penalty: 1.1,
      }, KEY);
      assertApiError(res, 400, { code: "unsupported_for_upstream_model", param: "model" });
      assert.match(res.body.error.message, /do not offer legacy completions/);
      assert.doesNotMatch(res.body.error.message, /tokenize/);
      const sent = s1.requests.at(-1)!;
      assert.equal(sent.path, "/v1/completions");
      assert.deepEqual(
        [sent.model, sent.body.prompt, sent.body.stream, sent.body.stream_options],
        ["think", "hi", true, { include_usage: true }],
        "always streamed from the upstream, with usage",
      );
      assert.deepEqual([sent.body.repeat_penalty, sent.body.repetition_penalty], [1.1, 1.1]);
    }
    assert.equal(await count("failed"), failed, "not counted as a failure (no ejection)");
    assert.equal(await count("rejected"), rejected + 2);
    assert.equal(await upstreamState("gw/think", "upstream-0"), "healthy");
  },
);

// ---- what the gateway passes through and measures ----

serverTest("the upstream's system_fingerprint is passed through, streamed and not", async () => {
  const whole = await post({ model: "gw/think", messages: user });
  assert.equal(whole.body.system_fingerprint, "fp_standin");
  const events = await streamEvents(chatUrl, KEY, {
    model: "gw/think",
    messages: user,
    stream_options: { include_usage: true },
  });
  const chunks = events.slice(0, -1).filter((e) => e.choices.length > 0);
  assert.ok(chunks.length >= 3);
  assert.ok(chunks.every((c) => c.system_fingerprint === "fp_standin"), JSON.stringify(chunks[0]));
});

serverTest(
  "the access log's queue_wait_ms ends when the request is sent upstream, not when the answer comes",
  async () => {
    for (const stream of [false, true]) {
      const id = `queue-wait-${stream}`;
      const res = await fetch(chatUrl, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-request-id": id },
        body: JSON.stringify({ model: "gw/delay", messages: user, stream }),
      });
      assert.equal(res.status, 200);
      await res.text();
      const held = s1.requests.findLast((r) => r.headers.get("x-request-id") === id)!.heldMs!;
      let line: Json;
      await poll("the access log line", () => {
        const text = gw.logs.find((l) => l.includes('"msg":"request"') && l.includes(`"request_id":"${id}"`));
        line = text && JSON.parse(text);
        return line !== undefined;
      });
      // The upstream held its answer for `held` ms after it got the request: the wait before sending
      // ended before that, so it fits in the request's time without the hold (whatever the machine's speed).
      assert.equal(typeof line.queue_wait_ms, "number");
      assert.ok(
        line.queue_wait_ms <= line.ms - held + 0.02,
        `queue_wait_ms ${line.queue_wait_ms}, request ${line.ms} ms, upstream hold ${held.toFixed(2)} ms`,
      );
    }
  },
);

serverTest(
  "a stream that stalls mid-way ends after streamIdleTimeoutMs: error event and [DONE], upstream aborted, failure counted",
  async () => {
    const failed = async () =>
      (await metrics()).counter("vserve_upstream_requests_total", {
        model: "gw/stall",
        upstream: "stalls",
        outcome: "failed",
      });
    const before = await failed();
    s1.requests.length = 0;
    const events = await streamEvents(chatUrl, KEY, { model: "gw/stall", messages: user });
    assert.equal(events[0].choices[0].delta.role, "assistant");
    assert.ok(events.some((e) => e.choices?.[0]?.delta.content === "Hello"), "what came before is kept");
    assert.equal(events.at(-1), "[DONE]");
    const error = events.at(-2);
    assert.equal(error.error.code, "upstream_timeout");
    assert.equal(error.error.type, "timeout_error");
    await poll("the upstream saw the abort", () => s1.requests[0]?.aborted === true);
    assert.equal(await failed(), before + 1, "counted as a failed request");
    assert.ok(
      gw.logs.some((l) => l.includes('"model":"gw/stall"') && l.includes("stream idle timeout")),
      "the log says why",
    );
    // Without streaming the client has nothing yet: a plain 504.
    assertApiError(await post({ model: "gw/stall", messages: user }), 504, { code: "upstream_timeout" });
    await poll("the second upstream request was aborted", () => s1.requests[1]?.aborted === true);
    assert.equal(await failed(), before + 2);
  },
);

serverTest("SIGTERM lets an upstream stream finish", async () => {
  const registry = await writeJsonFile({
    models: [{
      id: "gw/slowish",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: s1.url, model: "slowish" }],
    }],
  });
  const own = await startServer(["--models", registry], { waitReady: true });
  try {
    const res = await fetch(`${own.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "gw/slowish", messages: user, stream: true }),
    });
    const reader = res.body!.getReader();
    await reader.read();
    own.signal("SIGTERM");
    let text = "";
    const dec = new TextDecoder();
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += dec.decode(r.value);
    assert.ok(text.trimEnd().endsWith("data: [DONE]"));
    assert.ok(!text.includes('"error"'), "the stream finished normally");
    assert.ok(text.includes('"20 "'), "every chunk arrived");
    assert.equal(await own.exited, 0);
  } finally {
    await own.stop();
  }
});
