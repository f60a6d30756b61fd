/** The upstream pool's choices and the wire helpers, in-process (no servers). */
import assert from "node:assert/strict";
import { affinityKey, UpstreamPool } from "../src/engines/upstream/pool.ts";
import { RoutingSchema } from "../src/model_spec.ts";
import { errorFields, sseData } from "../src/engines/upstream/wire.ts";
import { UpstreamFailure } from "../src/engines/upstream/failure.ts";
import { modelStatus } from "../src/routes/model_status.ts";
import { affinityText, upstreamRequest } from "../src/engines/upstream/chat.ts";
import { parseRegistry } from "../src/registry.ts";
import { silentLogger } from "../src/log.ts";
import { EngineUpstreamError } from "../src/engines/types.ts";
import type { ChatJob } from "../src/engines/types.ts";

const pool = (n: number, routing: Record<string, unknown> = {}, now?: () => number) =>
  new UpstreamPool(
    "m",
    Array.from({ length: n }, (_, i) => ({ url: `http://127.0.0.1:${9 + i}/v1`, name: `u${i}` })),
    RoutingSchema.parse(routing),
    { log: silentLogger, now },
  );

Deno.test("least outstanding: the least loaded upstream, ties to the least recently picked", () => {
  const p = pool(3);
  const [a, b, c] = p.upstreams;
  assert.deepEqual([p.pick(), p.pick(), p.pick(), p.pick()], [a, b, c, a], "round robin while idle");
  a.outstanding = 2;
  b.outstanding = 1;
  c.outstanding = 1;
  assert.equal(p.pick(), b);
  assert.equal(p.pick(), c);
  c.state = "ejected";
  b.state = "unhealthy";
  assert.equal(p.pick(), a, "only routable upstreams");
  a.state = "ejected";
  assert.equal(p.pick(), undefined);
});

Deno.test("prefix affinity: one key stays on one upstream until it holds more than its share", () => {
  const p = pool(4);
  const key = affinityKey("x".repeat(2000), 1024)!;
  const first = p.pick(key)!;
  for (let i = 0; i < 20; i++) assert.equal(p.pick(key), first, "the same upstream while idle");
  const others = new Set(
    Array.from({ length: 64 }, (_, i) => p.pick(affinityKey(`conversation ${i} `.padEnd(1100, "."), 1024))),
  );
  assert.equal(others.size, 4, "different keys use every upstream");
  // Load: it keeps the key while under max(2, 1.5 × mean), then the key's next choice takes over.
  first.outstanding = 1;
  assert.equal(p.pick(key), first);
  first.outstanding = 2;
  const second = p.pick(key)!;
  assert.notEqual(second, first);
  assert.equal(p.pick(key), second, "the overflow goes to one place too");
  for (const u of p.upstreams) u.outstanding = 4;
  first.outstanding = 6;
  assert.equal(p.pick(key), first, "under 1.5 × the mean load it keeps the key");
  first.outstanding = 8;
  assert.notEqual(p.pick(key), first);
  first.state = "ejected";
  assert.notEqual(p.pick(key), first, "an ejected upstream loses its keys");
});

Deno.test("affinity keys: only prompts longer than the prefix, from the conversation's start", () => {
  assert.equal(affinityKey("short", 1024), undefined);
  assert.equal(affinityKey("x".repeat(5000), 0), undefined, "0 turns affinity off");
  const job = (turns: number): Pick<ChatJob, "messages" | "tools"> => ({
    tools: [],
    messages: [
      { role: "system", text: "S".repeat(300) },
      ...Array.from({ length: turns }, (_, i) => ({ role: "user" as const, text: `turn ${i}` })),
    ],
  });
  const k1 = affinityKey(affinityText(job(1), 200), 200);
  assert.ok(k1 !== undefined);
  assert.equal(affinityKey(affinityText(job(5), 200), 200), k1, "later turns share the key");
});

Deno.test("an upstream that fails in a row is ejected for its back-off; a working answer resets the count", () => {
  const now = 1_000_000;
  const p = pool(2, { failures: 2, ejectMs: 60_000 }, () => now);
  const [a] = p.upstreams;
  const fail = () => p.lease(a).end("failed", "boom");
  fail();
  p.lease(a).end("rejected");
  fail();
  assert.equal(a.state, "healthy", "a 4xx answer shows a working upstream");
  p.lease(a).end("busy");
  assert.equal(a.failures, 1, "a 429 neither counts nor resets");
  p.lease(a).end("cancelled");
  fail();
  assert.equal(a.state, "ejected");
  assert.equal(a.ejectedUntil, now + 60_000, "ejected for ejectMs");
  assert.equal(p.statuses()[0].routable, false);
  assert.equal(p.pick(), p.upstreams[1]);
  p.dispose();
});

Deno.test("an upstream on trial takes one request at a time while another can take the rest; a failure ejects it", () => {
  const p = pool(2, { failures: 3, ejectMs: 60_000 });
  const [a, b] = p.upstreams;
  a.state = b.state = "healthy";
  a.trial = true;
  const trial = p.lease(a);
  assert.equal(p.pick(), b, "its trial is under way: the others take requests");
  assert.equal(p.pick(), b);
  b.state = "unhealthy";
  assert.equal(p.pick(), a, "alone, it takes them all");
  trial.end("ok");
  assert.equal(a.trial, false, "one success proves it");
  a.trial = true;
  a.readmittedBy = "health";
  p.lease(a).end("failed", "boom");
  assert.equal(a.state, "ejected", "one failure on trial ejects it, whatever `failures` says");
  assert.equal(a.healthVouches, false, "its health check vouched for it wrongly");
  p.dispose();
});

Deno.test("health checks: a passing one readmits an ejected upstream on trial, unless it vouched wrongly before", async () => {
  let healthy = true;
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    () => new Response("{}", { status: healthy ? 200 : 503 }),
  );
  try {
    const p = new UpstreamPool(
      "m",
      [{ url: `http://127.0.0.1:${server.addr.port}/v1`, name: "a" }],
      RoutingSchema.parse({ failures: 3, ejectMs: 600_000, healthIntervalMs: 0 }),
      { log: silentLogger },
    );
    const [a] = p.upstreams;
    await p.checkAll();
    assert.equal(a.state, "healthy");
    p.lease(a).end("failed");
    p.lease(a).end("failed");
    await p.checkAll();
    assert.equal(a.failures, 2, "a passing check does not reset failed requests in a row");
    p.lease(a).end("failed");
    assert.equal(a.state, "ejected");
    await p.checkAll();
    assert.deepEqual([a.state, a.trial, a.readmittedBy], ["healthy", true, "health"], "readmitted on trial");
    p.lease(a).end("failed");
    assert.equal(a.state, "ejected");
    await p.checkAll();
    assert.equal(a.state, "ejected", "its check passes while its requests fail: no longer trusted");
    healthy = false;
    await p.checkAll();
    assert.equal(a.state, "ejected");
    healthy = true;
    await p.checkAll();
    assert.deepEqual([a.state, a.trial], ["healthy", true], "down and back up: readmitted");
    p.lease(a).end("ok");
    assert.deepEqual([a.state, a.trial, a.ejections], ["healthy", false, 0]);
    // An outage seen by the checks makes earlier request failures stale.
    p.lease(a).end("failed");
    healthy = false;
    await p.checkAll();
    assert.equal(a.state, "unhealthy");
    healthy = true;
    await p.checkAll();
    assert.deepEqual([a.state, a.failures], ["healthy", 0]);
    p.dispose();
  } finally {
    await server.shutdown();
  }
});

Deno.test("a model served by upstreams is loaded, degraded or unavailable by how many can take requests", () => {
  const u = (routable: boolean) => ({
    name: "u",
    state: "healthy" as const,
    routable,
    inFlight: 0,
    failures: 0,
  });
  assert.equal(modelStatus("loaded", [u(true), u(true)]), "loaded");
  assert.equal(modelStatus("loaded", [u(true), u(false)]), "degraded");
  assert.equal(modelStatus("loaded", [u(false), u(false)]), "unavailable");
  assert.equal(modelStatus("loaded"), "loaded", "a local model");
  assert.equal(modelStatus("loading", [u(false)]), "loading");
});

Deno.test("server-sent events: the idle limit counts waiting for the stream, not the consumer's time", async () => {
  let push!: (text: string) => void;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      push = (t) => c.enqueue(new TextEncoder().encode(t));
    },
  });
  let expired = 0;
  const events = sseData(body, { ms: 50, expired: () => expired++ });
  push("data: 1\n\n");
  assert.deepEqual((await events.next()).value, "1");
  // The consumer holds the event longer than the limit (the stream sent the next one meanwhile).
  await new Promise((r) => setTimeout(r, 120));
  push("data: 2\n\n");
  assert.deepEqual((await events.next()).value, "2");
  assert.equal(expired, 0, "a slow consumer is not a stalled stream");
  const third = events.next();
  // (This timer is due after the limit's: it fires later, however late both are.)
  await new Promise((r) => setTimeout(r, 120));
  assert.equal(expired, 1, "the stream itself was silent past the limit");
  push("data: 3\n\n");
  assert.deepEqual((await third).value, "3");
  await events.return(undefined);
});

Deno.test("dispatch with no routable upstream is a 503 no_upstream_available", async () => {
  const p = pool(1);
  p.upstreams[0].state = "unhealthy";
  const e = await p.dispatch({ signal: new AbortController().signal }, () => Promise.resolve(1)).catch((e) =>
    e
  );
  assert.ok(e instanceof UpstreamFailure);
  const api = e.toEngineError("m");
  assert.ok(api instanceof EngineUpstreamError);
  assert.equal(api.status, 503);
  assert.equal(api.code, "no_upstream_available");
});

Deno.test("error bodies in every upstream's shape", () => {
  assert.deepEqual(errorFields('{"error":{"message":"m","type":"t","param":"p","code":"c"}}'), {
    message: "m",
    param: "p",
    code: "c",
  });
  assert.deepEqual(
    errorFields('{"object":"error","message":"too long","type":"BadRequestError","code":400}'),
    {
      message: "too long",
      param: undefined,
      code: undefined,
    },
  );
  assert.deepEqual(errorFields('{"error":"Input validation error","error_type":"Validation"}'), {
    message: "Input validation error",
  });
  assert.deepEqual(errorFields('{"detail":[{"loc":["body","messages",2,"role"],"msg":"bad role"}]}'), {
    message: "messages[2].role: bad role",
    param: "messages[2].role",
  });
  assert.deepEqual(errorFields("plain text"), { message: "plain text" });
});

Deno.test("server-sent events: data lines, CRLF, comments, split reads, a character split across reads", async () => {
  const parts = [
    ': ping\r\n\r\ndata: {"a":1}\r',
    "\n\r\ndata: line1\ndata: line2\n\n",
    "data: é\n\n",
    "data: [DONE]\n\n",
  ]
    .map((p) => new TextEncoder().encode(p));
  // "é" is two bytes: the read ends between them.
  const split = [...parts.slice(0, 2), parts[2].subarray(0, 7), parts[2].subarray(7), parts[3]];
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of split) c.enqueue(p);
      c.close();
    },
  });
  const got: string[] = [];
  for await (const d of sseData(body)) got.push(d);
  assert.deepEqual(got, ['{"a":1}', "line1\nline2", "é", "[DONE]"]);
});

Deno.test("the upstream request carries the job, streamed, with usage", () => {
  const body = upstreamRequest({
    messages: [
      { role: "system", text: "s" },
      {
        role: "assistant",
        text: "",
        reasoning: "r",
        toolCalls: [{ id: "call_1", name: "f", arguments: { x: 1 } }],
      },
      { role: "tool", text: "42", toolCallId: "call_1" },
    ],
    tools: [{ name: "f", parameters: { type: "object" } }],
    toolChoice: { name: "f" },
    parallelToolCalls: false,
    output: { type: "text" },
    sampling: { temperature: 0.5, repeatPenalty: 1.1, logitBias: { 7: -100 } },
    maxTokens: 9,
    stop: ["END"],
    enableThinking: false,
    n: 2,
  });
  assert.deepEqual(body, {
    messages: [
      { role: "system", content: "s" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_1", type: "function", function: { name: "f", arguments: '{"x":1}' } }],
        reasoning_content: "r",
      },
      { role: "tool", tool_call_id: "call_1", content: "42" },
    ],
    stream: true,
    stream_options: { include_usage: true },
    n: 2,
    tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
    tool_choice: { type: "function", function: { name: "f" } },
    parallel_tool_calls: false,
    temperature: 0.5,
    repeat_penalty: 1.1,
    repetition_penalty: 1.1,
    logit_bias: { "7": -100 },
    max_tokens: 9,
    stop: ["END"],
    chat_template_kwargs: { enable_thinking: false },
  });
});

Deno.test("registry entries of the openai backend are checked", () => {
  const ok = parseRegistry({
    models: [{ id: "m", kind: "chat", backend: "openai", upstreams: [{ url: "http://10.0.0.5:8000" }] }],
  }, "test");
  assert.equal(ok[0].source, undefined);
  const bad = (m: unknown) => assert.throws(() => parseRegistry({ models: [m] }, "test"));
  bad({ id: "m", kind: "chat", backend: "openai" });
  bad({ id: "m", kind: "chat", backend: "openai", upstreams: [{ url: "ftp://x" }] });
  bad({ id: "m", kind: "chat", source: "builtin:tiny-chat", upstreams: [{ url: "http://x" }] });
  bad({ id: "m", kind: "chat" });
  bad({
    id: "m",
    kind: "chat",
    backend: "openai",
    upstreams: [{ url: "http://a", name: "x" }, { url: "http://b", name: "x" }],
  });
  bad({
    id: "m",
    kind: "chat",
    backend: "openai",
    upstreams: [{ url: "http://a" }],
    routing: { retries: 9 },
  });
});

Deno.test("the fleet example of deploy/ is a valid registry", async () => {
  const json = JSON.parse(
    await Deno.readTextFile(new URL("../deploy/fleet/models.fleet.json", import.meta.url)),
  );
  const specs = parseRegistry(json, "deploy/fleet/models.fleet.json");
  assert.deepEqual(specs.map((s) => s.backend), ["openai", "openai"]);
  assert.deepEqual(specs.map((s) => s.id), ["Vendor/Vendor3.6-35B-A3B", "Vendor/Vendor3-Embedding-8B"]);
});
