/** POST /v1/chat/completions through a real server process on the generated tiny chat model. */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Ajv } from "ajv";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { ChatChunkSchema, ChatCompletionSchema } from "../src/protocol/chat.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
const url = `${server.url}/v1/chat/completions`;
const ajv = new Ajv({ strict: false });
const user = (content: string) => [{ role: "user" as const, content }];

const weather = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 12 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "integer" },
  },
  required: ["city", "unit", "days"],
  additionalProperties: false,
};
const clock = {
  type: "object",
  properties: { zone: { type: "string", enum: ["UTC", "CET", "JST"] } },
  required: ["zone"],
  additionalProperties: false,
};
const TOOLS = [
  {
    type: "function" as const,
    function: { name: "get_weather", description: "Weather for a city", parameters: weather },
  },
  {
    type: "function" as const,
    function: { name: "get_time", description: "Time in a zone", parameters: clock },
  },
];
const schemaOf: Record<string, object> = { get_weather: weather, get_time: clock };

function assertValidCall(call: { type: string; id: string; function: { name: string; arguments: string } }) {
  assert.equal(call.type, "function");
  assert.match(call.id, /^call_/);
  const args = JSON.parse(call.function.arguments);
  const validate = ajv.compile(schemaOf[call.function.name]);
  assert.ok(
    validate(args),
    `${call.function.name}(${call.function.arguments}): ${ajv.errorsText(validate.errors)}`,
  );
}

/** Raw SSE events of a streamed request. */
async function streamEvents(body: Record<string, unknown>): Promise<string[]> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
  assert.equal(res.headers.get("cache-control"), "no-cache");
  const text = await res.text();
  assert.ok(text.endsWith("data: [DONE]\n\n"), "the stream ends with [DONE]");
  return text.split("\n\n").filter((e) => e !== "" && !e.startsWith(":")).map((e) => {
    assert.ok(e.startsWith("data: "), `event framing: ${e}`);
    return e.slice(6);
  });
}

serverTest("non-stream response has the OpenAI shape and real token counts", async () => {
  const res = await postJson(url, { model: MODEL, messages: user("Hello"), max_tokens: 8, seed: 1 }, KEY);
  assert.equal(res.status, 200);
  const body = ChatCompletionSchema.strict().parse(res.body);
  assert.equal(body.model, MODEL);
  assert.equal(body.choices[0].message.role, "assistant");
  assert.equal(typeof body.choices[0].message.content, "string");
  assert.ok(Math.abs(body.created - Date.now() / 1000) < 60);
  assert.equal(body.usage.completion_tokens, 8);
  assert.ok(body.usage.prompt_tokens > 5);
  assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + 8);
});

serverTest("max_tokens ends with finish_reason length; max_completion_tokens too", async () => {
  const a = await client.chat.completions.create({
    model: MODEL,
    messages: user("Count"),
    max_tokens: 5,
    seed: 2,
  });
  assert.equal(a.choices[0].finish_reason, "length");
  assert.equal(a.usage?.completion_tokens, 5);
  const b = await client.chat.completions.create({
    model: MODEL,
    messages: user("Count"),
    max_completion_tokens: 3,
    seed: 2,
  });
  assert.equal(b.usage?.completion_tokens, 3);
});

serverTest("the same seed and request give the same output", async () => {
  const req = { model: MODEL, messages: user("Tell me a story"), max_tokens: 24, seed: 42, temperature: 0.9 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const c = await client.chat.completions.create({ ...req, seed: 43 });
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

serverTest("stream: chunks share id and created, role first, finish chunk, usage chunk, [DONE]", async () => {
  const events = await streamEvents({
    model: MODEL,
    messages: user("Stream please"),
    max_tokens: 10,
    seed: 3,
    stream_options: { include_usage: true },
  });
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1).map((e) => ChatChunkSchema.strict().parse(JSON.parse(e)));
  assert.ok(chunks.every((c) => c.id === chunks[0].id && c.created === chunks[0].created));
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === MODEL));
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  const usage = chunks.at(-1)!;
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage?.completion_tokens, 10);
  const finish = chunks.at(-2)!;
  assert.equal(finish.choices[0].finish_reason, "length");
  assert.deepEqual(finish.choices[0].delta, {});
  assert.ok(chunks.slice(0, -2).every((c) => c.choices[0].finish_reason === null));
});

serverTest("stream without include_usage has no usage chunk", async () => {
  const events = await streamEvents({ model: MODEL, messages: user("x"), max_tokens: 3, seed: 3 });
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  assert.ok(chunks.every((c: Json) => c.choices.length === 1 && c.usage === undefined));
});

serverTest("stream deltas concatenate to the non-stream content, never splitting a character", async () => {
  const req = { model: MODEL, messages: user("你好！请用中文和表情回答 🙂🎉"), max_tokens: 48, seed: 7 };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true });
  const deltas: string[] = [];
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta?.content;
    if (d) deltas.push(d);
  }
  const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
  for (const d of deltas) assert.ok(!lone.test(d), `a delta splits a surrogate pair: ${JSON.stringify(d)}`);
  assert.equal(deltas.join(""), whole.choices[0].message.content);
  assert.ok(deltas.length > 1);
  assert.ok(
    new TextEncoder().encode(deltas.join("")).length > deltas.join("").length,
    "the sample holds multi-byte characters",
  );
});

serverTest("stop: the output ends before the stop text, which is not returned", async () => {
  const req = { model: MODEL, messages: user("Say things"), max_tokens: 30, seed: 11 };
  const full = (await client.chat.completions.create(req)).choices[0].message.content!;
  const chars = Array.from(full);
  assert.ok(chars.length > 12, `need text to cut: ${JSON.stringify(full)}`);
  const stopText = chars.slice(8, 11).join("");
  const cut = await client.chat.completions.create({ ...req, stop: ["\u0000never", stopText] });
  const expected = full.slice(0, full.indexOf(stopText));
  assert.equal(cut.choices[0].message.content, expected);
  assert.equal(cut.choices[0].finish_reason, "stop");
});

serverTest("a named tool_choice forces exactly one valid call", async () => {
  const res = await client.chat.completions.create({
    model: MODEL,
    messages: user("Weather in Paris?"),
    tools: TOOLS,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    parallel_tool_calls: false,
    max_tokens: 200,
    seed: 5,
  });
  const choice = res.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls?.length, 1);
  const call = choice.message.tool_calls![0] as Json;
  assert.equal(call.function.name, "get_weather");
  assertValidCall(call);
});

serverTest("tool_choice required with parallel calls returns several valid calls", async () => {
  let found: Json;
  for (let seed = 1; seed <= 12 && !found; seed++) {
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: user("Weather and time?"),
      tools: TOOLS,
      tool_choice: "required",
      max_tokens: 400,
      seed,
    });
    const calls = res.choices[0].message.tool_calls ?? [];
    if (res.choices[0].finish_reason !== "tool_calls") continue;
    calls.forEach((c) => assertValidCall(c as never));
    if (calls.length >= 2) found = res;
  }
  assert.ok(found, "some seed produced parallel calls");
  const ids = found.choices[0].message.tool_calls.map((c: Json) => c.id);
  assert.equal(new Set(ids).size, ids.length, "call ids are unique");
});

serverTest(
  "stream: tool-call deltas carry index, id, name, then argument fragments that reassemble",
  async () => {
    const events = await streamEvents({
      model: MODEL,
      messages: user("Time in Tokyo?"),
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_time" } },
      parallel_tool_calls: false,
      max_tokens: 200,
      seed: 9,
    });
    const chunks = events.slice(0, -1).map((e) => ChatChunkSchema.strict().parse(JSON.parse(e)));
    const parts = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    assert.ok(parts.length >= 2);
    assert.equal(parts[0].index, 0);
    assert.match(parts[0].id ?? "", /^call_/);
    assert.equal(parts[0].type, "function");
    assert.equal(parts[0].function.name, "get_time");
    assert.ok(parts.slice(1).every((p) => p.id === undefined && p.function.name === undefined));
    const args = parts.map((p) => p.function.arguments ?? "").join("");
    assertValidCall({ type: "function", id: parts[0].id!, function: { name: "get_time", arguments: args } });
    assert.equal(chunks.at(-1)!.choices[0].finish_reason, "tool_calls");
  },
);

serverTest(
  "tool_choice auto: a call the model opens is finished under the tool grammar (logit_bias)",
  async () => {
    // logit_bias pushes <tool_call> (id 151657) so that the random model opens a call by itself.
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: user("Weather?"),
      tools: TOOLS,
      parallel_tool_calls: false,
      max_tokens: 300,
      seed: 2,
      logit_bias: { "151657": 100 },
    });
    const choice = res.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.tool_calls?.length, 1);
    for (const call of choice.message.tool_calls!) assertValidCall(call as Json);
    const plain = await client.chat.completions.create({
      model: MODEL,
      messages: user("Weather?"),
      tools: TOOLS,
      max_tokens: 8,
      seed: 2,
    });
    assert.equal(plain.choices[0].message.tool_calls, undefined, "without the bias the model writes text");
  },
);

serverTest(
  "tool_choice auto with a schema the grammar cannot enforce still answers (no grammar)",
  async () => {
    const tools = [{
      type: "function" as const,
      function: {
        name: "count",
        parameters: { type: "object", properties: { n: { type: "integer", minimum: 1 } } },
      },
    }];
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: user("Count"),
      tools,
      max_tokens: 4,
      seed: 1,
    });
    assert.equal(res.choices[0].finish_reason, "length");
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL,
        messages: user("Count"),
        tools,
        tool_choice: "required",
      }),
      (e: Error & { status?: number }) => e.status === 400 && /minimum/.test(e.message),
    );
  },
);

serverTest("tool_choice none gives no calls and leaves the tools out of the prompt", async () => {
  const base = { model: MODEL, messages: user("Hi"), max_tokens: 4, seed: 1 };
  const none = await client.chat.completions.create({ ...base, tools: TOOLS, tool_choice: "none" });
  const plain = await client.chat.completions.create(base);
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.usage?.prompt_tokens, plain.usage?.prompt_tokens);
  const auto = await client.chat.completions.create({ ...base, tools: TOOLS });
  assert.ok(auto.usage!.prompt_tokens > plain.usage!.prompt_tokens + 50, "auto renders the tools");
});

serverTest("json_object output is a JSON object", async () => {
  let parsed: unknown;
  for (let seed = 1; seed <= 12 && parsed === undefined; seed++) {
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: user("Reply in JSON"),
      response_format: { type: "json_object" },
      max_tokens: 120,
      seed,
    });
    if (res.choices[0].finish_reason === "stop") parsed = JSON.parse(res.choices[0].message.content!);
  }
  assert.ok(parsed !== undefined, "some seed finished within max_tokens");
  assert.ok(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed));
});

serverTest("json_schema output validates against the schema", async () => {
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 10 },
      mood: { enum: ["happy", "sad"] },
      score: { type: "number" },
      tags: { type: "array", items: { type: "string", maxLength: 5 }, maxItems: 3 },
    },
    required: ["name", "mood", "score", "tags"],
    additionalProperties: false,
  };
  const validate = ajv.compile(schema);
  for (const seed of [1, 2, 3]) {
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: user("Describe yourself"),
      response_format: { type: "json_schema", json_schema: { name: "profile", schema, strict: true } },
      max_tokens: 200,
      seed,
    });
    assert.equal(res.choices[0].finish_reason, "stop");
    const value = JSON.parse(res.choices[0].message.content!);
    assert.ok(validate(value), ajv.errorsText(validate.errors));
  }
});

serverTest("a schema keyword the grammar cannot enforce is 400 naming it", async () => {
  const res = await postJson(url, {
    model: MODEL,
    messages: user("x"),
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "s",
        schema: { type: "object", properties: { id: { type: "string", pattern: "^a" } } },
      },
    },
  }, KEY);
  assertApiError(res, 400, { code: "unsupported_schema", param: "response_format.json_schema.schema" });
  assert.match(res.body.error.message, /'pattern'/);
});

serverTest(
  "thinking off adds the template's empty think block; thinking never leaks into content",
  async () => {
    const base = { model: MODEL, messages: user("Think?"), max_tokens: 6, seed: 4 };
    const off = await postJson(url, { ...base, chat_template_kwargs: { enable_thinking: false } }, KEY);
    const on = await postJson(url, { ...base, chat_template_kwargs: { enable_thinking: true } }, KEY);
    const dflt = await postJson(url, base, KEY);
    assert.equal(off.status, 200);
    // "<think>\n\n</think>\n\n" is 4 tokens in the Qwen3 vocabulary.
    assert.equal(off.body.usage.prompt_tokens, on.body.usage.prompt_tokens + 4);
    assert.equal(dflt.body.usage.prompt_tokens, off.body.usage.prompt_tokens, "the registry default is off");
    for (const r of [off, on]) assert.ok(!r.body.choices[0].message.content.includes("<think>"));
    const effort = await postJson(url, { ...base, reasoning_effort: "high" }, KEY);
    assert.equal(
      effort.body.usage.prompt_tokens,
      off.body.usage.prompt_tokens,
      "reasoning_effort is not translated",
    );
  },
);

serverTest(
  "thinking on: reasoning goes to reasoning_content (and reasoning), never into content",
  async () => {
    // logit_bias makes the random model open <think> (151667) and, a few tokens later, close it (151668);
    // the JSON schema then constrains the answer after the reasoning block.
    const schema = { type: "object", properties: { mood: { enum: ["happy", "sad"] } }, required: ["mood"] };
    const request = (seed: number) => ({
      model: MODEL,
      messages: user("Think, then answer"),
      max_tokens: 160,
      seed,
      chat_template_kwargs: { enable_thinking: true },
      logit_bias: { "151667": 100, "151668": 10 },
      response_format: { type: "json_schema", json_schema: { name: "answer", schema } },
    });
    let found: { seed: number; body: Json } | undefined;
    for (let seed = 1; seed <= 12 && !found; seed++) {
      const res = await postJson(url, request(seed), KEY);
      assert.equal(res.status, 200);
      const m = res.body.choices[0].message;
      if (res.body.choices[0].finish_reason !== "stop") continue;
      assert.ok(!m.content.includes("<think>") && !m.content.includes("</think>"), m.content);
      assert.ok(ajv.validate(schema, JSON.parse(m.content)), m.content);
      if (m.reasoning_content) found = { seed, body: res.body };
    }
    assert.ok(found, "some seed produced reasoning followed by an answer");
    const message = found.body.choices[0].message;
    assert.equal(message.reasoning, message.reasoning_content);
    const events = await streamEvents(request(found.seed));
    const deltas = events.slice(0, -1).map((e) => JSON.parse(e).choices[0]?.delta ?? {});
    assert.equal(deltas.map((d: Json) => d.reasoning_content ?? "").join(""), message.reasoning_content);
    assert.equal(deltas.map((d: Json) => d.content ?? "").join(""), message.content);
  },
);

serverTest("history with all four roles, tool calls and reasoning is accepted", async () => {
  const res = await client.chat.completions.create({
    model: MODEL,
    max_tokens: 4,
    seed: 1,
    tools: TOOLS,
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: [{ type: "text", text: "Weather in " }, { type: "text", text: "Oslo?" }] },
      {
        role: "assistant",
        content: null,
        // @ts-expect-error: reasoning_content is the vLLM/DeepSeek extension field
        reasoning_content: "I should call the tool.",
        tool_calls: [{
          id: "call_1",
          type: "function",
          function: { name: "get_weather", arguments: '{"city":"Oslo","unit":"celsius","days":1}' },
        }],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"temp": 3}' },
      { role: "user", content: "Thanks" },
    ],
  });
  assert.equal(res.choices[0].message.role, "assistant");
  assert.ok(res.usage!.prompt_tokens > 100);
});

const badRequests: [string, Record<string, unknown>, string | null, string | null][] = [
  ["n > 1", { n: 2 }, "n", "unsupported_value"],
  [
    "tool_choice naming an unknown function",
    {
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "nope" } },
    },
    "tool_choice.function.name",
    null,
  ],
  ["tool_choice required without tools", { tool_choice: "required" }, "tool_choice", null],
  [
    "prompt + max_tokens beyond the context window",
    { max_tokens: 40000 },
    "messages",
    "context_length_exceeded",
  ],
  [
    "tool call arguments that are not JSON",
    {
      messages: [
        { role: "user", content: "x" },
        {
          role: "assistant",
          tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{oops" } }],
        },
      ],
    },
    "messages[1].tool_calls[0].function.arguments",
    null,
  ],
  ["an embedding model in chat", { model: "Vendor/Vendor3-Embedding-8B" }, "model", "wrong_model_kind"],
];
for (const [what, extra, param, code] of badRequests) {
  serverTest(`${what} is 400 with param ${param}`, async () => {
    const res = await postJson(url, { model: MODEL, messages: user("x"), ...extra }, KEY);
    assertApiError(res, 400, { param, ...(code ? { code } : {}) });
  });
}

serverTest("the SDK surfaces a 400 as an APIError with the status", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: user("x"), n: 3 }),
    (e: Error & { status?: number }) => e.status === 400,
  );
});
