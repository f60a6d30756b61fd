/**
 * Production operation through real server processes: readiness, metrics, backpressure,
 * time limits, graceful shutdown, and a reliability drill of adversarial requests.
 */
import assert from "node:assert/strict";
import { type Json, postJson, startServer, type TestServer, writeJsonFile } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { startStandIn } from "./helpers/standin.ts";
import { poll } from "./helpers/poll.ts";
import { eventData, SseReader } from "./helpers/sse.ts";
import { scrapeMetrics } from "./helpers/metrics.ts";

const KEY = "test-key";
const CHAT = "Vendor/Vendor3.6-35B-A3B";
const EMBED = "Vendor/Vendor3-Embedding-8B";
const auth = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
const user = [{ role: "user", content: "Go on" }];
/** The chat models' end tokens banned: a generation runs to its max_tokens. */
const NO_END = { "151643": -100, "151645": -100 };

async function withServer(args: string[], fn: (s: TestServer) => Promise<void>, waitReady = true) {
  const server = await startServer(["--api-key", KEY, ...args], { waitReady });
  try {
    await fn(server);
  } finally {
    await server.stop();
  }
}

serverTest("readiness is 503 while models load, /v1 answers 503 with Retry-After, then 200", async () => {
  // A model that stays loading until the test lets it: its upstream holds the load's health check.
  const upstream = startStandIn();
  const release = upstream.holdHealth();
  const registry = await writeJsonFile({
    models: [{
      id: "gated",
      kind: "chat",
      backend: "openai",
      upstreams: [{ url: upstream.url, model: "ok" }],
      routing: { healthTimeoutMs: 600_000 },
    }],
  });
  try {
    await withServer(["--models", registry], async (server) => {
      // (Released at the end whatever happens: a server stopped while it loads waits for the load.)
      using _ = { [Symbol.dispose]: release };
      const early = await fetch(`${server.url}/health/ready`);
      assert.equal(early.status, 503);
      assert.equal((await early.json()).ready, false);
      const live = await fetch(`${server.url}/health`);
      await live.body?.cancel();
      assert.equal(live.status, 200, "liveness is 200 while loading");
      const chat = await postJson(
        `${server.url}/v1/chat/completions`,
        { model: "gated", messages: user },
        KEY,
      );
      assertApiError(chat, 503, { code: "model_loading" });
      assert.ok(Number(chat.headers.get("retry-after")) > 0);
      release();
      const ready = await poll("the model loaded", async () => {
        const res = await fetch(`${server.url}/health/ready`);
        const body = await res.json();
        return res.status === 200 && body;
      });
      assert.equal(ready.ready, true);
      const served = await postJson(
        `${server.url}/v1/chat/completions`,
        { model: "gated", messages: user },
        KEY,
      );
      assert.equal(served.status, 200, JSON.stringify(served.body));
    }, false);
  } finally {
    release();
    await upstream.stop();
    await Deno.remove(registry);
  }
});

serverTest("a model that fails to load is reported in /health with its reason, and answers 503", async () => {
  const registry = await Deno.makeTempFile({ suffix: ".json" });
  const bad = await Deno.makeTempFile({ suffix: ".gguf" });
  await Deno.writeTextFile(bad, "not a gguf file");
  await Deno.writeTextFile(
    registry,
    JSON.stringify({ models: [{ id: "broken", kind: "chat", source: bad }] }),
  );
  await withServer(["--models", registry], async (server) => {
    const health: Json = await poll("the load ended", async () => {
      const h = await (await fetch(`${server.url}/health`)).json();
      return h.models[0].status !== "loading" && h;
    });
    assert.equal(health.models[0].status, "failed");
    assert.ok(health.models[0].error.length > 0);
    assert.ok(
      !health.models[0].error.includes(bad.slice(0, bad.lastIndexOf("/"))),
      "no directory in /health",
    );
    const res = await postJson(`${server.url}/v1/chat/completions`, { model: "broken", messages: user }, KEY);
    assertApiError(res, 503, { code: "model_failed" });
    assert.ok(!res.body.error.message.includes(bad), "no file path in the error body");
    assert.ok(server.logs.some((l) => l.includes('"msg":"model failed to load"')));
  }, false);
  await Deno.remove(registry);
  await Deno.remove(bad);
});

serverTest("/metrics exposes requests, latency, tokens, queue, slots, load state and memory", async () => {
  await withServer([], async (server) => {
    await postJson(`${server.url}/v1/embeddings`, { model: EMBED, input: "metrics" }, KEY);
    await postJson(`${server.url}/v1/chat/completions`, { model: CHAT, messages: user, max_tokens: 3 }, KEY);
    await postJson(`${server.url}/v1/embeddings`, { model: EMBED, input: "", dimensions: 1 }, KEY);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (
      const line of [
        'route="/v1/embeddings",status="200"} 1',
        'route="/v1/embeddings",status="400"} 1',
        'route="/v1/chat/completions",status="200"} 1',
        `vserve_completion_tokens_total{model="${CHAT}"} 3`,
        `vserve_model_state{model="${CHAT}"} 1`,
        `vserve_queue_depth{model="${CHAT}"} 0`,
        `vserve_busy_slots{model="${EMBED}"} 0`,
      ]
    ) assert.ok(text.includes(line), `missing: ${line}`);
    for (
      const family of [
        "vserve_http_request_duration_seconds_bucket",
        "vserve_time_to_first_token_seconds_count",
        "vserve_prompt_tokens_total",
        "vserve_model_load_seconds",
        "vserve_process_resident_memory_bytes",
      ]
    ) assert.ok(text.includes(family), `missing family ${family}`);
    assert.match(text, /# TYPE vserve_http_request_duration_seconds histogram/);
  });
});

serverTest(
  "a flood beyond the queue: every request answered 200 or 429 with Retry-After, none lost",
  async () => {
    await withServer(["--parallel", "1", "--max-queue", "2"], async (server) => {
      const results = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          postJson(`${server.url}/v1/chat/completions`, {
            model: CHAT,
            messages: user,
            max_tokens: 24,
            seed: i,
          }, KEY)),
      );
      const ok = results.filter((r) => r.status === 200);
      const limited = results.filter((r) => r.status === 429);
      assert.equal(ok.length + limited.length, 12, `statuses: ${results.map((r) => r.status)}`);
      assert.ok(ok.length >= 3, "the running request and the queue are served");
      assert.ok(limited.length >= 1, "beyond the queue is refused");
      for (const r of limited) {
        assertApiError(r, 429, { type: "rate_limit_error", code: "queue_full" });
        assert.ok(Number(r.headers.get("retry-after")) >= 1);
      }
      const after = await postJson(`${server.url}/v1/chat/completions`, {
        model: CHAT,
        messages: user,
        max_tokens: 2,
      }, KEY);
      assert.equal(after.status, 200);
    });
  },
);

serverTest("the request time limit answers 504 and frees the slot", async () => {
  await withServer(["--parallel", "1", "--request-timeout-ms", "1500"], async (server) => {
    // The end tokens banned: 20,000 tokens cannot be done within the limit, on any machine.
    const slow = await postJson(`${server.url}/v1/chat/completions`, {
      model: CHAT,
      messages: user,
      max_tokens: 20000,
      logit_bias: NO_END,
    }, KEY);
    assertApiError(slow, 504, { type: "timeout_error", code: "timeout" });
    const next = await postJson(`${server.url}/v1/chat/completions`, {
      model: CHAT,
      messages: user,
      max_tokens: 2,
    }, KEY);
    assert.equal(next.status, 200);
  });
});

serverTest("SIGTERM during a stream: the stream completes, new requests are refused, exit 0", async () => {
  const server = await startServer(["--api-key", KEY, "--drain-timeout-ms", "600000"], { waitReady: true });
  const stream = await SseReader.open(`${server.url}/v1/chat/completions`, {
    model: CHAT,
    messages: user,
    max_tokens: 400,
    seed: 1,
    logit_bias: NO_END,
  }, { key: KEY, headers: { "x-request-id": "drained" } });
  await stream.take(1);
  const exited = server.stop("SIGTERM");
  await poll("the server is draining", () => server.logs.some((l) => l.includes('"msg":"shutting down')));
  const refused = await fetch(`${server.url}/v1/models`, { headers: auth }).then(
    async (r) => (await r.body?.cancel(), r.status),
    () => "refused",
  );
  // 503 while a request still reads its body, else refused (the listener has closed).
  assert.ok(refused === 503 || refused === "refused", `new request during drain: ${refused}`);
  const data = eventData(await stream.rest());
  assert.equal(data.at(-1), "[DONE]");
  assert.equal(data.at(-2).choices[0].finish_reason, "length", "the stream ran to its end");
  assert.equal(await exited, 0);
  const drainAt = server.logs.findIndex((l) => l.includes('"msg":"shutting down'));
  const streamEnd = server.logs.findIndex((l) =>
    l.includes('"request_id":"drained"') && l.includes('"msg":"request"')
  );
  assert.ok(drainAt >= 0 && drainAt < streamEnd, "the stream was still running when the drain began");
});

serverTest(
  "SIGTERM while a request's body is still arriving: the request is answered, new ones get 503, exit 0",
  async () => {
    const server = await startServer(["--api-key", KEY], { waitReady: true });
    // Over the ~1 KB Deno reads with the headers: the handler runs, the rest of the body still to come.
    const body = new TextEncoder().encode(JSON.stringify({ model: EMBED, input: "x ".repeat(2000) }));
    const port = Number(new URL(server.url).port);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    const head = `POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${KEY}\r\n` +
      `content-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`;
    await conn.write(new TextEncoder().encode(head));
    await conn.write(body.subarray(0, 10));
    const inFlight = async () =>
      (await scrapeMetrics(server.url)).value("vserve_http_requests_in_flight") === 1;
    await poll("the request is in its handler", inFlight);
    server.signal("SIGTERM");
    await poll("the server is draining", () => server.logs.some((l) => l.includes('"msg":"shutting down')));
    // The listener is still open while that request is in flight: a newcomer is told why.
    const refused = await fetch(`${server.url}/v1/models`, { headers: auth });
    await refused.body?.cancel();
    assert.equal(refused.status, 503);
    await conn.write(body.subarray(10));
    const raw = new TextDecoder().decode(await new Response(conn.readable).arrayBuffer());
    assert.match(raw, /^HTTP\/1\.1 200 /, raw.slice(0, 300));
    const answer = JSON.parse(raw.slice(raw.indexOf("\r\n\r\n") + 4));
    assert.equal(answer.data[0].embedding.length > 0, true);
    assert.equal(await server.exited, 0);
  },
);

serverTest("SIGTERM past the drain time: streams end with an error event and [DONE], exit 0", async () => {
  const server = await startServer(["--api-key", KEY, "--drain-timeout-ms", "300"], { waitReady: true });
  // The end tokens banned: 30,000 tokens are not done within the drain time, on any machine.
  const stream = await SseReader.open(`${server.url}/v1/chat/completions`, {
    model: CHAT,
    messages: user,
    max_tokens: 30000,
    logit_bias: NO_END,
  }, { key: KEY });
  await stream.take(1);
  const code = await server.stop("SIGTERM");
  const data = eventData(await stream.rest());
  assert.equal(data.at(-1), "[DONE]");
  assert.equal(data.at(-2).error.code, "shutting_down");
  assert.equal(code, 0);
});

serverTest("20 streams cut mid-way: every slot freed, memory steady, normal requests succeed", async () => {
  await withServer(["--parallel", "4"], async (server) => {
    const rss = async () => (await scrapeMetrics(server.url)).value("vserve_process_resident_memory_bytes");
    const cut = async (seed: number) => {
      const stream = await SseReader.open(`${server.url}/v1/chat/completions`, {
        model: CHAT,
        messages: user,
        max_tokens: 5000,
        seed,
        logit_bias: NO_END,
      }, { key: KEY });
      await stream.take(3);
      await stream.cancel();
    };
    for (let round = 0; round < 5; round++) await Promise.all([0, 1, 2, 3].map((i) => cut(round * 4 + i)));
    const before = await rss();
    for (let round = 0; round < 5; round++) {
      await Promise.all([0, 1, 2, 3].map((i) => cut(100 + round * 4 + i)));
    }
    await poll("every cut stream freed its slot", async () => {
      const health = await (await fetch(`${server.url}/health`)).json();
      return health.models.every((m: Json) => m.in_flight === 0);
    });
    const ok = await Promise.all(
      [0, 1, 2, 3].map((seed) =>
        postJson(
          `${server.url}/v1/chat/completions`,
          { model: CHAT, messages: user, max_tokens: 3, seed },
          KEY,
        )
      ),
    );
    assert.deepEqual(ok.map((r) => r.status), [200, 200, 200, 200]);
    const grown = (await rss()) - before;
    assert.ok(
      grown < 64 * 1024 * 1024,
      `RSS grew by ${(grown / 1048576).toFixed(1)} MiB over 20 cut streams`,
    );
  });
});

/** At least 200 malformed or adversarial requests. */
function adversarialCases(): { path: string; body: BodyInit; contentType?: string }[] {
  const cases: { path: string; body: BodyInit; contentType?: string }[] = [];
  const chat = "/v1/chat/completions";
  const emb = "/v1/embeddings";
  const rawBodies = [
    "",
    " ",
    "{",
    "}",
    "[",
    "null",
    "true",
    "42",
    '"string"',
    "{'model': 'x'}",
    '{"model": "x",}',
    '{"model": NaN}',
    '{"model": Infinity}',
    '{"model": "x", "messages": [}',
    '{"a":1}{"b":2}',
    "\u0000\u0001\u0002",
    "[".repeat(100_000) + "]".repeat(100_000),
    '{"input":' + "[".repeat(50_000) + "]".repeat(50_000) + "}",
    '{"messages":' + '{"a":'.repeat(20_000) + "1" + "}".repeat(20_000) + "}",
  ];
  for (const body of rawBodies) for (const path of [chat, emb]) cases.push({ path, body });
  for (const path of [chat, emb]) {
    cases.push({ path, body: new Uint8Array([0x7b, 0x22, 0x6d, 0x22, 0x3a, 0x22, 0xc3, 0x28, 0x22, 0x7d]) });
    cases.push({ path, body: new Uint8Array([0xff, 0xfe, 0x7b, 0x7d]) });
    cases.push({ path, body: "{}", contentType: "text/plain" });
    cases.push({ path, body: "model=x", contentType: "application/x-www-form-urlencoded" });
  }
  const weird: unknown[] = [
    null,
    true,
    -1,
    0,
    1.5,
    1e308,
    -1e308,
    2 ** 64,
    "",
    "x".repeat(100_000),
    [],
    [null],
    {},
    { "$ref": "#" },
    "\u202e\u0000",
  ];
  const chatFields = [
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "stream",
    "stop",
    "n",
    "tools",
    "tool_choice",
    "response_format",
    "chat_template_kwargs",
    "stream_options",
    "seed",
  ];
  for (const field of chatFields) {
    for (const value of weird) {
      // null max_tokens is valid: it generates to the end of the context, which is slow, not adversarial.
      if (field === "max_tokens" && value === null) continue;
      const body: Record<string, unknown> = { model: CHAT, messages: user, max_tokens: 2, [field]: value };
      if (field === "messages" && Array.isArray(value) && value.length === 0) body.messages = [];
      cases.push({ path: chat, body: JSON.stringify(body) });
    }
  }
  for (const field of ["model", "input", "dimensions", "encoding_format", "truncate"]) {
    for (const value of weird) {
      cases.push({ path: emb, body: JSON.stringify({ model: EMBED, input: "x", [field]: value }) });
    }
  }
  const messages: unknown[] = [
    [{ role: "wizard", content: "x" }],
    [{ role: "user" }],
    [{ content: "x" }],
    [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://127.0.0.1/x.png" } }] }],
    [{ role: "user", content: [{ type: "text" }] }],
    [{ role: "tool", content: "x" }],
    [{ role: "assistant", tool_calls: [{ id: 1 }] }],
    [{
      role: "assistant",
      tool_calls: [{ id: "a", type: "function", function: { name: "f", arguments: "not json" } }],
    }],
    [{ role: "user", content: "x".repeat(1_000_000) }],
    ["just a string"],
    Array(5000).fill({ role: "user", content: "" }).concat([{ role: "bad" }]),
  ];
  for (const m of messages) {
    cases.push({ path: chat, body: JSON.stringify({ model: CHAT, messages: m, max_tokens: 2 }) });
  }
  const inputs: unknown[] = [
    [[]],
    [[-1]],
    [[1.5]],
    [[2 ** 40]],
    ["ok", null],
    [["a"]],
    Array(3000).fill("x"),
    "y".repeat(1_000_000),
  ];
  for (const input of inputs) cases.push({ path: emb, body: JSON.stringify({ model: EMBED, input }) });
  const forms: unknown[] = [
    { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "a+" } } },
    { type: "json_schema", json_schema: { name: "bad name!", schema: {} } },
    {
      type: "json_schema",
      json_schema: { name: "x", schema: { type: "object", properties: { a: { not: {} } } } },
    },
    { type: "json_schema", json_schema: { name: "x", schema: { $ref: "#/$defs/missing" } } },
  ];
  for (const f of forms) {
    cases.push({
      path: chat,
      body: JSON.stringify({ model: CHAT, messages: user, max_tokens: 2, response_format: f }),
    });
  }
  const tools = [{
    type: "function",
    function: {
      name: "f",
      parameters: { type: "object", properties: { a: { type: "string", format: "ipv6" } } },
    },
  }];
  cases.push({
    path: chat,
    body: JSON.stringify({ model: CHAT, messages: user, tools, tool_choice: "required", max_tokens: 8 }),
  });
  // The hardening findings: deep, huge and costly schemas, a huge echoed model value.
  let deep: unknown = {};
  for (let i = 0; i < 3000; i++) deep = { type: "array", items: deep };
  const bigEnum = { enum: Array.from({ length: 100_000 }, (_, i) => `v${i}`) };
  // Patterns whose automata would take seconds, gigabytes or the whole stack to build.
  const alternatives = Array.from({ length: 300 }, (_, i) => String.fromCharCode(0x100 + i * 3)).join("|");
  const costlyPatterns = [
    `^(${alternatives})*x(${alternatives}){6}$`,
    "^(((a{256}){256}){256})$",
    `${"(".repeat(20_000)}a${")".repeat(20_000)}`,
    `^(a|b)*a(a|b){11}$`,
  ].map((pattern) => ({ type: "object", properties: { s: { type: "string", pattern } } }));
  for (const schema of [deep, bigEnum, ...costlyPatterns]) {
    for (
      const patch of [
        { response_format: { type: "json_schema", json_schema: { name: "x", schema } } },
        { tools: [{ type: "function", function: { name: "f", parameters: schema } }] },
      ]
    ) {
      cases.push({
        path: chat,
        body: JSON.stringify({ model: CHAT, messages: user, max_tokens: 2, ...patch }),
      });
    }
  }
  cases.push({ path: emb, body: JSON.stringify({ model: "m".repeat(1_000_000), input: "x" }) });
  // The Responses API's stateful and hosted features, and malformed items.
  const responses = "/v1/responses";
  const responseBodies: Record<string, unknown>[] = [
    { store: true },
    { previous_response_id: "resp_x" },
    { input: [{ type: "item_reference", id: "x" }] },
    { input: [{ type: "function_call_output", call_id: "x", output: "y" }] },
    { input: [{ type: "function_call", call_id: "", name: "f", arguments: "{}" }] },
    { input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }] },
    { input: Array(5000).fill({ role: "user", content: "" }).concat([null]) },
    { tools: [{ type: "file_search" }] },
    { tools: [{ type: "function", name: "f", parameters: deep }] },
    { text: { format: { type: "json_schema", name: "x", schema: bigEnum } } },
    { input: [] },
    { reasoning: "high" },
  ];
  for (const patch of responseBodies) {
    cases.push({
      path: responses,
      body: JSON.stringify({ model: CHAT, input: "x", max_output_tokens: 2, ...patch }),
    });
  }
  return cases;
}

serverTest(
  "reliability drill: 200+ adversarial requests, no crash, no 5xx, OpenAI errors, still serving",
  async () => {
    await withServer(
      ["--body-limit-bytes", String(4 * 1024 * 1024), "--max-embedding-inputs", "2048"],
      async (server) => {
        const cases = adversarialCases();
        assert.ok(cases.length >= 200, `${cases.length} cases`);
        const statuses = new Map<number, number>();
        for (let i = 0; i < cases.length; i += 8) {
          await Promise.all(
            cases.slice(i, i + 8).map(async (c, j) => {
              const res = await fetch(`${server.url}${c.path}`, {
                method: "POST",
                headers: {
                  authorization: `Bearer ${KEY}`,
                  "content-type": c.contentType ?? "application/json",
                },
                body: c.body,
              });
              const text = await res.text();
              statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
              const where = `case ${i + j} (${c.path}, ${String(c.body).slice(0, 80)}): ${res.status} ${
                text.slice(0, 200)
              }`;
              assert.ok(res.status < 500, where);
              if (res.status !== 200) {
                assertApiError({ status: res.status, body: JSON.parse(text) }, res.status);
              }
            }),
          );
        }
        const ok = await postJson(`${server.url}/v1/chat/completions`, {
          model: CHAT,
          messages: user,
          max_tokens: 2,
        }, KEY);
        assert.equal(ok.status, 200);
        const emb = await postJson(`${server.url}/v1/embeddings`, { model: EMBED, input: "fine" }, KEY);
        assert.equal(emb.status, 200);
        assert.ok(
          !server.logs.some((l) => l.includes('"msg":"unexpected error"')),
          "no unexpected errors logged",
        );
      },
    );
  },
);

serverTest(
  "an idle server does not spin: the compute threads sleep once the engines run out of work",
  async () => {
    // With 2 threads ggml keeps a worker polling for new work after every decode (~100 ms of a core on
    // this Xeon); the engines put the pool to sleep when their queues empty. Measured in CPU time of the
    // process, which other load on the machine does not inflate.
    await withServer(["--threads", "2"], async (server) => {
      const cpuMs = async () => {
        const stat = (await Deno.readTextFile(`/proc/${server.pid}/stat`)).split(") ")[1].split(" ");
        return (Number(stat[11]) + Number(stat[12])) * 1000 / 100;
      };
      const idleFor = async (ms: number) => {
        const before = await cpuMs();
        await new Promise((r) => setTimeout(r, ms));
        return (await cpuMs()) - before;
      };
      const quiet = await idleFor(1000);
      const after: Record<string, number> = {};
      for (
        const [name, call] of Object.entries({
          embedding: () =>
            postJson(`${server.url}/v1/embeddings`, { model: EMBED, input: "idle check" }, KEY),
          chat: () =>
            postJson(
              `${server.url}/v1/chat/completions`,
              { model: CHAT, messages: user, max_tokens: 3 },
              KEY,
            ),
        })
      ) {
        const res = await call();
        assert.equal(res.status, 200, JSON.stringify(res.body));
        after[name] = await idleFor(1000);
      }
      console.log(
        `CPU time in 1 s: idle ${quiet} ms, after an embedding ${after.embedding} ms, after a chat ${after.chat} ms`,
      );
      for (const [name, ms] of Object.entries(after)) {
        assert.ok(
          ms <= quiet + 50,
          `${ms} ms of CPU in the second after a ${name} request (idle: ${quiet} ms)`,
        );
      }
    });
  },
);

serverTest(
  "queue_wait_ms is the wait for a sequence on every local route: the time behind a busy engine, not the prompt's processing",
  async () => {
    await withServer(["--parallel", "1", "--max-queue", "4"], async (server) => {
      const engine = async () => {
        const text = await (await fetch(`${server.url}/metrics`)).text();
        const value = (name: string) =>
          Number(text.split("\n").find((l) => l.startsWith(`${name}{model="${CHAT}"}`))?.split(" ").at(-1));
        return {
          decodeMs: value("vserve_engine_decode_seconds_total") * 1000,
          decodes: value("vserve_engine_decodes_total"),
          queued: value("vserve_queue_depth"),
        };
      };
      const logLine = async (id: string): Promise<Json> => {
        for (let i = 0; i < 200; i++) {
          const line = server.logs.find((l) =>
            l.includes('"msg":"request"') && l.includes(`"request_id":"${id}"`)
          );
          if (line) return JSON.parse(line);
          await new Promise((r) => setTimeout(r, 25));
        }
        assert.fail(`no access log line for ${id}`);
      };
      const post = (path: string, id: string, body: unknown) =>
        fetch(`${server.url}${path}`, {
          method: "POST",
          headers: { ...auth, "x-request-id": id },
          body: JSON.stringify(body),
        });
      // Each route with a prompt of its own (nothing reused) of ~1,200 tokens, and one token to generate.
      const words = (seed: number) =>
        Array.from({ length: 400 }, (_, i) => `w${(i * 7919 + seed) % 997}`).join(" ");
      const figures: string[] = [];
      const routes: [string, (text: string) => unknown][] = [
        [
          "/v1/chat/completions",
          (text) => ({ model: CHAT, messages: [{ role: "user", content: text }], max_tokens: 1 }),
        ],
        ["/v1/completions", (text) => ({ model: CHAT, prompt: text, max_tokens: 1 })],
        ["/v1/responses", (text) => ({ model: CHAT, input: text, max_output_tokens: 1 })],
        [
          "/v1/messages",
          (text) => ({ model: CHAT, messages: [{ role: "user", content: text }], max_tokens: 1 }),
        ],
      ];
      // An idle engine: the wait ends before the prompt is processed (the decodes of this request alone).
      for (const [i, [path, body]] of routes.entries()) {
        const before = await engine();
        const res = await post(path, `idle-${i}`, body(words(i)));
        const text = await res.text();
        assert.equal(res.status, 200, text);
        const prompt = (await engine()).decodeMs - before.decodeMs;
        const line = await logLine(`idle-${i}`);
        assert.equal(typeof line.queue_wait_ms, "number", `${path}: ${JSON.stringify(line)}`);
        assert.ok(
          line.queue_wait_ms < prompt,
          `${path}: queue wait ${line.queue_wait_ms} ms, prompt ${prompt} ms`,
        );
        figures.push(`${path} idle ${line.queue_wait_ms} ms (prompt ${prompt.toFixed(0)} ms)`);
      }

      // A busy engine: A holds the only sequence and cannot end by itself (end tokens banned, a long budget).
      const ends = await postJson(`${server.url}/tokenize`, {
        model: CHAT,
        content: "<|im_end|><|endoftext|>",
      }, KEY);
      const leave = new AbortController();
      const a = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers: auth,
        body: JSON.stringify({
          model: CHAT,
          messages: user,
          max_tokens: 4000,
          stream: true,
          logit_bias: Object.fromEntries(ends.body.tokens.map((t: number) => [t, -100])),
        }),
        signal: leave.signal,
      });
      const reader = a.body!.getReader();
      await reader.read();
      // B (chat) and C (completions) wait behind it.
      const waiting = routes.slice(0, 2).map(([path, body], i) =>
        post(path, `queued-${i}`, body(words(10 + i)))
      );
      let m0 = await engine();
      while (m0.queued < 2) m0 = await engine();
      // Decodes run one after another. Those counted between m1 and m2 began after the last one counted
      // in m1 ended, which was after m0 was read (both were waiting then), and ended before m2 was read,
      // while A still held the sequence: both waited through all of them.
      let m1 = await engine();
      while (m1.decodes <= m0.decodes) m1 = await engine();
      let m2 = await engine();
      while (m2.decodes < m1.decodes + 5) m2 = await engine();
      const { value } = await reader.read();
      assert.ok(!new TextDecoder().decode(value).includes("[DONE]"), "A was still generating");
      leave.abort();
      for (const [i, res] of (await Promise.all(waiting)).entries()) {
        const text = await res.text();
        assert.equal(res.status, 200, text);
        const line = await logLine(`queued-${i}`);
        assert.ok(
          line.queue_wait_ms >= m2.decodeMs - m1.decodeMs,
          `${line.route}: queue wait ${line.queue_wait_ms} ms, A's decodes meanwhile ${
            m2.decodeMs - m1.decodeMs
          } ms`,
        );
        figures.push(
          `${line.route} queued ${line.queue_wait_ms} ms (A's decodes ${
            (m2.decodeMs - m1.decodeMs).toFixed(0)
          } ms)`,
        );
      }
      console.log(`queue_wait_ms: ${figures.join("; ")}`);
    });
  },
);
