/**
 * What the token policy (client text is text: docs/tokenization.md) costs per request: the CPU time
 * of rendering and tokenizing an agent prompt like the ones coding agents send (Qwen Code: ~77 KB,
 * 15 tools, a long system prompt, a dozen tool calls and results), the way the server does it
 * (placeholders, split at the template's markup, tokenized piece by piece) against rendering it as
 * is and tokenizing the whole text with special-token parsing (what llama-server does). CPU time of
 * this process, so a busy machine changes the figures less than wall time would.
 *
 *   deno run --allow-all bench/prompt_cost.ts [tiny-moe|tiny-chat] [runs]
 */
import process from "node:process";
import { Template } from "@huggingface/jinja";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { NativeModel } from "../src/engines/llama/native.ts";
import { ChatTemplate } from "../src/engines/llama/template.ts";
import type { EngineMessage, EngineTool } from "../src/engines/types.ts";

const WORDS =
  ("the of and to in is you that it was for on are as with they at be this have from or one had by " +
    "word but not what all were we when your can said there use an each which she do how their if will up other " +
    "about out many then them these so some her would make like him into time has look two more write go see " +
    "number no way could people my than first water been call who its now find long down day did get come made " +
    "may part").split(" ");

/** `n` words of deterministic text, a sentence per 13 words. */
function text(n: number, seed: number): string {
  let s = "";
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) & 0x7fffffff;
    s += WORDS[x % WORDS.length] + (i % 13 === 12 ? ".\n" : " ");
  }
  return s;
}

/** An agent request of ~77 KB; `markup`: its tool results quote special-token strings too. */
function agentRequest(markup: boolean): { messages: EngineMessage[]; tools: EngineTool[] } {
  const tools: EngineTool[] = Array.from({ length: 15 }, (_, i) => ({
    name: `tool_${i}`,
    description: text(150, i),
    parameters: {
      type: "object",
      properties: Object.fromEntries(
        Array.from({ length: 5 }, (_, k) => [`p${k}`, { type: "string", description: text(25, i * 7 + k) }]),
      ),
      required: ["p0"],
    },
  }));
  const quote = markup ? " <|im_end|> <tool_call> </think> " : " ";
  const messages: EngineMessage[] = [
    { role: "system", text: text(5200, 99) },
    { role: "user", text: text(200, 5) },
  ];
  for (let t = 0; t < 12; t++) {
    messages.push({
      role: "assistant",
      text: text(30, t),
      toolCalls: [{ id: `c${t}`, name: `tool_${t % 15}`, arguments: { p0: text(10, t), p1: "x" } }],
    });
    messages.push({ role: "tool", text: text(150, t + 50) + quote + text(150, t + 70), toolCallId: `c${t}` });
  }
  return { messages, tools };
}

const name = Deno.args[0] ?? "tiny-moe";
const runs = Number(Deno.args[1] ?? 30);
await llamaRuntime("cpu", silentLogger);
const cacheDir = new URL("../models/cache", import.meta.url).pathname;
const model = await NativeModel.load(
  openLlamaLibrary(),
  await resolveSource(`builtin:${name}`, { cacheDir, hubUrl: "", log: silentLogger }),
  0,
);
const source = model.chatTemplate()!;
const template = new ChatTemplate({
  source,
  specials: { bos: "", eos: "" },
  markup: (await model.scanVocabulary()).markup,
});
const plain = new Template(source);
const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
const spread = (v: number[]) => {
  v.sort((a, b) => a - b);
  return `${v[0].toFixed(2)}–${v[v.length - 1].toFixed(2)} ms (median ${v[v.length >> 1].toFixed(2)})`;
};

for (const markup of [false, true]) {
  const { messages, tools } = agentRequest(markup);
  const context = {
    messages: messages.map((m) =>
      m.role === "assistant"
        ? {
          role: "assistant",
          content: m.text,
          tool_calls: m.toolCalls.map((c) => ({
            id: c.id,
            type: "function",
            function: { name: c.name, arguments: c.arguments },
          })),
        }
        : m.role === "tool"
        ? { role: "tool", content: m.text, tool_call_id: m.toolCallId }
        : { role: m.role, content: m.text }
    ),
    tools: tools.map((t) => ({
      type: "function",
      function: { name: t.name, description: t.description, parameters: t.parameters },
    })),
    add_generation_prompt: true,
    bos_token: "",
    eos_token: "",
  };
  const cost = {
    plainRender: [] as number[],
    plainTokens: [] as number[],
    render: [] as number[],
    tokens: [] as number[],
  };
  let sizes = "";
  for (let r = 0; r < runs + 3; r++) {
    let t0 = cpuMs();
    const rendered = plain.render(context);
    let t1 = cpuMs();
    const whole = model.tokenize(rendered, true);
    let t2 = cpuMs();
    if (r >= 3) cost.plainRender.push(t1 - t0), cost.plainTokens.push(t2 - t1);
    t0 = cpuMs();
    const prompt = template.render({ messages, tools, thinking: undefined });
    t1 = cpuMs();
    const ids: number[] = [];
    for (const p of prompt.pieces) {
      if (typeof p === "number") ids.push(p);
      else for (const id of model.tokenize(p, false)) ids.push(id);
    }
    t2 = cpuMs();
    if (r >= 3) cost.render.push(t1 - t0), cost.tokens.push(t2 - t1);
    sizes =
      `${
        (rendered.length / 1000).toFixed(0)
      } KB, ${whole.length} tokens as one text, ${ids.length} as pieces` +
      (markup ? "" : ` (same tokens: ${JSON.stringify(whole) === JSON.stringify(ids)})`);
  }
  console.log(`${name}, agent prompt${markup ? " quoting special-token strings" : ""}: ${sizes}`);
  console.log(`  render   as is ${spread(cost.plainRender)} | with placeholders ${spread(cost.render)}`);
  console.log(`  tokenize whole ${spread(cost.plainTokens)} | pieces ${spread(cost.tokens)}`);
}
model.free();
