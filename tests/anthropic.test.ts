/**
 * The Anthropic Messages API through a real server and the official `@anthropic-ai/sdk`: messages,
 * streams (Anthropic's events in their order), thinking on / off / omitted, tools (forced, then a
 * tool_result turn), stop sequences, count_tokens, Anthropic-shaped errors, load shedding (529)
 * and a client leaving mid-stream, the request Claude Code sends, and the same API through the
 * gateway (a model served by upstreams); the error mapping as a unit.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { type Json, postJson, startServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { startStandIn } from "./helpers/standin.ts";
import { postStream, SseReader } from "./helpers/sse.ts";
import { scrapeMetrics } from "./helpers/metrics.ts";
import { poll } from "./helpers/poll.ts";
import { AnthropicErrorSchema, MessageSchema, MessageStreamEventSchema } from "../src/protocol/anthropic.ts";
import { anthropicError } from "../src/services/messages.ts";
import { ApiError } from "../src/http/errors.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";

// Two sequences and no queue: a third request at once is shed (529), and a leaked sequence would show.
const registry = await writeJsonFile({
  models: [{ id: MODEL, kind: "chat", source: "builtin:tiny-moe", contextSize: 32768, parallel: 2 }],
});
const server = await startServer(
  ["--models", registry, "--api-key", KEY, "--max-queue", "0", "--body-limit-bytes", "4000000"],
  { waitReady: true },
);
globalThis.addEventListener("unload", () => void server.stop());
const client = new Anthropic({ baseURL: server.url, apiKey: KEY, maxRetries: 0 });
const url = `${server.url}/v1/messages`;

/** POST with `x-api-key`, as Anthropic clients authenticate. */
function post(body: unknown, headers: Record<string, string> = {}, path = "/v1/messages") {
  return postJson(`${server.url}${path}`, body, null, { "x-api-key": KEY, ...headers });
}

interface SseEvent {
  event: string;
  data: Json;
}

/** A streamed request read to its end: its status, headers and `event:` + `data:` frames. */
async function stream(body: unknown, headers: Record<string, string> = {}, base = server.url) {
  const res = await postStream(`${base}/v1/messages?beta=true`, body as Record<string, unknown>, {
    key: null,
    headers: { "x-api-key": KEY, ...headers },
  });
  const events: SseEvent[] = res.events.map((e) => ({ event: e.event ?? "", data: JSON.parse(e.data) }));
  return { status: res.status, headers: res.headers, events, text: res.text };
}

/**
 * Asserts Anthropic's order: `message_start`, `ping`, blocks 0, 1, … each opened, filled and closed
 * before the next, a thinking block's signature last, then `message_delta` and `message_stop`.
 */
function assertEventOrder(events: SseEvent[]): void {
  for (const e of events) {
    assert.equal(e.event, e.data.type, "the event name is the payload's type");
    MessageStreamEventSchema.parse(e.data);
  }
  const types = events.map((e) => e.data.type);
  assert.deepEqual(types.slice(0, 2), ["message_start", "ping"]);
  assert.deepEqual(types.slice(-2), ["message_delta", "message_stop"]);
  let open = -1;
  let kind = "";
  let last = "";
  for (const e of events.slice(2, -2)) {
    const d = e.data;
    if (d.type === "content_block_start") {
      assert.equal(open, -1, "a block opens after the previous one closed");
      assert.equal(d.index, events.filter((x) => x.data.type === "content_block_start").indexOf(e));
      open = d.index;
      kind = d.content_block.type;
      last = "";
    } else if (d.type === "content_block_delta") {
      assert.equal(d.index, open);
      const expected = { text: "text_delta", tool_use: "input_json_delta", thinking: "thinking_delta" }[kind];
      assert.ok(d.delta.type === expected || (kind === "thinking" && d.delta.type === "signature_delta"));
      if (kind === "thinking") assert.notEqual(last, "signature_delta", "the signature comes last");
      last = d.delta.type;
    } else if (d.type === "content_block_stop") {
      assert.equal(d.index, open);
      if (kind === "thinking") {
        assert.equal(last, "signature_delta", "a thinking block ends with its signature");
      }
      open = -1;
    } else if (d.type !== "ping") assert.fail(`unexpected ${d.type} between the blocks`);
  }
  assert.equal(open, -1, "every block is closed");
}

async function assertAnthropicError(
  res: { status: number; headers: Headers; body: Json },
  status: number,
  type: string,
  mentions?: string,
) {
  assert.equal(res.status, status, JSON.stringify(res.body));
  const body = AnthropicErrorSchema.strict().parse(res.body);
  assert.equal(body.error.type, type);
  assert.equal(body.request_id, res.headers.get("request-id"));
  assert.ok(!/\bat .*\.ts:\d+/.test(body.error.message), "no stack trace");
  if (mentions) assert.ok(body.error.message.includes(mentions), `'${mentions}' in: ${body.error.message}`);
  await Promise.resolve();
}

const WEATHER = {
  name: "get_weather",
  description: "The weather in a city",
  input_schema: {
    type: "object" as const,
    properties: {
      city: { type: "string", enum: ["Paris", "Rome", "Oslo"] },
      days: { type: "integer", minimum: 1, maximum: 3 },
    },
    required: ["city", "days"],
    additionalProperties: false,
  },
};
const TIME = {
  name: "get_time",
  description: "The time in a city",
  input_schema: {
    type: "object" as const,
    properties: { city: { type: "string", enum: ["Paris", "Rome"] } },
    required: ["city"],
  },
};
const OFF = { type: "disabled" } as const;

serverTest("messages.create: a message with usage, on the same engine path as chat completions", async () => {
  // temperature: sent as the API defines it (this SDK version leaves it out of its types).
  const res = await client.messages.create({
    model: MODEL,
    max_tokens: 8,
    temperature: 0,
    thinking: OFF,
    messages: [{ role: "user", content: "Say hi" }],
  } as never) as Anthropic.Message & { _request_id?: string | null };
  const msg = MessageSchema.parse(res);
  assert.match(msg.id, /^msg_/);
  assert.equal(msg.model, MODEL);
  assert.ok(msg.content.every((b) => b.type === "text"), "thinking disabled: no thinking block");
  assert.ok(msg.usage.output_tokens >= 1 && msg.usage.output_tokens <= 8);
  assert.equal(msg.stop_reason, msg.usage.output_tokens === 8 ? "max_tokens" : "end_turn");
  assert.equal(msg.stop_sequence, null);
  assert.match(res._request_id ?? "", /^req-/, "the SDK reads the request-id header");
  // The same conversation through /v1/chat/completions: the same prompt, the same greedy text.
  const openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const chat = await openai.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "Say hi" }],
    max_tokens: 8,
    temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  } as never) as Json;
  assert.equal(chat.usage.prompt_tokens, msg.usage.input_tokens + msg.usage.cache_read_input_tokens);
  assert.equal(chat.choices[0].message.content ?? "", msg.content.map((b) => (b as Json).text).join(""));
  // The access log and the metrics count it like any chat request.
  // (Both are written as the request ends, which may come after the client has read the body.)
  const line = await poll(
    "the request was logged",
    () =>
      server.logs.map((l) => JSON.parse(l)).find((l) =>
        l.msg === "request" && l.request_id === res._request_id
      ),
  );
  assert.equal(line.route, "/v1/messages");
  assert.equal(line.completion_tokens, msg.usage.output_tokens);
  const metrics = await scrapeMetrics(server.url, { headers: { "x-api-key": KEY } });
  assert.ok(metrics.counter("vserve_http_requests_total", { route: "/v1/messages", status: "200" }) >= 1);
});

serverTest("messages.stream: Anthropic's events in their order, and the SDK's finalMessage", async () => {
  const raw = await stream({
    model: MODEL,
    max_tokens: 24,
    thinking: { type: "enabled", budget_tokens: 1024 },
    messages: [{ role: "user", content: "Tell me a story" }],
  });
  assert.equal(raw.status, 200);
  assert.match(raw.headers.get("content-type") ?? "", /^text\/event-stream/);
  assert.ok(!raw.text.includes("[DONE]"), "no [DONE] in an Anthropic stream");
  assertEventOrder(raw.events);
  const start = raw.events[0].data.message;
  assert.deepEqual(start.content, []);
  assert.equal(start.stop_reason, null);
  assert.equal(raw.events[2].data.content_block.type, "thinking", "thinking on: the thinking block first");
  const delta = raw.events.at(-2)!.data;
  assert.equal(delta.usage.output_tokens, 24);
  assert.equal(delta.delta.stop_reason, "max_tokens");
  assert.equal(
    delta.usage.input_tokens + delta.usage.cache_read_input_tokens,
    start.usage.input_tokens + start.usage.cache_read_input_tokens,
  );

  let streamed = "";
  const s = client.messages.stream({
    model: MODEL,
    max_tokens: 16,
    thinking: OFF,
    messages: [{ role: "user", content: "Tell me a story" }],
  });
  s.on("text", (t) => (streamed += t));
  const final = await s.finalMessage();
  MessageSchema.parse(final);
  assert.equal(final.usage.output_tokens, 16);
  assert.equal(final.stop_reason, "max_tokens");
  assert.equal(final.content.map((b) => (b as Json).text ?? "").join(""), streamed);
});

serverTest(
  "thinking: enabled gives a signed thinking block, disabled none, omitted one that comes back",
  async () => {
    const on = await client.messages.create({
      model: MODEL,
      max_tokens: 12,
      thinking: { type: "enabled", budget_tokens: 1024 },
      messages: [{ role: "user", content: "Think" }],
    });
    const block = on.content[0] as Json;
    assert.equal(block.type, "thinking");
    assert.ok(block.thinking.length > 0 && block.signature.length > 0);
    assert.ok((on.usage as Json).output_tokens_details.thinking_tokens > 0);
    const off = await client.messages.create({
      model: MODEL,
      max_tokens: 12,
      thinking: OFF,
      messages: [{ role: "user", content: "Think" }],
    });
    assert.ok(off.content.every((b) => b.type !== "thinking"));
    assert.equal((off.usage as Json).output_tokens_details.thinking_tokens, 0);

    // display: omitted (Claude Code's choice): no text, and the signature restores it on the next turn.
    const omitted = await client.messages.create({
      model: MODEL,
      max_tokens: 12,
      thinking: { type: "adaptive", display: "omitted" } as never,
      messages: [{ role: "user", content: "Think" }],
    });
    const hidden = omitted.content[0] as Json;
    assert.equal(hidden.type, "thinking");
    assert.equal(hidden.thinking, "");
    // Other displays show the text (Claude Code 2.1.332 sends "updates"; it was a 400).
    const updates = await post({
      model: MODEL,
      max_tokens: 12,
      thinking: { type: "adaptive", display: "updates" },
      messages: [{ role: "user", content: "Think" }],
    });
    assert.equal(updates.status, 200, JSON.stringify(updates.body));
    assert.ok(updates.body.content[0].thinking.length > 0);
    const history = (thinking: Json[]) => ({
      model: MODEL,
      tools: [WEATHER],
      messages: [
        { role: "user", content: "Weather?" },
        {
          role: "assistant",
          content: [...thinking, {
            type: "tool_use",
            id: "toolu_1",
            name: "get_weather",
            input: { city: "Oslo" },
          }],
        },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "Snow" }] },
      ],
    });
    const count = async (thinking: Json[]) =>
      (await post(history(thinking), {}, "/v1/messages/count_tokens")).body.input_tokens;
    const withSignature = await count([hidden]);
    const none = await count([]);
    assert.ok(withSignature > none, "the omitted thinking is in the prompt again");
    // A shown block's signature seals its text too: sent back with or without the text, the same prompt.
    assert.equal(await count([{ ...block, thinking: "" }]), await count([block]));
    assert.ok((await count([block])) > none);
    // A block without a signature gives its own text.
    assert.notEqual(await count([{ type: "thinking", thinking: "I will look it up." }]), withSignature);
    // The Responses API's sealed reasoning is the same seal.
    const sealed = await (await fetch(`${server.url}/v1/responses`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: JSON.stringify({
        model: MODEL,
        input: "Think",
        max_output_tokens: 12,
        include: ["reasoning.encrypted_content"],
      }),
    })).json();
    const item = sealed.output.find((o: Json) => o.type === "reasoning");
    assert.equal(
      await count([{ type: "thinking", thinking: "", signature: item.encrypted_content }]),
      await count([{ type: "thinking", thinking: item.summary[0].text }]),
    );
  },
);

serverTest(
  "a thinking block whose signature was altered, or whose text was, is Anthropic's 400 (also streamed)",
  async () => {
    const first = await client.messages.create({
      model: MODEL,
      max_tokens: 12,
      thinking: { type: "enabled", budget_tokens: 1024 },
      messages: [{ role: "user", content: "Think" }],
    });
    const block = first.content[0] as Json;
    assert.equal(block.type, "thinking");
    const sig: string = block.signature;
    const flipped = sig.slice(0, 20) + (sig[20] === "A" ? "B" : "A") + sig.slice(21);
    const history = (thinking: Json) => ({
      model: MODEL,
      max_tokens: 2,
      thinking: OFF,
      messages: [
        { role: "user", content: "Think" },
        { role: "assistant", content: [thinking, { type: "text", text: "Done." }] },
        { role: "user", content: "Again" },
      ],
    });
    for (
      const bad of [
        { ...block, signature: flipped },
        { ...block, thinking: "", signature: flipped },
        { ...block, thinking: block.thinking + " (edited)" },
        { ...block, signature: "EqQBCkgIARABGAIiQL" }, // another provider's
      ]
    ) {
      for (const path of ["/v1/messages", "/v1/messages/count_tokens"]) {
        const res = await post(history(bad), {}, path);
        await assertAnthropicError(
          res,
          400,
          "invalid_request_error",
          "Invalid `signature` in `thinking` block",
        );
        assert.ok(res.body.error.message.startsWith("messages[1].content[0]"), res.body.error.message);
      }
      const streamed = await post({ ...history(bad), stream: true });
      await assertAnthropicError(streamed, 400, "invalid_request_error", "Invalid `signature`");
    }
    const ok = await post(history(block));
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  },
);

serverTest("tools: a call forced by tool_choice tool / any, then a tool_result turn", async () => {
  // Parallel calls disabled wherever the stop reason is asserted: with them allowed, the random-weight
  // model writes up to 8 calls of ~60 tokens, and 3 or more run into max_tokens (4 in 120 requests).
  const forced = await client.messages.create({
    model: MODEL,
    max_tokens: 200,
    thinking: OFF,
    tools: [WEATHER, TIME],
    tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
    messages: [{ role: "user", content: "Weather in Paris for two days?" }],
  });
  assert.equal(forced.stop_reason, "tool_use");
  assert.equal(
    forced.content.filter((b) => b.type === "tool_use").length,
    1,
    "one call: parallel use disabled",
  );
  const call = forced.content.find((b) => b.type === "tool_use") as Json;
  assert.ok(call, JSON.stringify(forced.content));
  assert.match(call.id, /^toolu_/);
  assert.equal(call.name, "get_weather");
  assert.ok(["Paris", "Rome", "Oslo"].includes(call.input.city), "input is an object under the schema");
  assert.ok(Number.isInteger(call.input.days) && call.input.days >= 1 && call.input.days <= 3);

  const any = await client.messages.create({
    model: MODEL,
    max_tokens: 200,
    thinking: OFF,
    tools: [WEATHER, TIME],
    tool_choice: { type: "any", disable_parallel_tool_use: true },
    messages: [{ role: "user", content: "Weather or time?" }],
  });
  assert.equal(any.stop_reason, "tool_use");
  assert.equal(any.content.filter((b) => b.type === "tool_use").length, 1, "one call: parallel use disabled");

  const turn = (isError: boolean) => ({
    model: MODEL,
    max_tokens: 8,
    thinking: OFF,
    tools: [WEATHER, TIME],
    tool_choice: { type: "none" as const },
    messages: [
      { role: "user" as const, content: "Weather in Paris for two days?" },
      { role: "assistant" as const, content: forced.content },
      {
        role: "user" as const,
        content: [
          {
            type: "tool_result" as const,
            tool_use_id: call.id,
            content: [{ type: "text" as const, text: "Sunny" }],
            is_error: isError,
          },
          { type: "text" as const, text: "Thanks" },
        ],
      },
    ],
  });
  const answer = await client.messages.create(turn(false) as never) as Anthropic.Message;
  assert.ok(answer.content.every((b) => b.type === "text"), "tool_choice none: text only");
  assert.notEqual(answer.stop_reason, "tool_use");
  const tokens = async (isError: boolean) =>
    (await client.messages.countTokens(turn(isError) as never)).input_tokens;
  assert.ok((await tokens(true)) > (await tokens(false)), "is_error marks the result as an error");
  // Under none the tools stay in the prompt (the same prompt as under auto: a cached prefix survives).
  const auto = await client.messages.countTokens({ ...turn(false), tool_choice: { type: "auto" } } as never);
  assert.equal(await tokens(false), auto.input_tokens);

  // Streamed: the call arrives as input_json_delta fragments; the SDK assembles the input object.
  const raw = await stream({
    ...turn(false),
    messages: turn(false).messages.slice(0, 1),
    max_tokens: 200,
    tool_choice: { type: "tool", name: "get_time", disable_parallel_tool_use: true },
  });
  assertEventOrder(raw.events);
  assert.ok(raw.events.some((e) => e.data.delta?.type === "input_json_delta"));
  assert.equal(raw.events.at(-2)!.data.delta.stop_reason, "tool_use");
  const s = client.messages.stream({
    model: MODEL,
    max_tokens: 200,
    thinking: OFF,
    tools: [TIME],
    tool_choice: { type: "tool", name: "get_time" },
    messages: [{ role: "user", content: "Time?" }],
  });
  // Parallel calls allowed: the first one always fits in max_tokens (a later one may be cut short).
  const final = await s.finalMessage();
  const streamedCall = final.content.find((b) => b.type === "tool_use") as Json;
  assert.ok(["Paris", "Rome"].includes(streamedCall.input.city), JSON.stringify(final.content));
});

serverTest("stop_sequences: generation stops at the first one, named in stop_sequence", async () => {
  const body = {
    model: MODEL,
    max_tokens: 16,
    temperature: 0,
    thinking: OFF,
    messages: [{ role: "user" as const, content: "Count" }],
  };
  const free = await client.messages.create(body);
  const text = free.content.map((b) => (b as Json).text).join("");
  assert.ok(text.length >= 8, `enough text to cut: ${JSON.stringify(text)}`);
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 2);
  const cut = await client.messages.create({ ...body, stop_sequences: ["never-written-here", stop] });
  assert.equal(cut.stop_reason, "stop_sequence");
  assert.equal(cut.stop_sequence, stop);
  assert.equal(cut.content.map((b) => (b as Json).text).join(""), text.slice(0, text.indexOf(stop)));
  const raw = await stream({ ...body, stop_sequences: [stop] });
  assert.deepEqual(raw.events.at(-2)!.data.delta, { stop_reason: "stop_sequence", stop_sequence: stop });
});

serverTest(
  "Anthropic-defined tools (web_search_…, bash_…) are left out of the prompt and named, as hosted tools of Responses",
  async () => {
    const body = {
      model: MODEL,
      thinking: OFF,
      tools: [{ type: "web_search_20250305", name: "web_search" }, WEATHER, {
        type: "bash_20250124",
        name: "bash",
      }],
      messages: [{ role: "user", content: "Weather?" }],
    };
    const res = await post({ ...body, max_tokens: 1 });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.headers.get("x-vserve-ignored-tools"), "web_search_20250305, bash_20250124");
    const id = res.headers.get("request-id")!;
    assert.ok(server.logs.some((l) => l.includes("left out of the prompt") && l.includes(id)), "a warning");
    const counted = await post(body, {}, "/v1/messages/count_tokens");
    const alone = await post({ ...body, tools: [WEATHER] }, {}, "/v1/messages/count_tokens");
    assert.equal(counted.body.input_tokens, alone.body.input_tokens);
  },
);

serverTest("logit_bias (extension, as on chat completions) reaches the sampler", async () => {
  const token = (await postJson(`${server.url}/tokenize`, { model: MODEL, content: " zebra" }, KEY)).body
    .tokens[0];
  const piece = (await postJson(`${server.url}/detokenize`, { model: MODEL, tokens: [token] }, KEY)).body
    .content;
  const res = await post({
    model: MODEL,
    max_tokens: 3,
    thinking: OFF,
    logit_bias: { [token]: 100 },
    messages: [{ role: "user", content: "Hi" }],
  });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.content[0].text, piece.repeat(3));
});

serverTest("count_tokens equals the prompt tokens of the same request", async () => {
  const body = {
    model: MODEL,
    system: [{ type: "text" as const, text: "You are terse." }, {
      type: "text" as const,
      text: "Answer in French.",
    }],
    tools: [WEATHER],
    thinking: { type: "enabled" as const, budget_tokens: 1024 },
    messages: [{ role: "user" as const, content: "What is the weather like in Rome these days?" }],
  };
  const counted = await client.messages.countTokens(body);
  const res = await client.messages.create({ ...body, max_tokens: 2 });
  assert.equal(counted.input_tokens, res.usage.input_tokens + (res.usage.cache_read_input_tokens ?? 0));
  assert.equal(res.usage.cache_creation_input_tokens, 0);
});

serverTest(
  "a system message inside the conversation is a <system-reminder> user turn of its own, as on every API",
  async () => {
    const body = {
      model: MODEL,
      thinking: OFF,
      system: "Base.",
      messages: [
        { role: "user", content: "hi" },
        { role: "assistant", content: "ok" },
        { role: "system", content: [{ type: "text", text: "Late." }] },
        { role: "user", content: "go" },
        { role: "system", content: "Later." },
      ],
    };
    const counted = await post(body, {}, "/v1/messages/count_tokens");
    assert.equal(counted.status, 200, JSON.stringify(counted.body));
    const rendered = await postJson(`${server.url}/tokenize`, {
      model: MODEL,
      messages: [
        { role: "system", content: "Base." },
        { role: "user", content: "hi" },
        { role: "assistant", content: "ok" },
        { role: "user", content: "<system-reminder>\nLate.\n</system-reminder>" },
        { role: "user", content: "go" },
        { role: "user", content: "<system-reminder>\nLater.\n</system-reminder>" },
      ],
      chat_template_kwargs: { enable_thinking: false },
    }, KEY);
    assert.equal(counted.body.input_tokens, rendered.body.count);
    const res = await post({ ...body, max_tokens: 1 });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.usage.input_tokens + res.body.usage.cache_read_input_tokens, rendered.body.count);
  },
);

serverTest(
  "output_format (the structured-outputs beta's name, which the SDK's beta.messages.parse sends) is output_config.format",
  async () => {
    const schema = {
      type: "object",
      properties: { answer: { type: "integer", minimum: 0, maximum: 9 } },
      required: ["answer"],
      additionalProperties: false,
    };
    const format = { type: "json_schema" as const, schema };
    const msg = await client.beta.messages.parse({
      model: MODEL,
      max_tokens: 60,
      thinking: OFF,
      messages: [{ role: "user", content: "One digit, please." }],
      output_format: format,
    });
    const parsed = msg.parsed_output as { answer: number } | null;
    assert.ok(
      parsed && Number.isInteger(parsed.answer) && parsed.answer >= 0 && parsed.answer <= 9,
      JSON.stringify(parsed),
    );
    const base = { model: MODEL, max_tokens: 8, thinking: OFF, messages: [{ role: "user", content: "Hi" }] };
    // Both names at once: which one is meant is not known.
    await assertAnthropicError(
      await post({ ...base, output_format: format, output_config: { format } }),
      400,
      "invalid_request_error",
      "output_format",
    );
    // A schema the grammar cannot take is named by the field it came in.
    const long = { type: "json_schema", schema: { type: "string", minLength: 100000 } };
    await assertAnthropicError(
      await post({ ...base, output_format: long }),
      400,
      "invalid_request_error",
      "output_format.schema",
    );
    await assertAnthropicError(
      await post({ ...base, output_config: { format: long } }),
      400,
      "invalid_request_error",
      "output_config.format.schema",
    );
  },
);

serverTest(
  "a tool parameter whose raw text cannot be written is a 400 and the server keeps serving (a U+0000 aborted the process)",
  async () => {
    const tool = (schema: Json) => ({
      name: "f",
      description: "takes s",
      input_schema: { type: "object", properties: { s: schema }, required: ["s"] },
    });
    const base = {
      model: MODEL,
      max_tokens: 24,
      thinking: OFF,
      tool_choice: { type: "any" },
      messages: [{ role: "user", content: "Call f." }],
    };
    // Refused before generating: constants the XML format's raw text cannot carry.
    for (
      const [schema, keyword] of [
        [{ type: "string", enum: ["\u0000"] }, "#/enum"],
        [{ type: "string", const: "a\u0000b" }, "#/const"],
        [{ type: "string", enum: ["ok", "\ud800"] }, "#/enum"],
        [{ type: "string", enum: ["x</tool_call>"] }, "#/enum"],
      ] as const
    ) {
      await assertAnthropicError(
        await post({ ...base, tools: [tool(schema)] }),
        400,
        "invalid_request_error",
        keyword,
      );
    }
    // Found while generating: the grammar allows no token (llama.cpp reads U+0000 as a token's end).
    await assertAnthropicError(
      await post({ ...base, tools: [tool({ type: "string", pattern: "^a\\u0000$" })] }),
      400,
      "invalid_request_error",
      "allows no token",
    );
    const chat = await postJson(`${server.url}/v1/chat/completions`, {
      model: MODEL,
      max_tokens: 24,
      messages: [{ role: "user", content: "Call f." }],
      chat_template_kwargs: { enable_thinking: false },
      tools: [{
        type: "function",
        function: { name: "f", parameters: tool({ type: "string", pattern: "^a\\u0000$" }).input_schema },
      }],
      tool_choice: "required",
    }, KEY);
    assert.equal(chat.status, 400, JSON.stringify(chat.body));
    assert.equal(chat.body.error.code, "invalid_schema");
    assert.equal(chat.body.error.param, "tools");
    assert.match(chat.body.error.message, /allows no token/);
    // Still serving: the same tool with a value it can write.
    const ok = await post({ ...base, tools: [tool({ type: "string", enum: ["left", "right"] })] });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    const call = ok.body.content.find((b: Json) => b.type === "tool_use");
    assert.ok(["left", "right"].includes(call.input.s), JSON.stringify(call));
  },
);

serverTest("errors: Anthropic's shape and status, naming the field", async () => {
  const base = { model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "Hi" }] };
  const { max_tokens: _, ...noMax } = base;
  await assertAnthropicError(await post(noMax), 400, "invalid_request_error", "max_tokens");
  await assertAnthropicError(
    await post({ ...base, messages: [{ role: "robot", content: "Hi" }] }),
    400,
    "invalid_request_error",
    "messages[0].role",
  );
  await assertAnthropicError(
    await post({ ...base, tool_choice: { type: "some" } }),
    400,
    "invalid_request_error",
    "tool_choice",
  );
  await assertAnthropicError(
    await post({ ...base, tools: [WEATHER], tool_choice: { type: "tool", name: "nope" } }),
    400,
    "invalid_request_error",
    "tool_choice.name",
  );
  await assertAnthropicError(
    await post({ ...base, tool_choice: { type: "any" } }),
    400,
    "invalid_request_error",
    "{type:'any'}",
  );
  await assertAnthropicError(
    await post({ ...base, temperature: 1.5 }),
    400,
    "invalid_request_error",
    "temperature",
  );
  await assertAnthropicError(
    await post({ ...base, tools: [{ ...WEATHER, input_schema: { type: "array" } }] }),
    400,
    "invalid_request_error",
    "tools[0].input_schema.type",
  );
  await assertAnthropicError(
    await post({
      ...base,
      messages: [{
        role: "user",
        content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }],
      }],
    }),
    400,
    "invalid_request_error",
    "text only",
  );
  await assertAnthropicError(
    await post({ ...base, messages: [...base.messages, { role: "assistant", content: "The answer is" }] }),
    400,
    "invalid_request_error",
    "prefilled",
  );
  await assertAnthropicError(
    await post({
      ...base,
      messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "x" }] }],
    }),
    400,
    "invalid_request_error",
    "toolu_x",
  );
  await assertAnthropicError(
    await post({ ...base, mcp_servers: [{ type: "url", url: "https://x", name: "x" }] }),
    400,
    "invalid_request_error",
    "mcp_servers",
  );
  await assertAnthropicError(
    await post({ ...base, model: "claude-nope" }),
    404,
    "not_found_error",
    "claude-nope",
  );
  await assertAnthropicError(
    await post({ ...base, padding: "x".repeat(4_100_000) }),
    413,
    "request_too_large",
  );
  await assertAnthropicError(
    await postJson(url, base, null, { "x-api-key": "wrong" }),
    401,
    "authentication_error",
  );
  await assertAnthropicError(await postJson(url, base, null), 401, "authentication_error", "x-api-key");
  assert.equal((await postJson(url, base, KEY)).status, 200, "Bearer keys work here too");
  const get = await fetch(url, { headers: { "x-api-key": KEY } });
  await assertAnthropicError(
    { status: get.status, headers: get.headers, body: await get.json() },
    405,
    "invalid_request_error",
  );
  // Through the SDK: its typed errors.
  await assert.rejects(
    client.messages.create({ ...noMax } as never),
    (e) =>
      e instanceof Anthropic.BadRequestError && e.status === 400 &&
      (e.error as Json)?.error?.type === "invalid_request_error",
  );
  const wrongKey = new Anthropic({ baseURL: server.url, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(
    wrongKey.messages.create(base as never),
    (e: Json) => e instanceof Anthropic.AuthenticationError,
  );
  // OpenAI routes keep OpenAI's shape, and take x-api-key too.
  const openaiShaped = await postJson(`${server.url}/v1/chat/completions`, { model: MODEL }, null, {
    "x-api-key": KEY,
  });
  assert.equal(openaiShaped.status, 400);
  assert.equal(openaiShaped.body.error.param, "messages");
});

serverTest("a full queue is shed with 529, and a client leaving mid-stream frees its sequence", async () => {
  const long = {
    model: MODEL,
    max_tokens: 4000,
    messages: [{ role: "user", content: "Go on" }],
    stream: true,
  };
  const streams = await Promise.all([0, 1].map(async () => {
    const s = await SseReader.open(url, long, { key: null, headers: { "x-api-key": KEY } });
    await s.take(3);
    return s;
  }));
  const shed = await post({ ...long, stream: false });
  await assertAnthropicError(shed, 529, "overloaded_error", "busy");
  assert.ok(shed.headers.get("retry-after"));
  for (const s of streams) await s.cancel();
  // The server notices the disconnects, ends the streams and releases their admission.
  await poll("both streams released their admission", async () => {
    const health = await (await fetch(`${server.url}/health`)).json();
    return health.models[0].in_flight === 0;
  });
  // Two sequences: this waits for ever unless both cancelled generations freed theirs.
  for (let i = 0; i < 2; i++) {
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": KEY },
      body: JSON.stringify({ ...long, stream: false, max_tokens: 3, thinking: OFF }),
    });
    assert.equal(res.status, 200);
    assert.equal((await res.json()).usage.output_tokens, 3);
  }
  assert.ok(
    server.logs.filter((l) => l.includes('"msg":"stream cancelled"')).length >= 2,
    "the cancellations are logged",
  );
});

// ---- Claude Code ----

/** A request shaped as Claude Code 2.1.x sends it (recorded against a local server; our own text). */
function claudeCodeRequest(billing = "cc_version=2.1.328.a1b; cc_entrypoint=sdk-cli; cch=0f3e2;") {
  const schema = (props: Record<string, Json>, required: string[]) => ({
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    properties: props,
    required,
    additionalProperties: false,
  });
  const str = (description: string) => ({ type: "string", description });
  const tools: Json[] = [
    {
      name: "Bash",
      description: "Runs a shell command.",
      input_schema: schema({
        command: str("The command"),
        timeout: { type: "number", description: "ms" },
        description: str("What it does"),
        run_in_background: { type: "boolean" },
      }, ["command"]),
    },
    {
      name: "Read",
      description: "Reads a file.",
      input_schema: schema({
        file_path: str("Absolute path"),
        offset: { type: "integer", minimum: 0 },
        limit: { type: "integer", exclusiveMinimum: 0 },
      }, ["file_path"]),
    },
    {
      name: "Edit",
      description: "Replaces text in a file.",
      input_schema: schema({
        file_path: str("Path"),
        old_string: str("Old"),
        new_string: str("New"),
        replace_all: { type: "boolean", default: false },
      }, ["file_path", "old_string", "new_string"]),
    },
    {
      name: "Write",
      description: "Writes a file.",
      input_schema: schema({ file_path: str("Path"), content: str("Content") }, ["file_path", "content"]),
    },
    {
      name: "Glob",
      description: "Finds files.",
      input_schema: schema({ pattern: str("Glob"), path: str("Where") }, ["pattern"]),
    },
    {
      name: "Grep",
      description: "Searches files.",
      input_schema: schema({
        pattern: str("Regex"),
        path: str("Where"),
        output_mode: { type: "string", enum: ["content", "files_with_matches", "count"] },
        "-n": { type: "boolean" },
        head_limit: { type: "number" },
      }, ["pattern"]),
    },
    {
      name: "TodoWrite",
      description: "Updates the task list.",
      input_schema: schema({
        todos: {
          type: "array",
          items: {
            type: "object",
            properties: {
              content: { type: "string", minLength: 1 },
              status: { type: "string", enum: ["pending", "in_progress", "completed"] },
              activeForm: { type: "string" },
            },
            required: ["content", "status", "activeForm"],
            additionalProperties: false,
          },
        },
      }, ["todos"]),
    },
    {
      name: "Agent",
      description: "Starts a sub-agent.",
      input_schema: schema({ description: str("Short"), prompt: str("Task"), subagent_type: str("Type") }, [
        "description",
        "prompt",
      ]),
    },
    {
      name: "ToolSearch",
      description: "Loads deferred tools.",
      input_schema: schema({ query: str("Query"), max_results: { type: "number", default: 5 } }, ["query"]),
    },
    {
      name: "Skill",
      description: "Runs a skill.",
      input_schema: schema({ skill: str("Name"), args: str("Arguments") }, ["skill"]),
    },
    {
      name: "NotebookEdit",
      description: "Edits a notebook cell.",
      input_schema: schema({
        notebook_path: str("Path"),
        new_source: str("Source"),
        cell_id: str("Cell"),
        edit_mode: { type: "string", enum: ["replace", "insert", "delete"] },
      }, ["notebook_path", "new_source"]),
    },
    {
      name: "WebFetch",
      description: "Fetches a URL.",
      input_schema: schema({ url: { type: "string", format: "uri" }, prompt: str("What to extract") }, [
        "url",
        "prompt",
      ]),
    },
    {
      name: "ExitPlanMode",
      description: "Leaves plan mode.",
      input_schema: schema({ plan: str("The plan") }, []),
    },
    {
      name: "BashOutput",
      description: "Reads a background shell's output.",
      input_schema: schema({ bash_id: str("Shell"), filter: str("Regex") }, ["bash_id"]),
    },
    {
      name: "KillShell",
      description: "Stops a background shell.",
      input_schema: schema({ shell_id: str("Shell") }, ["shell_id"]),
    },
    {
      name: "ScheduleWakeup",
      description: "Wakes the agent later.",
      input_schema: schema({
        delaySeconds: { type: "number" },
        reason: str("Why"),
        stop: { type: "boolean" },
      }, []),
    },
    {
      name: "ListAgents",
      description: "Lists agents.",
      input_schema: schema({ q: { type: "string", maxLength: 256 } }, []),
    },
    {
      name: "ReportFindings",
      description: "Reports review findings.",
      input_schema: schema({
        level: { type: "string", enum: ["low", "medium", "high", "xhigh", "max"] },
        findings: {
          type: "array",
          items: { type: "object", properties: { title: { type: "string" }, severity: { type: "string" } } },
        },
      }, ["findings"]),
    },
    {
      name: "Workflow",
      description: "Runs a workflow script.",
      input_schema: schema({ script: str("Script") }, ["script"]),
    },
    {
      name: "mcp__files__list",
      description: "An MCP tool.",
      input_schema: schema({ dir: str("Directory") }, ["dir"]),
    },
    {
      name: "mcp__files__stat",
      description: "An MCP tool.",
      input_schema: schema({ path: str("Path") }, ["path"]),
    },
    {
      name: "mcp__git__log",
      description: "An MCP tool.",
      input_schema: schema({ n: { type: "integer", minimum: 1, maximum: 50 } }, []),
    },
    {
      name: "Cron",
      description: "Schedules a prompt.",
      input_schema: schema({ cron: str("Expression"), prompt: str("Prompt") }, ["cron", "prompt"]),
    },
    {
      name: "DeferredToolPlaceholder",
      description: "Stands for tools loaded later.",
      input_schema: { type: "object", properties: {} },
      defer_loading: true,
    },
  ];
  const guidance = Array.from(
    { length: 40 },
    (_, i) =>
      `- Rule ${
        i + 1
      }: keep changes small, read before editing, and run the tests that cover what you touched.`,
  )
    .join("\n");
  return {
    model: MODEL,
    max_tokens: 32000,
    stream: true,
    system: [
      { type: "text", text: `x-anthropic-billing-header: ${billing}` },
      { type: "text", text: "You are a coding agent.", cache_control: { type: "ephemeral" } },
      {
        type: "text",
        text: `\nYou help the user with software tasks.\n\n# Guidance\n${guidance}`,
        cache_control: { type: "ephemeral" },
      },
    ],
    tools,
    metadata: {
      user_id: JSON.stringify({
        device_id: "0".repeat(64),
        account_uuid: "",
        session_id: crypto.randomUUID(),
      }),
    },
    thinking: { type: "adaptive", display: "omitted" },
    context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
    output_config: { effort: "high" },
    messages: [
      {
        role: "user",
        content: [
          {
            type: "text",
            text: "<system-reminder>\nEnd commit messages with a sign-off line.\n</system-reminder>\n",
          },
          { type: "text", text: "List the files here" },
        ],
      },
      {
        role: "system",
        content: [{
          type: "text",
          text: "# Environment\n - Working directory: /tmp/project\n - Platform: linux",
          cache_control: { type: "ephemeral" },
        }],
      },
    ],
  };
}
const CLAUDE_CODE_HEADERS = {
  "anthropic-version": "2023-06-01",
  "anthropic-beta":
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,effort-2025-11-24",
  "anthropic-dangerous-direct-browser-access": "true",
  "user-agent": "claude-cli/2.1.328 (external, sdk-cli)",
  "x-app": "cli",
  "x-stainless-lang": "js",
  "x-stainless-retry-count": "0",
};

serverTest(
  "Claude Code's request: HEAD /, then its streamed messages request, accepted and streamed",
  async () => {
    const head = await fetch(`${server.url}/`, { method: "HEAD" });
    assert.equal(head.status, 200);
    assert.equal(await head.text(), "");
    const root = await (await fetch(`${server.url}/`)).json();
    assert.equal(root.name, "vserve");

    const body = claudeCodeRequest();
    assert.ok(body.tools.length >= 24 && JSON.stringify(body).length > 8_000);
    const first = await stream({ ...body, max_tokens: 12 }, CLAUDE_CODE_HEADERS);
    assert.equal(first.status, 200, first.text);
    assertEventOrder(first.events);
    const start = first.events[0].data.message;
    assert.deepEqual(start.context_management, { applied_edits: [] });
    // The billing header is not part of the prompt (it changes every request and would defeat prompt
    // reuse), the deferred tool is left out, and the rest counts.
    const { stream: _s, max_tokens: _m, ...countable } = body;
    const count = async (b: Json) =>
      (await post(b, CLAUDE_CODE_HEADERS, "/v1/messages/count_tokens?beta=true")).body.input_tokens;
    const counted = await count(countable);
    assert.equal(start.usage.input_tokens + start.usage.cache_read_input_tokens, counted);
    assert.equal(await count({ ...countable, system: countable.system.slice(1) }), counted);
    assert.ok(
      await count({ ...countable, tools: countable.tools.slice(0, -1) }) === counted,
      "a defer_loading tool is not in the prompt",
    );
    const thinking = first.events.find((e) => e.data.content_block?.type === "thinking");
    assert.ok(thinking, "adaptive thinking: the model's default (on)");
    assert.ok(
      !first.events.some((e) => e.data.delta?.type === "thinking_delta"),
      "display omitted: no thinking text",
    );
    const signature =
      first.events.find((e) => e.data.delta?.type === "signature_delta")!.data.delta.signature;
    // The same request with the billing header Claude Code changes every time: the prompt is reused.
    const again = await post({
      ...claudeCodeRequest("cc_version=2.1.328.e4f; cc_entrypoint=sdk-cli; cch=55d10;"),
      stream: false,
      max_tokens: 2,
    }, CLAUDE_CODE_HEADERS);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.ok(again.body.usage.cache_read_input_tokens > counted * 0.9, JSON.stringify(again.body.usage));

    // The next turn, as Claude Code writes it: the thinking block sent back, a tool_use and its
    // result, another mid-conversation system message; the billing header has changed.
    const second = claudeCodeRequest("cc_version=2.1.328.c9d; cc_entrypoint=sdk-cli; cch=7a01b;");
    second.messages.push(
      {
        role: "assistant",
        content: [
          { type: "thinking", thinking: "", signature },
          {
            type: "tool_use",
            id: "toolu_01",
            name: "Bash",
            input: { command: "ls", description: "List files" },
          },
        ] as Json,
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_01",
          content: "README.md\nmain.ts",
          cache_control: { type: "ephemeral" },
        }] as Json,
      },
      { role: "system", content: [{ type: "text", text: "Reminder: the task list is empty." }] },
    );
    const next = await stream({ ...second, max_tokens: 8 }, CLAUDE_CODE_HEADERS);
    assert.equal(next.status, 200, next.text);
    assertEventOrder(next.events);
    const usage = next.events.at(-2)!.data.usage;
    assert.ok(usage.input_tokens + usage.cache_read_input_tokens > counted);
  },
);

// ---- through the gateway ----

serverTest(
  "a model served by upstreams serves /v1/messages through the upstream's chat completions",
  async () => {
    const standIn = startStandIn();
    const gatewayRegistry = await writeJsonFile({
      models: [{
        id: "gw/claude",
        kind: "chat",
        backend: "openai",
        upstreams: [{ url: `${server.url}/v1`, key: KEY, model: MODEL, name: "vserve" }],
      }, {
        // Its stream breaks after the first text.
        id: "gw/cut",
        kind: "chat",
        backend: "openai",
        upstreams: [{ url: standIn.url, model: "cut" }],
      }],
    });
    const gateway = await startServer(["--models", gatewayRegistry, "--api-key", "gw-key"], {
      waitReady: true,
    });
    try {
      const gw = new Anthropic({ baseURL: gateway.url, apiKey: "gw-key", maxRetries: 0 });
      const res = await gw.messages.create({
        model: "gw/claude",
        max_tokens: 200,
        thinking: OFF,
        tools: [WEATHER],
        tool_choice: { type: "tool", name: "get_weather" },
        messages: [{ role: "user", content: "Weather in Oslo?" }],
      });
      assert.equal(res.model, "gw/claude");
      assert.equal(res.stop_reason, "tool_use");
      const call = res.content.find((b) => b.type === "tool_use") as Json;
      assert.ok(["Paris", "Rome", "Oslo"].includes(call.input.city), JSON.stringify(res.content));
      assert.ok(
        res.usage.input_tokens + (res.usage.cache_read_input_tokens ?? 0) > 0,
        "the upstream's usage",
      );
      // The upstream saw a chat completion carrying the gateway's request id.
      const upstreamLine = server.logs.map((l) => JSON.parse(l)).find((l) =>
        l.msg === "request" && l.request_id === res._request_id
      );
      assert.equal(upstreamLine?.route, "/v1/chat/completions");

      const s = await stream(
        {
          model: "gw/claude",
          max_tokens: 6,
          thinking: OFF,
          stop_sequences: ["zzzz-not-here"],
          messages: [{ role: "user", content: "Hi" }],
        },
        { "x-api-key": "gw-key" },
        gateway.url,
      );
      assert.equal(s.status, 200, s.text);
      assertEventOrder(s.events);
      assert.equal(s.events.at(-2)!.data.usage.output_tokens, 6);

      const count = await postJson(
        `${gateway.url}/v1/messages/count_tokens`,
        {
          model: "gw/claude",
          messages: [{ role: "user", content: "Hi" }],
        },
        null,
        { "x-api-key": "gw-key" },
      );
      await assertAnthropicError(count, 400, "invalid_request_error", "upstream");

      // A failure after the first byte ends the stream with an error event (no message_stop).
      const cut = await stream({
        model: "gw/cut",
        max_tokens: 50,
        messages: [{ role: "user", content: "Hi" }],
      }, {
        "x-api-key": "gw-key",
      }, gateway.url);
      assert.equal(cut.status, 200);
      const types = cut.events.map((e) => e.data.type);
      assert.deepEqual(types.slice(0, 4), [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
      ]);
      const last = cut.events.at(-1)!;
      assert.equal(last.event, "error");
      assert.equal(last.data.error.type, "api_error");
      assert.ok(!types.includes("message_stop"));
    } finally {
      await gateway.stop();
      await standIn.stop();
    }
  },
);

// ---- pure logic ----

Deno.test("Anthropic error types and statuses: one mapping, 529 where load is shed", () => {
  const cases: [ApiError, number, string][] = [
    [new ApiError(400, "invalid_request_error", "m", "x"), 400, "invalid_request_error"],
    [new ApiError(415, "invalid_request_error", "m"), 415, "invalid_request_error"],
    [new ApiError(401, "invalid_request_error", "m", null, "invalid_api_key"), 401, "authentication_error"],
    [new ApiError(403, "permission_error", "m"), 403, "permission_error"],
    [new ApiError(404, "invalid_request_error", "m", "model", "model_not_found"), 404, "not_found_error"],
    [new ApiError(413, "invalid_request_error", "m"), 413, "request_too_large"],
    [new ApiError(429, "rate_limit_error", "m", null, "rate_limit_exceeded"), 429, "rate_limit_error"],
    [new ApiError(429, "rate_limit_error", "m", null, "queue_full"), 529, "overloaded_error"],
    [new ApiError(503, "service_unavailable_error", "m", null, "shutting_down"), 529, "overloaded_error"],
    [new ApiError(500, "server_error", "m"), 500, "api_error"],
    [new ApiError(502, "server_error", "m", null, "upstream_error"), 502, "api_error"],
    [new ApiError(504, "timeout_error", "m"), 504, "timeout_error"],
  ];
  for (const [e, status, type] of cases) {
    // No `param` in these bodies: the message names the field.
    const message = e.param ? `${e.param}: m` : "m";
    assert.deepEqual(anthropicError(e), { status, error: { type, message } });
  }
});
