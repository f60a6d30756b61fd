/**
 * The rest of the OpenAI surface real clients rely on, through a real server and the official SDK:
 * schemas that zod and pydantic emit (enforced, and valid on every run), logprobs, n, the
 * developer role, CORS for the browser SDK, legacy completions, tokenize / detokenize, version.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { postStream } from "./helpers/sse.ts";
import { engineCounter as engineCounterOf } from "./helpers/metrics.ts";
import { poll } from "./helpers/poll.ts";
import { checkSchema } from "./helpers/schema.ts";
import { JsonGrammar } from "../src/grammar/mod.ts";
import { ChatChunkSchema, ChatCompletionSchema } from "../src/protocol/chat.ts";
import { CompletionRequestSchema, CompletionSchema } from "../src/protocol/completions.ts";
import { createCompletion } from "../src/services/completions.ts";
import { ApiError } from "../src/http/errors.ts";
import type { ChatEngine } from "../src/engines/types.ts";
import { silentLogger } from "../src/log.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const ORIGIN = "https://app.example.com";
const server = await startServer(["--api-key", KEY, "--parallel", "8", "--cors-origin", ORIGIN], {
  waitReady: true,
});
globalThis.addEventListener("unload", () => void server.stop());
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
const url = (path: string) => `${server.url}${path}`;
const OFF = { chat_template_kwargs: { enable_thinking: false } };
const user = (content: string) => [{ role: "user" as const, content }];

function create(body: Record<string, unknown>): Promise<Json> {
  return client.chat.completions.create(body as never) as Promise<Json>;
}

const fixture = async (name: string) =>
  JSON.parse(await Deno.readTextFile(new URL(`./fixtures/schemas/${name}`, import.meta.url)));
const zodFormat = await fixture("zod_order_response_format.json");
const zodFunction = await fixture("zod_order_function.json");
const pydantic = await fixture("pydantic_order.json");

/** The keywords of a schema the grammar leaves to the output check (none: it enforces all of them). */
function leftToCheck(schema: Json): string[] {
  const g = new JsonGrammar();
  g.schema(schema, "response_format", "out");
  return [...g.validated].sort();
}

/**
 * The faults of the output check that made the server generate request `id`'s answer again (read
 * once the request's access-log line is in: the log is one ordered stream).
 */
async function regenerations(id: string | null): Promise<string[]> {
  const entries = () =>
    server.logs.filter((line) => line.startsWith("{")).map((line) => JSON.parse(line))
      .filter((e) => e.request_id === id);
  await poll(`request ${id} was logged`, () => entries().some((e) => e.msg === "request"));
  return entries().filter((e) => e.msg === "the output failed its schema; generating it again")
    .map((e) => String(e.fault));
}

const SEEDS = [1, 2, 3, 4];

/**
 * Every seed of a structured request finishes within max_tokens and validates, and no answer needed
 * the server's regeneration: the grammar enforced the schema, the output check never caught anything
 * (except faults matching `checked`, for keywords the grammar leaves to the check).
 */
async function structured(
  schema: Json,
  body: (seed: number) => Record<string, unknown>,
  read: (r: Json) => string,
  checked?: RegExp,
) {
  for (const seed of SEEDS) {
    const res = await postJson(url("/v1/chat/completions"), body(seed), KEY);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    const choice = res.body.choices[0];
    assert.notEqual(choice.finish_reason, "length", `seed ${seed} finished within max_tokens`);
    const value = JSON.parse(read(res.body));
    const check = await checkSchema(schema, value);
    assert.ok(check.ok, `seed ${seed}: ${JSON.stringify(value)}: ${(check as { reason?: string }).reason}`);
    const faults = await regenerations(res.headers.get("x-request-id"));
    assert.ok(
      faults.every((f) => checked?.test(f)),
      `seed ${seed}: the grammar let through output the check caught: ${faults.join("; ")}`,
    );
  }
}

// A random model rarely closes a free string or an e-mail address: logit_bias favours '"' (1), '@' (31),
// '.' (13), '}' (92) and ']' (60); for XML calls also '\n' (198), which ends a raw parameter value.
const CLOSE = { logit_bias: { "1": 17, "31": 16, "13": 14, "92": 4, "60": 4 } };
const CLOSE_XML = { logit_bias: { ...CLOSE.logit_bias, "198": 17 } };
// Pydantic's schema has no e-mail pattern; a milder bias keeps its unique tags from all being "".
const CLOSE_MILD = { logit_bias: { "1": 8, "92": 4, "60": 4 } };

serverTest(
  "zodResponseFormat (zod 4): ints at ±2^53−1, uuid, email, enum, union, nested list — enforced",
  async () => {
    const schema = zodFormat.json_schema.schema;
    assert.deepEqual(leftToCheck(schema), [], "every keyword is grammar-enforced");
    await structured(schema, (seed) => ({
      model: MODEL,
      messages: user("An order, please"),
      response_format: zodFormat,
      max_tokens: 1500,
      seed,
      ...OFF,
      ...CLOSE,
    }), (r) => r.choices[0].message.content);
  },
);

serverTest(
  "pydantic v2: ge/le/gt, UUID, EmailStr, Decimal pattern, set (uniqueItems), discriminated union",
  async () => {
    // The discriminated union (oneOf over $refs, const tags) is grammar-enforced; only the set is checked.
    assert.deepEqual(leftToCheck(pydantic), ["uniqueItems"]);
    await structured(
      pydantic,
      (seed) => ({
        model: MODEL,
        messages: user("An order, please"),
        response_format: {
          type: "json_schema",
          json_schema: { name: "order", schema: pydantic, strict: true },
        },
        max_tokens: 1500,
        seed,
        ...OFF,
        ...CLOSE_MILD,
      }),
      (r) => r.choices[0].message.content,
      /duplicate items/,
    );
  },
);

serverTest("zodFunction: a named call's arguments follow the zod schema", async () => {
  assert.deepEqual(leftToCheck(zodFunction.function.parameters), []);
  await structured(zodFunction.function.parameters, (seed) => ({
    model: MODEL,
    messages: user("Create an order"),
    tools: [zodFunction],
    tool_choice: { type: "function", function: { name: "create_order" } },
    parallel_tool_calls: false,
    max_tokens: 1500,
    seed,
    ...OFF,
    ...CLOSE_XML,
  }), (r) => r.choices[0].message.tool_calls[0].function.arguments);
});

serverTest("output the check catches is generated again, each time logged, and never returned", async () => {
  // The grammar can only write ["a", "a"]; uniqueItems, left to the check, rejects it every time.
  const schema = { type: "array", items: { const: "a" }, minItems: 2, maxItems: 2, uniqueItems: true };
  const res = await postJson(url("/v1/chat/completions"), {
    model: MODEL,
    messages: user("Two"),
    response_format: { type: "json_schema", json_schema: { name: "pair", schema } },
    max_tokens: 40,
    ...OFF,
  }, KEY);
  // Not a server fault (a 500): the schema admits no value the grammar lets the model write.
  assertApiError(res, 422, { code: "invalid_output", param: "response_format.json_schema.schema" });
  const faults = await regenerations(res.headers.get("x-request-id"));
  assert.equal(faults.length, 2, "three attempts: two regenerations logged, then the error");
  assert.ok(faults.every((f) => /duplicate items/.test(f)), faults.join("; "));
});

serverTest("a schema the output check could not compile is a 400 naming the keyword", async () => {
  const res = await postJson(url("/v1/chat/completions"), {
    model: MODEL,
    messages: user("x"),
    response_format: {
      type: "json_schema",
      json_schema: { name: "x", schema: { type: "array", items: { type: "string" }, not: { pattern: "[" } } },
    },
    max_tokens: 4,
  }, KEY);
  assertApiError(res, 400, { code: "invalid_schema", param: "response_format.json_schema.schema" });
  assert.match(res.body.error.message, /'pattern' at #\/not/);
});

serverTest("a strict tool whose schema cannot be enforced is a 400 under auto, too", async () => {
  const tools = [{
    type: "function",
    function: {
      name: "f",
      strict: true,
      parameters: { type: "object", properties: { a: { $dynamicRef: "#x" } } },
    },
  }];
  const res = await postJson(url("/v1/chat/completions"), { model: MODEL, messages: user("x"), tools }, KEY);
  assertApiError(res, 400, { code: "unsupported_schema" });
  const lax = await postJson(url("/v1/chat/completions"), {
    model: MODEL,
    messages: user("x"),
    tools: [{ ...tools[0], function: { ...tools[0].function, strict: false } }],
    max_tokens: 2,
  }, KEY);
  assert.equal(lax.status, 200);
});

serverTest("developer role is a system message", async () => {
  const a = await create({
    model: MODEL,
    messages: [{ role: "developer", content: "Be brief." }, ...user("Hi")],
    max_tokens: 2,
    ...OFF,
  });
  const b = await create({
    model: MODEL,
    messages: [{ role: "system", content: "Be brief." }, ...user("Hi")],
    max_tokens: 2,
    ...OFF,
  });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
});

serverTest(
  "logprobs: OpenAI shapes, probabilities of alternatives sum to at most 1, same when streamed",
  async () => {
    const body = {
      model: MODEL,
      messages: user("Say something"),
      max_tokens: 12,
      seed: 5,
      logprobs: true,
      top_logprobs: 5,
      ...OFF,
    };
    const res = await create(body);
    ChatCompletionSchema.strict().parse(res);
    const content = res.choices[0].logprobs.content;
    assert.equal(content.length, 12);
    for (const t of content) {
      assert.equal(typeof t.token, "string");
      assert.ok(t.logprob <= 0);
      assert.ok(Array.isArray(t.bytes) && t.bytes.every((b: number) => b >= 0 && b < 256));
      assert.equal(t.top_logprobs.length, 5);
      const sum = t.top_logprobs.reduce((s: number, x: Json) => s + Math.exp(x.logprob), 0);
      assert.ok(sum <= 1 + 1e-6, `sum ${sum}`);
      assert.ok(t.top_logprobs[0].logprob >= t.logprob - 1e-6, "the best alternative is at least as likely");
    }
    // The tokens' bytes spell the content (leading newlines after the template's think block are layout).
    const bytes = new Uint8Array(content.flatMap((t: Json) => t.bytes));
    assert.equal(new TextDecoder().decode(bytes).replace(/^\n+/, ""), res.choices[0].message.content);
    const stream = await create({ ...body, stream: true });
    const streamed: Json[] = [];
    for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
    const plain = await create({ ...body, logprobs: undefined, top_logprobs: undefined });
    assert.equal(plain.choices[0].logprobs, null);
    assert.equal(
      plain.choices[0].message.content,
      res.choices[0].message.content,
      "logprobs do not change sampling",
    );
  },
);

serverTest("n: 4 returns 4 choices in order from one evaluation of the prompt", async () => {
  const before = await engineCounter("prompt_tokens_evaluated");
  const res = await create({
    model: MODEL,
    messages: user("Four ways"),
    n: 4,
    max_tokens: 8,
    seed: 3,
    cache_prompt: false,
    ...OFF,
  });
  assert.deepEqual(res.choices.map((c: Json) => c.index), [0, 1, 2, 3]);
  assert.ok(new Set(res.choices.map((c: Json) => c.message.content)).size > 1, "different choices");
  const evaluated = (await engineCounter("prompt_tokens_evaluated")) - before;
  assert.equal(evaluated, res.usage.prompt_tokens, "the prompt ran through the model once, not four times");
  assert.equal(res.usage.completion_tokens, 32);
  const events = await sse({
    model: MODEL,
    messages: user("Two"),
    n: 2,
    max_tokens: 4,
    seed: 3,
    stream: true,
    ...OFF,
  });
  const indexes = new Set(events.flatMap((e: Json) => e.choices.map((c: Json) => c.index)));
  assert.deepEqual([...indexes].sort(), [0, 1]);
  assert.equal(events.filter((e: Json) => e.choices[0]?.finish_reason).length, 2);
});

serverTest("usage details: cached prompt tokens and reasoning tokens", async () => {
  const messages = [{ role: "system", content: "A long shared instruction. ".repeat(150) }, ...user("First")];
  await create({ model: MODEL, messages, max_tokens: 1, ...OFF });
  const again = await create({ model: MODEL, messages, max_tokens: 1, ...OFF });
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0);
  const thinking = await create({ model: MODEL, messages: user("Think"), max_tokens: 6 });
  assert.equal(
    thinking.usage.completion_tokens_details.reasoning_tokens,
    6,
    "the spec model thinks by default",
  );
});

serverTest("a forced call cut by max_tokens ends with length and leaks no markup", async () => {
  // Cut inside the opening tag, and inside the arguments.
  for (const max_tokens of [3, 12]) {
    const res = await create({
      model: MODEL,
      messages: user("Create an order"),
      tools: [zodFunction],
      tool_choice: { type: "function", function: { name: "create_order" } },
      max_tokens,
      seed: 1,
      ...OFF,
    });
    const choice = res.choices[0];
    assert.equal(choice.finish_reason, "length");
    assert.ok(!choice.message.content, `max_tokens ${max_tokens}: ${JSON.stringify(choice.message)}`);
  }
});

serverTest("audio output is refused with a 400; system_fingerprint is set", async () => {
  const res = await postJson(url("/v1/chat/completions"), {
    model: MODEL,
    messages: user("x"),
    modalities: ["text", "audio"],
    audio: { voice: "alloy", format: "wav" },
  }, KEY);
  assertApiError(res, 400, { param: "audio", code: "unsupported_value" });
  const ok = await create({ model: MODEL, messages: user("x"), max_tokens: 1, ...OFF });
  assert.match(ok.system_fingerprint, /^fp_llamacpp-v0\.4\.0_[0-9a-f]{10}$/);
});

serverTest("CORS: a browser preflight with the SDK's x-stainless-* headers is allowed", async () => {
  const headers =
    "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-package-version";
  const res = await fetch(url("/v1/chat/completions"), {
    method: "OPTIONS",
    headers: {
      origin: ORIGIN,
      "access-control-request-method": "POST",
      "access-control-request-headers": headers,
    },
  });
  await res.body?.cancel();
  assert.equal(res.status, 204);
  assert.equal(res.headers.get("access-control-allow-origin"), ORIGIN);
  assert.equal(res.headers.get("access-control-allow-headers"), headers);
  const other = await fetch(url("/v1/models"), {
    method: "OPTIONS",
    headers: { origin: "https://evil.example" },
  });
  await other.body?.cancel();
  assert.equal(other.headers.get("access-control-allow-origin"), null);
});

serverTest(
  "/v1/completions through the SDK: text, streaming, echo, legacy logprobs, token prompts",
  async () => {
    const res = await client.completions.create(
      { model: MODEL, prompt: "Once upon a time", max_tokens: 6, seed: 2 } as never,
    );
    CompletionSchema.strict().parse(res);
    assert.equal(res.object, "text_completion");
    assert.equal(res.usage?.completion_tokens, 6);
    const stream = await client.completions.create(
      { model: MODEL, prompt: "Once upon a time", max_tokens: 6, seed: 2, stream: true } as never,
    );
    let text = "";
    for await (const chunk of stream as unknown as AsyncIterable<Json>) text += chunk.choices[0]?.text ?? "";
    assert.equal(text, res.choices[0].text);
    const lp = await client.completions.create(
      { model: MODEL, prompt: "Hello there", max_tokens: 4, seed: 2, logprobs: 3, echo: true } as never,
    ) as Json;
    assert.ok(lp.choices[0].text.startsWith("Hello there"));
    const l = lp.choices[0].logprobs;
    assert.equal(l.tokens.length, l.token_logprobs.length);
    assert.equal(l.token_logprobs[0], null, "the first prompt token has no logprob");
    assert.equal(l.tokens.join(""), lp.choices[0].text);
    assert.ok(
      l.top_logprobs.slice(1).every((t: Json) => Object.keys(t).length >= 1 && Object.keys(t).length <= 3),
    );
    // lm-eval-harness' loglikelihood: the prompt's logprobs alone.
    const ll = await postJson(url("/v1/completions"), {
      model: MODEL,
      prompt: "The cat sat",
      max_tokens: 0,
      echo: true,
      logprobs: 0,
    }, KEY);
    assert.equal(ll.status, 200);
    assert.equal(ll.body.choices[0].text, "The cat sat");
    assert.equal(ll.body.usage.completion_tokens, 0);
    const ids = await postJson(url("/tokenize"), { model: MODEL, content: "Once upon a time" }, KEY);
    const byIds = await postJson(url("/v1/completions"), {
      model: MODEL,
      prompt: ids.body.tokens,
      max_tokens: 6,
      seed: 2,
    }, KEY);
    assert.equal(byIds.body.choices[0].text, res.choices[0].text);
    const many = await postJson(url("/v1/completions"), {
      model: MODEL,
      prompt: ["a", "b"],
      n: 2,
      max_tokens: 2,
    }, KEY);
    assert.deepEqual(many.body.choices.map((c: Json) => c.index), [0, 1, 2, 3]);
  },
);

serverTest("/v1/completions: suffix uses the vocabulary's fill-in-the-middle tokens", async () => {
  const res = await postJson(url("/v1/completions"), {
    model: MODEL,
    prompt: "def f(x):",
    suffix: "return y",
    max_tokens: 4,
  }, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  const plain = await postJson(url("/v1/completions"), {
    model: MODEL,
    prompt: "def f(x):return y",
    max_tokens: 1,
  }, KEY);
  assert.equal(
    res.body.usage.prompt_tokens,
    plain.body.usage.prompt_tokens + 3,
    "three FIM tokens around the parts",
  );
});

serverTest("/v1/completions: stop ends the text before the stop sequence, streamed or not", async () => {
  const req = { model: MODEL, prompt: "Once upon a time", max_tokens: 30, seed: 4 };
  const full: string = (await postJson(url("/v1/completions"), req, KEY)).body.choices[0].text;
  const chars = Array.from(full);
  assert.ok(chars.length > 12, `need text to cut: ${JSON.stringify(full)}`);
  const stop = chars.slice(8, 11).join("");
  const expected = full.slice(0, full.indexOf(stop));
  const cut = await postJson(url("/v1/completions"), { ...req, stop: ["\u0000never", stop] }, KEY);
  assert.equal(cut.status, 200, JSON.stringify(cut.body));
  assert.equal(cut.body.choices[0].text, expected);
  assert.equal(cut.body.choices[0].finish_reason, "stop");
  assert.ok(cut.body.usage.completion_tokens < 30);
  const stream = await client.completions.create({ ...req, stop, stream: true } as never);
  let text = "";
  let finish: string | null = null;
  for await (const chunk of stream as unknown as AsyncIterable<Json>) {
    text += chunk.choices[0]?.text ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, expected);
  assert.equal(finish, "stop");
});

Deno.test("/v1/completions: suffix on a model without fill-in-the-middle tokens is a 400, before generating", async () => {
  let generated = false;
  const engine = {
    fim: undefined,
    vocabSize: 1000,
    tokenize: (text: string) => Array.from(text, (c) => c.charCodeAt(0) % 1000),
    detokenize: () => "",
    generate: () => {
      generated = true;
      throw new Error("generation must not start");
    },
  } as unknown as ChatEngine;
  const req = CompletionRequestSchema.parse({ model: "m", prompt: "def f(x):", suffix: "return y" });
  const ctx = { created: 0, signal: new AbortController().signal, log: silentLogger, requestId: "r" };
  await assert.rejects(
    createCompletion(req, engine, ctx),
    (e: unknown) =>
      e instanceof ApiError && e.status === 400 && e.param === "suffix" && e.code === "unsupported_value",
  );
  assert.equal(generated, false);
});

serverTest("n counts against admission as n sequences, in chat and legacy completions", async () => {
  const dir = await Deno.makeTempDir();
  const models = `${dir}/models.json`;
  await Deno.writeTextFile(
    models,
    JSON.stringify({
      models: [{ id: "tiny", kind: "chat", source: "builtin:tiny-chat", contextSize: 8192, parallel: 2 }],
    }),
  );
  // Two sequences and one place in the queue.
  const small = await startServer(["--api-key", KEY, "--models", models, "--max-queue", "1"], {
    waitReady: true,
  });
  try {
    const inFlight = async () =>
      (await (await fetch(`${small.url}/health`)).json()).models.find((m: Json) => m.id === "tiny").in_flight;
    const chat = (body: Record<string, unknown>) =>
      fetch(`${small.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ model: "tiny", messages: user("Go on"), ...OFF, ...body }),
      });
    // A long n: 2 stream (the end tokens banned) holds both sequences.
    const busy = await chat({
      n: 2,
      max_tokens: 6000,
      stream: true,
      logit_bias: { "151643": -100, "151645": -100 },
    });
    assert.equal(busy.status, 200);
    const reader = busy.body!.getReader();
    await reader.read();
    assert.equal(await inFlight(), 2, "n: 2 holds two sequences");
    // 2 + 2 is over 2 sequences + 1 queued; so are two prompts, or one prompt with n: 2.
    const two = await chat({ n: 2, max_tokens: 1 });
    assertApiError({ status: two.status, body: await two.json() }, 429, { code: "queue_full" });
    const complete = (body: Record<string, unknown>) =>
      postJson(`${small.url}/v1/completions`, { model: "tiny", max_tokens: 1, ...body }, KEY);
    assertApiError(await complete({ prompt: ["a", "b"] }), 429, { code: "queue_full" });
    assertApiError(await complete({ prompt: "a", n: 2 }), 429, { code: "queue_full" });
    // One more sequence fits the queue.
    const one = chat({ max_tokens: 1 });
    await poll("n: 1 waits in the queue", async () => await inFlight() === 3);
    await reader.cancel();
    const answered = await one;
    assert.equal(answered.status, 200);
    await answered.body?.cancel();
    const again = await chat({ n: 2, max_tokens: 1 });
    assert.equal(again.status, 200, "the sequences are free again");
    await again.body?.cancel();
  } finally {
    await small.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

serverTest("/tokenize and /detokenize round trip; messages go through the chat template", async () => {
  const text = "Hola, ¿qué tal? 你好 🙂";
  const t = await postJson(url("/tokenize"), { model: MODEL, content: text, with_pieces: true }, KEY);
  assert.equal(t.status, 200);
  assert.equal(t.body.count, t.body.tokens.length);
  const ids = t.body.tokens.map((p: Json) => p.id);
  const d = await postJson(url("/detokenize"), { model: MODEL, tokens: ids }, KEY);
  assert.equal(d.body.content, text);
  assert.equal(d.body.prompt, text);
  const m = await postJson(url("/tokenize"), { model: MODEL, messages: user("Hi"), ...OFF }, KEY);
  assert.match(
    m.body.prompt,
    /^<\|im_start\|>user\nHi<\|im_end\|>\n<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n$/,
  );
  assert.equal(
    m.body.count,
    (await postJson(url("/tokenize"), { model: MODEL, content: m.body.prompt }, KEY)).body.count,
  );
  const e = await postJson(
    url("/v1/tokenize"),
    { model: "Vendor/Vendor3-Embedding-8B", prompt: "hello" },
    KEY,
  );
  assert.equal(e.status, 200);
  assertApiError(await postJson(url("/detokenize"), { model: MODEL, tokens: [999999999] }, KEY), 400, {
    param: "tokens[0]",
  });
});

serverTest("GET /version names the server and its engines", async () => {
  const v = await (await fetch(url("/version"))).json();
  assert.equal(v.name, "vserve");
  assert.equal(v.engines["node-llama-cpp"], "3.21.1");
});

const engineCounter = (name: string) => engineCounterOf(server.url, name, MODEL);

async function sse(body: Record<string, unknown>): Promise<Json[]> {
  const { data } = await postStream(url("/v1/chat/completions"), body, { key: KEY });
  return data.filter((d) => d !== "[DONE]").map((d) => ChatChunkSchema.parse(d));
}
