/**
 * `deno task bench`: the same work through HTTP (a real server process, a real client) and
 * in-process (the engine called directly: the ceiling), alternating in one run, reported as
 * medians, min–max and HTTP / in-process ratios. See bench/README.md.
 */
import { parseArgs } from "node:util";
import OpenAI from "openai";
import { startServer, type TestServer } from "../tests/helpers/server.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { engineThreads, llamaRuntime } from "../src/engines/llama/runtime.ts";
import { LlamaChatEngine } from "../src/engines/llama/chat.ts";
import { LlamaEmbeddingEngine } from "../src/engines/llama/embedding.ts";
import { OnnxEmbeddingEngine } from "../src/engines/onnx/embedding.ts";
import type { EmbeddingEngine } from "../src/engines/types.ts";
import { qwen3TokenizerJsonPath } from "../src/models/qwen3_vocab.ts";
import { toJob } from "../src/services/chat.ts";
import type { ChatRequest } from "../src/protocol/chat.ts";
import { markdownReport, percentile, type Row, summarize } from "./stats.ts";
import denoJson from "../deno.json" with { type: "json" };

const { values: opt } = parseArgs({
  args: Deno.args,
  options: {
    quick: { type: "boolean", default: false },
    tiny: { type: "boolean", default: false },
    reps: { type: "string" },
    scenarios: { type: "string", default: "chat,concurrency,embeddings,overhead" },
    threads: { type: "string" },
    "embed-backend": { type: "string", default: "llama" },
    out: { type: "string", default: "bench/results" },
    "baseline-url": { type: "string" },
    "baseline-key": { type: "string", default: "none" },
    "baseline-chat-model": { type: "string" },
    "baseline-embedding-model": { type: "string" },
    help: { type: "boolean", default: false },
  },
});
if (opt.help) {
  console.log(
    `deno task bench [--quick] [--tiny] [--reps N] [--scenarios chat,concurrency,embeddings,overhead]
  [--threads N] [--out DIR] [--baseline-url URL --baseline-key K --baseline-chat-model M --baseline-embedding-model M]`,
  );
  Deno.exit(0);
}

const quick = opt.quick;
const reps = Number(opt.reps ?? (quick ? 1 : 3));
const scenarios = new Set(opt.scenarios!.split(","));
const threads = engineThreads(Number(opt.threads ?? navigator.hardwareConcurrency));
const decodeTokens = quick ? 32 : 128;
const promptWords = quick ? 120 : 400; // ~1.25 tokens per word: ~500 tokens in full mode
const concurrency = quick ? [1, 4] : [1, 2, 4, 8];
const chatPreset = opt.tiny ? "tiny-chat" : "bench-chat";
const onnxEmbed = opt["embed-backend"] === "onnx";
// The ONNX path has one preset (a small graph over the Qwen3 vocabulary): it shows batching, not model speed.
const embedPreset = onnxEmbed ? "tiny-embed-onnx" : opt.tiny ? "tiny-embed" : "bench-embed";
const CHAT = "bench/chat";
const EMBED = "bench/embed";
const KEY = "bench-key";
const log = (msg: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}`);

const cacheDir = new URL("../models/cache", import.meta.url).pathname;
log(`preparing ${chatPreset} and ${embedPreset} (generated on first use)`);
const chatPath = await resolveSource(`builtin:${chatPreset}`, { cacheDir, hubUrl: "", log: silentLogger });
const embedPath = await resolveSource(`builtin:${embedPreset}`, { cacheDir, hubUrl: "", log: silentLogger });
const chatParallel = Math.max(...concurrency);
const chatCtx = 1024;
const embedParallel = 1;
const embedMaxTokens = 4096;

const registry = await Deno.makeTempFile({ suffix: ".json" });
await Deno.writeTextFile(
  registry,
  JSON.stringify({
    models: [
      { id: CHAT, kind: "chat", source: chatPath, contextSize: chatCtx, parallel: chatParallel },
      onnxEmbed
        ? {
          id: EMBED,
          kind: "embedding",
          backend: "onnx",
          source: embedPath,
          tokenizer: "builtin:qwen3",
          pooling: "mean",
          maxInputTokens: embedMaxTokens,
        }
        : {
          id: EMBED,
          kind: "embedding",
          source: embedPath,
          maxInputTokens: embedMaxTokens,
          parallel: embedParallel,
        },
    ],
  }),
);

log(`starting the server (threads ${threads}) and loading the in-process engines`);
const server: TestServer = await startServer(
  ["--models", registry, "--api-key", KEY, "--threads", String(threads), "--gpu", "cpu"],
  { waitReady: true, timeoutMs: 600_000 },
);
const llama = await llamaRuntime("cpu", silentLogger);
const chatEngine = await LlamaChatEngine.load(llama, {
  modelPath: chatPath,
  threads,
  parallel: chatParallel,
  contextSize: chatCtx,
  log: silentLogger,
});
const embedEngine: EmbeddingEngine = onnxEmbed
  ? (await OnnxEmbeddingEngine.load({
    modelPath: embedPath,
    tokenizerPath: qwen3TokenizerJsonPath(),
    pooling: "mean",
    threads,
    gpu: "cpu",
    maxBatch: 64,
    log: silentLogger,
  })).engine
  : await LlamaEmbeddingEngine.load(llama, {
    modelPath: embedPath,
    threads,
    parallel: embedParallel,
    maxInputTokens: embedMaxTokens,
  });

const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
const baseline = opt["baseline-url"]
  ? new OpenAI({
    baseURL: `${opt["baseline-url"].replace(/\/$/, "")}/v1`,
    apiKey: opt["baseline-key"],
    maxRetries: 0,
  })
  : undefined;

// ---- workloads ----

const FILLER = "the river carries light across stones while distant bells count the hours of a quiet town"
  .split(" ");
function promptText(tag: string, words: number): string {
  const out = [`Request ${tag}.`];
  for (let i = 0; i < words; i++) out.push(FILLER[i % FILLER.length]);
  return out.join(" ");
}
const SENTENCE_COUNT = quick ? 16 : 64;
const SENTENCES = Array.from(
  { length: SENTENCE_COUNT },
  (_, i) => `Sentence number ${i}: ${FILLER.slice(i % 7, (i % 7) + 8).join(" ")}.`,
);
const DOCUMENT = promptText("document", quick ? 400 : 1996); // ~2,000 tokens in full mode

interface StreamTiming {
  start: number;
  first: number;
  end: number;
  promptTokens: number;
  completionTokens: number;
}

async function httpStream(
  api: OpenAI,
  model: string,
  content: string,
  maxTokens: number,
): Promise<StreamTiming> {
  const start = performance.now();
  let first = NaN;
  let usage = { prompt_tokens: 0, completion_tokens: 0 };
  const stream = await api.chat.completions.create({
    model,
    messages: [{ role: "user", content }],
    max_tokens: maxTokens,
    seed: 1,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
    if (Number.isNaN(first) && (d?.content || d?.reasoning_content)) first = performance.now();
    if (chunk.usage) usage = chunk.usage;
  }
  return {
    start,
    first,
    end: performance.now(),
    promptTokens: usage.prompt_tokens,
    completionTokens: usage.completion_tokens,
  };
}

async function engineStream(content: string, maxTokens: number): Promise<StreamTiming> {
  const start = performance.now();
  const request = {
    model: CHAT,
    messages: [{ role: "user", content }],
    max_tokens: maxTokens,
    seed: 1,
  } as ChatRequest;
  let first = NaN;
  let promptTokens = 0;
  let completionTokens = 0;
  for await (const ev of chatEngine.generate(toJob(request, false), new AbortController().signal)) {
    if (ev.type === "prompt") promptTokens = ev.promptTokens;
    else if (ev.type === "end") completionTokens = ev.completionTokens;
    else if (ev.type !== "first_token" && Number.isNaN(first)) first = performance.now();
  }
  return { start, first, end: performance.now(), promptTokens, completionTokens };
}

const rows: Row[] = [];
function record(scenario: string, metric: string, unit: string, better: Row["better"], samples: {
  http: number[];
  inProcess?: number[];
  baseline?: number[];
}) {
  rows.push({
    scenario,
    metric,
    unit,
    better,
    http: summarize(samples.http),
    ...(samples.inProcess ? { inProcess: summarize(samples.inProcess) } : {}),
    ...(samples.baseline?.length ? { baseline: summarize(samples.baseline) } : {}),
  });
}

async function warmUp() {
  await httpStream(client, CHAT, "warm up", 4);
  await engineStream("warm up", 4);
  await client.embeddings.create({ model: EMBED, input: "warm up" });
  await embedEngine.embed([await embedEngine.tokenize("warm up")]);
}

async function chatSingle() {
  const m = { ttft: [[], [], []], prompt: [[], [], []], decode: [[], [], []] } as Record<string, number[][]>;
  for (let rep = 0; rep < reps; rep++) {
    // A unique prompt per run: no request may reuse another's cached prefix.
    const runs: [number, () => Promise<StreamTiming>][] = [
      [0, () => httpStream(client, CHAT, promptText(`h${rep}`, promptWords), decodeTokens)],
      [1, () => engineStream(promptText(`e${rep}`, promptWords), decodeTokens)],
    ];
    if (baseline && opt["baseline-chat-model"]) {
      const model = opt["baseline-chat-model"];
      runs.push([2, () => httpStream(baseline, model, promptText(`b${rep}`, promptWords), decodeTokens)]);
    }
    for (const [i, run] of runs) {
      const t = await run();
      m.ttft[i].push(t.first - t.start);
      m.prompt[i].push(t.promptTokens / ((t.first - t.start) / 1000));
      m.decode[i].push((t.completionTokens - 1) / ((t.end - t.first) / 1000));
    }
    log(`chat single-stream rep ${rep + 1}/${reps}`);
  }
  const ttftTokens = `${promptWords} words ≈ ${Math.round(promptWords * 1.25)} tokens`;
  record("chat single stream", `time to first token, ${ttftTokens}`, "ms", "lower", split(m.ttft));
  record("chat single stream", "prompt processing", "tok/s", "higher", split(m.prompt));
  record("chat single stream", `decode over ${decodeTokens} tokens`, "tok/s", "higher", split(m.decode));
}

function split(v: number[][]) {
  return { http: v[0], inProcess: v[1], baseline: v[2] };
}

async function chatConcurrency() {
  for (const c of concurrency) {
    const samples = [[], [], []] as number[][];
    for (let rep = 0; rep < reps; rep++) {
      const modes: [number, (i: number) => Promise<StreamTiming>][] = [
        [0, (i) => httpStream(client, CHAT, promptText(`c${c}h${rep}s${i}`, 8), decodeTokens)],
        [1, (i) => engineStream(promptText(`c${c}e${rep}s${i}`, 8), decodeTokens)],
      ];
      if (baseline && opt["baseline-chat-model"]) {
        const model = opt["baseline-chat-model"];
        modes.push([2, (i) => httpStream(baseline, model, promptText(`c${c}b${rep}s${i}`, 8), decodeTokens)]);
      }
      for (const [mode, run] of modes) {
        const timings = await Promise.all(Array.from({ length: c }, (_, i) => run(i)));
        const tokens = timings.reduce((n, t) => n + t.completionTokens, 0);
        const wall = Math.max(...timings.map((t) => t.end)) - Math.min(...timings.map((t) => t.start));
        samples[mode].push(tokens / (wall / 1000));
      }
    }
    log(`chat ${c} concurrent streams done`);
    record(
      "chat aggregate decode",
      `${c} concurrent stream${c > 1 ? "s" : ""}`,
      "tok/s",
      "higher",
      split(samples),
    );
  }
}

async function embeddings() {
  // The in-process side tokenizes inside the timed region too: the server does the same work.
  const tokenizeAll = (texts: string[]) => Promise.all(texts.map((s) => embedEngine.tokenize(s)));
  const docTokens = (await embedEngine.tokenize(DOCUMENT)).length;
  const cases: [
    string,
    string,
    () => Promise<unknown>,
    () => Promise<unknown>,
    (() => Promise<unknown>) | undefined,
  ][] = [
    [
      `${SENTENCE_COUNT} sentences in one request`,
      "embeddings/s",
      () => client.embeddings.create({ model: EMBED, input: SENTENCES }),
      async () => embedEngine.embed(await tokenizeAll(SENTENCES)),
      baseline && opt["baseline-embedding-model"]
        ? () => baseline.embeddings.create({ model: opt["baseline-embedding-model"]!, input: SENTENCES })
        : undefined,
    ],
    [
      `${SENTENCE_COUNT} concurrent single-sentence requests`,
      "embeddings/s",
      () => Promise.all(SENTENCES.map((s) => client.embeddings.create({ model: EMBED, input: s }))),
      () => Promise.all(SENTENCES.map(async (s) => embedEngine.embed([await embedEngine.tokenize(s)]))),
      baseline && opt["baseline-embedding-model"]
        ? () =>
          Promise.all(
            SENTENCES.map((s) =>
              baseline.embeddings.create({ model: opt["baseline-embedding-model"]!, input: s })
            ),
          )
        : undefined,
    ],
    [
      `${SENTENCE_COUNT} sentences one by one`,
      "embeddings/s",
      async () => {
        for (const s of SENTENCES) await client.embeddings.create({ model: EMBED, input: s });
      },
      async () => {
        for (const s of SENTENCES) await embedEngine.embed([await embedEngine.tokenize(s)]);
      },
      undefined,
    ],
  ];
  for (const [name, unit, http, inProc, base] of cases) {
    const samples = [[], [], []] as number[][];
    for (let rep = 0; rep < reps; rep++) {
      for (const [i, run] of [[0, http], [1, inProc], [2, base]] as const) {
        if (!run) continue;
        const t0 = performance.now();
        await run();
        samples[i].push(SENTENCES.length / ((performance.now() - t0) / 1000));
      }
    }
    log(`embeddings: ${name} done`);
    record("embeddings", name, unit, "higher", split(samples));
  }
  const docSamples = [[], []] as number[][];
  for (let rep = 0; rep < reps; rep++) {
    let t0 = performance.now();
    await client.embeddings.create({ model: EMBED, input: DOCUMENT });
    docSamples[0].push(performance.now() - t0);
    t0 = performance.now();
    await embedEngine.embed([await embedEngine.tokenize(DOCUMENT)]);
    docSamples[1].push(performance.now() - t0);
  }
  record("embeddings", `one ${docTokens}-token document`, "ms", "lower", {
    http: docSamples[0],
    inProcess: docSamples[1],
  });
}

async function latencies(clients: number, total: number, call: () => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: clients }, async () => {
    while (next++ < total) {
      const t0 = performance.now();
      await call();
      out.push(performance.now() - t0);
    }
  }));
  return out.sort((a, b) => a - b);
}

async function overhead() {
  const n = quick ? 400 : 2000;
  const models = await latencies(16, n, async () => {
    const res = await fetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } });
    await res.arrayBuffer();
  });
  rows.push(
    {
      scenario: "server overhead",
      metric: "GET /v1/models p50, 16 clients",
      unit: "ms",
      better: "lower",
      http: summarize([percentile(models, 50)]),
    },
    {
      scenario: "server overhead",
      metric: "GET /v1/models p99, 16 clients",
      unit: "ms",
      better: "lower",
      http: summarize([percentile(models, 99)]),
    },
  );
  const one = [(await embedEngine.tokenize("a"))[0]];
  const body = JSON.stringify({ model: EMBED, input: one });
  const m = quick ? 200 : 800;
  const viaHttp = await latencies(16, m, async () => {
    const res = await fetch(`${server.url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body,
    });
    await res.arrayBuffer();
  });
  const direct = await latencies(16, m, () => embedEngine.embed([embedEngine.completeTokens(one)]));
  // One client, HTTP and in-process calls interleaved one by one (both see the same machine
  // state): the difference of the medians is the server's own overhead per request.
  const n1 = quick ? 30 : 100;
  const soloHttp: number[] = [];
  const soloDirect: number[] = [];
  for (let i = 0; i < n1; i++) {
    let t0 = performance.now();
    const res = await fetch(`${server.url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body,
    });
    await res.arrayBuffer();
    soloHttp.push(performance.now() - t0);
    t0 = performance.now();
    await embedEngine.embed([embedEngine.completeTokens(one)]);
    soloDirect.push(performance.now() - t0);
  }
  soloHttp.sort((a, b) => a - b);
  soloDirect.sort((a, b) => a - b);
  rows.push({
    scenario: "server overhead",
    metric: "1-token embedding p50, 1 client",
    unit: "ms",
    better: "lower",
    http: summarize([percentile(soloHttp, 50)]),
    inProcess: summarize([percentile(soloDirect, 50)]),
  });
  for (const p of [50, 99]) {
    rows.push({
      scenario: "server overhead",
      metric: `1-token embedding p${p}, 16 clients`,
      unit: "ms",
      better: "lower",
      http: summarize([percentile(viaHttp, p)]),
      inProcess: summarize([percentile(direct, p)]),
    });
  }
  log("overhead done");
}

await warmUp();
if (scenarios.has("chat")) await chatSingle();
if (scenarios.has("concurrency")) await chatConcurrency();
if (scenarios.has("embeddings")) await embeddings();
if (scenarios.has("overhead")) await overhead();

const status = await Deno.readTextFile(`/proc/${server.pid}/status`).catch(() => "");
const peakRss = Number(status.match(/VmHWM:\s+(\d+) kB/)?.[1] ?? NaN) / 1024;
const meta = {
  date: new Date().toISOString().slice(0, 16).replace("T", " "),
  cores: navigator.hardwareConcurrency,
  threads,
  models: `${chatPreset}, ${embedPreset}${onnxEmbed ? " (onnx)" : ""}`,
  reps,
  mode: quick ? "quick" : "full",
  deno: Deno.version.deno,
  "node-llama-cpp": denoJson.imports["node-llama-cpp"].split("@").pop(),
  "server peak RSS": `${peakRss.toFixed(0)} MiB`,
};
const markdown = markdownReport(meta, rows);
await Deno.mkdir(opt.out!, { recursive: true });
await Deno.writeTextFile(`${opt.out}/latest.md`, markdown + "\n");
await Deno.writeTextFile(`${opt.out}/latest.json`, JSON.stringify({ meta, rows }, null, 2) + "\n");
console.log(markdown);
log(`wrote ${opt.out}/latest.md and latest.json`);

await server.stop();
await chatEngine.dispose();
await embedEngine.dispose();
await Deno.remove(registry);
Deno.exit(0);
