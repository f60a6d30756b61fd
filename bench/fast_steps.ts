/**
 * The `fast` scenario of `deno task bench`: the tiny presets, whose decode steps take 1–4 ms on two
 * CPU threads (like a step of the real model on a GPU), so that what a server adds per token and per
 * request shows. vserve and llama-server (same files, threads and slots) alternate request by request
 * (the order reversed every other request), so that a drift of the host's speed hits both alike:
 *
 * - one stream of 256 tokens (64 with --quick), streamed (decode tok/s after the first token) and not
 *   (completion tokens over the request's time), 8 requests of each side and kind per repetition;
 * - aggregate decode of 1, 4 and 8 concurrent streams of 64 tokens (total tokens over wall time);
 * - the server process's CPU time a generated token (all its threads, from /proc), streamed and not,
 *   and vserve's minus llama-server's request by request: our own per-token overhead in µs; and the
 *   share of vserve's decodes that ran on its JavaScript thread (src/engines/llama/pace.ts);
 * - one short embedding on tiny-embed, one client, the two servers' calls interleaved (median of 40),
 *   and its server CPU.
 *
 * A repetition's figure is the median of its requests; the rows give the median of the repetitions
 * (min–max). Each ratio row pairs neighbouring requests (vserve / llama-server of one round) and takes
 * their median: the host's pace of the moment cancels out of it. The end-of-text tokens get a -100
 * logit bias on both sides, so every generation runs to its length.
 */
import OpenAI from "openai";
import { startServer } from "../tests/helpers/server.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { percentile } from "./stats.ts";
import { chatServerArgs, embeddingServerArgs, startLlamaServer } from "./llama_server.ts";
import { httpStream, promptText, runOrder, SAMPLING, shortText } from "./workload.ts";

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
/** Requests of each side and kind per repetition (one stream; the aggregates take half as many). */
const ROUNDS = 8;
const EMBED = "fast/tiny-embed";

interface Server {
  key: "http" | "baseline";
  /** Chat model id → the process serving it. */
  pids: Map<string, number>;
  /** Chat model id → client. */
  chat: Map<string, OpenAI>;
  embed: OpenAI;
  /** The process serving the embedding model (the baseline's own). */
  embedPid?: number;
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
    servers.push({ key: "baseline", pids, chat, embed: openai(e.url, b.key), embedPid: e.pid });
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
  const rounds = b.quick ? 3 : ROUNDS;
  const pairs = servers.length > 1;
  for (const preset of CHAT) {
    const model = `fast/${preset}`;
    const label = `fast steps (${preset})`;
    const streamed = new Rounds(b.reps);
    const plain = new Rounds(b.reps);
    const cpu = new Rounds(b.reps);
    const cpuPlain = new Rounds(b.reps);
    const onThread: number[] = [];
    const decodes = async () =>
      await Promise.all(
        ["decodes", "decodes_on_thread"].map((n) => engineCounter(vserve.url, b.key, n, model)),
      );
    for (let rep = 0; rep < b.reps; rep++) {
      const counted = await decodes();
      for (let round = 0; round < rounds; round++) {
        // Request by request: the two servers' requests of a kind follow each other.
        for (const s of runOrder(servers, round)) {
          await cooldown();
          const before = processCpuMicros(pidOf(s, model));
          const t = await httpStream(s.chat.get(model)!, model, body(`fs${s.key}${rep}r${round}`, long));
          cpu.add(rep, s.key, (processCpuMicros(pidOf(s, model)) - before) / t.completionTokens);
          streamed.add(rep, s.key, (t.completionTokens - 1) / ((t.end - t.first) / 1000));
        }
        for (const s of runOrder(servers, round + 1)) {
          await cooldown();
          const before = processCpuMicros(pidOf(s, model));
          const t0 = performance.now();
          const r = await s.chat.get(model)!.chat.completions.create(
            {
              ...body(`fu${s.key}${rep}r${round}`, long),
              model,
            } as OpenAI.ChatCompletionCreateParamsNonStreaming,
          );
          const tokens = r.usage?.completion_tokens ?? 0;
          plain.add(rep, s.key, tokens / ((performance.now() - t0) / 1000));
          cpuPlain.add(rep, s.key, (processCpuMicros(pidOf(s, model)) - before) / tokens);
        }
      }
      const [all, on] = await decodes();
      if (all > counted[0]) onThread.push(100 * (on - counted[1]) / (all - counted[0]));
      b.log(`${label}: one stream, rep ${rep + 1}/${b.reps}`);
    }
    b.record(label, `one stream, ${long} tokens, streamed (decode)`, "tok/s", "higher", streamed.medians());
    if (pairs) b.record(label, PAIRED, "×", "higher", { http: streamed.ratios("higher") });
    b.record(label, `one stream, ${long} tokens, not streamed`, "tok/s", "higher", plain.medians());
    if (pairs) b.record(label, PAIRED, "×", "higher", { http: plain.ratios("higher") });
    for (const c of [1, 4, 8]) {
      const agg = new Rounds(b.reps);
      for (let rep = 0; rep < b.reps; rep++) {
        for (let round = 0; round < Math.ceil(rounds / 2); round++) {
          for (const s of runOrder(servers, round)) {
            await cooldown();
            const timings = await Promise.all(
              Array.from(
                { length: c },
                (_, i) =>
                  httpStream(s.chat.get(model)!, model, body(`fa${c}${s.key}${rep}r${round}s${i}`, short)),
              ),
            );
            const tokens = timings.reduce((n, t) => n + t.completionTokens, 0);
            const wall = Math.max(...timings.map((t) => t.end)) - Math.min(...timings.map((t) => t.start));
            agg.add(rep, s.key, tokens / (wall / 1000));
          }
        }
      }
      const metric = `aggregate, ${c} stream${c > 1 ? "s" : ""} × ${short} tokens`;
      b.record(label, metric, "tok/s", "higher", agg.medians());
      if (pairs) b.record(label, PAIRED, "×", "higher", { http: agg.ratios("higher") });
    }
    b.record(label, "server CPU a token, one stream streamed (all threads)", "µs", "lower", cpu.medians());
    b.record(
      label,
      "server CPU a token, one stream not streamed (all threads)",
      "µs",
      "lower",
      cpuPlain.medians(),
    );
    b.record(label, "vserve's decodes on the JavaScript thread, one stream", "%", "higher", {
      http: onThread,
    });
    if (pairs) {
      b.record(label, "our CPU a token beyond llama-server's, streamed (paired)", "µs", "lower", {
        http: cpu.differences(),
      });
      b.record(label, "our CPU a token beyond llama-server's, not streamed (paired)", "µs", "lower", {
        http: cpuPlain.differences(),
      });
    }
  }

  // One short embedding at a time, the servers' calls interleaved.
  const calls = b.quick ? 15 : 40;
  const latency = new Rounds(b.reps);
  const embedCpu = new Rounds(b.reps);
  const embedPid = (s: Server) => s.key === "http" ? vserve.pid : s.embedPid!;
  for (let rep = 0; rep < b.reps; rep++) {
    for (let i = 0; i < calls; i++) {
      for (const s of runOrder(servers, i)) {
        await cooldown();
        const before = processCpuMicros(embedPid(s));
        const t0 = performance.now();
        await s.embed.embeddings.create({ model: EMBED, input: shortText(`fe${rep}-${i}`) });
        latency.add(rep, s.key, performance.now() - t0);
        embedCpu.add(rep, s.key, processCpuMicros(embedPid(s)) - before);
      }
    }
  }
  const embedLabel = "fast steps (tiny-embed)";
  b.record(embedLabel, `one short embedding, 1 client, median of ${calls}`, "ms", "lower", latency.medians());
  if (pairs) b.record(embedLabel, PAIRED, "×", "higher", { http: latency.ratios("lower") });
  b.record(embedLabel, "server CPU of one short embedding (all threads)", "µs", "lower", embedCpu.medians());
}

/** The label of a paired-ratio row: the row above it, vserve / llama-server request by request. */
const PAIRED = "the row above, paired request by request: median of vserve / llama-server";

/**
 * One metric's values by repetition and side, in the order measured: round k of a repetition holds
 * the k-th request of each side, taken one after the other.
 */
export class Rounds {
  readonly #values: Map<Server["key"], number[]>[];

  constructor(reps: number) {
    this.#values = Array.from({ length: reps }, () => new Map());
  }

  add(rep: number, side: Server["key"], value: number): void {
    const list = this.#values[rep].get(side) ?? [];
    list.push(value);
    this.#values[rep].set(side, list);
  }

  /** Each side's median of each repetition (the rows show their median, min and max). */
  medians(): Samples {
    const out: Samples = {};
    for (const rep of this.#values) {
      for (const [side, list] of rep) (out[side] ??= []).push(median(list));
    }
    return out;
  }

  /**
   * Per repetition, the median ratio of the two sides' values round by round, oriented so that > 1 is
   * vserve better: neighbouring requests share the machine's state of the moment, so drift cancels.
   */
  ratios(better: "higher" | "lower"): number[] {
    return this.#paired((h, b) => better === "higher" ? h / b : b / h);
  }

  /** Per repetition, the median difference vserve − baseline, round by round. */
  differences(): number[] {
    return this.#paired((h, b) => h - b);
  }

  #paired(f: (http: number, baseline: number) => number): number[] {
    const out: number[] = [];
    for (const rep of this.#values) {
      const h = rep.get("http") ?? [];
      const b = rep.get("baseline") ?? [];
      const n = Math.min(h.length, b.length);
      if (n > 0) out.push(median(Array.from({ length: n }, (_, i) => f(h[i], b[i]))));
    }
    return out;
  }
}

function median(values: readonly number[]): number {
  return percentile([...values].sort((x, y) => x - y), 50);
}
