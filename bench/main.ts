/**
 * `deno task bench`: the same work through vserve's HTTP API (a real server process, a real client), and
 * optionally in-process (the engines called directly: the ceiling) and on a baseline server (llama.cpp's
 * llama-server on the same files and settings, or any OpenAI-compatible URL), alternating in one run,
 * reported as medians, min–max and ratios. See bench/README.md.
 */
import { PRESETS } from "../src/models/presets.ts";
import OpenAI from "openai";
import { startServer, type TestServer } from "../tests/helpers/server.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { markdownReport, percentile, type Row, summarize } from "./stats.ts";
import { type BenchOptions, parseBenchArgs, USAGE, UsageError } from "./options.ts";
import {
  chatBody,
  httpStream,
  latencies,
  loadLeads,
  promptText,
  runOrder,
  sentences,
  shortText,
  type StreamTiming,
} from "./workload.ts";
import { cacheRoot, ensureLlamaServer, loadedCpuVariant } from "./llama_server_build.ts";
import {
  chatServerArgs,
  embeddingServerArgs,
  type LlamaServerProcess,
  peakRssMiB,
  startLlamaServer,
} from "./llama_server.ts";
import denoJson from "../deno.json" with { type: "json" };
import { affinityGain, type GatewayBench, gatewayOverhead } from "./gateway.ts";
import { samplerCost } from "./sampler.ts";
import { responsiveness } from "./responsiveness.ts";
import { fastSteps } from "./fast_steps.ts";
import { mixedLoad } from "./mixed.ts";
import { agentConversations, promptBurst } from "./agents.ts";

let opt: BenchOptions;
try {
  opt = parseBenchArgs(Deno.args, Deno.env.toObject());
} catch (e) {
  if (!(e instanceof UsageError)) throw e;
  console.error(`${e.message}\n\n${USAGE}`);
  Deno.exit(2);
}
if (opt.help) {
  console.log(USAGE);
  Deno.exit(0);
}

const { reps, quick, decodeTokens, promptWords, concurrency } = opt;
const threads = Math.max(
  1,
  Math.min(opt.threads ?? navigator.hardwareConcurrency, navigator.hardwareConcurrency),
);
/** Only scenarios that start their own servers: the main ones then run the tiny presets (nothing to generate). */
const ownServersOnly = [...opt.scenarios].every((s) => s === "fast" || s === "sampler");
const tiny = opt.tiny || ownServersOnly;
/** The chat models measured: the dense Qwen3-0.6B shape and the spec model's hybrid MoE shape. */
const chatModels = opt.chatModels.map((kind) => {
  const preset = kind === "dense" ? (tiny ? "tiny-chat" : "bench-chat") : (tiny ? "tiny-moe" : "bench-moe");
  return { kind, preset, id: `bench/${preset}`, path: "" };
});
const chatPreset = chatModels.map((m) => m.preset).join(", ");
const onnxEmbed = opt.embedBackend === "onnx";
// The ONNX path has one preset (a small graph over the Qwen3 vocabulary): it shows batching, not model speed.
const embedPreset = onnxEmbed ? "tiny-embed-onnx" : tiny ? "tiny-embed" : "bench-embed";
const EMBED = "bench/embed";
const KEY = "bench-key";
const chatParallel = opt.slots;
const chatCtx = opt.ctxPerSlot;
const embedMaxTokens = 4096;
const llamaServerBaseline = opt.baseline?.kind === "llama-server";
const baselineLabel = llamaServerBaseline ? "llama-server" : "baseline";
const log = (msg: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}`);

// ---- processes: everything started is stopped on every way out ----

const cleanups: (() => Promise<unknown>)[] = [];
async function cleanUp() {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
}
Deno.addSignalListener("SIGINT", async () => {
  await cleanUp();
  Deno.exit(130);
});

/** One thing measured: vserve over HTTP, the engines in-process, or the baseline server. */
interface Side {
  key: "http" | "inProcess" | "baseline";
  /** Streams one generation of the chat model `chatId` (undefined: this side does not serve it). */
  chat?: (chatId: string, body: Record<string, unknown>) => Promise<StreamTiming> | undefined;
  /** Returns the number of prompt tokens the server counted, when it says. */
  embed?: (input: string | string[]) => Promise<number | undefined>;
  models?: () => Promise<void>;
  /** CPU seconds its server processes have used so far (user + system), for the prompt scenarios. */
  cpuSeconds?: () => Promise<number>;
}

/** A side reached through the OpenAI client: the same code for vserve and every baseline. */
function httpSide(
  key: Side["key"],
  endpoints: {
    /** Chat model id → its server and the model name to send there. */
    chat: Map<string, { api: OpenAI; model: string }>;
    embed?: OpenAI;
    embedModel?: string;
    models: OpenAI;
  },
): Side {
  const { chat, embed, embedModel, models } = endpoints;
  return {
    key,
    chat: chat.size > 0
      ? (chatId, body) => {
        const c = chat.get(chatId);
        return c ? httpStream(c.api, c.model, body) : undefined;
      }
      : undefined,
    embed: embed && embedModel
      ? async (input) => (await embed.embeddings.create({ model: embedModel, input })).usage?.prompt_tokens
      : undefined,
    models: async () => {
      const res = await fetch(`${models.baseURL}/models`, {
        headers: { authorization: `Bearer ${models.apiKey}` },
      });
      await res.arrayBuffer();
    },
  };
}
const openai = (url: string, apiKey: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });

let server: TestServer | undefined;
const llamaServers: { chat: LlamaServerProcess[]; embed?: LlamaServerProcess } = { chat: [] };
/** Chat model ids the baseline serves. */
const baselineChats = new Set<string>();
const meta: Record<string, unknown> = {};
const rows: Row[] = [];
const sides: Side[] = [];

try {
  let llamaServerBinary: string | undefined;
  if (opt.baseline?.kind === "llama-server") {
    const cpu = opt.baseline.cpu === "same" ? await loadedCpuVariant() : opt.baseline.cpu;
    meta["llama-server CPU build"] = cpu === "prebuilt"
      ? `node-llama-cpp's prebuilt libllama and ggml (CPU variant ${await loadedCpuVariant()}), as vserve`
      : cpu;
    llamaServerBinary = opt.baseline.binary ??
      await ensureLlamaServer(cacheRoot(opt.baseline.cache, Deno.env.toObject()), log, undefined, cpu);
  }

  const cacheDir = new URL("../models/cache", import.meta.url).pathname;
  await loadLeads();
  log(`preparing ${chatPreset} and ${embedPreset} (generated on first use)`);
  for (const m of chatModels) {
    m.path = await resolveSource(`builtin:${m.preset}`, { cacheDir, hubUrl: "", log: silentLogger });
  }
  const embedPath = await resolveSource(`builtin:${embedPreset}`, {
    cacheDir,
    hubUrl: "",
    log: silentLogger,
  });

  const registry = await Deno.makeTempFile({ suffix: ".json" });
  cleanups.push(() => Deno.remove(registry));
  await Deno.writeTextFile(
    registry,
    JSON.stringify({
      models: [
        ...chatModels.map((m) => ({
          id: m.id,
          kind: "chat",
          source: m.path,
          contextSize: chatCtx,
          parallel: chatParallel,
        })),
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
          : { id: EMBED, kind: "embedding", source: embedPath, maxInputTokens: embedMaxTokens },
      ],
    }),
  );

  const serverArgs = ["--models", registry, "--threads", String(threads), "--gpu", opt.gpu];
  log(`starting vserve (threads ${threads}, ${chatParallel} chat slots × ${chatCtx} tokens)`);
  // (An hour per request: a loaded machine must slow the long prompt scenarios down, not fail them.)
  server = await startServer([...serverArgs, "--api-key", KEY, "--request-timeout-ms", "3600000"], {
    waitReady: true,
    timeoutMs: 600_000,
  });
  const vserve = server;
  cleanups.push(() => vserve.stop());
  const client = openai(server.url, KEY);
  sides.push({
    ...httpSide("http", {
      chat: new Map(chatModels.map((m) => [m.id, { api: client, model: m.id }])),
      embed: client,
      embedModel: EMBED,
      models: client,
    }),
    cpuSeconds: () => cpuSeconds([vserve.pid]),
  });

  if (opt.inProcess) {
    log("loading the in-process engines");
    // Imported here, not at the top: runs without the in-process column never load the engines' API.
    const { loadInProcess } = await import("./in_process.ts");
    const ip = await loadInProcess(serverArgs, chatModels.map((m) => m.id), EMBED);
    cleanups.push(() => ip.dispose());
    sides.push({
      key: "inProcess",
      chat: (chatId, body) => ip.chatStream(chatId, body),
      embed: async (input) => {
        await ip.embedTexts(typeof input === "string" ? [input] : input);
        return undefined;
      },
    });
  }

  if (llamaServerBinary) {
    const version = await new Deno.Command(llamaServerBinary, {
      args: ["--version"],
      stdout: "piped",
      stderr: "piped",
    })
      .output();
    const versionText = new TextDecoder().decode(version.stderr) + new TextDecoder().decode(version.stdout);
    meta["llama-server"] = versionText.match(/version: .*/)?.[0] ?? llamaServerBinary;
    await Deno.mkdir(opt.out, { recursive: true });
    const chatApis = new Map<string, { api: OpenAI; model: string }>();
    for (const m of chatModels) {
      const chatArgs = chatServerArgs({
        model: m.path,
        alias: m.id,
        threads,
        slots: chatParallel,
        ctxPerSlot: chatCtx,
        apiKey: KEY,
        hybrid: PRESETS[m.preset]?.arch === "qwen35moe",
      });
      log(`starting llama-server (${m.preset}): ${llamaServerBinary} ${chatArgs.join(" ")}`);
      const chat = await startLlamaServer(
        llamaServerBinary,
        chatArgs,
        `${opt.out}/llama-server-${m.preset}.log`,
      );
      llamaServers.chat.push(chat);
      cleanups.push(() => chat.stop());
      chatApis.set(m.id, { api: openai(chat.url, KEY), model: m.id });
      baselineChats.add(m.id);
    }
    const embedArgs = embeddingServerArgs({
      model: embedPath,
      alias: EMBED,
      threads,
      slots: opt.embedSlots,
      maxInputTokens: embedMaxTokens,
      apiKey: KEY,
    });
    log(`starting llama-server (embeddings): ${embedArgs.join(" ")}`);
    const embed = await startLlamaServer(llamaServerBinary, embedArgs, `${opt.out}/llama-server-embed.log`);
    llamaServers.embed = embed;
    cleanups.push(() => embed.stop());
    sides.push({
      ...httpSide("baseline", {
        chat: chatApis,
        embed: openai(embed.url, KEY),
        embedModel: EMBED,
        models: [...chatApis.values()][0].api,
      }),
      cpuSeconds: () => cpuSeconds([...llamaServers.chat.map((c) => c.pid), embed.pid]),
    });
  } else if (opt.baseline?.kind === "url") {
    const b = opt.baseline;
    if (b.chatModel) baselineChats.add(chatModels[0].id);
    const api = openai(b.url, b.key);
    sides.push(
      httpSide("baseline", {
        // The URL baseline serves one chat model: compared with the first one here.
        chat: new Map(b.chatModel ? [[chatModels[0].id, { api, model: b.chatModel }]] : []),
        embed: api,
        embedModel: b.embeddingModel,
        models: api,
      }),
    );
  }

  await warmUp();
  if (opt.scenarios.has("chat")) await chatSingle();
  if (opt.scenarios.has("concurrency")) await chatConcurrency();
  if (opt.scenarios.has("burst")) await burst();
  if (opt.scenarios.has("agents")) await agents();
  if (opt.scenarios.has("embeddings")) await embeddings();
  if (opt.scenarios.has("overhead")) await overhead();
  if (opt.scenarios.has("features")) await features();
  if (opt.scenarios.has("gateway")) await gateway();
  if (opt.scenarios.has("sampler")) await sampler();
  if (opt.scenarios.has("fast")) {
    await fastSteps({
      threads,
      reps,
      quick,
      key: KEY,
      llamaServer: llamaServerBinary,
      out: opt.out,
      record,
      log,
      adopt: (stop) => void cleanups.push(stop),
    });
  }
  if (opt.scenarios.has("mixed")) await mixed();
  if (!ownServersOnly) await memory();

  const facts = {
    date: new Date().toISOString().slice(0, 16).replace("T", " "),
    cores: navigator.hardwareConcurrency,
    threads,
    models: `${chatPreset}, ${embedPreset}${onnxEmbed ? " (onnx)" : ""}`,
    chat: `${chatParallel} slots × ${chatCtx} tokens`,
    reps,
    mode: quick ? "quick" : "full",
    deno: Deno.version.deno,
    "node-llama-cpp": denoJson.imports["node-llama-cpp"].split("@").pop(),
    ...meta,
  };
  const markdown = markdownReport(facts, rows, { baselineLabel });
  await Deno.mkdir(opt.out, { recursive: true });
  await Deno.writeTextFile(`${opt.out}/latest.md`, markdown + "\n");
  await Deno.writeTextFile(`${opt.out}/latest.json`, JSON.stringify({ meta: facts, rows }, null, 2) + "\n");
  console.log(markdown);
  log(`wrote ${opt.out}/latest.md and latest.json`);
} catch (e) {
  console.error(e instanceof Error ? e.stack ?? e.message : e);
  await cleanUp();
  Deno.exit(1);
}
await cleanUp();
Deno.exit(0);

// ---- measuring ----

/**
 * Waits until the other side's compute threads are idle: llama.cpp's thread pools keep polling
 * for work for ~0.1–0.2 s after each decode (in vserve and llama-server alike), and a measurement
 * started meanwhile would share the cores with them.
 */
function cooldown(): Promise<void> {
  return new Promise((r) => setTimeout(r, 300));
}

type Samples = Partial<Record<Side["key"], number[]>>;

/** Runs `run` once per repetition on every side that can (`can`), in alternating order; results by side. */
async function perRep<T>(
  can: (s: Side) => boolean,
  run: (s: Side, rep: number) => Promise<T>,
  what: string,
): Promise<Map<Side["key"], T[]>> {
  const out = new Map<Side["key"], T[]>();
  for (let rep = 0; rep < reps; rep++) {
    for (const side of runOrder(sides.filter(can), rep)) {
      await cooldown();
      const list = out.get(side.key) ?? [];
      list.push(await run(side, rep));
      out.set(side.key, list);
    }
    log(`${what}: rep ${rep + 1}/${reps}`);
  }
  return out;
}

function samples<T>(results: Map<Side["key"], T[]>, f: (t: T) => number): Samples {
  return Object.fromEntries([...results].map(([k, v]) => [k, v.map(f)]));
}

/** One figure per side: the p-th percentile of its (sorted) latencies. */
function percentiles(latenciesBySide: Map<Side["key"], number[]>, p: number): Samples {
  return Object.fromEntries([...latenciesBySide].map(([k, l]) => [k, [percentile(l, p)]]));
}

function record(scenario: string, metric: string, unit: string, better: Row["better"], s: Samples) {
  rows.push({
    scenario,
    metric,
    unit,
    better,
    http: summarize(s.http ?? []),
    ...(s.inProcess?.length ? { inProcess: summarize(s.inProcess) } : {}),
    ...(s.baseline?.length ? { baseline: summarize(s.baseline) } : {}),
  });
}

function checkLength(side: Side, t: StreamTiming, wanted: number) {
  if (t.completionTokens < wanted) {
    log(`note: ${side.key} stopped after ${t.completionTokens} of ${wanted} tokens (end of text)`);
  }
}

async function warmUp() {
  for (const side of sides) {
    for (const m of chatModels) if (servesChat(side, m.id)) await side.chat!(m.id, chatBody("warm up", 4));
    await side.embed?.("warm up");
  }
}

/** Whether `side` serves chat model `id` (asked without sending anything). */
function servesChat(side: Side, id: string): boolean {
  return side.key !== "baseline" || !side.chat ? !!side.chat : baselineChats.has(id);
}

async function chatSingle() {
  for (const m of chatModels) {
    const label = `chat single stream (${m.preset})`;
    const results = await perRep((s) => servesChat(s, m.id), async (side, rep) => {
      // A unique prompt per run: no request may reuse another's cached prefix.
      const t = await side.chat!(m.id, chatBody(promptText(`${side.key}${rep}`, promptWords), decodeTokens))!;
      checkLength(side, t, decodeTokens);
      return t;
    }, label);
    const tokens = results.get("http")?.[0]?.promptTokens;
    const ttftLabel = `time to first token, ${
      tokens ? `${tokens}-token` : `~${Math.round(promptWords * 1.25)}-token`
    } prompt`;
    record(label, ttftLabel, "ms", "lower", samples(results, (t) => t.first - t.start));
    record(
      label,
      "prompt processing",
      "tok/s",
      "higher",
      samples(results, (t) => t.promptTokens / ((t.first - t.start) / 1000)),
    );
    record(
      label,
      `decode over ${decodeTokens} tokens`,
      "tok/s",
      "higher",
      samples(results, (t) => (t.completionTokens - 1) / ((t.end - t.first) / 1000)),
    );
  }
}

async function chatConcurrency() {
  for (const m of chatModels) {
    for (const c of concurrency) {
      const results = await perRep((s) => servesChat(s, m.id), async (side, rep) => {
        const timings = await Promise.all(
          Array.from(
            { length: c },
            (_, i) => side.chat!(m.id, chatBody(promptText(`c${c}${side.key}${rep}s${i}`, 8), decodeTokens))!,
          ),
        );
        const tokens = timings.reduce((n, t) => n + t.completionTokens, 0);
        const wall = Math.max(...timings.map((t) => t.end)) - Math.min(...timings.map((t) => t.start));
        return tokens / (wall / 1000);
      }, `chat ${m.preset}: ${c} concurrent streams`);
      record(
        `chat aggregate decode (${m.preset})`,
        `${c} concurrent stream${c > 1 ? "s" : ""}`,
        "tok/s",
        "higher",
        samples(results, (x) => x),
      );
    }
  }
}

/** Whether `side` takes part in the prompt scenarios (the servers: the in-process column measures HTTP). */
function promptSide(side: Side, id: string): boolean {
  return side.key !== "inProcess" && servesChat(side, id);
}

/**
 * Distinct long prompts sent at once: when each one's first token comes (first, median, last), and the
 * prompt tokens processed per second until the last one.
 */
async function burst() {
  const { prompts, words, replyTokens } = opt.burst;
  for (const m of chatModels) {
    const label = `chat prompt burst (${m.preset})`;
    const results = await perRep(
      (s) => promptSide(s, m.id),
      (side, rep) =>
        withCpu(
          side,
          () =>
            promptBurst((body) => side.chat!(m.id, body)!, prompts, words, replyTokens, `${side.key}${rep}`),
        ),
      `${label}: ${prompts} prompts`,
    );
    const tokens = Math.round((results.get("http")?.[0]?.promptTokens ?? 0) / prompts);
    const what = `${prompts} distinct ~${tokens}-token prompts at once`;
    record(label, `${what}: first one's first token`, "ms", "lower", samples(results, (r) => r.firsts[0]));
    record(
      label,
      `${what}: median first token`,
      "ms",
      "lower",
      samples(results, (r) => percentile(r.firsts, 50)),
    );
    record(label, `${what}: last first token`, "ms", "lower", samples(results, (r) => r.firsts.at(-1)!));
    record(
      label,
      `${what}: aggregate prompt processing (to the last first token)`,
      "tok/s",
      "higher",
      samples(results, (r) => r.promptTokens / (r.firsts.at(-1)! / 1000)),
    );
    recordCpu(label, `${what}: CPU time of the server`, results);
  }
}

/** Runs `run` and adds the CPU seconds `side`'s servers used meanwhile (NaN when unknown). */
async function withCpu<T>(side: Side, run: () => Promise<T>): Promise<T & { cpu: number }> {
  const before = await side.cpuSeconds?.() ?? NaN;
  const result = await run();
  return { ...result, cpu: (await side.cpuSeconds?.() ?? NaN) - before };
}

/** A row of server CPU seconds, when every side measured them. */
function recordCpu(label: string, metric: string, results: Map<Side["key"], { cpu: number }[]>) {
  const cpu = samples(results, (r) => r.cpu);
  if (Object.values(cpu).flat().every(Number.isFinite)) record(label, metric, "s", "lower", cpu);
}

/** CPU seconds (user + system) the processes `pids` have used, from /proc (Linux; NaN elsewhere). */
async function cpuSeconds(pids: number[]): Promise<number> {
  let ticks = 0;
  for (const pid of pids) {
    const stat = await Deno.readTextFile(`/proc/${pid}/stat`).catch(() => "");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(fields[11]) + Number(fields[12]); // utime, stime (fields 14, 15)
  }
  return ticks / 100; // USER_HZ
}

/**
 * Agent conversations sharing a long system prompt, more of them than slots, several turns each: time to
 * first token of first and later turns, the share of prompt tokens served from cache, the wall time.
 */
async function agents() {
  const a = opt.agents;
  for (const m of chatModels) {
    const label =
      `agents (${m.preset}): ${a.conversations} conversations × ${a.turns} turns, ${a.concurrency} at a time`;
    const results = await perRep(
      (s) => promptSide(s, m.id),
      (side, rep) =>
        withCpu(side, () => agentConversations((body) => side.chat!(m.id, body)!, a, `${side.key}${rep}`)),
      label,
    );
    const first = results.get("http")?.[0]?.firstPromptTokens ?? 0;
    const p50 = (v: number[]) => percentile([...v].sort((x, y) => x - y), 50);
    record(label, `first-turn time to first token p50 (${first}-token first prompt)`, "ms", "lower", {
      ...samples(results, (r) => p50(r.firstTurn)),
    });
    if (a.turns > 1) {
      record(
        label,
        "later-turn time to first token p50",
        "ms",
        "lower",
        samples(results, (r) => p50(r.laterTurns)),
      );
    }
    record(
      label,
      "prompt tokens taken from the server's cache",
      "%",
      "higher",
      samples(results, (r) => 100 * r.cachedTokens / r.promptTokens),
    );
    record(
      label,
      "prompt tokens computed",
      "tokens",
      "lower",
      samples(results, (r) => r.promptTokens - r.cachedTokens),
    );
    record(label, "wall time", "s", "lower", samples(results, (r) => r.wallMs / 1000));
    recordCpu(label, "CPU time of the server", results);
  }
}

/**
 * The cost of OpenAI features: `n: 4` in one request against four separate concurrent requests
 * (one prompt evaluation instead of four), and decoding with `top_logprobs: 5` against without.
 */
async function features() {
  for (const m of chatModels) {
    const label = `chat features (${m.preset})`;
    const tokens = 32;
    const body = (tag: string, extra: Record<string, unknown> = {}) => ({
      ...chatBody(promptText(tag, promptWords), tokens),
      ...extra,
    });
    const perTok = (run: (side: Side, rep: number) => Promise<StreamTiming[]>, vserveOnly = false) =>
      perRep((s) => servesChat(s, m.id) && (!vserveOnly || s.key === "http"), async (side, rep) => {
        const t0 = performance.now();
        const timings = await run(side, rep);
        const generated = timings.reduce((n, t) => n + t.completionTokens, 0);
        return generated / ((performance.now() - t0) / 1000);
      }, label);
    const separate = await perTok((side, rep) =>
      Promise.all(Array.from({ length: 4 }, (_, i) => side.chat!(m.id, body(`f4${side.key}${rep}x${i}`))!))
    );
    record(
      label,
      `4 separate concurrent requests, ${promptWords}-word prompts, ${tokens} tokens each`,
      "tok/s",
      "higher",
      samples(separate, (x) => x),
    );
    const together = await perTok(async (
      side,
      rep,
    ) => [await side.chat!(m.id, body(`fn${side.key}${rep}`, { n: 4 }))!], true);
    // Only vserve serves n > 1 (llama-server answers one choice): compared with its own 4 separate requests.
    record(
      label,
      `n: 4 in one request (vs vserve's 4 separate: ${ratioText(together, separate)})`,
      "tok/s",
      "higher",
      samples(together, (x) => x),
    );
    const plain = await perTok(async (side, rep) => [await side.chat!(m.id, body(`fp${side.key}${rep}`))!]);
    record(label, `one stream, ${tokens} tokens`, "tok/s", "higher", samples(plain, (x) => x));
    const withLogprobs = await perTok(async (side, rep) => [
      await side.chat!(m.id, body(`fl${side.key}${rep}`, { logprobs: true, top_logprobs: 5 }))!,
    ]);
    record(
      label,
      `one stream with top_logprobs: 5 (vs without: ${ratioText(withLogprobs, plain)})`,
      "tok/s",
      "higher",
      samples(withLogprobs, (x) => x),
    );
  }
}

/** vserve's median of `a` over its median of `b`. */
function ratioText(a: Map<Side["key"], number[]>, b: Map<Side["key"], number[]>): string {
  const med = (v?: number[]) => v && v.length ? [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)] : NaN;
  return `${(med(a.get("http")) / med(b.get("http"))).toFixed(2)}×`;
}

async function embeddings() {
  // Every run gets inputs of its own (tag = case, side, repetition): servers that cache prompts
  // (llama-server reuses a slot's KV cache) must compute them like everyone else.
  const n = opt.sentenceCount;
  const rate = (run: (side: Side, tag: string) => Promise<unknown>) => async (side: Side, rep: number) => {
    const tag = `${side.key}${rep}-`;
    const t0 = performance.now();
    await run(side, tag);
    return n / ((performance.now() - t0) / 1000);
  };
  const cases: [string, string, Row["better"], (side: Side, rep: number) => Promise<number>][] = [
    [
      `${n} sentences in one request`,
      "embeddings/s",
      "higher",
      rate((s, t) => s.embed!(sentences(n, `a${t}`))),
    ],
    [
      `${n} concurrent single-sentence requests`,
      "embeddings/s",
      "higher",
      rate((s, t) => Promise.all(sentences(n, `b${t}`).map((x) => s.embed!(x)))),
    ],
    [
      `${n} sentences one by one`,
      "embeddings/s",
      "higher",
      rate(async (s, t) => {
        for (const x of sentences(n, `c${t}`)) await s.embed!(x);
      }),
    ],
  ];
  for (const [name, unit, better, run] of cases) {
    record(
      "embeddings",
      name,
      unit,
      better,
      samples(await perRep((s) => !!s.embed, run, `embeddings: ${name}`), (x) => x),
    );
  }

  const DOCUMENT = (tag: string) => promptText(`document ${tag}`, quick ? 400 : 1996); // ~2,000 tokens in full mode
  const docTokens = await sides[0].embed!(DOCUMENT("probe"));
  const doc = await perRep((s) => !!s.embed, async (side, rep) => {
    const t0 = performance.now();
    await side.embed!(DOCUMENT(`${side.key}${rep}`));
    return performance.now() - t0;
  }, "embeddings: one document");
  record("embeddings", `one ${docTokens ?? "~2,000"}-token document`, "ms", "lower", samples(doc, (x) => x));

  // One short request at a time, the sides' calls interleaved one by one (same machine state for all):
  // the median per repetition.
  const calls = quick ? 15 : 40;
  const perSide = new Map<Side["key"], number[]>();
  for (let rep = 0; rep < reps; rep++) {
    const lat = new Map<Side["key"], number[]>();
    for (let i = 0; i < calls; i++) {
      for (const side of runOrder(sides.filter((s) => !!s.embed), i)) {
        await cooldown();
        const t0 = performance.now();
        await side.embed!(shortText(`${rep}-${i}`));
        const list = lat.get(side.key) ?? [];
        list.push(performance.now() - t0);
        lat.set(side.key, list);
      }
    }
    for (const [k, v] of lat) {
      perSide.set(k, [
        ...(perSide.get(k) ?? []),
        percentile(v.sort((a, b) => a - b), 50),
      ]);
    }
  }
  record(
    "embeddings",
    `one short request, 1 client, median of ${calls}`,
    "ms",
    "lower",
    Object.fromEntries(perSide),
  );
}

async function overhead() {
  const n = quick ? 400 : 2000;
  const models = new Map<Side["key"], number[]>();
  for (const side of sides) {
    await cooldown();
    if (side.models) models.set(side.key, await latencies(16, n, side.models));
  }
  for (const p of [50, 99]) {
    record(
      "server overhead",
      `GET /v1/models p${p}, 16 clients`,
      "ms",
      "lower",
      percentiles(models, p),
    );
  }
  const m = quick ? 200 : 800;
  const embeds = new Map<Side["key"], number[]>();
  for (const side of sides) {
    await cooldown();
    if (side.embed) {
      embeds.set(
        side.key,
        await latencies(16, m, (k) => side.embed!(`a ${k}`)),
      );
    }
  }
  for (const p of [50, 99]) {
    record(
      "server overhead",
      `one-word embedding p${p}, 16 clients`,
      "ms",
      "lower",
      percentiles(embeds, p),
    );
  }
  if (server) {
    await cooldown();
    await responsiveness({
      url: server.url,
      key: KEY,
      chatModel: chatModels[0].id,
      embedModel: EMBED,
      reps,
      quick,
      record: (metric, unit, values) => record("server overhead", metric, unit, "lower", { http: values }),
      log,
    });
  }
  log("overhead done");
}

/** vserve in front of vserve: see bench/gateway.ts. */
async function gateway() {
  const b: GatewayBench = {
    direct: server!,
    key: KEY,
    chat: { id: chatModels[0].id, path: chatModels[0].path },
    embedId: EMBED,
    threads,
    reps,
    quick,
    decodeTokens,
    promptWords,
    record: (metric, unit, better, values) => record("gateway", metric, unit, better, { http: values }),
    log,
    adopt: (s) => void cleanups.push(() => s.stop()),
  };
  await gatewayOverhead(b);
  await affinityGain(b);
  log("gateway done");
}

async function sampler() {
  log("sampler: kernels against plain JavaScript");
  await samplerCost(
    reps,
    quick ? 100 : 400,
    (metric, values) => record("sampler (in-process)", metric, "µs", "lower", { http: values }),
  );
}

/** A chat model and the embedding model loaded together: see bench/mixed.ts (vserve only). */
async function mixed() {
  const chat = chatModels[0];
  await mixedLoad({
    url: server!.url,
    key: KEY,
    chatId: chat.id,
    embedId: EMBED,
    clients: opt.mixedClients,
    seconds: opt.mixedSeconds,
    reps,
    decodeTokens,
    record: (metric, unit, better, values) =>
      record(`mixed load (${chat.preset} + ${embedPreset})`, metric, unit, better, { http: values }),
    log,
  });
  log("mixed done");
}

async function memory() {
  const vserveRss = server ? await peakRssMiB(server.pid) : NaN;
  meta["vserve peak RSS"] = `${vserveRss.toFixed(0)} MiB`;
  const s: Samples = { http: [vserveRss] };
  if (llamaServers.chat.length > 0 && llamaServers.embed) {
    let chat = 0;
    for (const c of llamaServers.chat) chat += await c.peakRssMiB();
    const embed = await llamaServers.embed.peakRssMiB();
    meta["llama-server peak RSS"] = `chat ${chat.toFixed(0)} MiB + embeddings ${embed.toFixed(0)} MiB`;
    s.baseline = [chat + embed];
  }
  record("memory", "peak RSS (VmHWM) of the server process(es)", "MiB", "lower", s);
}
