/**
 * Inputs a hostile tenant sends, through a real server: a history of thousands of messages is
 * refused or counted without holding the event loop; compressed bodies are decoded (gzip, deflate)
 * or refused with a 415 naming the encoding; an overlong path is a 414 with the OpenAI error body;
 * the start leaves no llama.cpp warning about pooling; a long embedding input is tokenized off the
 * event loop.
 */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { longEventLoopStalls } from "./helpers/metrics.ts";

const KEY = "test-key";
const CHAT = "vserve/tiny-chat";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = (path: string) => `${server.url}${path}`;
const auth = { authorization: `Bearer ${KEY}` };

/**
 * Probes `/health` from a worker (this thread builds large bodies) until stopped; `answered()` says
 * how many answers came so far.
 */
async function healthProbe(): Promise<{ answered(): number; stop(): Promise<void> }> {
  const code = `
    let stopped = false;
    self.onmessage = () => void (stopped = true);
    while (!stopped) {
      const res = await fetch(${JSON.stringify(url("/health"))});
      await res.body?.cancel();
      self.postMessage("answer");
      await new Promise((r) => setTimeout(r, 5));
    }
    self.postMessage("stopped");`;
  const worker = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })), {
    type: "module",
  });
  let answers = 0;
  let stopped!: () => void;
  const ended = new Promise<void>((resolve) => (stopped = resolve));
  const first = new Promise<void>((resolve) => {
    worker.onmessage = (e) => {
      if (e.data === "stopped") return stopped();
      answers++;
      resolve();
    };
  });
  await first;
  return {
    answered: () => answers,
    stop: async () => {
      worker.postMessage("stop");
      await ended;
      worker.terminate();
    },
  };
}

/** `n` alternating user and assistant messages of about ten tokens each. */
function history(n: number) {
  return Array.from({ length: n }, (_, i) => ({
    role: i % 2 ? "assistant" : "user",
    content: `message number ${i} with a few more words in it`,
  }));
}

/** POSTs a body serialised beforehand; returns what `postJson` does, and probe answers meanwhile. */
async function timedPost(path: string, body: unknown, probe: { answered(): number }) {
  const text = JSON.stringify(body);
  const before = probe.answered();
  const res = await postJson(url(path), text, KEY);
  return { ...res, answersMeanwhile: probe.answered() - before };
}

serverTest(
  "10,000 messages: a 400 naming messages; /health answers while long histories are counted",
  async () => {
    const stallsBefore = await longEventLoopStalls(server.url);
    const probe = await healthProbe();
    try {
      // Refused before rendering: 4 tokens a message at least, 40,000 past the 32k context.
      const ten = await timedPost("/v1/chat/completions", { model: CHAT, messages: history(10_000) }, probe);
      assertApiError(ten, 400, { param: "messages", code: "context_length_exceeded" });
      assert.match(ten.body.error.message, /at least 40000 tokens/);
      // 6,000 messages might fit by that bound: rendered on the template's worker and tokenized
      // until the prompt passes the context (~107k tokens in all), while /health keeps answering.
      const six = await timedPost("/v1/chat/completions", { model: CHAT, messages: history(6_000) }, probe);
      assertApiError(six, 400, { param: "messages", code: "context_length_exceeded" });
      assert.ok(six.answersMeanwhile >= 2, `${six.answersMeanwhile} /health answers during the request`);
      // /tokenize has no context limit: the whole history is rendered and counted.
      const counted = await timedPost("/tokenize", { model: CHAT, messages: history(10_000) }, probe);
      assert.equal(counted.status, 200);
      assert.ok(counted.body.count > 170_000, `${counted.body.count} tokens`);
      assert.ok(
        counted.answersMeanwhile >= 2,
        `${counted.answersMeanwhile} /health answers during /tokenize`,
      );
    } finally {
      await probe.stop();
    }
    assert.equal(
      await longEventLoopStalls(server.url) - stallsBefore,
      0,
      "the event loop was held for a quarter of a second",
    );
    // Past 16,384 messages the request is refused before its messages are validated (past 100,000
    // objects in all, before the body is parsed).
    const many = await postJson(
      url("/v1/chat/completions"),
      { model: CHAT, messages: history(60_000) },
      KEY,
    );
    assertApiError(many, 400, { param: "messages" });
    assert.match(many.body.error.message, /at most 16384 messages/);
    // The same cap on the other chat-shaped APIs: Responses input items, Anthropic messages.
    const items = await postJson(url("/v1/responses"), { model: CHAT, input: history(16_385) }, KEY);
    assertApiError(items, 400, { param: "input" });
    assert.match(items.body.error.message, /at most 16384 items/);
    const anthropic = await postJson(
      url("/v1/messages"),
      { model: CHAT, max_tokens: 1, messages: history(16_385) },
      KEY,
    );
    assert.equal(anthropic.status, 400);
    assert.equal(anthropic.body.type, "error");
    assert.equal(anthropic.body.error.type, "invalid_request_error");
    assert.match(anthropic.body.error.message, /messages.*at most 16384 messages/s);
    const health = await fetch(url("/health"));
    await health.body?.cancel();
    assert.equal(health.status, 200, "the server keeps serving");
  },
);

/** A JSON body compressed with `format`. */
async function compressed(body: unknown, format: CompressionFormat): Promise<Uint8Array<ArrayBuffer>> {
  const stream = new Blob([JSON.stringify(body)]).stream().pipeThrough(new CompressionStream(format));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

async function postEncoded(body: BodyInit, encoding: string) {
  const res = await fetch(url("/v1/chat/completions"), {
    method: "POST",
    headers: { ...auth, "content-type": "application/json", "content-encoding": encoding },
    body,
  });
  return { status: res.status, body: await res.json() };
}

serverTest("one embedding input of megabytes is tokenized off the event loop", async () => {
  // 3 MB of text (1.5M tokens) tokenized on the JavaScript thread held it for over a second (a
  // 7.8 MB input: 3.5 s, /health unanswered meanwhile) before the answer, a 400.
  const stallsBefore = await longEventLoopStalls(server.url);
  const res = await postJson(
    url("/v1/embeddings"),
    JSON.stringify({ model: "Vendor/Vendor3-Embedding-8B", input: "a ".repeat(1_500_000) }),
    KEY,
  );
  assertApiError(res, 400, { param: "input", code: "context_length_exceeded" });
  assert.equal(
    await longEventLoopStalls(server.url) - stallsBefore,
    0,
    "the event loop was held for a quarter of a second",
  );
});

serverTest("one ONNX embedding input of megabytes is tokenized off the event loop", async () => {
  // The ONNX models' tokenizer is JavaScript: a 7.8 MB input to tiny-embed-onnx held the event loop
  // (and /health) for 10-15 s before its 400.
  const stallsBefore = await longEventLoopStalls(server.url);
  const res = await postJson(
    url("/v1/embeddings"),
    JSON.stringify({ model: "vserve/tiny-embed-onnx", input: "a ".repeat(1_500_000) }),
    KEY,
  );
  assertApiError(res, 400, { param: "input", code: "context_length_exceeded" });
  assert.equal(
    await longEventLoopStalls(server.url) - stallsBefore,
    0,
    "the event loop was held for a quarter of a second",
  );
});

serverTest("deep and dense JSON bodies: refused or parsed in slices, the event loop free", async () => {
  // One JSON.parse on the JavaScript thread: 8 MB of '[' held it ~500 ms before its 400, an 8 MB
  // body of arrays nested 200 deep 0.9-1.4 s, 4M empty arrays ~300 ms.
  const stallsBefore = await longEventLoopStalls(server.url);
  const open = await postJson(url("/v1/chat/completions"), "[".repeat(8 * 1024 * 1024 - 16), KEY);
  assertApiError(open, 400, { code: "json_too_deep" });
  assert.match(open.body.error.message, /more than 512 levels deep/);
  const closed = await postJson(
    url("/v1/embeddings"),
    `{"model":"vserve/tiny-embed-onnx","input":${"[".repeat(1_000_000)}${"]".repeat(1_000_000)}}`,
    KEY,
  );
  assertApiError(closed, 400, { code: "json_too_deep" });
  // Shallow but dense (nested 200 deep, side by side): 8 MB of it holds 4M arrays, refused by the
  // count before parsing; 80,000 of them are parsed, then refused as a request.
  const unit = `${"[".repeat(200)}${"]".repeat(200)}`;
  const dense = await postJson(
    url("/v1/embeddings"),
    `{"model":"vserve/tiny-embed-onnx","input":[${Array(20_000).fill(unit).join(",")}]}`,
    KEY,
  );
  assertApiError(dense, 400, { code: "json_too_large" });
  assert.match(dense.body.error.message, /more than 100000 arrays and objects/);
  const fewer = await postJson(
    url("/v1/embeddings"),
    `{"model":"vserve/tiny-embed-onnx","input":[${Array(400).fill(unit).join(",")}]}`,
    KEY,
  );
  assertApiError(fewer, 400, { param: "input" });
  // The Anthropic route answers the nesting in its own error shape.
  const messages = await fetch(url("/v1/messages"), {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: "{".repeat(100_000),
  });
  assert.equal(messages.status, 400);
  const body = await messages.json();
  assert.equal(body.type, "error");
  assert.equal(body.error.type, "invalid_request_error");
  assert.match(body.error.message, /more than 512 levels deep/);
  assert.equal(
    await longEventLoopStalls(server.url) - stallsBefore,
    0,
    "the event loop was held for a quarter of a second",
  );
});

serverTest(
  "a tool call's arguments in the history: parsed in slices, their nesting refused with a 400",
  async () => {
    // JSON inside a string escapes the body's checks: 1,000,000 nested objects in one call's
    // arguments held the event loop 300 ms (JSON.parse, then the template's recursion) before a 400
    // "Maximum call stack size exceeded" of the template.
    const stallsBefore = await longEventLoopStalls(server.url);
    const deep = '{"a":'.repeat(1_000_000) + "1" + "}".repeat(1_000_000);
    const messages = [
      { role: "user", content: "hi" },
      {
        role: "assistant",
        tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: deep } }],
      },
      { role: "tool", tool_call_id: "c", content: "r" },
    ];
    const param = "messages[1].tool_calls[0].function.arguments";
    for (const path of ["/v1/chat/completions", "/tokenize"]) {
      const res = await postJson(url(path), JSON.stringify({ model: CHAT, max_tokens: 1, messages }), KEY);
      assertApiError(res, 400, { param, code: "invalid_value" });
      assert.match(
        res.body.error.message,
        /function.arguments nests arrays and objects more than 512 levels deep/,
      );
    }
    const input = [
      { type: "function_call", call_id: "c", name: "f", arguments: deep },
      { type: "function_call_output", call_id: "c", output: "r" },
    ];
    const res = await postJson(
      url("/v1/responses"),
      JSON.stringify({ model: CHAT, max_output_tokens: 1, input }),
      KEY,
    );
    assertApiError(res, 400, { code: "invalid_value" });
    assert.match(res.body.error.message, /more than 512 levels deep/);
    // Within the limit, a large arguments text still renders (parsed in pieces).
    const wide = JSON.stringify({ rows: Array.from({ length: 20_000 }, (_, i) => [i, `v${i}`]) });
    const ok = await postJson(
      url("/tokenize"),
      JSON.stringify({
        model: CHAT,
        messages: [messages[0], {
          ...messages[1],
          tool_calls: [{ ...messages[1].tool_calls![0], function: { name: "f", arguments: wide } }],
        }, messages[2]],
      }),
      KEY,
    );
    assert.equal(ok.status, 200, JSON.stringify(ok.body).slice(0, 300));
    assert.ok(ok.body.prompt.includes("v19999"));
    assert.equal(
      await longEventLoopStalls(server.url) - stallsBefore,
      0,
      "the event loop was held for a quarter of a second",
    );
  },
);

serverTest("a large body nested within the limit is parsed as JSON.parse parses it", async () => {
  // Over 64 KB: parsed in pieces of 32 KB, each large container walked member by member.
  const input = Array.from(
    { length: 500 },
    (_, i) => Array.from({ length: 100 }, (_, j) => (i * 7 + j) % 1000),
  );
  const extra = { nested: Array.from({ length: 3000 }, (_, i) => ({ i, s: '],}{[\\"' })) };
  const text = `{ "model" : "vserve/tiny-embed-onnx", "input": ${JSON.stringify(input)},\n "extra": ${
    JSON.stringify(extra)
  }, "encoding_format" : "base64" }`;
  assert.ok(text.length > 200_000);
  const res = await postJson(url("/v1/embeddings"), text, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.data.length, 500);
  assert.equal(res.body.usage.prompt_tokens, 50_000);
  assert.equal(typeof res.body.data[0].embedding, "string");
  const broken = await postJson(url("/v1/embeddings"), `{"input":${JSON.stringify(input)},}`, KEY);
  assertApiError(broken, 400, { code: "invalid_json" });
});

serverTest(
  "an object of 600,000 members (8 MB of metadata) is a 400 before it is built, the limit and the field named",
  async () => {
    const keys = Array.from({ length: 600_000 }, (_, i) => `"k${i}":"v"`).join(",");
    const text =
      `{"model":"${CHAT}","messages":[{"role":"user","content":"x"}],"max_tokens":2,"metadata":{${keys}}}`;
    const res = await postJson(url("/v1/chat/completions"), text, KEY);
    assertApiError(res, 400, { code: "json_too_large", param: "metadata" });
    assert.match(res.body.error.message, /an object of more than 262144 members \(metadata, /);
  },
);

serverTest("gzip and deflate bodies are decoded; other encodings are a 415 naming them", async () => {
  const request = { model: CHAT, messages: [{ role: "user", content: "hi" }], max_tokens: 2 };
  for (const format of ["gzip", "deflate"] as const) {
    const res = await postEncoded(await compressed(request, format), format);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.usage.completion_tokens, 2);
  }
  for (const encoding of ["br", "zstd", "gzip, br"]) {
    const res = await postEncoded(JSON.stringify(request), encoding);
    assertApiError(res, 415, { code: "unsupported_content_encoding" });
    assert.ok(res.body.error.message.includes(`'${encoding}'`), res.body.error.message);
  }
  assertApiError(await postEncoded("not gzip", "gzip"), 400, { code: "invalid_content_encoding" });
  // A small body that inflates past the body limit (8 MiB) is refused, not decoded into memory.
  const bomb = await compressed({ ...request, pad: " ".repeat(9 * 1024 * 1024) }, "gzip");
  assert.ok(bomb.length < 64 * 1024);
  assertApiError(await postEncoded(bomb, "gzip"), 413, { code: "request_too_large" });
});

serverTest("an overlong model id in the path is a 414 with the OpenAI error body", async () => {
  for (const n of [10_000, 60_000]) {
    const res = await fetch(url(`/v1/models/${"m".repeat(n)}`), { headers: auth });
    assertApiError({ status: res.status, body: await res.json() }, 414, { code: "uri_too_long" });
  }
  // Past 65,534 bytes Deno's HTTP parser answers an empty 400 itself (no handler runs); the
  // server goes on serving. (fetch refuses such a URL: a raw request.)
  const host = new URL(server.url);
  const conn = await Deno.connect({ hostname: host.hostname, port: Number(host.port) });
  await conn.write(
    new TextEncoder().encode(`GET /v1/models/${"m".repeat(100_000)} HTTP/1.1\r\nHost: x\r\n\r\n`),
  );
  const buf = new Uint8Array(1024);
  const n = await conn.read(buf);
  conn.close();
  assert.match(new TextDecoder().decode(buf.subarray(0, n ?? 0)), /^HTTP\/1\.1 400 /);
  const ok = await fetch(url(`/v1/models/${CHAT}`), { headers: auth });
  assert.equal((await ok.json()).id, CHAT);
});

serverTest("the start logs no llama.cpp warning about the embedding context's pooling", () => {
  const warnings = server.logs.filter((l) => l.includes('"level":"warn"'));
  assert.ok(!warnings.some((l) => l.includes("pooling_type")), warnings.join("\n"));
  assert.ok(server.logs.some((l) => l.includes("Vendor3-Embedding-8B")), "the embedding model was loaded");
  return Promise.resolve();
});
