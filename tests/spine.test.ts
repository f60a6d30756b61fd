/** The HTTP spine through a real server process: routing, errors, auth, body rules, zod params. */
import assert from "node:assert/strict";
import { postJson, runMain, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";

const KEY = "test-key";
const server = await startServer([
  "--api-key",
  KEY,
  "--api-key",
  "second-key",
  "--body-limit-bytes",
  "65536",
]);
globalThis.addEventListener("unload", () => void server.stop());
const url = server.url;
const chat = `${url}/v1/chat/completions`;
const emb = `${url}/v1/embeddings`;
const user = [{ role: "user", content: "hi" }];

serverTest("GET /health answers 200 without a key", async () => {
  const res = await fetch(`${url}/health`);
  assert.equal(res.status, 200);
  assert.equal((await res.json()).status, "ok");
});

serverTest(
  "JSON answers and errors carry a content-length (sent whole, not chunked)",
  async () => {
    for (const res of [await fetch(`${url}/health`), await fetch(`${url}/v2/nothing`)]) {
      const text = await res.text();
      assert.equal(res.headers.get("content-length"), String(new TextEncoder().encode(text).length));
      assert.equal(res.headers.get("transfer-encoding"), null);
    }
  },
);

serverTest("unknown path is 404 with an OpenAI error body", async () => {
  const res = await fetch(`${url}/v2/nothing`, { headers: { authorization: `Bearer ${KEY}` } });
  assertApiError({ status: res.status, body: await res.json() }, 404, { code: "unknown_url" });
});

serverTest("wrong method is 405 with Allow and an OpenAI error body", async () => {
  const res = await fetch(chat, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(res.headers.get("allow"), "POST");
  assertApiError({ status: res.status, body: await res.json() }, 405, { code: "method_not_allowed" });
});

serverTest("no Authorization header is 401 invalid_api_key", async () => {
  const res = await postJson(chat, { model: "m", messages: user }, null);
  assertApiError(res, 401, { type: "invalid_request_error", code: "invalid_api_key" });
});

serverTest("a non-Bearer scheme is 401", async () => {
  const res = await postJson(chat, { model: "m", messages: user }, null, {
    authorization: `Basic ${btoa("a:b")}`,
  });
  assertApiError(res, 401, { code: "invalid_api_key" });
  assert.match(res.body.error.message, /Bearer/);
});

serverTest("a wrong key is 401 and the message does not echo the key", async () => {
  const res = await postJson(chat, { model: "m", messages: user }, "sk-wrong-secret");
  assertApiError(res, 401, { code: "invalid_api_key" });
  assert.ok(!res.body.error.message.includes("sk-wrong-secret"));
});

serverTest("every configured key is accepted", async () => {
  for (const key of [KEY, "second-key"]) {
    const res = await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(res.status, 200);
    await res.body?.cancel();
  }
});

serverTest("GET /v1/models needs a key", async () => {
  const res = await fetch(`${url}/v1/models`);
  assertApiError({ status: res.status, body: await res.json() }, 401, { code: "invalid_api_key" });
});

serverTest("malformed JSON is 400 invalid_request_error", async () => {
  const res = await postJson(chat, '{"model": "m", "messages": [', KEY);
  assertApiError(res, 400, { type: "invalid_request_error", code: "invalid_json" });
});

serverTest("a JSON body that is not an object is 400", async () => {
  assertApiError(await postJson(chat, "[1,2]", KEY), 400, { code: "invalid_json" });
});

serverTest("an empty body is 400", async () => {
  assertApiError(await postJson(chat, "", KEY), 400);
});

serverTest("invalid UTF-8 in the body is 400", async () => {
  const res = await fetch(chat, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]),
  });
  assertApiError({ status: res.status, body: await res.json() }, 400, { code: "invalid_json" });
});

serverTest("a non-JSON content type is 415", async () => {
  const res = await fetch(chat, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: "m", messages: user }),
  });
  const body = await res.json();
  assertApiError({ status: res.status, body }, 415, { code: "unsupported_media_type" });
  assert.match(body.error.message, /application\/json/);
});

serverTest("a body over the limit is 413", async () => {
  const res = await postJson(emb, { model: "m", input: "x".repeat(70_000) }, KEY);
  assertApiError(res, 413, { code: "request_too_large" });
});

serverTest("an unknown model is 404 model_not_found with param model", async () => {
  assertApiError(await postJson(emb, { model: "no/such-model", input: "a" }), 404, {
    code: "model_not_found",
    param: "model",
  });
  assertApiError(await postJson(chat, { model: "no/such-model", messages: user }), 404, {
    code: "model_not_found",
  });
  const res = await fetch(`${url}/v1/models/no/such-model`, { headers: { authorization: `Bearer ${KEY}` } });
  assertApiError({ status: res.status, body: await res.json() }, 404, { code: "model_not_found" });
});

serverTest("a model id like ../../etc/passwd is just an unknown model", async () => {
  assertApiError(await postJson(emb, { model: "../../etc/passwd", input: "a" }), 404, {
    code: "model_not_found",
  });
});

const zodCases: [string, string, unknown, string][] = [
  ["missing model", chat, { messages: user }, "model"],
  ["model of the wrong type", emb, { model: 5, input: "a" }, "model"],
  ["missing messages", chat, { model: "m" }, "messages"],
  ["empty messages", chat, { model: "m", messages: [] }, "messages"],
  [
    "unknown role",
    chat,
    { model: "m", messages: [...user, user[0], { role: "wizard", content: "x" }] },
    "messages[2].role",
  ],
  [
    "content of the wrong type",
    chat,
    { model: "m", messages: [{ role: "user", content: 7 }] },
    "messages[0].content",
  ],
  ["non-text content part", chat, {
    model: "m",
    messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }],
  }, "messages[0].content"],
  [
    "tool message without tool_call_id",
    chat,
    { model: "m", messages: [{ role: "tool", content: "1" }] },
    "messages[0].tool_call_id",
  ],
  ["temperature above 2", chat, { model: "m", messages: user, temperature: 3 }, "temperature"],
  ["top_p as a string", chat, { model: "m", messages: user, top_p: "0.5" }, "top_p"],
  ["max_tokens not an integer", chat, { model: "m", messages: user, max_tokens: 1.5 }, "max_tokens"],
  ["max_tokens zero", chat, { model: "m", messages: user, max_tokens: 0 }, "max_tokens"],
  ["stream not a boolean", chat, { model: "m", messages: user, stream: "yes" }, "stream"],
  ["five stop sequences", chat, { model: "m", messages: user, stop: ["a", "b", "c", "d", "e"] }, "stop"],
  ["bad tool_choice", chat, { model: "m", messages: user, tool_choice: "always" }, "tool_choice"],
  ["tool with a bad function name", chat, {
    model: "m",
    messages: user,
    tools: [{ type: "function", function: { name: "has space" } }],
  }, "tools[0].function.name"],
  [
    "unknown response_format type",
    chat,
    { model: "m", messages: user, response_format: { type: "xml" } },
    "response_format.type",
  ],
  ["json_schema without json_schema", chat, {
    model: "m",
    messages: user,
    response_format: { type: "json_schema" },
  }, "response_format.json_schema"],
  ["enable_thinking not a boolean", chat, {
    model: "m",
    messages: user,
    chat_template_kwargs: { enable_thinking: "no" },
  }, "chat_template_kwargs.enable_thinking"],
  [
    "presence_penalty out of range",
    chat,
    { model: "m", messages: user, presence_penalty: 5 },
    "presence_penalty",
  ],
  [
    "logit_bias out of range",
    chat,
    { model: "m", messages: user, logit_bias: { "42": 500 } },
    "logit_bias.42",
  ],
  ["input of the wrong type", emb, { model: "m", input: { text: "a" } }, "input"],
  ["input mixing strings and ids", emb, { model: "m", input: ["a", 1] }, "input"],
  ["dimensions not an integer", emb, { model: "m", input: "a", dimensions: 64.5 }, "dimensions"],
  ["unknown encoding_format", emb, { model: "m", input: "a", encoding_format: "int8" }, "encoding_format"],
];
for (const [what, endpoint, body, param] of zodCases) {
  serverTest(`schema: ${what} is 400 with param ${param}`, async () => {
    const res = await postJson(endpoint, body);
    assertApiError(res, 400, { type: "invalid_request_error", param });
  });
}

serverTest(
  "unknown fields and nulls for optional fields are accepted (only the model is unknown)",
  async () => {
    const res = await postJson(chat, {
      model: "no/such-model",
      messages: user,
      logit_bias_extra: { x: 1 },
      stop: null,
      temperature: null,
      reasoning_effort: "high",
    });
    assertApiError(res, 404, { code: "model_not_found" });
  },
);

serverTest("x-request-id is echoed, and generated when absent", async () => {
  const given = await fetch(`${url}/health`, { headers: { "x-request-id": "abc-123" } });
  await given.body?.cancel();
  assert.equal(given.headers.get("x-request-id"), "abc-123");
  const made = await fetch(`${url}/health`);
  await made.body?.cancel();
  assert.match(made.headers.get("x-request-id") ?? "", /^req-/);
});

serverTest("keys never appear in the log", () => {
  const text = server.logs.join("\n");
  assert.ok(!text.includes(KEY) && !text.includes("sk-wrong-secret"));
  assert.ok(text.includes('"msg":"request"'), "requests are logged");
  return Promise.resolve();
});

serverTest("CORS is off unless origins are configured", async () => {
  const res = await fetch(`${url}/v1/models`, {
    headers: { authorization: `Bearer ${KEY}`, origin: "https://evil.example" },
  });
  await res.body?.cancel();
  assert.equal(res.headers.get("access-control-allow-origin"), null);
});

Deno.test({
  name: "plain HTTP on a non-loopback address starts with a warning",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const s = await startServer(["--host", "0.0.0.0", "--api-key", "k"]);
    await s.stop();
    assert.ok(s.logs.some((l) => l.includes("serving plain HTTP on a non-loopback address")));
  },
});

Deno.test("no key on a non-loopback address refuses to start", async () => {
  const out = await runMain(["--host", "0.0.0.0", "--port", "0"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /--no-auth/);
});

Deno.test("an invalid setting exits non-zero naming it", async () => {
  const out = await runMain(["--port", "http"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /--port/);
  const env = await runMain([], { VSERVE_GPU: "tpu" });
  assert.equal(env.code, 2);
  assert.match(env.stderr, /VSERVE_GPU/);
});

Deno.test("--help lists flags with their env names and defaults", async () => {
  const out = await runMain(["--help"]);
  assert.equal(out.code, 0);
  assert.match(out.stdout, /--api-key VALUE\s+\(env VSERVE_API_KEY\)/);
  assert.match(out.stdout, /\[default: 8080\]/);
});
