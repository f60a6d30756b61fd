/**
 * POST /v1/chat/completions through a real server process, on both built-in chat stand-ins: the
 * spec model's family (tiny-moe: qwen35moe, XML tool calls, thinking on by default) and the Qwen3
 * one (tiny-chat: JSON tool calls). Most behaviours run on both.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Ajv } from "ajv";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { postStream } from "./helpers/sse.ts";
import { ChatChunkSchema, ChatCompletionSchema } from "../src/protocol/chat.ts";

const KEY = "test-key";
const SPEC_MODEL = "Vendor/Vendor3.6-35B-A3B";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
const url = `${server.url}/v1/chat/completions`;
const ajv = new Ajv({ strict: false });
const user = (content: string) => [{ role: "user" as const, content }];

/** A chat stand-in; `extra` turns thinking off where the template thinks by default. */
interface Target {
  label: string;
  model: string;
  extra: Record<string, unknown>;
  /** The token that opens a reasoning block the model writes itself (Qwen3), if the prompt does not. */
  thinkOpen?: string;
}
const TARGETS: Target[] = [
  { label: "xml", model: SPEC_MODEL, extra: { chat_template_kwargs: { enable_thinking: false } } },
  {
    label: "json",
    model: "tiny-chat",
    extra: { chat_template_kwargs: { enable_thinking: false } },
    thinkOpen: "151667",
  },
];
// deno-lint-ignore no-explicit-any
type Body = any;

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
  const res = await postStream(url, body, { key: KEY });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
  assert.equal(res.headers.get("cache-control"), "no-cache");
  assert.ok(res.text.endsWith("data: [DONE]\n\n"), "the stream ends with [DONE]");
  // OpenAI's framing: one `data:` line a frame, no event names (comments allowed).
  for (const frame of res.text.split("\n\n").filter((e) => e !== "" && !e.startsWith(":"))) {
    assert.ok(frame.startsWith("data: ") && !frame.includes("\n"), `event framing: ${frame}`);
  }
  assert.ok(res.events.every((e) => e.event === undefined));
  return res.events.map((e) => e.data);
}

/** A streamed single choice put together: its content, tool calls (if any) and finish reason. */
async function streamedChoice(body: Record<string, unknown>): Promise<Body> {
  const message: Body = { content: "" };
  let finish: string | null = null;
  for (const data of await streamEvents(body)) {
    if (data === "[DONE]") continue;
    for (const c of JSON.parse(data).choices) {
      message.content += c.delta.content ?? "";
      for (const call of c.delta.tool_calls ?? []) (message.tool_calls ??= [])[call.index] = call;
      finish = c.finish_reason ?? finish;
    }
  }
  return { message, finish_reason: finish };
}

/** The SDK's create with vserve's extension fields. */
function create(body: Record<string, unknown>): Promise<Body> {
  return client.chat.completions.create(body as never) as Promise<Body>;
}

for (const t of TARGETS) {
  const base = (content: string, more: Record<string, unknown> = {}) => ({
    model: t.model,
    messages: user(content),
    ...t.extra,
    ...more,
  });

  serverTest(`${t.label}: non-stream response has the OpenAI shape and real token counts`, async () => {
    const sent = Math.floor(Date.now() / 1000);
    const res = await postJson(url, base("Hello", { max_tokens: 8, seed: 1 }), KEY);
    const answered = Math.ceil(Date.now() / 1000);
    assert.equal(res.status, 200);
    const body = ChatCompletionSchema.strict().parse(res.body);
    assert.equal(body.model, t.model);
    assert.equal(body.choices[0].message.role, "assistant");
    assert.equal(typeof body.choices[0].message.content, "string");
    assert.ok(body.created >= sent && body.created <= answered, "created: when the request was served");
    assert.equal(body.usage.completion_tokens, 8);
    assert.ok(body.usage.prompt_tokens > 5);
    assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + 8);
  });

  serverTest(`${t.label}: greedy output is visible text`, async () => {
    const res = await create(base("Hello", { max_tokens: 16, temperature: 0 }));
    assert.ok(res.choices[0].message.content.trim().length > 0, JSON.stringify(res.choices[0].message));
  });

  serverTest(`${t.label}: max_tokens ends with finish_reason length; max_completion_tokens too`, async () => {
    const a = await create(base("Count", { max_tokens: 5, seed: 2 }));
    assert.equal(a.choices[0].finish_reason, "length");
    assert.equal(a.usage?.completion_tokens, 5);
    const b = await create(base("Count", { max_completion_tokens: 3, seed: 2 }));
    assert.equal(b.usage?.completion_tokens, 3);
  });

  serverTest(`${t.label}: the same seed and request give the same output`, async () => {
    const req = base("Tell me a story", { max_tokens: 24, seed: 42, temperature: 0.9 });
    const a = await create(req);
    const b = await create(req);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    const c = await create({ ...req, seed: 43 });
    assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
  });

  serverTest(
    `${t.label}: stream: chunks share id and created, role first, finish, usage, [DONE]`,
    async () => {
      const events = await streamEvents(base("Stream please", {
        max_tokens: 10,
        seed: 3,
        stream_options: { include_usage: true },
      }));
      assert.equal(events.at(-1), "[DONE]");
      const chunks = events.slice(0, -1).map((e) => ChatChunkSchema.strict().parse(JSON.parse(e)));
      assert.ok(chunks.every((c) => c.id === chunks[0].id && c.created === chunks[0].created));
      assert.ok(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === t.model));
      assert.equal(chunks[0].choices[0].delta.role, "assistant");
      const usage = chunks.at(-1)!;
      assert.deepEqual(usage.choices, []);
      assert.equal(usage.usage?.completion_tokens, 10);
      const finish = chunks.at(-2)!;
      assert.equal(finish.choices[0].finish_reason, "length");
      assert.deepEqual(finish.choices[0].delta, {});
      assert.ok(chunks.slice(0, -2).every((c) => c.choices[0].finish_reason === null));
    },
  );

  serverTest(`${t.label}: stream without include_usage has no usage chunk`, async () => {
    const events = await streamEvents(base("x", { max_tokens: 3, seed: 3 }));
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.ok(chunks.every((c: Json) => c.choices.length === 1 && c.usage === undefined));
  });

  serverTest(
    `${t.label}: stream deltas concatenate to the non-stream content, never splitting a character`,
    async () => {
      const req = base("你好！请用中文和表情回答 🙂🎉", { max_tokens: 48, seed: 7 });
      const whole = await create(req);
      const stream = await create({ ...req, stream: true });
      const deltas: string[] = [];
      for await (const chunk of stream) {
        const d = chunk.choices[0]?.delta?.content;
        if (d) deltas.push(d);
      }
      const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
      for (const d of deltas) {
        assert.ok(!lone.test(d), `a delta splits a surrogate pair: ${JSON.stringify(d)}`);
      }
      assert.equal(deltas.join(""), whole.choices[0].message.content);
      assert.ok(deltas.length > 1);
      assert.ok(
        new TextEncoder().encode(deltas.join("")).length > deltas.join("").length,
        "the sample holds multi-byte characters",
      );
    },
  );

  serverTest(`${t.label}: stop: the output ends before the stop text, which is not returned`, async () => {
    const req = base("Say things", { max_tokens: 30, seed: 11 });
    const full = (await create(req)).choices[0].message.content!;
    const chars = Array.from(full);
    assert.ok(chars.length > 12, `need text to cut: ${JSON.stringify(full)}`);
    const stopText = chars.slice(8, 11).join("");
    const cut = await create({ ...req, stop: ["\u0000never", stopText] });
    const expected = full.slice(0, full.indexOf(stopText));
    assert.equal(cut.choices[0].message.content, expected);
    assert.equal(cut.choices[0].finish_reason, "stop");
  });

  serverTest(`${t.label}: a named tool_choice forces exactly one valid call`, async () => {
    const res = await create(base("Weather in Paris?", {
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      parallel_tool_calls: false,
      max_tokens: 200,
      seed: 5,
    }));
    const choice = res.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls?.length, 1);
    const call = choice.message.tool_calls![0] as Json;
    assert.equal(call.function.name, "get_weather");
    assertValidCall(call);
  });

  serverTest(`${t.label}: tool_choice required with parallel calls returns several valid calls`, async () => {
    let found: Json;
    // About one seed in six makes several calls on the random stand-ins (24 seeds: 3-4 of them).
    for (let seed = 1; seed <= 40 && !found; seed++) {
      const res = await create(base("Weather and time?", {
        tools: TOOLS,
        tool_choice: "required",
        max_tokens: 400,
        seed,
      }));
      const calls = res.choices[0].message.tool_calls ?? [];
      if (res.choices[0].finish_reason !== "tool_calls") {
        continue;
      }
      calls.forEach((c: Json) => assertValidCall(c));
      if (calls.length >= 2) found = res;
    }
    assert.ok(found, "some seed produced parallel calls");
    const ids = found.choices[0].message.tool_calls.map((c: Json) => c.id);
    assert.equal(new Set(ids).size, ids.length, "call ids are unique");
  });

  serverTest(
    `${t.label}: stream: tool-call deltas carry index, id, name, then argument fragments that reassemble`,
    async () => {
      const req = base("Weather in Lisbon?", {
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_weather" } },
        parallel_tool_calls: false,
        max_tokens: 200,
        seed: 9,
      });
      const events = await streamEvents(req);
      const chunks = events.slice(0, -1).map((e) => ChatChunkSchema.strict().parse(JSON.parse(e)));
      const parts = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
      assert.ok(parts.length >= 3, "arguments arrive in several fragments");
      assert.equal(parts[0].index, 0);
      assert.match(parts[0].id ?? "", /^call_/);
      assert.equal(parts[0].type, "function");
      assert.equal(parts[0].function.name, "get_weather");
      assert.ok(parts.slice(1).every((p) => p.id === undefined && p.function.name === undefined));
      const args = parts.map((p) => p.function.arguments ?? "").join("");
      assertValidCall({
        type: "function",
        id: parts[0].id!,
        function: { name: "get_weather", arguments: args },
      });
      assert.equal(chunks.at(-1)!.choices[0].finish_reason, "tool_calls");
      // The same request without streaming gives the same call.
      const whole = await create(req);
      assert.equal(whole.choices[0].message.tool_calls[0].function.arguments, args);
    },
  );

  serverTest(
    `${t.label}: tool_choice auto: a call the model opens is finished under the tool grammar`,
    async () => {
      // logit_bias pushes <tool_call> (id 151657) so that the random model opens a call by itself.
      const res = await create(base("Weather?", {
        tools: TOOLS,
        parallel_tool_calls: false,
        max_tokens: 300,
        seed: 2,
        logit_bias: { "151657": 100 },
      }));
      const choice = res.choices[0];
      assert.equal(choice.finish_reason, "tool_calls");
      assert.equal(choice.message.tool_calls?.length, 1);
      for (const call of choice.message.tool_calls!) assertValidCall(call as Json);
      const plain = await create(base("Weather?", { tools: TOOLS, max_tokens: 8, seed: 2 }));
      assert.equal(plain.choices[0].message.tool_calls, undefined, "without the bias the model writes text");
    },
  );

  serverTest(
    `${t.label}: tool_choice auto with a schema the grammar cannot enforce still answers`,
    async () => {
      const tools = [{
        type: "function" as const,
        function: {
          name: "count",
          parameters: { type: "object", properties: { ip: { type: "string", format: "ipv6" } } },
        },
      }];
      const res = await create(base("Count", { tools, max_tokens: 4, seed: 1 }));
      assert.equal(res.choices[0].finish_reason, "length");
      await assert.rejects(
        create(base("Count", { tools, tool_choice: "required", max_tokens: 8 })),
        (e: Error & { status?: number }) => e.status === 400 && /ipv6/.test(e.message),
      );
    },
  );

  serverTest(
    `${t.label}: tool_choice none keeps the tools in the prompt (auto's prefix) and never opens a call`,
    async () => {
      // A long system prompt, so that the hybrid model keeps a checkpoint to resume from (past 512 tokens).
      const rules = Array.from({ length: 300 }, (_, i) => `rule${i}`).join(" ");
      const messages = [{ role: "system", content: rules }, { role: "user", content: "Weather in Paris?" }];
      const b = { model: t.model, messages, ...t.extra, tools: TOOLS, max_tokens: 1, seed: 1 };
      const auto = await create({ ...b, tool_choice: "auto" });
      const none = await create({ ...b, tool_choice: "none" });
      const plain = await create({ model: t.model, messages, ...t.extra, max_tokens: 1 });
      assert.ok(auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50, "the tools are in the prompt");
      assert.equal(none.usage.prompt_tokens, auto.usage.prompt_tokens);
      // The none request resumed from the auto request's state: its prompt starts with auto's tokens.
      // (A dense prompt resumes up to 64 tokens before the end of what is held, so that its last chunk
      // is computed as the prompt alone computes it: exactResume.)
      assert.ok(
        none.usage.prompt_tokens_details.cached_tokens >= auto.usage.prompt_tokens - 64,
        JSON.stringify(none.usage),
      );
      // Even a model pushed to open a call (a bias toward the opener) writes no call under none.
      const opener = await postJson(
        `${server.url}/tokenize`,
        { model: t.model, content: "<tool_call>" },
        KEY,
      );
      assert.equal(opener.body.tokens.length, 1);
      const push = { logit_bias: { [opener.body.tokens[0]]: 100 } };
      const called = await create({ ...b, ...push, tool_choice: "auto", max_tokens: 40 });
      assert.ok(called.choices[0].message.tool_calls?.length >= 1, "the bias opens a call under auto");
      for (const stream of [false, true]) {
        const body = { ...b, ...push, tool_choice: "none", max_tokens: 12 };
        const choice = stream ? await streamedChoice(body) : (await create(body)).choices[0];
        assert.equal(choice.message.tool_calls, undefined, JSON.stringify(choice));
        assert.equal(choice.finish_reason, "length");
        assert.ok(!choice.message.content.includes("<tool_call>"), choice.message.content);
      }
    },
  );

  serverTest(`${t.label}: a 3-turn agent loop renders the call and its result, then answers`, async () => {
    const messages: Body[] = [{ role: "user", content: "What is the weather in Oslo?" }];
    const first = await create({
      model: t.model,
      messages,
      ...t.extra,
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 200,
      seed: 3,
    });
    const call = first.choices[0].message.tool_calls[0];
    assertValidCall(call);
    // Sent back exactly as the SDK received it: arguments as a JSON string.
    messages.push(first.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"temp": 3}' });
    const second = await create({
      model: t.model,
      messages,
      ...t.extra,
      tools: TOOLS,
      max_tokens: 12,
      seed: 3,
    });
    assert.equal(second.choices[0].message.role, "assistant");
    assert.ok(["stop", "length", "tool_calls"].includes(second.choices[0].finish_reason));
    assert.ok(
      second.usage.prompt_tokens > first.usage.prompt_tokens + 10,
      "the call and its result are in the prompt",
    );
    messages.push(second.choices[0].message, { role: "user", content: "Thanks. And tomorrow?" });
    const third = await create({
      model: t.model,
      messages,
      ...t.extra,
      tools: TOOLS,
      max_tokens: 8,
      seed: 3,
    });
    assert.equal(third.choices[0].message.role, "assistant");
  });

  serverTest(`${t.label}: json_object output is a JSON object`, async () => {
    let parsed: unknown;
    for (let seed = 1; seed <= 12 && parsed === undefined; seed++) {
      // A random model rarely closes a free-form string; logit_bias favours '"' (1) and '}' (92).
      const res = await create(base("Reply in JSON", {
        response_format: { type: "json_object" },
        max_tokens: 120,
        seed,
        logit_bias: { "1": 15, "92": 12 },
      }));
      if (res.choices[0].finish_reason === "stop") parsed = JSON.parse(res.choices[0].message.content!);
    }
    assert.ok(parsed !== undefined, "some seed finished within max_tokens");
    assert.ok(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed));
  });

  serverTest(`${t.label}: json_schema output validates against the schema`, async () => {
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
      const res = await create(base("Describe yourself", {
        response_format: { type: "json_schema", json_schema: { name: "profile", schema, strict: true } },
        max_tokens: 200,
        seed,
      }));
      assert.equal(res.choices[0].finish_reason, "stop");
      const value = JSON.parse(res.choices[0].message.content!);
      assert.ok(validate(value), ajv.errorsText(validate.errors));
    }
  });

  serverTest(
    `${t.label}: thinking: the switch changes the prompt; the default is the template's (on)`,
    async () => {
      const b = { model: t.model, messages: user("Think?"), max_tokens: 6, seed: 4 };
      const off = await postJson(url, { ...b, chat_template_kwargs: { enable_thinking: false } }, KEY);
      const on = await postJson(url, { ...b, chat_template_kwargs: { enable_thinking: true } }, KEY);
      const dflt = await postJson(url, b, KEY);
      assert.equal(off.status, 200);
      assert.ok(off.body.usage.prompt_tokens > on.body.usage.prompt_tokens, "off adds an empty think block");
      assert.equal(
        dflt.body.usage.prompt_tokens,
        on.body.usage.prompt_tokens,
        "both templates think by default",
      );
      for (const r of [off, on, dflt]) assert.ok(!r.body.choices[0].message.content.includes("think>"));
      const effort = await postJson(url, { ...b, reasoning_effort: "low" }, KEY);
      assert.equal(
        effort.body.usage.prompt_tokens,
        dflt.body.usage.prompt_tokens,
        "reasoning_effort is not translated",
      );
    },
  );

  serverTest(`${t.label}: thinking on: reasoning goes to reasoning_content, never into content`, async () => {
    // logit_bias makes the random model close its reasoning (</think> = 151668), and on Qwen3 (whose
    // prompt does not open the block) open it first (<think> = 151667); the JSON schema then
    // constrains the answer after the reasoning.
    const schema = { type: "object", properties: { mood: { enum: ["happy", "sad"] } }, required: ["mood"] };
    const request = (seed: number) => ({
      model: t.model,
      messages: user("Think, then answer"),
      max_tokens: 160,
      seed,
      chat_template_kwargs: { enable_thinking: true },
      logit_bias: { ...(t.thinkOpen ? { [t.thinkOpen]: 100 } : {}), "151668": 10 },
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
    assert.ok(found.body.usage.completion_tokens_details.reasoning_tokens > 0);
    const events = await streamEvents(request(found.seed));
    const deltas = events.slice(0, -1).map((e) => JSON.parse(e).choices[0]?.delta ?? {});
    assert.equal(deltas.map((d: Json) => d.reasoning_content ?? "").join(""), message.reasoning_content);
    assert.equal(deltas.map((d: Json) => d.content ?? "").join(""), message.content);
  });

  serverTest(`${t.label}: history with all four roles, tool calls and reasoning is accepted`, async () => {
    const res = await create({
      model: t.model,
      max_tokens: 4,
      seed: 1,
      tools: TOOLS,
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: [{ type: "text", text: "Weather in " }, { type: "text", text: "Oslo?" }] },
        {
          role: "assistant",
          content: null,
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
}

serverTest("a schema keyword the grammar cannot enforce is 400 naming it", async () => {
  const res = await postJson(url, {
    model: SPEC_MODEL,
    messages: user("x"),
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "s",
        schema: { type: "object", properties: { ip: { type: "string", format: "ipv6" } } },
      },
    },
    max_tokens: 8,
  }, KEY);
  assertApiError(res, 400, { code: "unsupported_schema", param: "response_format.json_schema.schema" });
  assert.match(res.body.error.message, /'ipv6'/);
});

serverTest(
  "leading system and developer messages are joined into one; a later one is a <system-reminder> user turn in its place",
  async () => {
    // The spec model's template takes one system message, first (as Qwen3.6's does).
    const res = await create({
      model: SPEC_MODEL,
      max_tokens: 2,
      messages: [
        { role: "developer", content: "Base prompt." },
        { role: "system", content: "Permissions." },
        { role: "user", content: "hi" },
        { role: "developer", content: "Late instruction." },
        { role: "system", content: " " },
      ],
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(res.choices[0].message.role, "assistant");
    const rendered = await postJson(`${server.url}/tokenize`, {
      model: SPEC_MODEL,
      messages: [
        { role: "developer", content: "Base prompt." },
        { role: "system", content: "Permissions." },
        { role: "user", content: "hi" },
        { role: "system", content: "Late instruction." },
      ],
    }, KEY);
    assert.equal(rendered.status, 200, JSON.stringify(rendered.body));
    // The request was that prompt (an empty late message adds nothing).
    const explicit = await postJson(`${server.url}/tokenize`, {
      model: SPEC_MODEL,
      messages: [
        { role: "system", content: "Base prompt.\n\nPermissions." },
        { role: "user", content: "hi" },
        { role: "user", content: "<system-reminder>\nLate instruction.\n</system-reminder>" },
      ],
      chat_template_kwargs: { enable_thinking: false },
    }, KEY);
    assert.equal(res.usage!.prompt_tokens, explicit.body.count);
    assert.match(
      rendered.body.prompt,
      /^<\|im_start\|>system\nBase prompt\.\n\nPermissions\.<\|im_end\|>\n<\|im_start\|>user\nhi<\|im_end\|>\n<\|im_start\|>user\n<system-reminder>\nLate instruction\.\n<\/system-reminder><\|im_end\|>\n/,
    );
    // Only system text and no user query is still the template's 400, with its reason.
    const noUser = await postJson(
      url,
      { model: SPEC_MODEL, messages: [{ role: "system", content: "only" }] },
      KEY,
    );
    assertApiError(noUser, 400, { param: "messages", code: "invalid_messages" });
    assert.match(noUser.body.error.message, /no user query/i);
    // …and the same 400 from /tokenize, which renders the messages with no service in between (it was a 500).
    const tokenized = await postJson(
      `${server.url}/tokenize`,
      { model: SPEC_MODEL, messages: [{ role: "system", content: "only" }] },
      KEY,
    );
    assertApiError(tokenized, 400, { param: "messages", code: "invalid_messages" });
  },
);

const badRequests: [string, Record<string, unknown>, string | null, string | null][] = [
  ["n above the model's parallel sequences", { n: 9 }, "n", "invalid_value"],
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
    "invalid_value",
  ],
  [
    "tool call arguments that are JSON but not an object",
    {
      messages: [
        { role: "user", content: "x" },
        {
          role: "assistant",
          tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "[1, 2]" } }],
        },
      ],
    },
    "messages[1].tool_calls[0].function.arguments",
    "invalid_value",
  ],
  ["an embedding model in chat", { model: "Vendor/Vendor3-Embedding-8B" }, "model", "wrong_model_kind"],
];
for (const [what, extra, param, code] of badRequests) {
  serverTest(`${what} is 400 with param ${param}`, async () => {
    const res = await postJson(url, { model: SPEC_MODEL, messages: user("x"), ...extra }, KEY);
    assertApiError(res, 400, { param, ...(code ? { code } : {}) });
  });
}

serverTest("the SDK surfaces a 400 as an APIError with the status", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: SPEC_MODEL, messages: user("x"), n: 50 }),
    (e: Error & { status?: number }) => e.status === 400,
  );
});

for (const t of TARGETS) {
  serverTest(
    `${t.label}: a streamed forced call cut by max_tokens ends with length, no markup in content`,
    async () => {
      // Cut before the name is known, inside the arguments, and at several points in between.
      for (const max_tokens of [3, 8, 13, 18]) {
        const events = await streamEvents({
          model: t.model,
          messages: user("Weather in Paris?"),
          ...t.extra,
          tools: TOOLS,
          tool_choice: { type: "function", function: { name: "get_weather" } },
          max_tokens,
          seed: 5,
        });
        const chunks = events.filter((e) => e !== "[DONE]").map((e) => JSON.parse(e));
        const deltas = chunks.flatMap((c: Json) => c.choices.map((ch: Json) => ch.delta));
        // A forced call starts at the first token: there is no text, not even a piece of its tag.
        const content = deltas.map((d: Json) => d.content ?? "").join("");
        assert.equal(content, "", `max_tokens ${max_tokens}`);
        const finishes = chunks.flatMap((c: Json) => c.choices.map((ch: Json) => ch.finish_reason))
          .filter(Boolean);
        assert.deepEqual(finishes, ["length"], `max_tokens ${max_tokens}`);
        const names = deltas.flatMap((d: Json) => d.tool_calls ?? []).map((c: Json) => c.function?.name)
          .filter(Boolean);
        assert.ok(names.every((n: string) => n === "get_weather"), JSON.stringify(names));
      }
    },
  );
}

serverTest("n: 8 on the built-in chat models (8 sequences each) returns 8 choices", async () => {
  for (const model of [SPEC_MODEL, "tiny-chat"]) {
    const res = await create({
      model,
      messages: user("Eight"),
      n: 8,
      max_tokens: 2,
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.deepEqual(res.choices.map((c: Body) => c.index), [0, 1, 2, 3, 4, 5, 6, 7], model);
    assert.equal(res.usage.completion_tokens, 16);
  }
});

serverTest(
  "/tokenize of messages with tools counts the prompt chat completions computes; tools alone are a 400",
  async () => {
    const messages = user("Weather in Paris?");
    const chat = await postJson(url, {
      model: SPEC_MODEL,
      messages,
      tools: TOOLS,
      max_tokens: 1,
      chat_template_kwargs: { enable_thinking: false },
    }, KEY);
    assert.equal(chat.status, 200, JSON.stringify(chat.body));
    const tokenize = (body: Record<string, unknown>) =>
      postJson(`${server.url}/tokenize`, {
        model: SPEC_MODEL,
        chat_template_kwargs: { enable_thinking: false },
        ...body,
      }, KEY);
    const withTools = await tokenize({ messages, tools: TOOLS });
    assert.equal(withTools.status, 200, JSON.stringify(withTools.body));
    assert.equal(withTools.body.count, chat.body.usage.prompt_tokens);
    assert.match(withTools.body.prompt, /get_weather/);
    const without = await tokenize({ messages });
    assert.ok(without.body.count < withTools.body.count, "the tools are in the prompt");
    assertApiError(await tokenize({ content: "hi", tools: TOOLS }), 400, { param: "tools" });
  },
);
