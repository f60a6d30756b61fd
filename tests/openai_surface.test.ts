/**
 * The rest of the OpenAI surface real clients rely on, through a real server and the official SDK:
 * schemas that zod and pydantic emit (enforced, and valid on every run), logprobs, n, the
 * developer role, CORS for the browser SDK, legacy completions, tokenize / detokenize, version.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { checkAgainstSchema } from "../src/services/schema_check.ts";
import { ChatChunkSchema, ChatCompletionSchema } from "../src/protocol/chat.ts";
import { CompletionSchema } from "../src/protocol/completions.ts";

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

/** Several seeds of a structured request; every finished answer must validate. Returns how many finished. */
async function structured(
  schema: Json,
  body: (seed: number) => Record<string, unknown>,
  read: (r: Json) => string,
) {
  let finished = 0;
  for (let seed = 1; seed <= 6 && finished < 3; seed++) {
    const res = await postJson(url("/v1/chat/completions"), body(seed), KEY);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    const choice = res.body.choices[0];
    if (choice.finish_reason === "length") continue;
    const value = JSON.parse(read(res.body));
    const check = checkAgainstSchema(schema, value);
    assert.ok(check.ok, `seed ${seed}: ${JSON.stringify(value)}: ${(check as { reason?: string }).reason}`);
    finished++;
  }
  assert.ok(finished >= 2, `at least two seeds finished within max_tokens (${finished})`);
}

// A random model rarely closes a free string or an e-mail address: logit_bias favours '"' (1), '@' (31),
// '.' (13), '}' (92) and ']' (60); for XML calls also '\n' (198), which ends a raw parameter value.
const CLOSE = { logit_bias: { "1": 17, "31": 16, "13": 14, "92": 4, "60": 4 } };
const CLOSE_XML = { logit_bias: { ...CLOSE.logit_bias, "198": 17 } };
// Pydantic's schema has no e-mail pattern; a milder bias keeps its unique tags from all being "".
const CLOSE_MILD = { logit_bias: { "1": 6, "92": 4, "60": 4 } };

serverTest(
  "zodResponseFormat (zod 4): ints at ±2^53−1, uuid, email, enum, union, nested list — enforced",
  async () => {
    const schema = zodFormat.json_schema.schema;
    await structured(schema, (seed) => ({
      model: MODEL,
      messages: user("An order, please"),
      response_format: zodFormat,
      max_tokens: 700,
      seed,
      ...OFF,
      ...CLOSE,
    }), (r) => r.choices[0].message.content);
  },
);

serverTest(
  "pydantic v2: ge/le/gt, UUID, EmailStr, Decimal pattern, set (uniqueItems), discriminated union",
  async () => {
    await structured(pydantic, (seed) => ({
      model: MODEL,
      messages: user("An order, please"),
      response_format: {
        type: "json_schema",
        json_schema: { name: "order", schema: pydantic, strict: true },
      },
      max_tokens: 800,
      seed,
      ...OFF,
      ...CLOSE_MILD,
    }), (r) => r.choices[0].message.content);
  },
);

serverTest("zodFunction: a named call's arguments follow the zod schema", async () => {
  await structured(zodFunction.function.parameters, (seed) => ({
    model: MODEL,
    messages: user("Create an order"),
    tools: [zodFunction],
    tool_choice: { type: "function", function: { name: "create_order" } },
    parallel_tool_calls: false,
    max_tokens: 700,
    seed,
    ...OFF,
    ...CLOSE_XML,
  }), (r) => r.choices[0].message.tool_calls[0].function.arguments);
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
  const res = await create({
    model: MODEL,
    messages: user("Create an order"),
    tools: [zodFunction],
    tool_choice: { type: "function", function: { name: "create_order" } },
    max_tokens: 12,
    seed: 1,
    ...OFF,
  });
  const choice = res.choices[0];
  assert.equal(choice.finish_reason, "length");
  assert.ok(!(choice.message.content ?? "").includes("<tool_call>"), JSON.stringify(choice.message));
  assert.ok(!(choice.message.content ?? "").includes("<function"));
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

async function engineCounter(name: string): Promise<number> {
  const text = await (await fetch(url("/metrics"))).text();
  const line = text.split("\n").find((l) => l.startsWith(`vserve_engine_${name}_total{model="${MODEL}"}`));
  return Number(line?.split(" ").at(-1) ?? 0);
}

async function sse(body: Record<string, unknown>): Promise<Json[]> {
  const res = await fetch(url("/v1/chat/completions"), {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return text.split("\n\n").filter((e) => e.startsWith("data: {")).map((e) =>
    ChatChunkSchema.parse(JSON.parse(e.slice(6)))
  );
}
