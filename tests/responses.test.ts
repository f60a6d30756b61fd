/**
 * POST /v1/responses through a real server and the official SDK's `responses.create` and
 * `responses.stream`: text, reasoning, streaming events, a function-call round trip, structured
 * output (json_schema, json_object), parallel calls, sampling parameters, failures mid-stream (the
 * output check, the time limit), the stateless refusals; and the event writer on fake chunks (pure logic).
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { postStream } from "./helpers/sse.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { ResponseObjectSchema, ResponseStreamEventSchema } from "../src/protocol/responses.ts";
import { checkSchema } from "./helpers/schema.ts";
import { streamEvents } from "../src/services/responses.ts";
import { ApiError } from "../src/http/errors.ts";
import type { ChatChunk } from "../src/protocol/chat.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const server = await startServer(["--api-key", KEY, "--parallel", "4"], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
const url = `${server.url}/v1/responses`;

/** A request through the SDK; extension fields (seed, logit_bias) ride along. */
function create(body: Record<string, unknown>): Promise<Json> {
  return client.responses.create(body as never) as Promise<Json>;
}

const WEATHER = {
  type: "function",
  name: "get_weather",
  description: "The weather in a city",
  parameters: {
    type: "object",
    properties: {
      city: { type: "string", enum: ["Paris", "Rome", "Oslo"] },
      days: { type: "integer", minimum: 1, maximum: 3 },
    },
    required: ["city", "days"],
    additionalProperties: false,
  },
};
const NO_THINKING = { reasoning: { effort: "minimal" } };

serverTest("responses.create: text output, usage, and the same engine path as chat completions", async () => {
  const res = await create({
    model: MODEL,
    input: "Say hi",
    max_output_tokens: 8,
    temperature: 0,
    ...NO_THINKING,
  });
  ResponseObjectSchema.parse(res);
  assert.equal(res.object, "response");
  assert.match(res.id, /^resp_/);
  assert.equal(res.store, false);
  const message = res.output.find((o: Json) => o.type === "message");
  assert.ok(message, JSON.stringify(res.output));
  assert.equal(message.content[0].type, "output_text");
  assert.equal(res.output_text, message.content[0].text, "the SDK's output_text reads our output");
  assert.ok(res.output.every((o: Json) => o.type !== "reasoning"), "effort minimal switches thinking off");
  assert.equal(res.usage.output_tokens_details.reasoning_tokens, 0);
  assert.ok(res.usage.output_tokens >= 1 && res.usage.output_tokens <= 8);
  assert.equal(res.usage.total_tokens, res.usage.input_tokens + res.usage.output_tokens);
  if (res.usage.output_tokens === 8) {
    assert.equal(res.status, "incomplete");
    assert.deepEqual(res.incomplete_details, { reason: "max_output_tokens" });
  }
  // The same conversation through /v1/chat/completions: same prompt, same tokens.
  const chat = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "Say hi" }],
    max_completion_tokens: 8,
    temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  } as never) as Json;
  assert.equal(chat.usage.prompt_tokens, res.usage.input_tokens);
  assert.equal(chat.choices[0].message.content, message.content[0].text);
  // instructions are a system message.
  const withInstructions = await create({
    model: MODEL,
    instructions: "You are terse.",
    input: "Say hi",
    max_output_tokens: 2,
    ...NO_THINKING,
  });
  assert.ok(withInstructions.usage.input_tokens > res.usage.input_tokens + 3);
  assert.equal(withInstructions.instructions, "You are terse.");
});

serverTest("thinking (on by default): a reasoning item with summary text, and reasoning_tokens", async () => {
  const res = await create({ model: MODEL, input: "Think", max_output_tokens: 6, seed: 3 });
  ResponseObjectSchema.parse(res);
  const reasoning = res.output[0];
  assert.equal(reasoning.type, "reasoning", JSON.stringify(res.output));
  assert.match(reasoning.id, /^rs_/);
  assert.equal(reasoning.summary[0].type, "summary_text");
  assert.ok(reasoning.summary[0].text.length > 0);
  assert.ok(res.usage.output_tokens_details.reasoning_tokens > 0);
  assert.ok(res.usage.output_tokens_details.reasoning_tokens <= res.usage.output_tokens);
  const high = await create({
    model: MODEL,
    input: "Think",
    max_output_tokens: 6,
    seed: 3,
    reasoning: { effort: "high" },
  });
  assert.equal(
    high.output[0].summary[0].text,
    reasoning.summary[0].text,
    "effort high: thinking on, as default",
  );
});

serverTest(
  "streaming: typed events with consecutive sequence numbers add up to the final response",
  async () => {
    const body = { model: MODEL, input: "Tell a story", max_output_tokens: 12, temperature: 0, seed: 5 };
    const stream = await client.responses.create(
      { ...body, stream: true } as never,
    ) as unknown as AsyncIterable<Json>;
    const events: Json[] = [];
    for await (const e of stream) events.push(e);
    events.forEach((e, i) => {
      ResponseStreamEventSchema.parse(e);
      assert.equal(e.sequence_number, i);
    });
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ["response.created", "response.in_progress"]);
    const last = events.at(-1);
    assert.ok(["response.completed", "response.incomplete"].includes(last.type), types.join(","));
    const final = ResponseObjectSchema.parse(last.response);
    for (const t of ["response.output_item.added", "response.output_item.done"]) assert.ok(types.includes(t));
    // Text deltas make the message; summary deltas make the reasoning.
    const text = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
    const summary = events.filter((e) => e.type === "response.reasoning_summary_text.delta").map((e) =>
      e.delta
    )
      .join("");
    const message = final.output.find((o) => o.type === "message");
    const reasoning = final.output.find((o) => o.type === "reasoning");
    assert.equal(message?.type === "message" ? message.content[0].text : "", text);
    assert.equal(reasoning?.type === "reasoning" ? reasoning.summary[0].text : "", summary);
    if (message) {
      assert.ok(types.includes("response.content_part.added") && types.includes("response.output_text.done"));
    }
    // Every added item is done, in order, at the output index it announced.
    const added = events.filter((e) => e.type === "response.output_item.added").map((e) => e.output_index);
    const done = events.filter((e) => e.type === "response.output_item.done").map((e) => e.output_index);
    assert.deepEqual(added, done);
    assert.deepEqual(added, final.output.map((_, i) => i));
    // The non-streamed answer is the same.
    const whole = await create(body);
    assert.deepEqual(
      whole.output.map((o: Json) => [o.type, o.content?.[0].text ?? o.summary?.[0].text]),
      final.output.map((o: Json) => [o.type, o.content?.[0].text ?? o.summary?.[0].text]),
    );
    assert.deepEqual(whole.usage, final.usage);
    // The SDK's accumulating helper agrees.
    const helper = client.responses.stream(body as never);
    const acc = await helper.finalResponse() as Json;
    assert.equal(acc.output_text, whole.output_text);
  },
);

serverTest("a function-call round trip: call → function_call_output → answer", async () => {
  const first = await create({
    model: MODEL,
    input: [{ role: "user", content: "Weather in Paris?" }],
    tools: [WEATHER],
    tool_choice: "required",
    ...NO_THINKING,
  });
  ResponseObjectSchema.parse(first);
  const call = first.output.find((o: Json) => o.type === "function_call");
  assert.ok(call, JSON.stringify(first.output));
  assert.match(call.id, /^fc_/);
  assert.equal(call.name, "get_weather");
  assert.ok(call.call_id.length > 0);
  const args = JSON.parse(call.arguments);
  assert.ok((await checkSchema(WEATHER.parameters, args)).ok, call.arguments);
  assert.equal(first.status, "completed");

  const second = await create({
    model: MODEL,
    input: [
      { role: "user", content: "Weather in Paris?" },
      { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "I should call the tool." }] },
      ...first.output,
      { type: "function_call_output", call_id: call.call_id, output: "Sunny, 24 C" },
    ],
    tools: [WEATHER],
    tool_choice: "none",
    max_output_tokens: 6,
    ...NO_THINKING,
  });
  ResponseObjectSchema.parse(second);
  assert.ok(second.output.every((o: Json) => o.type !== "function_call"), "tool_choice none: no call");
  assert.ok(second.output.some((o: Json) => o.type === "message"), JSON.stringify(second.output));
  // The history (reasoning, call and its output) is in the prompt.
  const alone = await create({
    model: MODEL,
    input: [{ role: "user", content: "Weather in Paris?" }],
    tools: [WEATHER],
    tool_choice: "none",
    max_output_tokens: 1,
    ...NO_THINKING,
  });
  assert.ok(
    second.usage.input_tokens > alone.usage.input_tokens + 15,
    JSON.stringify([second.usage, alone.usage]),
  );
  const calls = first.output.filter((o: Json) => o.type === "function_call");
  // The same chat messages through chat completions (the tools are in the prompt under none too).
  const rendered = await postJson(`${server.url}/v1/chat/completions`, {
    model: MODEL,
    tools: [{
      type: "function",
      function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.parameters },
    }],
    tool_choice: "none",
    max_tokens: 1,
    messages: [
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: null,
        reasoning_content: "I should call the tool.",
        tool_calls: calls.map((c: Json) => ({
          id: c.call_id,
          type: "function",
          function: { name: c.name, arguments: c.arguments },
        })),
      },
      { role: "tool", tool_call_id: call.call_id, content: "Sunny, 24 C" },
    ],
    chat_template_kwargs: { enable_thinking: false },
  }, KEY);
  assert.equal(rendered.status, 200, JSON.stringify(rendered.body));
  assert.equal(
    second.usage.input_tokens,
    rendered.body.usage.prompt_tokens,
    "the items render as the same chat messages",
  );

  // The same call streamed: argument deltas add up to .done and to the final item.
  const stream = await client.responses.create({
    model: MODEL,
    input: "Weather in Rome?",
    tools: [WEATHER],
    tool_choice: { type: "function", name: "get_weather" },
    stream: true,
    ...NO_THINKING,
  } as never) as unknown as AsyncIterable<Json>;
  const events: Json[] = [];
  for await (const e of stream) events.push(e);
  // Per call: argument deltas add up to its .done and to its final item.
  const items = events.filter((e) =>
    e.type === "response.output_item.done" && e.item.type === "function_call"
  );
  assert.ok(items.length >= 1);
  for (const { item } of items) {
    const deltas = events.filter((e) =>
      e.type === "response.function_call_arguments.delta" && e.item_id === item.id
    )
      .map((e) => e.delta).join("");
    const done = events.find((e) =>
      e.type === "response.function_call_arguments.done" && e.item_id === item.id
    );
    assert.equal(done.arguments, deltas);
    assert.equal(item.arguments, deltas);
    assert.equal(item.name, "get_weather");
    assert.ok((await checkSchema(WEATHER.parameters, JSON.parse(deltas))).ok, deltas);
  }
  assert.equal(events.at(-1).type, "response.completed");
});

serverTest("structured output via text.format json_schema is valid JSON of the schema", async () => {
  const schema = {
    type: "object",
    properties: {
      unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      count: { type: "integer", minimum: 0, maximum: 9 },
      ok: { type: "boolean" },
    },
    required: ["unit", "count", "ok"],
    additionalProperties: false,
  };
  for (const seed of [1, 2]) {
    const res = await create({
      model: MODEL,
      input: "Report",
      text: { format: { type: "json_schema", name: "report", schema, strict: true } },
      seed,
      ...NO_THINKING,
    });
    assert.equal(res.status, "completed", JSON.stringify(res));
    const value = JSON.parse(res.output_text);
    assert.ok((await checkSchema(schema, value)).ok, res.output_text);
    assert.equal(res.text.format.type, "json_schema");
  }
});

/** A streamed request through the SDK: its events, and the error that ended the stream, if one did. */
async function streamed(body: Record<string, unknown>): Promise<{ events: Json[]; error?: Json }> {
  const stream = await client.responses.create(
    { ...body, stream: true } as never,
  ) as unknown as AsyncIterable<Json>;
  const events: Json[] = [];
  try {
    for await (const e of stream) events.push(e);
  } catch (error) {
    return { events, error };
  }
  return { events };
}

const deltasOf = (events: Json[], type: string) =>
  events.filter((e) => e.type === type).map((e) => e.delta).join("");

serverTest(
  "text.format json_object: the grammar makes the output a JSON object, streamed or not",
  async () => {
    // A random model rarely closes a free-form string; logit_bias favours '"' (1) and '}' (92).
    const body = {
      model: MODEL,
      input: "Reply in JSON",
      text: { format: { type: "json_object" } },
      max_output_tokens: 120,
      logit_bias: { "1": 15, "92": 12 },
      ...NO_THINKING,
    };
    let done: { seed: number; res: Json } | undefined;
    for (let seed = 1; seed <= 12 && !done; seed++) {
      const res = await create({ ...body, seed });
      ResponseObjectSchema.parse(res);
      assert.deepEqual(res.text.format, { type: "json_object" });
      assert.match(res.output_text, /^\s*\{/, "the grammar opens an object");
      if (res.status !== "completed") {
        assert.deepEqual(res.incomplete_details, { reason: "max_output_tokens" });
        continue;
      }
      const value = JSON.parse(res.output_text);
      assert.ok(typeof value === "object" && value !== null && !Array.isArray(value), res.output_text);
      if (Object.keys(value).length > 0) done = { seed, res };
    }
    assert.ok(done, "some seed closed an object with members within max_output_tokens");
    // Streamed: the deltas make the same object, and the stream completes.
    const { events, error } = await streamed({ ...body, seed: done.seed });
    assert.equal(error, undefined);
    assert.equal(deltasOf(events, "response.output_text.delta"), done.res.output_text);
    assert.equal(events.at(-1).type, "response.completed");
    assert.deepEqual(events.at(-1).response.text.format, { type: "json_object" });
    // Without the format the same seed writes free text: it is the grammar that makes the object.
    const { text: _, ...free } = body;
    const plain = await create({ ...free, seed: done.seed });
    assert.doesNotMatch(plain.output_text, /^\s*\{/, plain.output_text);
  },
);

const CLOCK = {
  type: "function",
  name: "get_time",
  description: "The time in a zone",
  parameters: {
    type: "object",
    properties: { zone: { type: "string", enum: ["UTC", "CET", "JST"] } },
    required: ["zone"],
    additionalProperties: false,
  },
};
const SCHEMAS: Record<string, Record<string, unknown>> = {
  get_weather: WEATHER.parameters,
  get_time: CLOCK.parameters,
};

/** The function_call items of an output, each checked against its tool's schema. */
async function callsOf(output: Json[]): Promise<Json[]> {
  const calls = output.filter((o) => o.type === "function_call");
  for (const c of calls) {
    assert.ok(c.name in SCHEMAS, c.name);
    assert.ok(
      (await checkSchema(SCHEMAS[c.name], JSON.parse(c.arguments))).ok,
      `${c.name}(${c.arguments})`,
    );
    assert.equal(c.status, "completed");
  }
  return calls;
}

serverTest(
  "parallel_tool_calls: true may give several function_call items, false exactly one; a cut call is incomplete",
  async () => {
    const body = {
      model: MODEL,
      input: "Weather and time?",
      tools: [WEATHER, CLOCK],
      tool_choice: "required",
      max_output_tokens: 400,
      ...NO_THINKING,
    };
    let several: { seed: number; res: Json } | undefined;
    for (let seed = 1; seed <= 12 && !several; seed++) {
      const res = await create({ ...body, seed });
      if (res.status !== "completed") continue;
      if ((await callsOf(res.output)).length >= 2) several = { seed, res };
    }
    assert.ok(several, "some seed produced parallel calls");
    const { seed, res } = several;
    assert.equal(res.parallel_tool_calls, true, "the default is true");
    const calls = await callsOf(res.output);
    assert.equal(new Set(calls.map((c) => c.call_id)).size, calls.length, "call ids are unique");
    assert.equal(new Set(calls.map((c) => c.id)).size, calls.length, "item ids are unique");

    // Streamed: one function_call item per call, in order, with the same names and arguments.
    const { events, error } = await streamed({ ...body, seed });
    assert.equal(error, undefined);
    const final = events.at(-1);
    assert.equal(final.type, "response.completed");
    const items = events.filter((e) => e.type === "response.output_item.done").map((e) => e.item);
    assert.deepEqual(
      items.map((i) => [i.type, i.name, i.arguments]),
      calls.map((c) => ["function_call", c.name, c.arguments]),
    );
    for (const item of items) {
      const args = events.filter((e) =>
        e.type === "response.function_call_arguments.delta" && e.item_id === item.id
      ).map((e) => e.delta).join("");
      assert.equal(args, item.arguments);
    }
    assert.deepEqual(final.response.output.map((o: Json) => o.call_id), items.map((i) => i.call_id));

    // parallel_tool_calls false: the grammar closes after one call, here the first one of that seed.
    for (const stream of [false, true]) {
      const one = stream
        ? (await streamed({ ...body, seed, parallel_tool_calls: false })).events.at(-1).response
        : await create({ ...body, seed, parallel_tool_calls: false });
      assert.equal(one.status, "completed", JSON.stringify(one.output));
      assert.equal(one.parallel_tool_calls, false);
      const single = await callsOf(one.output);
      assert.equal(single.length, 1, `stream ${stream}: ${JSON.stringify(one.output)}`);
      assert.deepEqual([single[0].name, single[0].arguments], [calls[0].name, calls[0].arguments]);
    }

    // Cut by max_output_tokens inside the last call: that call is incomplete, the ones before completed.
    const limit = res.usage.output_tokens - 3;
    for (const stream of [false, true]) {
      const cut = stream
        ? (await streamed({ ...body, seed, max_output_tokens: limit })).events.at(-1).response
        : await create({ ...body, seed, max_output_tokens: limit });
      assert.equal(cut.status, "incomplete");
      assert.deepEqual(cut.incomplete_details, { reason: "max_output_tokens" });
      assert.deepEqual(
        cut.output.map((o: Json) => [o.type, o.name, o.status]),
        calls.map((c, i) => ["function_call", c.name, i < calls.length - 1 ? "completed" : "incomplete"]),
        `stream ${stream}`,
      );
      assert.equal(cut.output[0].arguments, calls[0].arguments);
    }
  },
);

serverTest("temperature, top_p and seed reach the sampler, as on chat completions", async () => {
  const body = { model: MODEL, input: "Tell a story", max_output_tokens: 16, ...NO_THINKING };
  const chat = async (fields: Record<string, unknown>) =>
    (await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Tell a story" }],
      max_completion_tokens: 16,
      chat_template_kwargs: { enable_thinking: false },
      ...fields,
    } as never) as Json).choices[0].message.content;
  const greedy = (await create({ ...body, temperature: 0 })).output_text;
  const sampled = await create({ ...body, temperature: 1, seed: 7 });
  assert.equal(sampled.temperature, 1);
  assert.equal(sampled.top_p, null);
  assert.equal(
    (await create({ ...body, temperature: 1, seed: 7 })).output_text,
    sampled.output_text,
    "a seed repeats",
  );
  assert.notEqual(sampled.output_text, greedy, "temperature 1 samples");
  assert.notEqual((await create({ ...body, temperature: 1, seed: 8 })).output_text, sampled.output_text);
  assert.equal(await chat({ temperature: 1, seed: 7 }), sampled.output_text, "the same job as chat's");
  // top_p near 0 keeps only the likeliest token: greedy, whatever the seed, streamed or not.
  for (const seed of [7, 8]) {
    const res = await create({ ...body, temperature: 1, top_p: 1e-9, seed });
    assert.equal(res.output_text, greedy, `seed ${seed}`);
    assert.equal(res.top_p, 1e-9);
  }
  const { events } = await streamed({ ...body, temperature: 1, top_p: 1e-9, seed: 8 });
  assert.equal(deltasOf(events, "response.output_text.delta"), greedy);
  assert.equal(events.at(-1).response.top_p, 1e-9);
  // Values in between: the same text as chat completions with the same numbers.
  const mid = { temperature: 1.5, top_p: 0.5, seed: 7 };
  const both = await create({ ...body, ...mid });
  assert.deepEqual([both.temperature, both.top_p], [1.5, 0.5]);
  assert.equal(both.output_text, await chat(mid));
  assert.notEqual(both.output_text, await chat({ ...mid, top_p: 1 }), "top_p 0.5 changes the draw");
  assert.notEqual(both.output_text, await chat({ ...mid, temperature: 1 }), "temperature 1.5 changes it");
});

serverTest(
  "output that fails its schema check mid-stream ends in response.failed and error; unstreamed a 422",
  async () => {
    // The grammar can only write ["a","a"]; uniqueItems, left to the output check, rejects it.
    const schema = { type: "array", items: { const: "a" }, minItems: 2, maxItems: 2, uniqueItems: true };
    const body = {
      model: MODEL,
      input: "Two",
      text: { format: { type: "json_schema", name: "pair", schema } },
      max_output_tokens: 40,
      ...NO_THINKING,
    };
    const { events, error } = await streamed(body);
    assert.ok(error instanceof OpenAI.APIError, String(error));
    assert.equal(error.code, "invalid_output");
    assert.match(error.message, /did not satisfy the requested schema/);
    events.forEach((e, i) => {
      ResponseStreamEventSchema.parse(e);
      assert.equal(e.sequence_number, i);
    });
    const types = events.map((e) => e.type);
    assert.equal(types.at(-1), "response.failed", types.join(","));
    assert.ok(!types.includes("response.completed") && !types.includes("response.incomplete"));
    // The text went out before the check: it is in the deltas and in the failed snapshot.
    const text = deltasOf(events, "response.output_text.delta");
    assert.deepEqual(JSON.parse(text), ["a", "a"]);
    const failed = ResponseObjectSchema.parse(events.at(-1).response);
    assert.equal(failed.status, "failed");
    assert.equal(failed.error?.code, "invalid_output");
    assert.equal(failed.error?.message, error.message);
    assert.equal(failed.usage, null);
    const message = failed.output.find((o) => o.type === "message");
    assert.equal(message?.type === "message" ? message.content[0].text : undefined, text);
    // On the wire: the error event is the last one, named, and no [DONE] follows.
    const raw = await postStream(url, body, { key: KEY });
    assert.equal(raw.status, 200);
    assert.deepEqual(raw.events.slice(-2).map((e) => e.event), ["response.failed", "error"]);
    assert.ok(!raw.text.includes("[DONE]"));
    const last = JSON.parse(raw.events.at(-1)!.data);
    assert.deepEqual([last.type, last.code, last.param], ["error", "invalid_output", "text.format.schema"]);
    // Unstreamed, the output is generated again and, failing each time, never returned.
    await assert.rejects(
      create(body),
      (e: Json) => e instanceof OpenAI.APIError && e.status === 422 && e.code === "invalid_output",
    );
  },
);

serverTest(
  "the request time limit mid-stream: response.failed and error with code timeout, and the slot is freed",
  async () => {
    const limited = await startServer(
      ["--api-key", KEY, "--parallel", "1", "--request-timeout-ms", "3000"],
      { waitReady: true },
    );
    try {
      const sdk = new OpenAI({ baseURL: `${limited.url}/v1`, apiKey: KEY, maxRetries: 0 });
      const stream = await sdk.responses.create({
        model: MODEL,
        input: "Go on",
        max_output_tokens: 20000,
        seed: 1,
        // <|endoftext|> and <|im_end|> never come: only the time limit ends this answer.
        logit_bias: { "151643": -100, "151645": -100 },
        stream: true,
        ...NO_THINKING,
      } as never) as unknown as AsyncIterable<Json>;
      const events: Json[] = [];
      const error = await (async () => {
        for await (const e of stream) events.push(e);
      })().then(() => undefined, (e) => e);
      assert.ok(error instanceof OpenAI.APIError, String(error));
      assert.equal(error.code, "timeout");
      events.forEach((e, i) => assert.equal(e.sequence_number, i));
      const failed = events.at(-1);
      assert.equal(failed.type, "response.failed", events.map((e) => e.type).join(","));
      const response = ResponseObjectSchema.parse(failed.response);
      assert.deepEqual(response.error, { code: "timeout", message: error.message });
      // It failed mid-way: text had been sent, and the snapshot holds it.
      const text = deltasOf(events, "response.output_text.delta");
      assert.ok(text.length > 0, "text was streamed before the limit");
      const message = response.output.find((o) => o.type === "message");
      assert.equal(message?.type === "message" ? message.content[0].text : undefined, text);
      // The one sequence is free again.
      const next = await sdk.responses.create({ model: MODEL, input: "hi", max_output_tokens: 2 } as never);
      assert.equal((next as Json).object, "response");
    } finally {
      await limited.stop();
    }
  },
);

serverTest(
  "stateless: store true, previous_response_id, conversation, background and retrieval are refused",
  async () => {
    const base = { model: MODEL, input: "hi", max_output_tokens: 2 };
    for (
      const [field, value] of [["store", true], ["previous_response_id", "resp_1"], [
        "conversation",
        "conv_1",
      ], [
        "background",
        true,
      ]] as const
    ) {
      const res = await postJson(url, { ...base, [field]: value }, KEY);
      assertApiError(res, 400, { param: field, code: "unsupported_value" });
      assert.match(res.body.error.message, /stateless/);
    }
    // store false (what agent CLIs send) is fine.
    assert.equal((await postJson(url, { ...base, store: false }, KEY)).status, 200);
    const got = await fetch(`${server.url}/v1/responses/resp_123`, {
      headers: { authorization: `Bearer ${KEY}` },
    });
    assertApiError({ status: got.status, body: await got.json() }, 404, { code: "not_found" });
  },
);

serverTest("bad input is a 400 naming the Responses field, and the server keeps serving", async () => {
  const cases: [Record<string, unknown>, string][] = [
    [{ input: 5 }, "input"],
    [{ input: [{ type: "computer_call" }] }, "input[0].type"],
    [{ input: [{ type: "item_reference", id: "msg_1" }] }, "input[0].type"],
    [
      { input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] },
      "input[0].content[0].type",
    ],
    [{ input: [{ role: "robot", content: "x" }] }, "input[0].role"],
    [{
      input: [{ role: "user", content: "x" }, { type: "function_call_output", call_id: "nope", output: "x" }],
    }, "input[1].call_id"],
    [
      { input: [{ type: "function_call", call_id: "c1", name: "get_weather", arguments: "not json" }] },
      "input[0].arguments",
    ],
    [{ tools: [{ type: "web_search_2030" }] }, "tools[0].type"],
    [
      { tools: [{ type: "namespace", name: "ns", tools: [{ type: "web_search" }] }] },
      "tools[0].tools[0].type",
    ],
    [
      { tools: [{ type: "namespace", name: "ns", tools: [{ type: "function", name: "a b" }] }] },
      "tools[0].tools[0].name",
    ],
    [{
      tools: [{ type: "function", name: "ns__f" }, {
        type: "namespace",
        name: "ns",
        tools: [{ type: "function", name: "f" }],
      }],
    }, "tools[1].tools[0].name"],
    [
      {
        tools: [{ type: "custom", name: "c", format: { type: "grammar", syntax: "ebnf", definition: "x" } }],
      },
      "tools[0].format.syntax",
    ],
    [{ tools: [{ type: "file_search" }], tool_choice: { type: "file_search" } }, "tool_choice"],
    [
      { input: [{ type: "reasoning", summary: [], encrypted_content: "vsr1_AAAA" }] },
      "input[0].encrypted_content",
    ],
    [{ tools: [{ type: "function", name: "bad name" }] }, "tools[0].name"],
    [{ tools: [WEATHER], tool_choice: { type: "function", name: "other" } }, "tool_choice.name"],
    [{ tool_choice: "required" }, "tool_choice"],
    [
      { text: { format: { type: "json_schema", name: "s", schema: { type: "string", format: "ipv6" } } } },
      "text.format.schema",
    ],
    [{ max_output_tokens: 0 }, "max_output_tokens"],
    [{ reasoning: { effort: "extreme" } }, "reasoning.effort"],
  ];
  for (const [patch, param] of cases) {
    const res = await postJson(url, { model: MODEL, input: "hi", max_output_tokens: 2, ...patch }, KEY);
    assertApiError(res, 400, { param });
  }
  assertApiError(await postJson(url, { model: "nope", input: "hi" }, KEY), 404);
  assert.equal((await postJson(url, { model: MODEL, input: "hi", max_output_tokens: 2 }, KEY)).status, 200);
});

serverTest("an answer that ends at once is still a message item (empty), streamed or not", async () => {
  // <|im_end|> (151645) as the first token: the model says nothing.
  const body = { model: MODEL, input: "hi", logit_bias: { "151645": 100 }, ...NO_THINKING };
  const res = await create(body);
  assert.equal(res.status, "completed");
  assert.deepEqual(res.output.map((o: Json) => [o.type, o.content?.[0]?.text]), [["message", ""]]);
  assert.equal(res.output_text, "");
  const { events } = await streamed(body);
  const done = events.find((e) => e.type === "response.output_item.done");
  assert.equal(done.item.type, "message");
  assert.equal(done.item.content[0].text, "");
  assert.deepEqual(events.at(-1).response.output, [done.item]);
});

// What Codex (0.171) sends: a namespace of function tools, hosted tools, developer messages first,
// and include: ["reasoning.encrypted_content"] with store: false.
const AGENTS = {
  type: "namespace",
  name: "multi_agent_v1",
  description: "Tools for spawning and managing sub-agents.",
  tools: [
    {
      type: "function",
      name: "close_agent",
      description: "Close an agent.",
      strict: false,
      parameters: {
        type: "object",
        properties: { target: { type: "string", enum: ["a1", "a2"] } },
        required: ["target"],
        additionalProperties: false,
      },
    },
    {
      type: "function",
      name: "wait_agent",
      parameters: { type: "object", properties: {}, additionalProperties: false },
    },
  ],
};

serverTest(
  "namespace tools: a call names the function and its namespace, and goes back in as history",
  async () => {
    const body = {
      model: MODEL,
      input: "Close agent a1",
      tools: [WEATHER, AGENTS],
      // The inner name is enough when it is unique.
      tool_choice: { type: "function", name: "close_agent" },
      parallel_tool_calls: false,
      ...NO_THINKING,
    };
    const first = await create(body);
    ResponseObjectSchema.parse(first);
    const call = first.output.find((o: Json) => o.type === "function_call");
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, "close_agent");
    assert.equal(call.namespace, "multi_agent_v1");
    assert.ok(["a1", "a2"].includes(JSON.parse(call.arguments).target), call.arguments);
    // Streamed: the item is named the same from output_item.added on.
    const { events } = await streamed(body);
    const added = events.find((e) =>
      e.type === "response.output_item.added" && e.item.type === "function_call"
    );
    assert.equal(added.item.name, "close_agent");
    assert.equal(added.item.namespace, "multi_agent_v1");
    assert.equal(events.at(-1).type, "response.completed");
    // History with the namespace is the model's flat name, multi_agent_v1__close_agent.
    const history = (name: Record<string, string>) =>
      create({
        model: MODEL,
        input: [
          { role: "user", content: "Close agent a1" },
          { type: "function_call", call_id: "call_1", arguments: '{"target":"a1"}', ...name },
          { type: "function_call_output", call_id: "call_1", output: "closed" },
        ],
        tools: [AGENTS],
        tool_choice: "none",
        max_output_tokens: 1,
        ...NO_THINKING,
      });
    const a = await history({ name: "close_agent", namespace: "multi_agent_v1" });
    const b = await history({ name: "multi_agent_v1__close_agent" });
    const c = await history({ name: "close_agent" });
    assert.equal(a.usage.input_tokens, b.usage.input_tokens);
    assert.notEqual(a.usage.input_tokens, c.usage.input_tokens);
  },
);

serverTest(
  "custom tools: a forced call is a custom_tool_call whose input follows a regex format",
  async () => {
    const patch = {
      type: "custom",
      name: "apply_patch",
      description: "Apply a patch.",
      format: { type: "grammar", syntax: "regex", definition: "(add|del) [a-c]{2}" },
    };
    const body = {
      model: MODEL,
      input: "Patch it",
      tools: [WEATHER, patch],
      tool_choice: { type: "custom", name: "apply_patch" },
      parallel_tool_calls: false,
      ...NO_THINKING,
    };
    const first = await create(body);
    ResponseObjectSchema.parse(first);
    const call = first.output.find((o: Json) => o.type === "custom_tool_call");
    assert.ok(call, JSON.stringify(first.output));
    assert.match(call.id, /^ctc_/);
    assert.equal(call.name, "apply_patch");
    assert.match(call.input, /^(add|del) [a-c]{2}$/);
    const { events } = await streamed(body);
    const done = events.find((e) => e.type === "response.custom_tool_call_input.done");
    const item = events.find((e) =>
      e.type === "response.output_item.done" && e.item.type === "custom_tool_call"
    );
    assert.match(done.input, /^(add|del) [a-c]{2}$/);
    assert.equal(deltasOf(events, "response.custom_tool_call_input.delta"), done.input);
    assert.equal(item.item.input, done.input);
    // The call and its output go back in as history.
    const second = await create({
      model: MODEL,
      input: [
        { role: "user", content: "Patch it" },
        { type: "custom_tool_call", call_id: call.call_id, name: "apply_patch", input: call.input },
        { type: "custom_tool_call_output", call_id: call.call_id, output: "applied" },
      ],
      tools: [patch],
      tool_choice: "none",
      max_output_tokens: 2,
      ...NO_THINKING,
    });
    assert.equal(second.object, "response");
  },
);

serverTest(
  "hosted tools are left out of the prompt: named in x-vserve-ignored-tools and in a log warning",
  async () => {
    const base = { model: MODEL, input: "Weather?", max_output_tokens: 1, ...NO_THINKING };
    const plain = await postJson(url, { ...base, tools: [WEATHER] }, KEY);
    assert.equal(plain.status, 200, JSON.stringify(plain.body));
    assert.equal(plain.headers.get("x-vserve-ignored-tools"), null);
    const hosted = await postJson(url, {
      ...base,
      tools: [
        { type: "web_search", external_web_access: false },
        WEATHER,
        { type: "mcp", server_label: "x", server_url: "https://example.com" },
        { type: "web_search" },
      ],
    }, KEY);
    assert.equal(hosted.status, 200, JSON.stringify(hosted.body));
    assert.equal(hosted.headers.get("x-vserve-ignored-tools"), "web_search, mcp");
    assert.equal(hosted.body.usage.input_tokens, plain.body.usage.input_tokens, "the prompt is the same");
    assert.deepEqual(hosted.body.tools.map((t: Json) => t.type), [
      "web_search",
      "function",
      "mcp",
      "web_search",
    ]);
    const id = hosted.headers.get("x-request-id");
    const warning = server.logs.map((l) => JSON.parse(l)).find((e) =>
      e.request_id === id && e.level === "warn"
    );
    assert.deepEqual(warning?.tools, ["web_search", "mcp"]);
    // Streamed: the header comes with the event stream.
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ ...base, stream: true, tools: [{ type: "file_search" }] }),
    });
    assert.equal(res.headers.get("x-vserve-ignored-tools"), "file_search");
    await res.body?.cancel();
    // Forcing a tool the server does not run cannot be ignored.
    assertApiError(
      await postJson(
        url,
        { ...base, tools: [{ type: "web_search" }], tool_choice: { type: "web_search" } },
        KEY,
      ),
      400,
      { param: "tool_choice", code: "unsupported_value" },
    );
  },
);

serverTest(
  "Codex's request shape: leading developer messages are joined, and the tools it sends are accepted",
  async () => {
    const res = await create({
      model: MODEL,
      input: [
        { type: "message", id: "msg_1", role: "developer", content: [{ type: "input_text", text: "Base." }] },
        {
          type: "message",
          id: "msg_2",
          role: "developer",
          content: [{ type: "input_text", text: "Skills." }],
        },
        { type: "message", role: "user", content: [{ type: "input_text", text: "<environment_context/>" }] },
        { type: "message", role: "user", content: [{ type: "input_text", text: "Run echo hello" }] },
      ],
      tools: [WEATHER, AGENTS, { type: "web_search", external_web_access: false }],
      tool_choice: "auto",
      parallel_tool_calls: true,
      // "max" (the SDK's newest effort) is thinking on, as the default here.
      reasoning: { summary: "auto", effort: "max" },
      text: { verbosity: "low" },
      store: false,
      include: ["reasoning.encrypted_content"],
      prompt_cache_key: "019a-session",
      client_metadata: { session_id: "019a-session" },
      stream: false,
      max_output_tokens: 2,
    });
    assert.equal(res.object, "response");
    // Joined, they are the one system message of a chat request with both texts.
    const chat = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: "system", content: "Base.\n\nSkills." },
        { role: "user", content: "<environment_context/>" },
        { role: "user", content: "Run echo hello" },
      ],
      tools: [
        WEATHER,
        ...AGENTS.tools.map((t: Json) => ({
          ...t,
          name: `multi_agent_v1__${t.name}`,
          description: t.description ?? AGENTS.description,
        })),
      ].map((t: Json) => ({
        type: "function" as const,
        function: { name: t.name, description: t.description, parameters: t.parameters, strict: t.strict },
      })),
      max_completion_tokens: 2,
    } as never) as Json;
    assert.equal(res.usage.input_tokens, chat.usage.prompt_tokens);
  },
);

serverTest(
  "a developer or system message after the first turn is a <system-reminder> user turn, as on chat completions",
  async () => {
    const res = await create({
      model: MODEL,
      instructions: "Base.",
      input: [
        { role: "user", content: "hi" },
        { role: "assistant", content: "ok" },
        { type: "message", role: "developer", content: [{ type: "input_text", text: "Late." }] },
        { role: "system", content: "Later." },
      ],
      max_output_tokens: 1,
      ...NO_THINKING,
    });
    const rendered = await postJson(`${server.url}/tokenize`, {
      model: MODEL,
      messages: [
        { role: "system", content: "Base." },
        { role: "user", content: "hi" },
        { role: "assistant", content: "ok" },
        { role: "user", content: "<system-reminder>\nLate.\n</system-reminder>" },
        { role: "user", content: "<system-reminder>\nLater.\n</system-reminder>" },
      ],
      chat_template_kwargs: { enable_thinking: false },
    }, KEY);
    assert.equal(res.usage.input_tokens, rendered.body.count);
  },
);

serverTest(
  "reasoning round trip: encrypted_content restores the thinking; an altered one is a 400 naming the item",
  async () => {
    // Thinking on; `</think>` (151668) favoured so that it ends within a few tokens.
    const first = await create({
      model: MODEL,
      input: "Think, then answer",
      include: ["reasoning.encrypted_content"],
      store: false,
      max_output_tokens: 40,
      logit_bias: { "151668": 10 },
      seed: 4,
    });
    const reasoning = first.output.find((o: Json) => o.type === "reasoning");
    assert.ok(reasoning, JSON.stringify(first.output));
    assert.match(reasoning.encrypted_content, /^vsr1_[A-Za-z0-9_-]+$/);
    // Not asked for: none.
    const plain = await create({ model: MODEL, input: "Think", max_output_tokens: 3, seed: 4 });
    assert.equal(plain.output[0].encrypted_content, undefined);
    // Streamed: the sealed blob is in the item's output_item.done and in the final response.
    const { events } = await streamed({
      model: MODEL,
      input: "Think, then answer",
      include: ["reasoning.encrypted_content"],
      max_output_tokens: 40,
      logit_bias: { "151668": 10 },
      seed: 4,
    });
    const done = events.find((e) => e.type === "response.output_item.done" && e.item.type === "reasoning");
    assert.match(done.item.encrypted_content, /^vsr1_/);
    assert.equal(events.at(-1).response.output[0].encrypted_content, done.item.encrypted_content);

    // Sent back, only the blob carries the thinking: the summary is left empty. (The template keeps
    // the thinking of the turn in progress, here a call and its result after the last user query.)
    const text = reasoning.summary[0].text;
    const turn = (item: Record<string, unknown>) =>
      create({
        model: MODEL,
        input: [
          { role: "user", content: "Think, then answer" },
          { type: "reasoning", id: reasoning.id, summary: [], ...item },
          {
            type: "function_call",
            call_id: "call_1",
            name: "get_weather",
            arguments: '{"city":"Oslo","days":1}',
          },
          { type: "function_call_output", call_id: "call_1", output: "Snow" },
        ],
        tools: [WEATHER],
        max_output_tokens: 1,
        ...NO_THINKING,
      });
    const sealed = await turn({ encrypted_content: reasoning.encrypted_content });
    const given = await turn({ content: [{ type: "reasoning_text", text }] });
    const none = await turn({});
    assert.equal(sealed.usage.input_tokens, given.usage.input_tokens, "the thinking is in the prompt");
    assert.ok(sealed.usage.input_tokens > none.usage.input_tokens);

    // One altered character, a foreign blob, or garbage: 400 naming the item's field.
    const blob: string = reasoning.encrypted_content;
    const flipped = blob.slice(0, 20) + (blob[20] === "A" ? "B" : "A") + blob.slice(21);
    for (const bad of [flipped, "gAAAAABfake-openai-blob", "vsr1_!!!"]) {
      const res = await postJson(url, {
        model: MODEL,
        input: [
          { role: "user", content: "x" },
          { type: "reasoning", summary: [], encrypted_content: bad },
          { role: "assistant", content: "y" },
          { role: "user", content: "z" },
        ],
        max_output_tokens: 1,
      }, KEY);
      assertApiError(res, 400, { param: "input[1].encrypted_content", code: "invalid_encrypted_content" });
    }
  },
);

serverTest(
  "tool_choice required with text.format: the forced call comes first, then schema-valid text under auto",
  async () => {
    const schema = {
      type: "object",
      properties: { city: { type: "string", enum: ["Paris", "Rome"] } },
      required: ["city"],
      additionalProperties: false,
    };
    const format = { format: { type: "json_schema", name: "answer", schema, strict: true } };
    const first = await create({
      model: MODEL,
      input: "Weather?",
      tools: [WEATHER],
      tool_choice: "required",
      text: format,
      ...NO_THINKING,
    });
    const call = first.output.find((o: Json) => o.type === "function_call");
    assert.ok(call, JSON.stringify(first.output));
    assert.ok((await checkSchema(WEATHER.parameters, JSON.parse(call.arguments))).ok);
    const history = [
      { role: "user", content: "Weather?" },
      call,
      { type: "function_call_output", call_id: call.call_id, output: "Sunny" },
    ];
    // Under auto the grammar allows a call or the format; `<tool_call>` (151657) disfavoured: text (the
    // grammar's call opens with that token only, never with the tag spelled in pieces).
    const second = await create({
      model: MODEL,
      input: history,
      tools: [WEATHER],
      tool_choice: "auto",
      text: format,
      logit_bias: { "151657": -100 },
      ...NO_THINKING,
    });
    assert.equal(second.status, "completed");
    assert.ok(second.output_text, JSON.stringify(second.output));
    assert.ok((await checkSchema(schema, JSON.parse(second.output_text))).ok, second.output_text);
    // …and favoured, a call: the format no longer shuts tools out.
    const again = await create({
      model: MODEL,
      input: history,
      tools: [WEATHER],
      tool_choice: "auto",
      text: format,
      logit_bias: { "151657": 100 },
      parallel_tool_calls: false,
      ...NO_THINKING,
    });
    const next = again.output.find((o: Json) => o.type === "function_call");
    assert.ok(next, JSON.stringify(again.output));
    assert.ok((await checkSchema(WEATHER.parameters, JSON.parse(next.arguments))).ok, next.arguments);
  },
);

serverTest(
  "--hosted-tools refuse: a hosted tool is a 400 (Responses and Anthropic); --reasoning-key: blobs and signatures survive a restart",
  async () => {
    const dir = await Deno.makeTempDir();
    const models = `${dir}/models.json`;
    await Deno.writeTextFile(
      models,
      JSON.stringify({
        models: [{ id: MODEL, kind: "chat", source: "builtin:tiny-moe", contextSize: 4096, parallel: 1 }],
      }),
    );
    const args = ["--api-key", KEY, "--models", models, "--hosted-tools", "refuse"];
    const secret = "a-reasoning-key-of-32-characters!";
    const start = () => startServer(args, { waitReady: true, env: { VSERVE_REASONING_KEY: secret } });
    let one = await start();
    let blob: string;
    let signature: string;
    try {
      const at = `${one.url}/v1/responses`;
      const refused = await postJson(at, {
        model: MODEL,
        input: "x",
        tools: [WEATHER, { type: "web_search" }],
        max_output_tokens: 1,
      }, KEY);
      assertApiError(refused, 400, { param: "tools[1].type", code: "unsupported_value" });
      assert.match(refused.body.error.message, /--hosted-tools refuse/);
      const anthropic = await postJson(`${one.url}/v1/messages`, {
        model: MODEL,
        max_tokens: 1,
        tools: [{ type: "web_search_20250305", name: "web_search" }],
        messages: [{ role: "user", content: "x" }],
      }, KEY);
      assert.equal(anthropic.status, 400);
      assert.equal(anthropic.body.error.type, "invalid_request_error");
      assert.match(anthropic.body.error.message, /^tools\[0\]\.type: .*--hosted-tools refuse/);
      const thought = await postJson(`${one.url}/v1/messages`, {
        model: MODEL,
        max_tokens: 30,
        thinking: { type: "enabled", budget_tokens: 1024, display: "omitted" },
        messages: [{ role: "user", content: "Think" }],
      }, KEY);
      // (No bias toward </think>, here or below: as a first token it leaves no thinking, so nothing to seal.)
      assert.equal(thought.body.content[0]?.type, "thinking", JSON.stringify(thought.body));
      signature = thought.body.content[0].signature;
      assert.match(signature, /^vsr1_/);
      const res = await postJson(at, {
        model: MODEL,
        input: "Think",
        include: ["reasoning.encrypted_content"],
        max_output_tokens: 30,
      }, KEY);
      const reasoning = res.body.output.find((o: Json) => o.type === "reasoning");
      assert.ok(reasoning, JSON.stringify(res.body.output));
      blob = reasoning.encrypted_content;
      // The main server's key is another (made at its start): the blob does not open there.
      const foreign = await postJson(url, {
        model: MODEL,
        input: [{ role: "user", content: "x" }, { type: "reasoning", summary: [], encrypted_content: blob }, {
          role: "user",
          content: "y",
        }],
        max_output_tokens: 1,
      }, KEY);
      assertApiError(foreign, 400, { param: "input[1].encrypted_content" });
    } finally {
      await one.stop();
    }
    one = await start();
    try {
      const back = await postJson(`${one.url}/v1/responses`, {
        model: MODEL,
        input: [{ role: "user", content: "x" }, { type: "reasoning", summary: [], encrypted_content: blob }, {
          role: "user",
          content: "y",
        }],
        max_output_tokens: 1,
      }, KEY);
      assert.equal(back.status, 200, JSON.stringify(back.body));
      const signed = await postJson(`${one.url}/v1/messages`, {
        model: MODEL,
        max_tokens: 1,
        messages: [
          { role: "user", content: "Think" },
          {
            role: "assistant",
            content: [{ type: "thinking", thinking: "", signature }, { type: "text", text: "y" }],
          },
          { role: "user", content: "z" },
        ],
      }, KEY);
      assert.equal(signed.status, 200, JSON.stringify(signed.body));
    } finally {
      await one.stop();
    }
  },
);

// The event writer on fake chunks (pure logic): item order, closing, and a failure mid-stream.
function chunk(
  delta: ChatChunk["choices"][0]["delta"],
  finish: ChatChunk["choices"][0]["finish_reason"] = null,
) {
  return {
    id: "chatcmpl-x",
    object: "chat.completion.chunk" as const,
    created: 0,
    model: "m",
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
}
const BASE = {
  id: "resp_x",
  object: "response" as const,
  created_at: 0,
  instructions: null,
  max_output_tokens: null,
  model: "m",
  parallel_tool_calls: true,
  previous_response_id: null,
  reasoning: { effort: null, summary: null },
  store: false as const,
  temperature: null,
  text: { format: { type: "text" } },
  tool_choice: "auto",
  tools: [],
  top_p: null,
  truncation: "disabled",
  metadata: {},
};

Deno.test("stream events: reasoning, blank text, two calls; each item closed before the next opens", async () => {
  async function* chunks(): AsyncGenerator<ChatChunk> {
    yield chunk({ role: "assistant", content: "" });
    yield chunk({ reasoning_content: "hm" });
    yield chunk({ content: "\n\n" });
    yield chunk({
      tool_calls: [{ index: 0, id: "call_a", type: "function", function: { name: "f", arguments: "" } }],
    });
    yield chunk({ tool_calls: [{ index: 0, function: { arguments: '{"a":1}' } }] });
    yield chunk({
      tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "g", arguments: "" } }],
    });
    yield chunk({ tool_calls: [{ index: 1, function: { arguments: "{}" } }] });
    yield chunk({}, "tool_calls");
  }
  const events: Json[] = [];
  for await (const e of streamEvents(BASE, chunks(), (e) => e)) events.push(e);
  const types = events.map((e) => e.type);
  assert.deepEqual(types, [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
  ]);
  const final = events.at(-1).response;
  assert.deepEqual(final.output.map((o: Json) => o.type), ["reasoning", "function_call", "function_call"]);
  assert.deepEqual(final.output.slice(1).map((o: Json) => [o.call_id, o.arguments]), [["call_a", '{"a":1}'], [
    "call_b",
    "{}",
  ]]);
  // The added item is an empty shell; the done one is whole.
  assert.deepEqual(events[2].item.summary, []);
  assert.equal(events[7].item.summary[0].text, "hm");
});

Deno.test("stream events: a call cut by the token limit is incomplete; the call before it completed", async () => {
  async function* chunks(): AsyncGenerator<ChatChunk> {
    yield chunk({
      tool_calls: [{
        index: 0,
        id: "call_a",
        type: "function",
        function: { name: "f", arguments: '{"a":1}' },
      }],
    });
    yield chunk({
      tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "g", arguments: '{"b":' } }],
    });
    yield chunk({}, "length");
  }
  const events: Json[] = [];
  for await (const e of streamEvents(BASE, chunks(), (e) => e)) events.push(e);
  const done = events.filter((e) => e.type === "response.output_item.done").map((e) => e.item.status);
  assert.deepEqual(done, ["completed", "incomplete"]);
  const final = events.at(-1);
  assert.equal(final.type, "response.incomplete");
  assert.deepEqual(final.response.output.map((o: Json) => o.status), ["completed", "incomplete"]);
});

Deno.test("stream events: an error mid-stream is response.failed, then an error event; nothing after", async () => {
  async function* chunks(): AsyncGenerator<ChatChunk> {
    yield chunk({ content: "par" });
    throw new ApiError(500, "server_error", "The output did not satisfy the schema.", null, "invalid_output");
  }
  const events: Json[] = [];
  for await (const e of streamEvents(BASE, chunks(), (e) => e)) events.push(e);
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(-2), ["response.failed", "error"]);
  assert.equal(events.at(-2).response.status, "failed");
  assert.deepEqual(events.at(-2).response.error, {
    code: "invalid_output",
    message: "The output did not satisfy the schema.",
  });
  assert.equal(events.at(-1).code, "invalid_output");
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
});
