/**
 * The self-made models and the registry: GGUF and ONNX writers read back by the real runtimes,
 * tokenisation parity, determinism, strict start-up, and hub downloads against a local stand-in.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { getLlama, LlamaCompletion, type LlamaModel, type Token } from "node-llama-cpp";
import * as ort from "onnxruntime-node";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { resolveSource } from "../src/models/sources.ts";
import { PRESETS, type Qwen35MoePreset, writePresetGguf } from "../src/models/presets.ts";
import { qwen35moeGguf } from "../src/models/qwen35moe_gguf.ts";
import { QWEN35_CHAT_TEMPLATE } from "../src/models/qwen35_chat_template.ts";
import { loadQwen3Vocab, qwen3TokenizerJsonPath } from "../src/models/qwen3_vocab.ts";
import { fetchFromHub, hubCachePath, parseHubRef } from "../src/models/hub.ts";
import { silentLogger } from "../src/log.ts";
import { runMain, startServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import type { Json } from "./helpers/server.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;
const source = (s: string) =>
  resolveSource(s, { cacheDir: CACHE, hubUrl: "http://127.0.0.1:9", log: silentLogger });
const tokenizerPath = qwen3TokenizerJsonPath();
const tokenizerConfig = JSON.parse(
  await Deno.readTextFile(tokenizerPath.replace("tokenizer.json", "tokenizer_config.json")),
);
const tokenizer = new Tokenizer(JSON.parse(await Deno.readTextFile(tokenizerPath)), tokenizerConfig);
const llama = await getLlama({ build: "never", gpu: false, logLevel: "error" as never });
/** A test that loads a builtin preset in node-llama-cpp and disposes it afterwards. */
function modelTest(name: string, preset: string, fn: (model: LlamaModel) => void | Promise<void>) {
  Deno.test({
    name,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async () => {
      const model = await llama.loadModel({ modelPath: await source(`builtin:${preset}`) });
      try {
        await fn(model);
      } finally {
        await model.dispose();
      }
    },
  });
}
const sha256 = async (path: string) => createHash("sha256").update(await Deno.readFile(path)).digest("hex");

const MULTILINGUAL = [
  "¿Dónde está la biblioteca? Está cerca del parque.",
  "The quick brown fox jumps over the lazy dog.",
  "A ação está em promoção até sexta-feira.",
  "L'àvia va anar al mercat a comprar peix.",
  "Perché non andiamo al cinema stasera?",
  "Où se trouve la gare, s'il vous plaît ?",
  "Schöne Grüße aus München — Straße, Übung.",
  "我们明天在北京见面吧，好吗？",
  "Emoji: 🙂🎉👩‍💻🇪🇸 and symbols ∑∫≈",
];

modelTest(
  "tiny-chat GGUF loads in node-llama-cpp as qwen3 with the Qwen3 vocabulary and chat template",
  "tiny-chat",
  (model) => {
    const meta = model.fileInfo.metadata;
    assert.equal(meta.general.architecture, "qwen3");
    assert.equal(meta.tokenizer.ggml.tokens.length, 151669);
    assert.equal(model.tokens.eos, 151645);
    assert.equal(model.tokens.eosString, "<|im_end|>");
    assert.equal(meta.tokenizer.chat_template, tokenizerConfig.chat_template);
    assert.deepEqual(model.tokenize("<|im_start|>user", true).slice(0, 1), [151644]);
    assert.deepEqual(model.tokenize("<think>", true), [151667]);
  },
);

modelTest("tiny-embed GGUF declares last-token pooling and end-of-text as EOS", "tiny-embed", (model) => {
  const meta = model.fileInfo.metadata as { qwen3: { pooling_type: number } };
  assert.equal(meta.qwen3.pooling_type, 3);
  assert.equal(model.tokens.eos, 151643);
  assert.equal(model.embeddingVectorSize, 128);
});

modelTest(
  "multilingual text tokenises to identical ids in llama.cpp and in tokenizer.json",
  "tiny-embed",
  (model) => {
    for (const text of MULTILINGUAL) {
      assert.deepEqual(Array.from(model.tokenize(text, false)), tokenizer.encode(text).ids, text);
    }
  },
);

// ---- chat stand-ins: greedy decoding writes visible text ----

const USER_PROMPTS = ["Hello", "What is the capital of France?", "Write a haiku about rust."];

/** Greedy completions of rendered prompts (special tokens parsed): each one's first token and text. */
async function greedy(model: LlamaModel, prompts: string[]): Promise<{ first: Token; text: string }[]> {
  const context = await model.createContext({ contextSize: 512, threads: 2 });
  const results = [];
  try {
    for (const prompt of prompts) {
      const sequence = context.getSequence();
      try {
        const tokens: Token[] = [];
        const text = await new LlamaCompletion({ contextSequence: sequence }).generateCompletion(
          model.tokenize(prompt, true),
          { maxTokens: 4, temperature: 0, onToken: (t) => void tokens.push(...t) },
        );
        results.push({ first: tokens[0], text });
      } finally {
        sequence.dispose();
      }
    }
    return results;
  } finally {
    await context.dispose();
  }
}

/** The model's own template rendered for one user turn, with the given thinking switch. */
function renderPrompt(model: LlamaModel, user: string, enableThinking?: boolean): string {
  const template = new Template(model.fileInfo.metadata.tokenizer.chat_template!);
  return template.render({
    messages: [{ role: "user", content: user }],
    add_generation_prompt: true,
    ...(enableThinking === undefined ? {} : { enable_thinking: enableThinking }),
  });
}

modelTest(
  "tiny-chat: greedy decoding after the thinking-off prompt writes visible text",
  "tiny-chat",
  async (model) => {
    const prompts = USER_PROMPTS.map((user) => renderPrompt(model, user, false));
    for (const prompt of prompts) {
      assert.ok(prompt.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
    (await greedy(model, prompts)).forEach(({ first, text }, i) => {
      assert.ok(!model.isEogToken(first), `${USER_PROMPTS[i]}: starts with an end-of-generation token`);
      assert.match(text, /\S/, `${USER_PROMPTS[i]}: greedy text ${JSON.stringify(text)} is blank`);
    });
  },
);

modelTest(
  "tiny-moe GGUF loads as qwen35moe: 3 linear-attention layers then 1 gated attention layer, MoE + shared expert",
  "tiny-moe",
  (model) => {
    const meta = model.fileInfo.metadata as Json;
    assert.equal(meta.general.architecture, "qwen35moe");
    const a = meta.qwen35moe;
    assert.deepEqual(
      [a.block_count, a.full_attention_interval, a.embedding_length, a.context_length],
      [4, 4, 64, 262144],
    );
    assert.deepEqual(a.attention.head_count, 4);
    assert.deepEqual(a.attention.head_count_kv, 2);
    assert.deepEqual(a.attention.key_length, 32);
    assert.deepEqual(a.rope, { freq_base: 10_000_000, dimension_count: 8, dimension_sections: [2, 1, 1, 0] });
    assert.deepEqual(a.ssm, {
      conv_kernel: 4,
      state_size: 16,
      group_count: 2,
      time_step_rank: 4,
      inner_size: 64,
    });
    assert.deepEqual(
      [
        a.expert_count,
        a.expert_used_count,
        a.expert_feed_forward_length,
        a.expert_shared_feed_forward_length,
      ],
      [8, 2, 32, 32],
    );
    assert.equal(meta.tokenizer.chat_template, QWEN35_CHAT_TEMPLATE);
    assert.equal(model.tokens.eosString, "<|im_end|>");
    const names = new Set(model.fileInfo.tensorInfo!.map((t) => t.name));
    for (const l of [0, 1, 2]) {
      for (const t of ["attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias"]) {
        assert.ok(names.has(`blk.${l}.${t}`), `blk.${l}.${t}`);
      }
      assert.ok(!names.has(`blk.${l}.attn_q.weight`));
    }
    for (const t of ["attn_q.weight", "attn_q_norm.weight", "attn_k_norm.weight"]) {
      assert.ok(names.has(`blk.3.${t}`));
    }
    assert.ok(!names.has("blk.3.ssm_a"));
    for (const t of ["ffn_gate_inp", "ffn_up_exps", "ffn_gate_inp_shexp", "ffn_down_shexp"]) {
      assert.ok(names.has(`blk.3.${t}.weight`), t);
    }
    assert.ok(names.has("output.weight"), "an untied output head");
  },
);

modelTest(
  "tiny-moe: greedy decoding writes content with thinking off and reasoning with thinking on",
  "tiny-moe",
  async (model) => {
    const thinkEnd = model.tokenize("</think>", true)[0];
    const cases = USER_PROMPTS.flatMap((user) => [false, true].map((thinking) => ({ user, thinking })));
    const prompts = cases.map(({ user, thinking }) => renderPrompt(model, user, thinking));
    const results = await greedy(model, prompts);
    cases.forEach(({ user, thinking }, i) => {
      const what = `${user} (thinking ${thinking ? "on" : "off"})`;
      const suffix = thinking ? "assistant\n<think>\n" : "assistant\n<think>\n\n</think>\n\n";
      assert.ok(prompts[i].endsWith(suffix), what);
      assert.ok(!model.isEogToken(results[i].first), `${what}: starts with an end-of-generation token`);
      assert.notEqual(results[i].first, thinkEnd, `${what}: closes the reasoning at once`);
      assert.match(results[i].text, /\S/, `${what}: greedy text ${JSON.stringify(results[i].text)} is blank`);
    });
  },
);

Deno.test("bench-moe has Qwen3.6-35B-A3B's per-token shape with 16 experts (metadata, not generated)", async () => {
  const p = PRESETS["bench-moe"] as Qwen35MoePreset;
  const { metadata, tensors } = qwen35moeGguf("bench-moe", p, await loadQwen3Vocab());
  const u = (key: string) => (metadata[`qwen35moe.${key}`] as { value: unknown }).value;
  assert.deepEqual(
    [
      "block_count",
      "embedding_length",
      "attention.head_count",
      "attention.head_count_kv",
      "attention.key_length",
    ]
      .map(u),
    [40, 2048, 16, 2, 256],
  );
  assert.deepEqual(
    ["ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size"].map(u),
    [4, 128, 16, 32, 4096],
  );
  assert.deepEqual(
    ["expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"]
      .map(u),
    [16, 8, 512, 512],
  );
  assert.deepEqual([u("rope.dimension_count"), u("rope.dimension_sections")], [64, [11, 11, 10, 0]]);
  assert.equal((metadata["tokenizer.ggml.tokens"].value as string[]).length, 248320);
  const bytes = tensors.reduce(
    (sum, t) => sum + t.dims.reduce((a, b) => a * b, 1) * (t.type === "F32" ? 4 : 34 / 32),
    0,
  );
  assert.ok(bytes > 4e9 && bytes < 5e9, `${bytes} bytes`);
});

modelTest(
  "spec-embed: qwen3, 4096 dims, last-token pooling, 32k context, tied table; a similar pair is closer",
  "spec-embed",
  async (model) => {
    const meta = model.fileInfo.metadata as Json;
    assert.equal(meta.general.architecture, "qwen3");
    assert.equal(meta.qwen3.pooling_type, 3);
    assert.ok(meta.qwen3.context_length >= 8192);
    assert.equal(model.embeddingVectorSize, 4096);
    assert.equal(model.tokens.eosString, "<|endoftext|>");
    assert.ok(!model.fileInfo.tensorInfo!.some((t) => t.name === "output.weight"), "the token table is tied");
    const context = await model.createEmbeddingContext({ contextSize: 512, threads: 2 });
    try {
      const embed = async (text: string) =>
        (await context.getEmbeddingFor([...model.tokenize(text, false), model.tokens.eos!])).vector;
      const [a, s, u] = [
        await embed("the cat sat on the warm mat by the door"),
        await embed("the cat sat on the warm rug by the door"),
        await embed("quarterly revenue grew in emerging markets"),
      ];
      assert.equal(a.length, 4096);
      const cos = (x: readonly number[], y: readonly number[]) => {
        let dot = 0, nx = 0, ny = 0;
        for (let i = 0; i < x.length; i++) {
          [dot, nx, ny] = [dot + x[i] * y[i], nx + x[i] ** 2, ny + y[i] ** 2];
        }
        return dot / Math.sqrt(nx * ny);
      };
      assert.ok(cos(a, s) > cos(a, u) + 0.1, `similar ${cos(a, s)} vs unrelated ${cos(a, u)}`);
      assert.ok(cos(a, s) < 0.99999, "vectors are not degenerate");
    } finally {
      await context.dispose();
    }
  },
);

Deno.test("the ONNX model loads in onnxruntime-node with HF input and output names", async () => {
  const session = await ort.InferenceSession.create(await source("builtin:tiny-embed-onnx"));
  try {
    assert.deepEqual([...session.inputNames].sort(), ["attention_mask", "input_ids"]);
    assert.deepEqual([...session.outputNames].sort(), ["last_hidden_state", "sentence_embedding"]);
    const ids = tokenizer.encode("hola").ids;
    const shape = [1, ids.length];
    const out = await session.run({
      input_ids: new ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)), shape),
      attention_mask: new ort.Tensor("int64", new BigInt64Array(ids.length).fill(1n), shape),
    });
    assert.deepEqual(out.sentence_embedding.dims, [1, 128]);
    assert.deepEqual(out.last_hidden_state.dims, [1, ids.length, 128]);
  } finally {
    await session.release();
  }
});

for (const preset of ["tiny-chat", "tiny-moe"]) {
  Deno.test(`${preset}: the same preset generates byte-identical files`, async () => {
    const dir = await Deno.makeTempDir();
    try {
      await writePresetGguf(preset, `${dir}/a.gguf`);
      await writePresetGguf(preset, `${dir}/b.gguf`);
      assert.equal(await sha256(`${dir}/a.gguf`), await sha256(`${dir}/b.gguf`));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

Deno.test("an unknown builtin preset is an error listing the known ones", async () => {
  await assert.rejects(source("builtin:huge-chat"), /unknown builtin preset 'huge-chat' \(known: tiny-chat/);
});

Deno.test("--chat-model naming a missing file refuses to start, naming the file", async () => {
  const out = await runMain(["--port", "0", "--chat-model", "/nonexistent/model.gguf"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /\/nonexistent\/model\.gguf/);
});

Deno.test("a registry file with a bad entry refuses to start, naming the entry and field", async () => {
  const file = await writeJsonFile({ models: [{ id: "x", kind: "vision", source: "builtin:tiny-chat" }] });
  const out = await runMain(["--port", "0", "--models", file]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /models\[0\]\.kind/);
  await Deno.remove(file);
});

// ---- hub downloads, against a stand-in hub on 127.0.0.1 ----

const payload = new Uint8Array(300_000).map((_, i) => (i * 7919) % 251);
const payloadSha = createHash("sha256").update(payload).digest("hex");
let cutNextDownload = false;
let corrupt = false;
const hubRequests: string[] = [];
const hub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
  const path = new URL(req.url).pathname;
  const range = req.headers.get("range");
  hubRequests.push(`${path} ${range ?? ""}`);
  if (path.startsWith("/org/embed/resolve/main/tiny-embed.gguf")) {
    return new Response(Deno.readFileSync(tinyEmbedPath));
  }
  if (!path.startsWith("/org/repo/resolve/main/weights.bin")) return new Response("no", { status: 404 });
  const body = corrupt ? payload.map((b) => b ^ 1) : payload;
  const start = range ? Number(range.match(/bytes=(\d+)-/)![1]) : 0;
  const rest = body.subarray(start);
  if (cutNextDownload) {
    cutNextDownload = false;
    // Send half, then break the connection.
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(rest.subarray(0, rest.length / 2));
        setTimeout(() => c.error(new Error("cut")), 50);
      },
    });
    return new Response(stream, {
      status: range ? 206 : 200,
      headers: { "content-length": String(rest.length) },
    });
  }
  return new Response(rest, {
    status: range ? 206 : 200,
    headers: range ? { "content-range": `bytes ${start}-${body.length - 1}/${body.length}` } : {},
  });
});
const hubUrl = `http://127.0.0.1:${hub.addr.port}`;
const tinyEmbedPath = await source("builtin:tiny-embed");
globalThis.addEventListener("unload", () => void hub.shutdown());

serverTest("hf: a cut download resumes with a Range request and verifies its SHA-256", async () => {
  const cacheDir = await Deno.makeTempDir();
  const src = "hf:org/repo/weights.bin";
  cutNextDownload = true;
  hubRequests.length = 0;
  await assert.rejects(fetchFromHub(src, { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha }));
  const part = `${hubCachePath(cacheDir, parseHubRef(src))}.part`;
  const partial = (await Deno.stat(part)).size;
  assert.ok(partial > 0 && partial < payload.length, `partial file of ${partial} bytes`);
  const path = await fetchFromHub(src, {
    hubUrl,
    cacheDir,
    log: silentLogger,
    sha256: payloadSha,
    size: payload.length,
  });
  assert.deepEqual(await Deno.readFile(path), payload);
  assert.equal(hubRequests.at(-1), `/org/repo/resolve/main/weights.bin bytes=${partial}-`);
  // A complete file is reused without asking the hub again.
  const before = hubRequests.length;
  await fetchFromHub(src, { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha });
  assert.equal(hubRequests.length, before);
  await Deno.remove(cacheDir, { recursive: true });
});

serverTest("hf: a corrupted download is rejected and removed", async () => {
  const cacheDir = await Deno.makeTempDir();
  corrupt = true;
  try {
    await assert.rejects(
      fetchFromHub("hf:org/repo/weights.bin", { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha }),
      /SHA-256 .* expected/,
    );
    const target = hubCachePath(cacheDir, parseHubRef("hf:org/repo/weights.bin"));
    assert.equal(await Deno.stat(`${target}.part`).catch(() => null), null);
    assert.equal(await Deno.stat(target).catch(() => null), null);
  } finally {
    corrupt = false;
    await Deno.remove(cacheDir, { recursive: true });
  }
});

serverTest("hf: references with path tricks are refused", () => {
  assert.throws(() => parseHubRef("hf:org/repo/../../etc/passwd"), /not a valid hf: source/);
  assert.deepEqual(parseHubRef("hf:org/repo/dir/f.gguf@v1.0"), {
    repo: "org/repo",
    file: "dir/f.gguf",
    revision: "v1.0",
  });
  return Promise.resolve();
});

serverTest(
  "a server configured with an hf: model downloads it from the configured hub and serves it",
  async () => {
    const cacheDir = await Deno.makeTempDir();
    const registry = await writeJsonFile({
      models: [{
        id: "org/embed",
        kind: "embedding",
        source: "hf:org/embed/tiny-embed.gguf",
        sha256: await sha256(tinyEmbedPath),
        maxInputTokens: 512,
        parallel: 1,
      }],
    });
    const server = await startServer(
      ["--api-key", "k", "--models", registry, "--model-cache", cacheDir, "--hub-url", hubUrl],
      { waitReady: true },
    );
    try {
      const list = await (await fetch(`${server.url}/v1/models`, { headers: { authorization: "Bearer k" } }))
        .json();
      assert.deepEqual(list.data.map((m: { id: string; status: string }) => [m.id, m.status]), [[
        "org/embed",
        "loaded",
      ]]);
      const res = await fetch(`${server.url}/v1/embeddings`, {
        method: "POST",
        headers: { authorization: "Bearer k", "content-type": "application/json" },
        body: JSON.stringify({ model: "org/embed", input: "downloaded" }),
      });
      assert.equal(res.status, 200);
      assert.equal((await res.json()).data[0].embedding.length, 128);
    } finally {
      await server.stop();
      await Deno.remove(cacheDir, { recursive: true });
      await Deno.remove(registry);
    }
  },
);

// ---- our Qwen3.5/3.6 chat template (embedded in the qwen35moe stand-ins) ----

const qwen35 = new Template(QWEN35_CHAT_TEMPLATE);
const render = (ctx: Record<string, unknown>) => qwen35.render(ctx);
const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const TEMPLATE_CASES: Record<string, Record<string, unknown>> = {
  plain: { messages: [{ role: "user", content: "Hi" }], add_generation_prompt: true },
  thinkingOff: {
    messages: [{ role: "user", content: "Hi" }],
    add_generation_prompt: true,
    enable_thinking: false,
  },
  systemAndTools: {
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Weather?" }],
    tools: [WEATHER_TOOL],
    add_generation_prompt: true,
  },
  toolsOnly: {
    messages: [{ role: "user", content: [{ type: "text", text: "Weather?" }] }],
    tools: [WEATHER_TOOL],
  },
  calls: {
    messages: [
      { role: "user", content: "Weather in Paris and Rome?" },
      {
        role: "assistant",
        content: "Checking both.",
        tool_calls: [
          {
            id: "1",
            type: "function",
            function: { name: "get_weather", arguments: { city: "Paris", days: 2 } },
          },
          {
            id: "2",
            type: "function",
            function: {
              name: "get_weather",
              arguments: { city: "Rome", units: { temp: "C" }, hourly: true },
            },
          },
        ],
      },
      { role: "tool", tool_call_id: "1", content: "sunny" },
      { role: "tool", tool_call_id: "2", content: "rain" },
      { role: "assistant", content: "Sunny in Paris, rain in Rome." },
      { role: "tool", tool_call_id: "3", content: "late" },
    ],
    tools: [WEATHER_TOOL],
  },
  reasoning: {
    messages: [
      { role: "user", content: "Q1" },
      { role: "assistant", content: "<think>\nold thoughts\n</think>\n\nA1" },
      { role: "user", content: "Q2" },
      {
        role: "assistant",
        content: "",
        reasoning_content: "new thoughts",
        tool_calls: [{ type: "function", function: { name: "f", arguments: {} } }],
      },
      { role: "user", content: "<tool_response>\n42\n</tool_response>" },
      { role: "assistant", content: "<think>\nlater thoughts\n</think>\n\nA2" },
    ],
  },
};

Deno.test("qwen35 template: ChatML turns, and the generation prompt opens <think> by default", () => {
  assert.equal(
    render(TEMPLATE_CASES.plain),
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
  );
});

Deno.test("qwen35 template: enable_thinking false gives an empty, closed think block", () => {
  assert.equal(
    render(TEMPLATE_CASES.thinkingOff),
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
  );
});

Deno.test("qwen35 template: tools are JSON lines in <tools> after the system message, with the XML call form", () => {
  const out = render(TEMPLATE_CASES.systemAndTools);
  assert.ok(out.startsWith("<|im_start|>system\nBe brief.\n\n"), out);
  assert.ok(
    out.includes(`<tools>\n${JSON.stringify(WEATHER_TOOL).replaceAll(/([,:])(?=["{\[])/g, "$1 ")}\n</tools>`),
    out,
  );
  assert.ok(
    out.includes(
      "<tool_call>\n<function=NAME_OF_THE_FUNCTION>\n<parameter=NAME_OF_A_PARAMETER>\nVALUE\n</parameter>\n",
    ),
  );
  assert.equal(out.match(/<\|im_start\|>system/g)?.length, 1, "one system turn");
  assert.ok(
    out.endsWith("<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n"),
  );
});

Deno.test("qwen35 template: tools without a system message get a system turn of their own", () => {
  const out = render(TEMPLATE_CASES.toolsOnly);
  assert.ok(out.startsWith("<|im_start|>system\n# Tools\n"), out);
  assert.ok(out.endsWith("<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"), out);
});

Deno.test("qwen35 template: earlier calls are XML from mapping arguments (strings raw, others JSON) after the content", () => {
  const out = render(TEMPLATE_CASES.calls);
  const call = (city: string, rest: string) =>
    `<tool_call>\n<function=get_weather>\n<parameter=city>\n${city}\n</parameter>\n${rest}</function>\n</tool_call>`;
  assert.ok(
    out.includes(
      "<|im_start|>assistant\n<think>\n\n</think>\n\nChecking both.\n\n" +
        call("Paris", "<parameter=days>\n2\n</parameter>\n") + "\n" +
        call(
          "Rome",
          '<parameter=units>\n{"temp": "C"}\n</parameter>\n<parameter=hourly>\ntrue\n</parameter>\n',
        ) +
        "<|im_end|>\n",
    ),
    out,
  );
});

Deno.test("qwen35 template: consecutive tool results share one user turn of <tool_response> blocks", () => {
  const out = render(TEMPLATE_CASES.calls);
  assert.ok(
    out.includes(
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n",
    ),
    out,
  );
  assert.ok(out.endsWith("<|im_start|>user\n<tool_response>\nlate\n</tool_response><|im_end|>\n"), out);
});

Deno.test("qwen35 template: reasoning is kept only after the last real user query (tool responses do not count)", () => {
  const out = render(TEMPLATE_CASES.reasoning);
  assert.ok(out.includes("<|im_start|>assistant\nA1<|im_end|>"), "before the last query: content only");
  assert.ok(!out.includes("old thoughts"));
  assert.ok(
    out.includes(
      "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\n<tool_call>\n<function=f>\n</function>",
    ),
    out,
  );
  assert.ok(out.endsWith("<|im_start|>assistant\n<think>\nlater thoughts\n</think>\n\nA2<|im_end|>\n"), out);
});

Deno.test("qwen35 template: raises for a late system message, no user query, an unknown role", () => {
  assert.throws(
    () => render({ messages: [{ role: "user", content: "x" }, { role: "system", content: "late" }] }),
    /system message may only be the first/,
  );
  assert.throws(() => render({ messages: [{ role: "system", content: "x" }] }), /no user query/);
  assert.throws(
    () => render({ messages: [{ role: "user", content: "x" }, { role: "robot", content: "y" }] }),
    /Unknown message role: robot/,
  );
});

Deno.test("qwen35 template: llama.cpp's Jinja engine (node-llama-cpp's native renderer) renders it identically", () => {
  // The native renderer is node-llama-cpp's fallback when @huggingface/jinja cannot parse a template;
  // it is llama.cpp's own engine, so this checks what llama.cpp-based servers would render.
  const Native = (llama as unknown as {
    _bindings: { AddonJinjaRenderer: new (t: string) => { render(c: unknown): string } };
  })
    ._bindings.AddonJinjaRenderer;
  const native = new Native(QWEN35_CHAT_TEMPLATE);
  for (const [name, ctx] of Object.entries(TEMPLATE_CASES)) {
    assert.equal(native.render(ctx), render(ctx), name);
  }
  assert.throws(() => native.render({ messages: [{ role: "system", content: "x" }] }), /no user query/);
});
