/** The benchmark's command line: flags, environment variables, and what they resolve to. */
import { parseArgs } from "node:util";

/** The usage text of `deno task bench --help`. */
export const USAGE = `deno task bench [options]

  --quick                      1 repetition, 32 decode tokens, fewer streams and sentences (< 2 min alone)
  --tiny                       the tiny presets: checks the harness, not the speed
  --reps N                     repetitions (default 3; --quick: 1)
  --scenarios LIST             chat,concurrency,burst,agents,embeddings,overhead,features,gateway,sampler,
                               mixed,fast (default: all); burst: distinct long prompts sent at once (first
                               tokens, aggregate prompt processing); agents: conversations sharing a long
                               system prompt, several turns each, more of them than slots; gateway: vserve
                               in front of vserve (overhead, gain of prefix affinity); sampler: the
                               sampler's kernels against plain JavaScript, in-process; mixed: chat streams
                               and embedding clients, alone and together; fast: the tiny presets' 1-4 ms
                               steps, where a server's own cost per token and per request shows (with
                               llama-server)
  --mixed-clients N            mixed: concurrent clients of each model (default 64; --quick: 16; --tiny: 4)
  --mixed-seconds N            mixed: length of each window (default 30; --quick: 15; --tiny: 4)
  --chat-models LIST           dense,moe: bench-chat (Qwen3-0.6B shape) and bench-moe (Qwen3.6-35B-A3B's
                               per-token compute, 16 experts); with --tiny: tiny-chat, tiny-moe
                               (default: both)
  --threads N                  CPU threads of every engine and server (default: all cores)
  --gpu cpu|cuda               vserve's --gpu (default cpu); on a CUDA VM: cuda, with
                               --llama-server-cpu cuda for a CUDA build of the baseline (deno task gpu-check)
  --slots N                    chat slots (parallel sequences) (default: the most concurrent streams)
  --ctx N                      chat context per slot, tokens (default 1024; 4096 with --baseline llama-server)
  --embed-slots N              llama-server's embedding slots (default 64: vserve's embedding engine
                               keeps up to 64 inputs in flight in one decode loop)
  --embed-backend llama|onnx   vserve's embedding engine (default llama)
  --burst N                    prompts of the burst scenario (default 8)
  --burst-words N              words per burst prompt (default 800, ~1,000 tokens; --quick: 200)
  --agent-conversations N      conversations of the agent scenario (default 16; --quick: 8)
  --agent-turns N              turns per conversation (default 3; --quick: 2)
  --agent-concurrency N        conversations at a time (default 8; --quick: 4)
  --agent-prefix N             words of the shared system prompt (default 1250, ~1,500 tokens;
                               --quick: 500, enough for hybrid models to reuse it)
  --agent-reply N              max_tokens of each reply (default 64; --quick: 16)
  --out DIR                    where latest.md / latest.json go (default bench/results)
  --in-process, --no-in-process
                               the in-process column (the engines called directly) (default: on, off
                               with --baseline llama-server)

  --baseline llama-server      also run llama.cpp's llama-server (built once from node-llama-cpp's
                               llama.cpp source; see bench/README.md) on the same files and settings
  --llama-server-cpu CPU       how the baseline gets llama.cpp: prebuilt (default: only the server is
                               compiled; it runs on node-llama-cpp's own prebuilt libllama and ggml, the
                               very binaries vserve runs) | same (compiled for the instruction sets of the
                               ggml CPU variant node-llama-cpp loads, e.g. haswell) | native
                               (-march=native) | a variant name | cuda (-march=native and CUDA; needs nvcc)
  --llama-server-bin PATH      use this llama-server binary, build nothing  (env VSERVE_BENCH_LLAMA_SERVER)
  --llama-server-cache DIR     where the build goes            (env VSERVE_BENCH_LLAMA_CACHE;
                               default \${XDG_CACHE_HOME:-$HOME/.cache}/vserve/llama-server)

  --baseline-url URL           any running OpenAI-compatible server as the baseline, with
  --baseline-key K --baseline-chat-model M --baseline-embedding-model M
`;

/** Everything the benchmark run needs to know from its command line. */
export interface BenchOptions {
  help: boolean;
  quick: boolean;
  tiny: boolean;
  reps: number;
  scenarios: Set<string>;
  /** Chat models measured in the chat scenarios, in order. */
  chatModels: ("dense" | "moe")[];
  threads: number | undefined;
  /** vserve's `--gpu` for every server and the in-process engines. */
  gpu: "cpu" | "cuda";
  embedBackend: "llama" | "onnx";
  out: string;
  inProcess: boolean;
  /** Concurrent chat streams measured in the aggregate-decode scenario. */
  concurrency: number[];
  slots: number;
  ctxPerSlot: number;
  /** Slots of llama-server's embedding process. */
  embedSlots: number;
  decodeTokens: number;
  promptWords: number;
  sentenceCount: number;
  /** The mixed scenario: clients of each model, and seconds per window. */
  mixedClients: number;
  mixedSeconds: number;
  /** The burst scenario: prompts sent at once and words per prompt. */
  burst: { prompts: number; words: number; replyTokens: number };
  /** The agent scenario's shape. */
  agents: {
    conversations: number;
    turns: number;
    concurrency: number;
    prefixWords: number;
    messageWords: number;
    replyTokens: number;
  };
  baseline?:
    | { kind: "llama-server"; binary?: string; cache?: string; cpu: string }
    | { kind: "url"; url: string; key: string; chatModel?: string; embeddingModel?: string };
}

/** A command line that cannot run; the message says why. */
export class UsageError extends Error {}

const SCENARIOS = [
  "chat",
  "concurrency",
  "burst",
  "agents",
  "embeddings",
  "overhead",
  "features",
  "gateway",
  "sampler",
  "mixed",
  "fast",
];

/**
 * Parses the benchmark's flags (and the environment variables that stand in for some of them).
 *
 * @example
 * ```ts
 * parseBenchArgs(["--baseline", "llama-server", "--quick"], {}).inProcess; // false
 * ```
 */
export function parseBenchArgs(args: string[], env: Record<string, string | undefined>): BenchOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args,
      options: {
        quick: { type: "boolean", default: false },
        tiny: { type: "boolean", default: false },
        reps: { type: "string" },
        scenarios: { type: "string", default: SCENARIOS.join(",") },
        "chat-models": { type: "string", default: "dense,moe" },
        threads: { type: "string" },
        gpu: { type: "string", default: "cpu" },
        slots: { type: "string" },
        ctx: { type: "string" },
        "embed-slots": { type: "string" },
        "embed-backend": { type: "string", default: "llama" },
        "mixed-clients": { type: "string" },
        "mixed-seconds": { type: "string" },
        burst: { type: "string" },
        "burst-words": { type: "string" },
        "agent-conversations": { type: "string" },
        "agent-turns": { type: "string" },
        "agent-concurrency": { type: "string" },
        "agent-prefix": { type: "string" },
        "agent-reply": { type: "string" },
        out: { type: "string", default: "bench/results" },
        "in-process": { type: "boolean" },
        "no-in-process": { type: "boolean" },
        baseline: { type: "string" },
        "llama-server-bin": { type: "string" },
        "llama-server-cpu": { type: "string", default: "prebuilt" },
        "llama-server-cache": { type: "string" },
        "baseline-url": { type: "string" },
        "baseline-key": { type: "string", default: "none" },
        "baseline-chat-model": { type: "string" },
        "baseline-embedding-model": { type: "string" },
        help: { type: "boolean", default: false },
      },
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const int = (name: string, v: string | undefined, min: number) => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) {
      throw new UsageError(`--${name} must be an integer ≥ ${min}, got '${v}'`);
    }
    return n;
  };
  const quick = values.quick!;
  const scenarios = new Set(values.scenarios!.split(",").map((s) => s.trim()).filter(Boolean));
  for (const s of scenarios) {
    if (!SCENARIOS.includes(s)) {
      throw new UsageError(`unknown scenario '${s}' (known: ${SCENARIOS.join(", ")})`);
    }
  }
  const chatModels = values["chat-models"]!.split(",").map((s) => s.trim()).filter(Boolean);
  for (const m of chatModels) {
    if (m !== "dense" && m !== "moe") throw new UsageError(`unknown chat model '${m}' (known: dense, moe)`);
  }
  if (chatModels.length === 0) throw new UsageError("--chat-models needs at least one of dense, moe");
  const gpu = values.gpu;
  if (gpu !== "cpu" && gpu !== "cuda") throw new UsageError(`--gpu must be cpu or cuda, got '${gpu}'`);
  const embedBackend = values["embed-backend"];
  if (embedBackend !== "llama" && embedBackend !== "onnx") {
    throw new UsageError(`--embed-backend must be llama or onnx, got '${embedBackend}'`);
  }

  let baseline: BenchOptions["baseline"];
  if (values.baseline !== undefined) {
    if (values.baseline !== "llama-server") {
      throw new UsageError(
        `--baseline accepts only 'llama-server' (or use --baseline-url), got '${values.baseline}'`,
      );
    }
    if (values["baseline-url"]) throw new UsageError("--baseline and --baseline-url exclude each other");
    if (embedBackend === "onnx") throw new UsageError("llama-server cannot serve the ONNX embedding model");
    baseline = {
      kind: "llama-server",
      binary: values["llama-server-bin"] ?? (env.VSERVE_BENCH_LLAMA_SERVER || undefined),
      cache: values["llama-server-cache"],
      cpu: values["llama-server-cpu"]!,
    };
  } else if (values["llama-server-bin"] || values["llama-server-cache"]) {
    throw new UsageError("--llama-server-bin and --llama-server-cache need --baseline llama-server");
  } else if (values["baseline-url"]) {
    baseline = {
      kind: "url",
      url: values["baseline-url"].replace(/\/$/, ""),
      key: values["baseline-key"]!,
      chatModel: values["baseline-chat-model"],
      embeddingModel: values["baseline-embedding-model"],
    };
  }
  const llamaServer = baseline?.kind === "llama-server";

  if (values["in-process"] && values["no-in-process"]) {
    throw new UsageError("--in-process and --no-in-process exclude each other");
  }
  const inProcess = values["in-process"] ?? (values["no-in-process"] ? false : !llamaServer);

  const concurrency = quick ? (llamaServer ? [1, 4, 8] : [1, 4]) : [1, 2, 4, 8];
  const slots = int("slots", values.slots, 1) ?? Math.max(...concurrency);
  if (slots < Math.max(...concurrency)) {
    throw new UsageError(
      `--slots ${slots} is fewer than the ${Math.max(...concurrency)} concurrent streams measured`,
    );
  }
  return {
    help: values.help!,
    quick,
    tiny: values.tiny!,
    reps: int("reps", values.reps, 1) ?? (quick ? 1 : 3),
    scenarios,
    chatModels: chatModels as ("dense" | "moe")[],
    threads: int("threads", values.threads, 1),
    gpu,
    embedBackend,
    out: values.out!,
    inProcess,
    concurrency,
    slots,
    ctxPerSlot: int("ctx", values.ctx, 256) ?? (llamaServer ? 4096 : 1024),
    embedSlots: int("embed-slots", values["embed-slots"], 1) ?? 64,
    decodeTokens: quick ? 32 : 128,
    promptWords: quick ? 120 : 400, // ~1.25 tokens per word: ~500 tokens in full mode
    sentenceCount: quick ? 16 : 64,
    mixedClients: int("mixed-clients", values["mixed-clients"], 1) ?? (values.tiny ? 4 : quick ? 16 : 64),
    mixedSeconds: int("mixed-seconds", values["mixed-seconds"], 1) ?? (values.tiny ? 4 : quick ? 15 : 30),
    burst: {
      prompts: int("burst", values.burst, 1) ?? 8,
      words: int("burst-words", values["burst-words"], 1) ?? (quick ? 200 : 800),
      replyTokens: quick ? 8 : 32,
    },
    agents: {
      conversations: int("agent-conversations", values["agent-conversations"], 1) ?? (quick ? 8 : 16),
      turns: int("agent-turns", values["agent-turns"], 1) ?? (quick ? 2 : 3),
      concurrency: int("agent-concurrency", values["agent-concurrency"], 1) ?? (quick ? 4 : 8),
      prefixWords: int("agent-prefix", values["agent-prefix"], 1) ?? (quick ? 500 : 1250),
      messageWords: quick ? 20 : 40,
      replyTokens: int("agent-reply", values["agent-reply"], 1) ?? (quick ? 16 : 64),
    },
    baseline,
  };
}
