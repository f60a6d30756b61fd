/**
 * scripts/agent_proxy.ts (pure logic): the same rewrite on the three chat-shaped APIs. The first leg
 * of a turn must call the tool with pinned arguments; after its result, tool choice none and a
 * one-value format end the turn; thinking is closed by a bias and the output capped.
 */
import assert from "node:assert/strict";
import { apiOf, type Options, rewrite } from "../scripts/agent_proxy.ts";

const OPTS: Options = {
  upstream: "http://127.0.0.1:8080",
  port: 8081,
  tool: "run",
  args: { cmd: "echo hello" },
  answer: "Done.",
  maxTokens: 512,
  thinkBias: 10,
};
const PINNED = {
  type: "object",
  properties: { cmd: { const: "echo hello" } },
  required: ["cmd"],
  additionalProperties: false,
};
const ANSWER = {
  type: "object",
  properties: { answer: { const: "Done." } },
  required: ["answer"],
  additionalProperties: false,
};
const params = { type: "object", properties: { cmd: { type: "string" } } };

Deno.test("agent proxy: the paths it rewrites", () => {
  assert.equal(apiOf("/v1/chat/completions"), "chat");
  assert.equal(apiOf("/v1/responses"), "responses");
  assert.equal(apiOf("/v1/messages"), "messages");
  assert.equal(apiOf("/v1/messages/count_tokens"), undefined);
  assert.equal(apiOf("/v1/models"), undefined);
});

Deno.test("agent proxy: Anthropic messages — a forced, pinned call, then tool choice none and the answer", () => {
  const tools = [{ name: "run", input_schema: params }, { name: "other", input_schema: params }];
  const first = rewrite(
    { model: "m", max_tokens: 32000, tools, messages: [{ role: "user", content: "Go" }] },
    "messages",
    OPTS,
    7,
  );
  assert.deepEqual(first.tool_choice, { type: "tool", name: "run", disable_parallel_tool_use: true });
  assert.deepEqual(first.tools[0].input_schema, PINNED);
  assert.deepEqual(first.tools[1].input_schema, params);
  assert.equal(first.max_tokens, 512);
  assert.deepEqual(first.logit_bias, { 7: 10 });
  const second = rewrite(
    {
      model: "m",
      max_tokens: 100,
      tools,
      output_config: { effort: "high" },
      messages: [
        { role: "user", content: "Go" },
        { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "run", input: {} }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "hello" }] },
        { role: "system", content: "reminder" },
      ],
    },
    "messages",
    OPTS,
  );
  assert.deepEqual(second.tool_choice, { type: "none" });
  assert.deepEqual(second.tools[0].input_schema, PINNED, "the same tools, so the same prompt prefix");
  assert.deepEqual(second.output_config, { effort: "high", format: { type: "json_schema", schema: ANSWER } });
  assert.equal(second.max_tokens, 100);
  assert.equal(second.logit_bias, undefined);
  // The client's own format, under the beta's name (beta.messages.parse), is kept, not doubled.
  const own = { type: "json_schema", schema: params };
  const parsed = rewrite(
    {
      model: "m",
      max_tokens: 100,
      tools,
      output_format: own,
      messages: [
        { role: "user", content: "Go" },
        { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "run", input: {} }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "hello" }] },
      ],
    },
    "messages",
    OPTS,
  );
  assert.deepEqual(parsed.output_format, own);
  assert.equal(parsed.output_config, undefined);
});

Deno.test("agent proxy: chat completions and Responses take the same rewrite", () => {
  const chatTools = [{ type: "function", function: { name: "run", parameters: params } }];
  const chat = rewrite(
    { model: "m", tools: chatTools, messages: [{ role: "user", content: "Go" }] },
    "chat",
    OPTS,
  );
  assert.deepEqual(chat.tool_choice, { type: "function", function: { name: "run" } });
  assert.equal(chat.parallel_tool_calls, false);
  assert.deepEqual(chat.tools[0].function.parameters, PINNED);
  const chatAnswer = rewrite(
    {
      model: "m",
      tools: chatTools,
      messages: [{ role: "user", content: "Go" }, { role: "tool", tool_call_id: "c", content: "hello" }],
    },
    "chat",
    OPTS,
  );
  assert.equal(chatAnswer.tool_choice, "none");
  assert.deepEqual(chatAnswer.response_format.json_schema.schema, ANSWER);

  const ns = {
    type: "namespace",
    name: "ns",
    tools: [{ type: "function", name: "run", parameters: params }],
  };
  const responses = rewrite({ model: "m", tools: [ns], input: "Go" }, "responses", OPTS);
  assert.deepEqual(responses.tool_choice, { type: "function", name: "run" });
  assert.deepEqual(responses.tools[0].tools[0].parameters, PINNED);
  assert.equal(responses.max_output_tokens, 512);
  const responsesAnswer = rewrite(
    {
      model: "m",
      tools: [ns],
      input: [{ role: "user", content: "Go" }, {
        type: "function_call_output",
        call_id: "c",
        output: "hello",
      }],
    },
    "responses",
    OPTS,
  );
  assert.equal(responsesAnswer.tool_choice, "none");
  assert.deepEqual(responsesAnswer.text.format.schema, ANSWER);
});
