/**
 * The `fast` scenario of `deno task bench`: the tiny presets, whose decode steps take 1–4 ms on two
 * CPU threads (like a step of the real model on a GPU), so that what a server adds per token and per
 * request shows. vserve and llama-server (same files, threads and slots) alternate:
 *
 * - one stream of 256 tokens (64 with --quick), streamed (decode tok/s after the first token) and not
 *   (completion tokens over the request's time);
 * - aggregate decode of 1, 4 and 8 concurrent streams of 64 tokens (total tokens over wall time);
 * - the server process's CPU time a generated token (all its threads, from /proc) over the streamed
 *   single streams, and vserve's minus llama-server's: our own per-token overhead in µs; and the
 *   share of vserve's decodes that ran on its JavaScript thread (src/engines/llama/pace.ts);
 * - one short embedding on tiny-embed, one client, the two servers' calls interleaved (median of 40).
 *
 * The end-of-text tokens get a -100 logit bias on both sides, so every generation runs to its length.
 */
import OpenAI from "openai";
import { startServer } from "../tests/helpers/server.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { percentile } from "./stats.ts";
import { chatServerArgs, embeddingServerArgs, startLlamaServer } from "./llama_server.ts";
import { httpStream, promptText, runOrder, SAMPLING, shortText, type StreamTiming } from "./workload.ts";

/** What the scenario needs from the benchmark run. */
export interface FastStepsBench {
  threads: number;
  reps: number;
  quick: boolean;
  key: string;
  /** The llama-server binary (undefined: vserve alone). */
  llamaServer?: string;
  /** Where llama-server's logs go. */
  out: string;
  record(scenario: string, metric: string, unit: string, better: "higher" | "lower", values: Samples): void;
  log(message: string): void;
  /** Registers a process to stop at the end of the run. */
  adopt(stop: () => Promise<unknown>): void;
}

/** Figures by side: vserve through HTTP and the baseline. */
export interface Samples {
  http?: number[];
  baseline?: number[];
}

/** Qwen3's end-of-text tokens (`<|endoftext|>`, `<|im_end|>`): banned, so generations run to their length. */
const NO_END = { "151643": -100, "151645": -100 };
const CHAT = ["tiny-chat", "tiny-moe"] as const;
const EMBED = "fast/tiny-embed";

interface Server {
  key: "http" | "baseline";
  /** Chat model id → the process serving it. */
  pids: Map<string, number>;
  /** Chat model id → client. */
  chat: Map<string, OpenAI>;
  embed: OpenAI;
}

const openai = (url: string, apiKey: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });
const cooldown = () => new Promise((r) => setTimeout(r, 300));

/** CPU time of all threads of process `pid` so far, µs (the first field of each thread's schedstat). */
export function processCpuMicros(pid: number): number {
  let ns = 0;
  for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/schedstat`).split(" ")[0]);
    } catch {
      // the thread ended
    }
  }
  return ns / 1000;
}

/** vserve's engine counter `name` of `model` from `/metrics`. */
async function engineCounter(url: string, key: string, name: string, model: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${key}` } })).text();
  const line = text.split("\n").find((l) => l.startsWith(`vserve_engine_${name}_total{model="${model}"}`));
  return Number(line?.split(" ").at(-1) ?? NaN);
}

/** Runs the scenario: see the module comment. */
export async function fastSteps(b: FastStepsBench): Promise<void> {
  const cacheDir = new URL("../models/cache", import.meta.url).pathname;
  const path = (preset: string) =>
    resolveSource(`builtin:${preset}`, { cacheDir, hubUrl: "", log: silentLogger });
  const paths = new Map<string, string>();
  for (const preset of [...CHAT, "tiny-embed"]) paths.set(preset, await path(preset));
  const registry = await Deno.makeTempFile({ suffix: ".json" });
  b.adopt(() => Deno.remove(registry));
  await Deno.writeTextFile(
    registry,
    JSON.stringify({
      models: [
        ...CHAT.map((p) => ({
          id: `fast/${p}`,
          kind: "chat",
          source: paths.get(p),
          contextSize: 4096,
          parallel: 8,
        })),
        { id: EMBED, kind: "embedding", source: paths.get("tiny-embed"), maxInputTokens: 4096 },
      ],
    }),
  );
  b.log(`fast steps: starting vserve on ${CHAT.join(", ")}, tiny-embed (threads ${b.threads})`);
  const vserve = await startServer(
    ["--models", registry, "--threads", String(b.threads), "--gpu", "cpu", "--api-key", b.key],
    { waitReady: true, timeoutMs: 600_000 },
  );
  b.adopt(() => vserve.stop());
  const v = openai(vserve.url, b.key);
  const servers: Server[] = [{
    key: "http",
    pids: new Map(CHAT.map((p) => [`fast/${p}`, vserve.pid])),
    chat: new Map(CHAT.map((p) => [`fast/${p}`, v])),
    embed: v,
  }];
  if (b.llamaServer) {
    const chat = new Map<string, OpenAI>();
    const pids = new Map<string, number>();
    for (const preset of CHAT) {
      const args = chatServerArgs({
        model: paths.get(preset)!,
        alias: `fast/${preset}`,
        threads: b.threads,
        slots: 8,
        ctxPerSlot: 4096,
        apiKey: b.key,
        hybrid: preset === "tiny-moe",
      });
      b.log(`fast steps: starting llama-server (${preset})`);
      const s = await startLlamaServer(b.llamaServer, args, `${b.out}/llama-server-fast-${preset}.log`);
      b.adopt(() => s.stop());
      chat.set(`fast/${preset}`, openai(s.url, b.key));
      pids.set(`fast/${preset}`, s.pid);
    }
    const embedArgs = embeddingServerArgs({
      model: paths.get("tiny-embed")!,
      alias: EMBED,
      threads: b.threads,
      slots: 64,
      maxInputTokens: 4096,
      apiKey: b.key,
    });
    const e = await startLlamaServer(b.llamaServer, embedArgs, `${b.out}/llama-server-fast-embed.log`);
    b.adopt(() => e.stop());
    servers.push({ key: "baseline", pids, chat, embed: openai(e.url, b.key) });
  }

  const pidOf = (s: Server, model: string) => s.pids.get(model)!;
  const body = (tag: string, maxTokens: number) => ({
    messages: [{ role: "user", content: promptText(tag, 8) }],
    max_tokens: maxTokens,
    ...SAMPLING,
    logit_bias: NO_END,
    chat_template_kwargs: { enable_thinking: false },
  });
  for (const s of servers) {
    for (const [model, api] of s.chat) await httpStream(api, model, body(`warm${s.key}`, 8));
    await s.embed.embeddings.create({ model: EMBED, input: "warm up" });
  }

  const long = b.quick ? 64 : 256;
  const short = 64;
  for (const preset of CHAT) {
    const model = `fast/${preset}`;
    const label = `fast steps (${preset})`;
    const streamed: Samples = {};
    const plain: Samples = {};
    const cpu: Samples = {};
    const onThread: number[] = [];
    const decodes = async () =>
      await Promise.all(
        ["decodes", "decodes_on_thread"].map((n) => engineCounter(vserve.url, b.key, n, model)),
      );
    for (let rep = 0; rep < b.reps; rep++) {
      for (const s of runOrder(servers, rep)) {
        await cooldown();
        const counted = s.key === "http" ? await decodes() : [];
        const before = processCpuMicros(pidOf(s, model));
        const t: StreamTiming = await httpStream(s.chat.get(model)!, model, body(`fs${s.key}${rep}`, long));
        (cpu[s.key] ??= []).push((processCpuMicros(pidOf(s, model)) - before) / t.completionTokens);
        if (s.key === "http") {
          const [all, on] = await decodes();
          if (all > counted[0]) onThread.push(100 * (on - counted[1]) / (all - counted[0]));
        }
        (streamed[s.key] ??= []).push((t.completionTokens - 1) / ((t.end - t.first) / 1000));
        await cooldown();
        const t0 = performance.now();
        const r = await s.chat.get(model)!.chat.completions.create(
          { ...body(`fu${s.key}${rep}`, long), model } as OpenAI.ChatCompletionCreateParamsNonStreaming,
        );
        (plain[s.key] ??= []).push((r.usage?.completion_tokens ?? 0) / ((performance.now() - t0) / 1000));
      }
      b.log(`${label}: one stream, rep ${rep + 1}/${b.reps}`);
    }
    b.record(label, `one stream, ${long} tokens, streamed (decode)`, "tok/s", "higher", streamed);
    b.record(label, `one stream, ${long} tokens, not streamed`, "tok/s", "higher", plain);
    for (const c of [1, 4, 8]) {
      const agg: Samples = {};
      for (let rep = 0; rep < b.reps; rep++) {
        for (const s of runOrder(servers, rep)) {
          await cooldown();
          const timings = await Promise.all(
            Array.from(
              { length: c },
              (_, i) => httpStream(s.chat.get(model)!, model, body(`fa${c}${s.key}${rep}s${i}`, short)),
            ),
          );
          const tokens = timings.reduce((n, t) => n + t.completionTokens, 0);
          const wall = Math.max(...timings.map((t) => t.end)) - Math.min(...timings.map((t) => t.start));
          (agg[s.key] ??= []).push(tokens / (wall / 1000));
        }
      }
      b.record(label, `aggregate, ${c} stream${c > 1 ? "s" : ""} × ${short} tokens`, "tok/s", "higher", agg);
    }
    b.record(label, "server CPU a token, one stream streamed (all threads)", "µs", "lower", cpu);
    b.record(label, "vserve's decodes on the JavaScript thread, one stream streamed", "%", "higher", {
      http: onThread,
    });
    if (cpu.http && cpu.baseline) {
      b.record(label, "our CPU a token beyond llama-server's (pairs of the row above)", "µs", "lower", {
        http: cpu.http.map((x, i) => x - cpu.baseline![i]),
      });
    }
  }

  // One short embedding at a time, the servers' calls interleaved.
  const calls = b.quick ? 15 : 40;
  const latency: Samples = {};
  for (let rep = 0; rep < b.reps; rep++) {
    const lat = new Map<Server["key"], number[]>();
    for (let i = 0; i < calls; i++) {
      for (const s of runOrder(servers, i)) {
        await cooldown();
        const t0 = performance.now();
        await s.embed.embeddings.create({ model: EMBED, input: shortText(`fe${rep}-${i}`) });
        lat.set(s.key, [...(lat.get(s.key) ?? []), performance.now() - t0]);
      }
    }
    for (const [k, list] of lat) (latency[k] ??= []).push(percentile(list.sort((x, y) => x - y), 50));
  }
  b.record(
    "fast steps (tiny-embed)",
    `one short embedding, 1 client, median of ${calls}`,
    "ms",
    "lower",
    latency,
  );
}
