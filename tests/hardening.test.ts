/**
 * Hardening, one test per finding of the adversarial drill: memory per embedding request,
 * event-loop freezes from huge or costly schemas, metrics cardinality, cancellation of
 * non-streaming work with large bodies, admission by work (embeddings and chat prefill), and
 * hostile transport (deep schemas, bad paths, aborted uploads, slowloris, huge echoed strings); a
 * request that could never be admitted is a 400.
 */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { engineCounter, longEventLoopStalls } from "./helpers/metrics.ts";
import { poll, settles } from "./helpers/poll.ts";
import { AutomatonCache, GbnfRules, JsonGrammar, type SliceSource } from "../src/grammar/mod.ts";

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

/** The server's resident memory, and its peak since {@link resetPeakRss} (MiB). */
function rssMiB(field: "VmRSS" | "VmHWM" = "VmRSS"): number {
  const status = Deno.readTextFileSync(`/proc/${server.pid}/status`);
  return Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status)![1]) / 1024;
}

/** Starts the kernel's count of the server's peak memory (VmHWM) afresh, at its present RSS. */
function resetPeakRss(): void {
  Deno.writeTextFileSync(`/proc/${server.pid}/clear_refs`, "5");
}

/** An engine counter of `model` on the main server; a missing series fails the test (it is not read as 0). */
const counter = (name: string, model: string) => engineCounter(server.url, name, model);

/** Sends a raw HTTP/1.1 request without reading the answer; returns the function that hangs up. */
async function sendRaw(path: string, body: string, id: string): Promise<() => void> {
  const conn = await Deno.connect({ hostname: host.hostname, port: Number(host.port) });
  const bytes = new TextEncoder().encode(body);
  const head = `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Content-Type: application/json\r\nx-request-id: ${id}\r\nContent-Length: ${bytes.length}\r\n\r\n`;
  await conn.write(new TextEncoder().encode(head));
  await conn.write(bytes);
  return () => conn.close();
}

/**
 * GETs `target` one request after another while `work` is pending; returns how many were answered
 * before it settled, and what it settled with. A server whose event loop the work holds answers
 * none while it is held: the count says the loop kept turning, whatever the machine's speed.
 */
async function answeredDuring<T>(target: string, work: Promise<T>): Promise<{ answered: number; result: T }> {
  let settled = false;
  const result = work.finally(() => (settled = true));
  let answered = 0;
  while (!settled) {
    const res = await fetch(target);
    await res.text();
    if (!settled) answered++;
  }
  return { answered, result: await result };
}

const longStalls = () => longEventLoopStalls(server.url);

/** The access-log entry of request `id`, once the request has ended (from the log of `from`). */
function logEntry(id: string, from: { readonly logs: string[] } = server) {
  return poll(`request ${id} was logged`, () => {
    const line = from.logs.find((l) => l.includes('"msg":"request"') && l.includes(`"request_id":"${id}"`));
    return line && JSON.parse(line);
  });
}

serverTest("an 8192-token embedding costs a bounded amount of memory, returned afterwards", async () => {
  await postJson(url("/v1/embeddings"), { model: EMBED, input: "warm up" }, KEY);
  const baseline = rssMiB();
  resetPeakRss();
  const res = await postJson(url("/v1/embeddings"), { model: EMBED, input: "word ".repeat(8000) }, KEY);
  const peak = rssMiB("VmHWM");
  assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 300));
  assert.ok(res.body.usage.prompt_tokens >= 8000);
  // README "Memory": the context is allocated once at load; a maximal input adds at most 256 MiB.
  assert.ok(peak > baseline, "the kernel's peak counts from the reset");
  assert.ok(
    peak - baseline < 256,
    `peak grew ${(peak - baseline).toFixed(0)} MiB over ${baseline.toFixed(0)}`,
  );
  await poll("the memory was returned", () => rssMiB() - baseline < 64);
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

serverTest(
  "/health is answered while costly and huge schemas and a long prompt are processed",
  async () => {
    // A grammar built on the request thread held every route for 220 ms with the 9-pattern schema,
    // 390 ms with 12 patterns and 103 s with the enum; one masking the vocabulary on it, 15-25 ms a
    // token. Probes answered while a request is processed show that its work leaves the event loop
    // turning; how long a probe waits is measured by `deno task bench` (the overhead scenario).
    const chat = (schema: unknown) =>
      JSON.stringify({
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        response_format: { type: "json_schema", json_schema: { name: "x", schema } },
      });
    const stalls = await longStalls();
    // Its patterns are compiled up to the request's step budget, then refused: all the request does.
    const twelve = await answeredDuring(
      url("/health"),
      postJson(url("/v1/chat/completions"), chat(patternSchema(12, "xc")), KEY),
    );
    assertApiError(twelve.result, 400, {
      code: "schema_too_large",
      param: "response_format.json_schema.schema",
    });
    assert.ok(twelve.answered >= 3, `${twelve.answered} /health answers while 12 patterns were compiled`);

    const huge = chat({ enum: Array.from({ length: 100_000 }, (_, i) => `value-${i}`) });
    const bodies = [
      chat(patternSchema(9, "xa")),
      chat(patternSchema(9, "xb")),
      huge,
      JSON.stringify({
        model: CHAT,
        messages: [{ role: "user", content: `${crypto.randomUUID()} ${"many words here ".repeat(600)}` }],
        max_tokens: 20,
        logit_bias: { "151643": -100, "151645": -100 },
      }),
    ];
    const { answered, result } = await answeredDuring(
      url("/health"),
      Promise.all(bodies.map((body) => postJson(url("/v1/chat/completions"), body, KEY))),
    );
    const [nine, nineOther, enumOfAll, long] = result;
    assert.equal(nine.status, 200, JSON.stringify(nine.body).slice(0, 300));
    assert.equal(nineOther.status, 200, JSON.stringify(nineOther.body).slice(0, 300));
    assertApiError(enumOfAll, 400, { code: "schema_too_large", param: "response_format.json_schema.schema" });
    assert.match(enumOfAll.body.error.message, /1000 enum values/);
    assert.equal(long.status, 200);
    assert.equal(long.body.usage.completion_tokens, 20);
    assert.ok(answered >= 10, `${answered} /health answers while the requests ran`);
    assert.equal(await longStalls() - stalls, 0, "a request held the event loop for a quarter of a second");
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

Deno.test("many small automata are cut into slices too: the build's slices run across them", async () => {
  // A drill's schema: 100 distinct patterns, each automaton well under a slice. Each automaton used to
  // get a slicer of its own, due only once it had itself run a slice's length: all 100 ran in one
  // block (80-300 ms with their garbage collections, /health held). Slices counted in steps here.
  let pauses = 0;
  const stepSlices: SliceSource = () => {
    let steps = 0;
    return {
      get due() {
        return ++steps % 50 === 0;
      },
      pause: async () => {
        pauses++;
        await Promise.resolve();
      },
    };
  };
  const automata = new AutomatonCache({ slices: stepSlices });
  const properties = Object.fromEntries(
    Array.from(
      { length: 100 },
      (_, i) => [`p${i}`, { type: "string", pattern: `^(a|b){0,${i % 20 + 1}}x${i}z$` }],
    ),
  );
  await automata.build(() => schemaGrammar({ type: "object", properties }, automata));
  assert.equal(automata.compiled, 100);
  // Two passes' turns, and a pause every 50 steps of the 100 compilations together (~700 steps; one
  // automaton takes ~7: with a slicer each, none reached 50 and only the passes paused).
  assert.ok(pauses >= 10, `${pauses} pauses`);
});

Deno.test("past the schema budget the remaining automata are refused without compiling", async () => {
  // 280 distinct patterns: the budget ran out after a few dozen, and each of the rest was still parsed
  // and refused in turn, one 100 ms block (no slice between refusals).
  const automata = new AutomatonCache({ budget: 400_000 });
  const properties = Object.fromEntries(
    Array.from(
      { length: 100 },
      (_, i) => [`p${i}`, { type: "string", pattern: `^(a|b){0,${i % 20 + 1}}x${i}z$` }],
    ),
  );
  await assert.rejects(
    automata.build(() => schemaGrammar({ type: "object", properties }, automata)),
    (e: Error) =>
      e.message.startsWith("The JSON schema is too large to enforce: compiling its patterns takes more"),
  );
  // Compiled until the budget ran out (67 of 100 here); the rest not even started (each was, before).
  assert.ok(automata.compiled > 0 && automata.compiled < 90, `${automata.compiled} compiled`);
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

serverTest("a non-streaming chat with a large body stops generating when its client leaves", async () => {
  // How soon after the client leaves is an engine matter (tests/engines.test.ts: no further chunk or
  // decode for a job whose signal aborted); here, that the server notices and ends the request.
  const before = await counter("tokens_generated", CHAT);
  const id = `leave-${crypto.randomUUID()}`;
  const body = JSON.stringify({
    model: CHAT,
    messages: [{ role: "system", content: "padding ".repeat(1000) }, { role: "user", content: "Go on" }],
    max_tokens: 1000,
    logit_bias: { "151643": -100, "151645": -100 },
  });
  assert.ok(body.length > 5000);
  const leave = await sendRaw("/v1/chat/completions", body, id);
  await poll("generation started", async () => (await counter("tokens_generated", CHAT)) > before);
  leave();
  assert.equal((await logEntry(id)).status, 499, "the request ended as cancelled");
  const generated = (await counter("tokens_generated", CHAT)) - before;
  assert.ok(generated > 0 && generated < 1000, `${generated} of 1000 tokens generated`);
});

serverTest("an embeddings request of 300 inputs stops evaluating when its client leaves", async () => {
  const before = await counter("tokens_evaluated", EMBED);
  const id = `leave-${crypto.randomUUID()}`;
  const input = Array.from({ length: 300 }, (_, i) => `sentence ${i} `.repeat(20));
  const leave = await sendRaw("/v1/embeddings", JSON.stringify({ model: EMBED, input }), id);
  await poll("evaluation started", async () => (await counter("tokens_evaluated", EMBED)) > before);
  leave();
  assert.equal((await logEntry(id)).status, 499, "the request ended as cancelled");
  const evaluated = (await counter("tokens_evaluated", EMBED)) - before;
  assert.ok(evaluated > 0 && evaluated < 300 * 60, `${evaluated} of ~${300 * 81} tokens evaluated`);
});

serverTest(
  "/health is answered while 500 long texts are tokenized, embedded (ONNX) and serialised",
  async () => {
    // Each phase held the event loop: onnxruntime-node runs a session on the calling thread (a
    // /health probe waited 4.2 s behind 2,000 such texts), and tokenization and the JSON body
    // were one block each (0.8 s to tokenize these texts with the ONNX model's tokenizer).
    const input = Array.from({ length: 500 }, (_, i) => `sentence ${i} `.repeat(200));
    const stalls = await longStalls();
    const { answered, result: res } = await answeredDuring(
      url("/health"),
      postJson(url("/v1/embeddings"), { model: "vserve/tiny-embed-onnx", input }, KEY),
    );
    assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 300));
    assert.equal(res.body.data.length, 500);
    assert.equal(res.body.data[499].index, 499);
    assert.ok(res.body.usage.prompt_tokens > 500 * 500, `${res.body.usage.prompt_tokens} tokens`);
    assert.ok(answered >= 20, `${answered} /health answers while the request ran`);
    assert.equal(await longStalls() - stalls, 0, "a phase held the event loop for a quarter of a second");
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
    const entry = await logEntry(id);
    assert.equal(entry.body, "cut", JSON.stringify(entry));
  },
);

serverTest("a one-word embedding is served while a 1,000-input request runs", async () => {
  // The order: with fair admission the small request finishes first, whatever the machine's speed
  // (without it, it waited 97 s for the 1,000 inputs ahead of it). How long it takes meanwhile is
  // measured by `deno task bench`.
  const before = await counter("inputs_embedded", EMBED);
  const input = Array.from({ length: 1000 }, (_, i) => `document number ${i} about things`);
  let bigDone = false;
  const big = postJson(url("/v1/embeddings"), { model: EMBED, input }, KEY).then((r) => {
    bigDone = true;
    return r;
  });
  await poll(
    "the 1,000-input request is running",
    async () => bigDone || (await counter("inputs_embedded", EMBED)) > before,
  );
  const atSend = (await counter("inputs_embedded", EMBED)) - before;
  assert.ok(!bigDone && atSend < 500, `the 1,000-input request is running (${atSend} embedded)`);
  const small = await postJson(url("/v1/embeddings"), { model: EMBED, input: "hello" }, KEY);
  assert.equal(small.status, 200);
  const atAnswer = (await counter("inputs_embedded", EMBED)) - before;
  assert.equal(bigDone, false, "the one-word request waited for the whole 1,000-input request");
  // Fair admission gives it the next free sequence: a step or two of the big request's inputs
  // run meanwhile, not the rest of them.
  assert.ok(
    atAnswer - atSend < (1000 - atSend) / 2,
    `${atAnswer - atSend} of the ${1000 - atSend} inputs left were embedded before the one-word request`,
  );
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
    await poll(
      "the long prompt is being prefilled",
      async () => longDone || (await counter("prompt_tokens_evaluated", CHAT)) - before >= 1024,
    );
    assert.ok(!longDone, "the long prompt is being prefilled");
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
  // Four at once, 1,500 tokens each, against a budget of 2,000: one runs at a time, the others that
  // arrive meanwhile are refused (the first admitted embeds for far longer than the rest take to
  // arrive).
  const results = await Promise.all(
    ["a", "b", "c", "d"].map((w) =>
      postJson(`${edge.url}/v1/embeddings`, { model: EMBED, input: `${w} `.repeat(1500) }, KEY)
    ),
  );
  const refused = results.filter((r) => r.status === 429);
  for (const r of refused) assertApiError(r, 429, { code: "token_budget_exceeded" });
  assert.ok(refused.length >= 1, "a request arriving while another holds the budget is refused");
  assert.ok(results.some((r) => r.status === 200), "one runs");
  assert.ok(
    results.every((r) => r.status === 200 || r.status === 429),
    JSON.stringify(results.map((r) => r.status)),
  );
  const alone = await postJson(`${edge.url}/v1/embeddings`, { model: EMBED, input: "e ".repeat(3000) }, KEY);
  assert.equal(alone.status, 200, "a request over the budget runs when it is alone");
});

serverTest(
  "a request needing more sequences than the model runs and queues is a 400, not a 429",
  async () => {
    // tiny-chat runs 8 sequences and queues 64: n=128, or 100 prompts, could never start, and the
    // 429 "busy … retry shortly" they got on an idle server had clients retry for ever.
    const chat = await postJson(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: "x" }],
      max_tokens: 1,
      n: 128,
    }, KEY);
    assertApiError(chat, 400, { param: "n" });
    const prompts = await postJson(url("/v1/completions"), {
      model: CHAT,
      prompt: Array.from({ length: 100 }, () => "x"),
      max_tokens: 1,
    }, KEY);
    assertApiError(prompts, 400, { param: "prompt" });
    assert.match(prompts.body.error.message, /needs 100 sequences/);
    // As many prompts as the model runs at once are served.
    const eight = await postJson(url("/v1/completions"), {
      model: CHAT,
      prompt: Array.from({ length: 8 }, () => "x"),
      max_tokens: 1,
    }, KEY);
    assert.equal(eight.status, 200);
  },
);

serverTest("deep schemas, bad percent-encoding and huge model values are clear 4xx", async () => {
  const nested = (levels: number) => {
    let deep: unknown = { type: "string" };
    for (let i = 0; i < levels; i++) deep = { type: "object", properties: { a: deep } };
    return postJson(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: "x" }],
      tools: [{ type: "function", function: { name: "f", parameters: deep } }],
    }, KEY);
  };
  // 200 schema levels (400 of JSON): past the schema's nesting limit, named.
  assertApiError(await nested(200), 400, { code: "schema_too_large", param: "tools[0].function.parameters" });
  // 5,000 (10,000 of JSON): past the body's nesting limit, refused before parsing.
  assertApiError(await nested(5000), 400, { code: "json_too_deep" });

  const bad = await fetch(url("/v1/models/%zz"), { headers: { authorization: `Bearer ${KEY}` } });
  assertApiError({ status: bad.status, body: await bad.json() }, 400, { code: "invalid_path" });

  const huge = "m".repeat(2_000_000);
  const id = `huge-${crypto.randomUUID()}`;
  const res = await postJson(url("/v1/embeddings"), { model: huge, input: "x" }, KEY, { "x-request-id": id });
  assertApiError(res, 404, { code: "model_not_found" });
  assert.ok(JSON.stringify(res.body).length < 2000, "the 404 body does not echo 2 MB");
  await logEntry(id); // the log is one ordered stream: what the request logged is in before its end
  assert.ok(server.logs.every((l) => l.length < 10_000), "no log line echoes the value");
  assert.ok(!server.logs.some((l) => l.includes("decodeURIComponent") || l.includes("file://")));
});

serverTest("an aborted upload is a 499, not a 500; a stalled body is a 408", async () => {
  const id = `upload-${crypto.randomUUID()}`;
  const conn = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await conn.write(new TextEncoder().encode(
    `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nx-request-id: ${id}\r\n` +
      `Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n`,
  ));
  // The interim answer says the server took the request and waits for its body.
  const interim = new Uint8Array(64);
  const got = await conn.read(interim);
  assert.match(new TextDecoder().decode(interim.subarray(0, got ?? 0)), /^HTTP\/1\.1 100 Continue/);
  await conn.write(new TextEncoder().encode(`{"model":"${EMBED}","input":"`));
  conn.close();
  assert.equal((await logEntry(id, edge)).status, 499, "the aborted upload is logged 499");
  const stalled = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await stalled.write(new TextEncoder().encode(
    `POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":`,
  ));
  const buf = new Uint8Array(4096);
  const n = await stalled.read(buf);
  stalled.close();
  assert.match(new TextDecoder().decode(buf.subarray(0, n ?? 0)), /^HTTP\/1\.1 408/);
  assert.ok(!edge.logs.some((l) => l.includes('"msg":"unexpected error"')), "no unexpected error");
});

serverTest("a slowloris connection is closed after the idle limit", async () => {
  const conn = await Deno.connect({ hostname: edgeHost.hostname, port: Number(edgeHost.port) });
  await conn.write(new TextEncoder().encode("POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"));
  const t = performance.now();
  let dripped = 0;
  const closed = (async () => {
    const buf = new Uint8Array(64);
    for (;;) {
      // One header byte at a time, as a slowloris does; the server stops waiting anyway.
      const n = await conn.read(buf).catch(() => null);
      if (n === null) return { after: performance.now() - t, dripped };
      assert.fail(`the server answered: ${new TextDecoder().decode(buf.subarray(0, n))}`);
    }
  })();
  const drip = setInterval(
    () => conn.write(new TextEncoder().encode("X")).then(() => dripped++, () => {}),
    200,
  );
  const { after, dripped: sent } = await settles("the server closed the connection", closed)
    .finally(() => clearInterval(drip));
  conn.close();
  // A lower bound only (a busy machine makes it later, never sooner): not closed for another reason.
  assert.ok(after >= IDLE_MS - 100, `closed after ${after.toFixed(0)} ms, before the idle limit`);
  assert.ok(sent >= 2, `closed while bytes kept coming (${sent} sent)`);
  const health = await fetch(`${edge.url}/health`);
  assert.equal(health.status, 200, "still serving");
  await health.body?.cancel();
});
