/**
 * Large inputs and answers leave the event loop turns (issue 26's last stall ticks). Asserted by
 * order: a timer set before the work fires before it ends (it could not while the work ran in one
 * block), or by the size of what one step handles.
 */
import assert from "node:assert/strict";
import { ChatTemplate } from "../src/engines/llama/template.ts";
import { packPrompt, unpackPrompt } from "../src/engines/llama/template_render.ts";
import { idLists } from "../src/engines/onnx/embedding.ts";
import { heldMs, helpersBusy, Slicer, turnIfHeld } from "../src/event_loop.ts";
import { type ApiError, slicedJsonResponse } from "../src/http/errors.ts";
import { detokenize } from "../src/services/tokens.ts";
import { toChatRequest } from "../src/services/messages.ts";
import { checkSchemaLimits, SchemaChecker } from "../src/services/schema_check.ts";
import { parseHistoryArguments } from "../src/services/chat.ts";
import type { ChatMessage } from "../src/protocol/chat.ts";
import { ReasoningSealer } from "../src/services/reasoning_seal.ts";
import { MessagesRequestSchema } from "../src/protocol/anthropic.ts";
import type { ChatEngine } from "../src/engines/types.ts";

const TOOLS_TEMPLATE =
  "{% for t in tools %}{{ t.function.name }}={{ t.function.parameters | tojson }};{% endfor %}" +
  "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";

Deno.test("a large render's 50,000 tools go to the template worker in parts, with turns between them", async () => {
  const template = new ChatTemplate({ source: TOOLS_TEMPLATE, specials: { bos: "", eos: "" }, markup: [] });
  const tools = Array.from({ length: 50_000 }, (_, i) => ({
    name: `tool_${i}`,
    description: `tool ${i}`,
    parameters: {
      type: "object",
      properties: { a: { type: "string" }, b: { type: "integer" } },
      required: ["a"],
    },
  }));
  const messages = Array.from({ length: 600 }, (_, i) => ({ role: "user" as const, text: `message ${i}` }));
  const input = { messages, tools, thinking: undefined };
  const posts: { type: string; afterTimer: boolean }[] = [];
  let fired = false;
  const post = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (this: Worker, message: { type: string }, ...rest: never[]) {
    posts.push({ type: message.type, afterTimer: fired });
    return post.call(this, message, ...rest);
  } as typeof post;
  try {
    const timer = setTimeout(() => (fired = true), 0);
    const prompt = await template.renderAsync(input);
    clearTimeout(timer);
    const render = posts.findIndex((p) => p.type === "render");
    assert.ok(render > 0, "the render was posted");
    assert.ok(
      posts.slice(0, render).some((p) => p.afterTimer),
      "a timer set before ran while the parts were posted",
    );
    // Put together in order: the same prompt as rendered here.
    assert.deepEqual(prompt, template.render(input));
  } finally {
    Worker.prototype.postMessage = post;
    template.dispose();
  }
});

Deno.test("wide call arguments and tool schemas render on the template worker, small ones here", async () => {
  const template = new ChatTemplate({
    source: "{% if tools %}{% for t in tools %}{{ t.function.parameters | tojson }};{% endfor %}{% endif %}" +
      "{% for m in messages %}[{{ m.role }}] {{ m.content }}" +
      "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}={{ c.function.arguments | tojson }}" +
      "{% endfor %}{% endif %}\n" +
      "{% endfor %}",
    specials: { bos: "", eos: "" },
    markup: [],
  });
  const call = (args: Record<string, unknown>) => [
    { role: "user" as const, text: "hi" },
    { role: "assistant" as const, text: "", toolCalls: [{ id: "c", name: "f", arguments: args }] },
  ];
  const tool = (parameters: Record<string, unknown>) => [{ name: "f", parameters }];
  const wide = Array.from({ length: 200_000 }, () => 0);
  const inputs = {
    smallCall: { messages: call({ city: "Paris" }), tools: [], thinking: undefined },
    wideCall: { messages: call({ a: wide }), tools: [], thinking: undefined },
    deepCall: {
      messages: call({ a: Array.from({ length: 20_000 }, () => []) }),
      tools: [],
      thinking: undefined,
    },
    smallTool: { messages: call({}), tools: tool({ type: "object" }), thinking: undefined },
    wideTool: {
      messages: call({}),
      tools: tool({ type: "object", properties: { a: { type: "integer", examples: wide } } }),
      thinking: undefined,
    },
  };
  const renders: string[] = [];
  const post = Worker.prototype.postMessage;
  let current = "";
  const asText: string[] = [];
  Worker.prototype.postMessage = function (
    this: Worker,
    message: { type: string; items?: { toolCalls?: { argumentsJson?: string }[] }[] },
    ...rest: never[]
  ) {
    if (message.type === "render") renders.push(current);
    // Wide arguments go as their JSON text (a structured clone copies each value on this thread).
    if (message.items?.some((m) => m.toolCalls?.some((c) => typeof c.argumentsJson === "string"))) {
      asText.push(current);
    }
    return post.call(this, message, ...rest);
  } as typeof post;
  try {
    for (const [name, input] of Object.entries(inputs)) {
      current = name;
      const prompt = await template.renderAsync(input);
      assert.deepEqual(prompt, template.render(input), name);
    }
    // One call of 200,000 numbers counted as 200 characters and rendered on this thread.
    assert.deepEqual(renders, ["wideCall", "deepCall", "wideTool"]);
    assert.deepEqual(asText, ["wideCall", "deepCall"]);
  } finally {
    Worker.prototype.postMessage = post;
    template.dispose();
  }
});

Deno.test("an Anthropic request's text blocks are joined once, not one block at a time", async () => {
  const blocks = Array.from({ length: 20_000 }, (_, i) => ({ type: "text", text: `b${i}` }));
  const joined = blocks.map((b) => b.text).join("\n");
  const req = MessagesRequestSchema.parse({
    model: "m",
    max_tokens: 1,
    system: blocks,
    messages: [
      { role: "user", content: blocks },
      { role: "assistant", content: blocks },
      { role: "assistant", content: [{ type: "text", text: "more" }] },
      ...Array.from({ length: 5_000 }, (_, i) => ({ role: "user", content: `turn ${i}` })),
    ],
  });
  // The characters the joins look at the end of: each join of the old code read the whole text so
  // far (20,000 blocks: ~1.4 billion characters a list; 50,000 held the event loop 7 s).
  let read = 0;
  const endsWith = String.prototype.endsWith;
  String.prototype.endsWith = function (this: string, ...args: Parameters<typeof endsWith>) {
    read += this.length;
    return endsWith.apply(this, args);
  };
  let chat;
  try {
    ({ chat } = await toChatRequest(req, { hostedTools: "ignore", sealer: await ReasoningSealer.create() }));
  } finally {
    String.prototype.endsWith = endsWith;
  }
  const turns = Array.from({ length: 5_000 }, (_, i) => `turn ${i}`);
  assert.deepEqual(chat.messages.map((m) => m.role), ["system", "user", "assistant", "user"]);
  assert.equal(chat.messages[0].content, joined);
  assert.equal(chat.messages[1].content, joined);
  assert.equal(chat.messages[2].content, `${joined}\nmore`);
  assert.equal(chat.messages[3].content, turns.join("\n\n"));
  assert.ok(read < 4 * (3 * joined.length + turns.join("").length), `${read} characters read`);
});

Deno.test("a schema with a list past the value limit is refused before the list is walked", () => {
  const schema = {
    type: "object",
    properties: { a: { type: "integer", examples: Array.from({ length: 2_000_000 }, () => 0) } },
  };
  let pushes = 0;
  const push = Array.prototype.push;
  Array.prototype.push = function (this: unknown[], ...items: unknown[]) {
    pushes++;
    return push.apply(this, items);
  };
  try {
    assert.throws(() => checkSchemaLimits(schema, "tools[0].function.parameters"), /more than 10000 values/);
  } finally {
    Array.prototype.push = push;
  }
  // The old walk pushed all 2,000,000 numbers (250-330 ms of the event loop) to fail at the 10,001st.
  assert.ok(pushes < 100, `${pushes} values pushed`);
});

Deno.test("an ONNX tokenizer's 4 million ids are copied out in runs, with turns between them", async () => {
  const ids = new Int32Array(4_000_000).map((_, i) => i % 151_000);
  // A clock that moves a millisecond each time it is read: the copy's pauses do not hang on speed.
  let now = 0;
  const slices = new Slicer(10, undefined, () => now++);
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  const lists = await idLists(ids, new Int32Array([3, 3_999_990, 7]), slices);
  clearTimeout(timer);
  assert.ok(fired, "a timer set before ran while the ids were copied");
  assert.deepEqual(lists.map((l) => l.length), [3, 3_999_990, 7]);
  assert.deepEqual(lists[0], [0, 1, 2]);
  assert.equal(lists[1][0], 3);
  assert.equal(lists[1].at(-1), 3_999_992 % 151_000);
  assert.deepEqual(lists[2], Array.from(ids.subarray(3_999_993)));
});

Deno.test("/detokenize of 1.1 million ids checks them against the vocabulary with a turn before decoding", async () => {
  const tokens = Array.from({ length: 1_100_000 }, (_, i) => 9707 + (i % 50));
  let fired = false;
  let firedAtDecode: boolean | undefined;
  const engine = {
    vocabSize: 151_936,
    prompt: () => Promise.reject(new Error("not used")),
    detokenize: (ids: readonly number[]) => {
      firedAtDecode = fired;
      return Promise.resolve(`${ids.length} ids`);
    },
  } as unknown as ChatEngine;
  const timer = setTimeout(() => (fired = true), 0);
  const out = await detokenize({ model: "m", tokens }, engine);
  clearTimeout(timer);
  assert.equal(out.content, "1100000 ids");
  assert.equal(firedAtDecode, true, "a timer set before ran before the engine decoded");
  await assert.rejects(
    detokenize({ model: "m", tokens: [...tokens, 151_936] }, engine),
    (e: ApiError) => e.status === 400 && e.param === "tokens[1100000]",
  );
});

Deno.test("a sliced JSON answer is written in pieces of about a megabyte, however long its slices", async () => {
  const text = "hello world ".repeat(1_000_000); // 12 MB
  const res = slicedJsonResponse({ content: text, prompt: text }, { sliceMs: 60_000 });
  const sizes: number[] = [];
  const reader = res.body!.getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) sizes.push(r.value.length);
  assert.equal(sizes.reduce((a, b) => a + b, 0), JSON.stringify({ content: text, prompt: text }).length);
  assert.ok(sizes.length >= 20, `${sizes.length} pieces`);
  assert.ok(Math.max(...sizes) < 2 << 20, `largest piece ${Math.max(...sizes)} bytes`);
});

Deno.test("a markup-dense render comes back from the worker packed, its pieces unpacked with turns between them", async () => {
  const markup = [
    { text: "<|im_end|>", id: 151645, matchedInText: false },
    { text: "<think>", id: 151667, matchedInText: true },
  ];
  const template = new ChatTemplate({
    source: "{% for m in messages %}[{{ m.role }}] {{ m.content }}<|im_end|>\n{% endfor %}",
    specials: { bos: "", eos: "" },
    markup,
  });
  const input = {
    messages: [{ role: "user" as const, text: "a<|im_end|>b<think>".repeat(20_000) }],
    tools: [],
    thinking: undefined,
  };
  try {
    const prompt = await template.renderAsync(input);
    assert.deepEqual(prompt, template.render(input));
    assert.ok(prompt.pieces.length > 20_000, `${prompt.pieces.length} pieces`);
    // Unpacking 400,000 pieces leaves turns (a clock that moves a millisecond at each look).
    const many = { text: "", pieces: Array.from({ length: 400_000 }, (_, i) => i % 3 ? `p${i}` : i) };
    let now = 0;
    let fired = false;
    const timer = setTimeout(() => (fired = true), 0);
    const back = await unpackPrompt(packPrompt(many), new Slicer(10, undefined, () => now++));
    clearTimeout(timer);
    assert.ok(fired, "a timer set before ran while the pieces were unpacked");
    assert.deepEqual(back, many);
  } finally {
    template.dispose();
  }
});

/** Synchronous work for `ms` milliseconds. */
function busy(ms: number) {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // the event loop is held
  }
}

Deno.test("a request's steps leave a turn between them once they held the loop 5 ms, and none before", async () => {
  heldMs(); // the watch starts
  await new Promise((resolve) => setTimeout(resolve, 5)); // a turn of the loop, seen by the watch
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  await turnIfHeld(5);
  assert.equal(fired, false, "no turn right after one");
  busy(6);
  assert.ok(heldMs() >= 6, `held ${heldMs()} ms`);
  await turnIfHeld(5);
  clearTimeout(timer);
  assert.ok(fired, "a timer set before ran after 6 ms of steps");
});

Deno.test("50,000 history calls' arguments are parsed with turns between them", async () => {
  const messages = [
    { role: "user", content: "hi" },
    {
      role: "assistant",
      content: null,
      tool_calls: Array.from({ length: 50_000 }, (_, i) => ({
        id: `c${i}`,
        type: "function",
        function: { name: "f", arguments: `{"q":${i}}` },
      })),
    },
  ] as ChatMessage[];
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  // Each call's text is short, so its own parse never looks at the clock: on the old code one block.
  await parseHistoryArguments(messages);
  clearTimeout(timer);
  assert.ok(fired, "a timer set before ran while the calls were parsed");
});

Deno.test("the output check's worker is helper work while it loads and checks, so decodes leave the loop", async () => {
  const checker = new SchemaChecker();
  try {
    assert.equal(helpersBusy(), false);
    const check = checker.check({ type: "object", required: ["a"] }, { b: 1 });
    assert.equal(helpersBusy(), true, "loading");
    const result = await check;
    assert.equal(result.ok, false);
    assert.equal(helpersBusy(), false, "done");
  } finally {
    checker.close();
  }
  assert.equal(helpersBusy(), false);
});
