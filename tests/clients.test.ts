/**
 * The client matrix: real client packages against a real server process, each in the scenario its
 * users run: the `openai` SDK's helpers (parse with zod, runTools, responses.parse), the OpenAI
 * Agents SDK (a two-turn tool agent on both model APIs; outputType with toolChoice required), the
 * Vercel AI SDK and LangChain (a tool call and a structured output each).
 *
 * The chat model is the random-weight stand-in, with thinking off (a registry setting, so clients
 * send nothing of their own for it). It never chooses a tool or ends a text by itself: tool calls are
 * forced by tool_choice (as agents do), structured output ends when its grammar does, and where a
 * turn must end in free text a logit bias on `<|im_end|>` ends it within a few tokens.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";
import { type Json, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import {
  Agent,
  agentTool,
  aiTool,
  ChatOpenAI,
  createOpenAI,
  createOpenAICompatible,
  generateText,
  langchainTool,
  OpenAIChatCompletionsModel,
  OpenAIResponsesModel,
  Output,
  run,
  setTracingDisabled,
} from "./helpers/clients.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const dir = await Deno.makeTempDir();
await Deno.writeTextFile(
  `${dir}/models.json`,
  JSON.stringify({
    models: [{
      id: MODEL,
      kind: "chat",
      source: "builtin:tiny-moe",
      contextSize: 8192,
      parallel: 4,
      thinking: false,
    }],
  }),
);
const server = await startServer(["--api-key", KEY, "--models", `${dir}/models.json`], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const baseURL = `${server.url}/v1`;
setTracingDisabled(true);

/** Token ids of the stand-in's vocabulary (Qwen's). */
const IM_END = "151645";
const OPEN_BRACE = "90";

/** An `openai` client that records every request body it sends. */
function recordingClient(): { client: OpenAI; bodies: Json[] } {
  const bodies: Json[] = [];
  const client = new OpenAI({
    baseURL,
    apiKey: KEY,
    maxRetries: 0,
    fetch: (url: string | URL | Request, init?: RequestInit) => {
      if (typeof init?.body === "string") bodies.push(JSON.parse(init.body));
      return fetch(url, init);
    },
  });
  return { client, bodies };
}

const City = z.object({ city: z.enum(["Paris", "Rome"]) });

serverTest(
  "openai SDK: chat.completions.parse with zodResponseFormat and with a zodFunction tool",
  async () => {
    const client = new OpenAI({ baseURL, apiKey: KEY, maxRetries: 0 });
    const parsed = await client.chat.completions.parse({
      model: MODEL,
      messages: [{ role: "user", content: "Which city?" }],
      response_format: zodResponseFormat(City, "city"),
    });
    assert.ok(City.safeParse(parsed.choices[0].message.parsed).success, JSON.stringify(parsed.choices[0]));
    const called = await client.chat.completions.parse({
      model: MODEL,
      messages: [{ role: "user", content: "Weather?" }],
      tools: [zodFunction({ name: "get_weather", parameters: City })],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      parallel_tool_calls: false,
    });
    const call = called.choices[0].message.tool_calls?.[0] as Json;
    assert.equal(call?.function.name, "get_weather");
    assert.ok(City.safeParse(call.function.parsed_arguments).success, JSON.stringify(call));
  },
);

serverTest(
  "openai SDK: runTools calls the named function with parsed arguments and records its result",
  async () => {
    const client = new OpenAI({ baseURL, apiKey: KEY, maxRetries: 0 });
    const seen: unknown[] = [];
    const runner = client.chat.completions.runTools({
      model: MODEL,
      messages: [{ role: "user", content: "Weather?" }],
      tools: [{
        type: "function",
        function: {
          name: "get_weather",
          parameters: z.toJSONSchema(City),
          parse: (text: string) => City.parse(JSON.parse(text)),
          function: (args: z.infer<typeof City>) => {
            seen.push(args);
            return `Sunny in ${args.city}`;
          },
        },
      }],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      parallel_tool_calls: false,
    } as never);
    const result = await runner.finalFunctionToolCallResult();
    assert.equal(seen.length, 1);
    assert.ok(City.safeParse(seen[0]).success);
    assert.equal(result, `Sunny in ${(seen[0] as z.infer<typeof City>).city}`);
    assert.deepEqual(runner.messages.map((m: Json) => m.role), ["user", "assistant", "tool"]);
  },
);

serverTest("openai SDK: responses.parse with zodTextFormat gives output_parsed", async () => {
  const client = new OpenAI({ baseURL, apiKey: KEY, maxRetries: 0 });
  const res = await client.responses.parse({
    model: MODEL,
    input: "Which city?",
    text: { format: zodTextFormat(City, "city") },
  });
  assert.equal(res.status, "completed");
  assert.ok(City.safeParse(res.output_parsed).success, JSON.stringify(res.output));
});

const weatherTool = (calls: string[]) =>
  agentTool({
    name: "get_weather",
    description: "The weather in a city",
    parameters: City,
    execute: ({ city }) => {
      calls.push(city);
      return `Sunny in ${city}`;
    },
  });

for (const api of ["chat", "responses"] as const) {
  const modelOf = (client: OpenAI) =>
    api === "chat"
      ? new OpenAIChatCompletionsModel(client as never, MODEL)
      : new OpenAIResponsesModel(client as never, MODEL);

  serverTest(
    `Agents SDK (${api}): a two-turn tool agent: the call, its result, then the answer`,
    async () => {
      const { client, bodies } = recordingClient();
      const calls: string[] = [];
      const agent = new Agent({
        name: "weather",
        instructions: "Answer briefly.",
        model: modelOf(client),
        tools: [weatherTool(calls)],
        // Required on the first turn, auto after it (resetToolChoice); <|im_end|> favoured ends the answer.
        modelSettings: {
          toolChoice: "required",
          parallelToolCalls: false,
          maxTokens: 64,
          providerData: { logit_bias: { [IM_END]: 12 } },
        },
      });
      const result = await run(agent, "Weather in Paris?", { maxTurns: 3 });
      assert.equal(calls.length, 1);
      assert.deepEqual(result.newItems.map((i) => i.type), [
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
      ]);
      assert.equal(typeof result.finalOutput, "string");
      assert.equal(bodies.length, 2);
      assert.equal(bodies[0].tool_choice, "required");
      assert.ok([undefined, "auto"].includes(bodies[1].tool_choice), "the second turn may answer");
    },
  );

  serverTest(
    `Agents SDK (${api}): outputType with toolChoice required: the forced call, then output of the schema`,
    async () => {
      const { client, bodies } = recordingClient();
      const calls: string[] = [];
      const agent = new Agent({
        name: "weather",
        instructions: "Answer with the city.",
        model: modelOf(client),
        tools: [weatherTool(calls)],
        outputType: City,
        // `{` favoured: under auto the answer is the format rather than another call.
        modelSettings: {
          toolChoice: "required",
          parallelToolCalls: false,
          maxTokens: 64,
          providerData: { logit_bias: { [OPEN_BRACE]: 100 } },
        },
      });
      const result = await run(agent, "Weather in Paris?", { maxTurns: 3 });
      assert.equal(calls.length, 1);
      assert.ok(City.safeParse(result.finalOutput).success, JSON.stringify(result.finalOutput));
      // The first request forced the call and carried the format: a 400 before.
      const first = bodies[0];
      assert.equal(first.tool_choice, "required");
      assert.equal(api === "chat" ? first.response_format.type : first.text.format.type, "json_schema");
      assert.equal(bodies.length, 2);
    },
  );
}

serverTest("Vercel AI SDK (openai-compatible): a forced tool call runs the tool; Output.object", async () => {
  const provider = createOpenAICompatible({
    name: "vserve",
    baseURL,
    apiKey: KEY,
    supportsStructuredOutputs: true,
  });
  const model = provider.chatModel(MODEL);
  const calls: string[] = [];
  const called = await generateText({
    model,
    prompt: "Weather in Paris?",
    tools: {
      get_weather: aiTool({
        description: "The weather in a city",
        inputSchema: City,
        execute: ({ city }) => {
          calls.push(city);
          return Promise.resolve(`Sunny in ${city}`);
        },
      }),
    },
    toolChoice: { type: "tool", toolName: "get_weather" },
    maxOutputTokens: 64,
    providerOptions: { vserve: { parallel_tool_calls: false } },
  });
  assert.equal(called.finishReason, "tool-calls");
  assert.equal(called.toolCalls.length, 1);
  assert.deepEqual(calls, [(called.toolCalls[0].input as z.infer<typeof City>).city]);
  assert.equal(called.toolResults[0].output, `Sunny in ${calls[0]}`);
  const object = await generateText({
    model,
    prompt: "Which city?",
    output: Output.object({ schema: City }),
    maxOutputTokens: 64,
  });
  assert.ok(City.safeParse(object.output).success, JSON.stringify(object.output));
});

serverTest("Vercel AI SDK (@ai-sdk/openai, Responses API): Output.object", async () => {
  const openai = createOpenAI({ baseURL, apiKey: KEY });
  const object = await generateText({
    model: openai(MODEL),
    prompt: "Which city?",
    output: Output.object({ schema: City }),
    maxOutputTokens: 64,
  });
  assert.ok(City.safeParse(object.output).success, JSON.stringify(object.output));
});

serverTest(
  "LangChain ChatOpenAI: bindTools with a named tool_choice; withStructuredOutput (json schema)",
  async () => {
    const llm = new ChatOpenAI({
      model: MODEL,
      apiKey: KEY,
      configuration: { baseURL },
      maxRetries: 0,
      maxTokens: 64,
    });
    const weather = langchainTool(({ city }: z.infer<typeof City>) => `Sunny in ${city}`, {
      name: "get_weather",
      description: "The weather in a city",
      schema: City,
    });
    const message = await llm.bindTools([weather], { tool_choice: "get_weather", parallel_tool_calls: false })
      .invoke("Weather in Paris?");
    assert.equal(message.tool_calls?.length, 1);
    assert.equal(message.tool_calls![0].name, "get_weather");
    assert.ok(City.safeParse(message.tool_calls![0].args).success, JSON.stringify(message.tool_calls));
    const structured = await llm.withStructuredOutput(City, { method: "jsonSchema", name: "city" })
      .invoke("Which city?");
    assert.ok(City.safeParse(structured).success, JSON.stringify(structured));
  },
);
