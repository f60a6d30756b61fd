/**
 * All settings in one zod schema. Precedence: command-line flags > environment (`VSERVE_*`) >
 * config file (`--config`, JSON) > defaults. `--help` is generated from the same table.
 */
import { z } from "zod";
import { type ApiKey, parseKeyFile, plainKey } from "./api_keys.ts";
import { checkOverrides } from "./tensor_override.ts";

const cores = navigator.hardwareConcurrency || 1;

const ModelSpecSchema = z.record(z.string(), z.unknown());

/** The settings schema; defaults live here and only here. */
export const ConfigSchema = z.object({
  host: z.string().min(1).default("127.0.0.1"),
  port: z.number().int().min(0).max(65535).default(8080),
  apiKeys: z.array(z.string().min(1)).default([]),
  apiKeyFile: z.string().optional(),
  noAuth: z.boolean().default(false),
  models: z.array(ModelSpecSchema).optional(),
  modelsFile: z.string().optional(),
  chatModel: z.string().optional(),
  embeddingModel: z.string().optional(),
  modelCache: z.string().default("models/cache"),
  hubUrl: z.string().url().default("https://huggingface.co"),
  threads: z.number().int().min(1).max(1024).default(cores),
  /** Nice levels the compute threads run below the event-loop thread (Linux; 0 = off). */
  computeNice: z.number().int().min(0).max(19).default(10),
  gpu: z.enum(["auto", "cuda", "vulkan", "cpu"]).default("auto"),
  gpuLayers: z.union([z.number().int().min(0), z.literal("auto"), z.literal("max")]).optional(),
  flashAttn: z.enum(["auto", "on", "off"]).default("auto"),
  ctxSize: z.number().int().min(256).optional(),
  parallel: z.number().int().min(1).max(256).optional(),
  cacheRam: z.number().int().min(0).max(16 * 1024 * 1024).optional(),
  maxQueue: z.number().int().min(0).default(64),
  requestTimeoutMs: z.number().int().min(1).default(600_000),
  drainTimeoutMs: z.number().int().min(0).default(30_000),
  bodyLimitBytes: z.number().int().min(1024).default(8 * 1024 * 1024),
  bodyTimeoutMs: z.number().int().min(0).default(30_000),
  idleTimeoutMs: z.number().int().min(0).default(60_000),
  maxQueuedEmbeddingTokens: z.number().int().min(1).default(262_144),
  maxEmbeddingInputs: z.number().int().min(1).default(2048),
  /** `MODEL=WEIGHT` pairs: the model's weight in the machine's compute share (registry `computeWeight`). */
  computeWeights: z.array(
    z.string().regex(/^[^=\s]+=(?:\d+(?:\.\d+)?|\.\d+)$/, "expected MODEL=WEIGHT, e.g. tiny-chat=2"),
  ).default([]),
  corsOrigins: z.array(z.string()).default([]),
  tlsCert: z.string().optional(),
  tlsKey: z.string().optional(),
  /** Whether /metrics and /health/ready need a key: auto = open on loopback, key elsewhere. */
  opsAuth: z.enum(["auto", "on", "off"]).default("auto"),
  /** Responses API tools the server cannot run (web_search, mcp, …): left out of the prompt, or a 400. */
  hostedTools: z.enum(["ignore", "refuse"]).default("ignore"),
  /** Secret the key that seals reasoning (`encrypted_content`) is derived from; unset: random per start. */
  reasoningKey: z.string().min(32, "use at least 32 characters (e.g. openssl rand -base64 32)").optional(),
  logFormat: z.enum(["json", "pretty"]).default(Deno.stderr.isTerminal() ? "pretty" : "json"),
  logLevel: z.enum(["debug", "info", "warn", "error"]).default("info"),
  // GPU placement (override the registry's per-model settings when given).
  cpuMoe: z.boolean().optional(),
  nCpuMoe: z.number().int().min(0).max(10_000).optional(),
  overrideTensor: z.array(z.string()).superRefine(checkOverrides).optional(),
  tensorSplit: z.array(z.number().min(0)).min(1).max(64).refine((v) => v.some((x) => x > 0), {
    message: "at least one proportion must be above 0",
  }).optional(),
  mainGpu: z.number().int().min(0).max(63).optional(),
  splitMode: z.enum(["none", "layer", "row"]).optional(),
  // The memory plan.
  plan: z.boolean().default(false),
  json: z.boolean().default(false),
  vram: z.array(z.number().positive().max(65_536)).min(1).max(64).optional(),
  ram: z.number().positive().max(1_048_576).optional(),
});

/** The validated settings the server runs with. */
export type Config = z.infer<typeof ConfigSchema>;
type Key = keyof Config;

interface Setting {
  key: Key;
  flag: string;
  kind: "string" | "int" | "bool" | "list" | "gpuLayers" | "number" | "numbers";
  help: string;
  env?: boolean;
}

/** Every flag, in `--help` order. Each one also has an env var `VSERVE_<FLAG>` unless noted. */
export const SETTINGS: readonly Setting[] = [
  { key: "host", flag: "host", kind: "string", help: "address to listen on" },
  { key: "port", flag: "port", kind: "int", help: "port to listen on (0 = any free port)" },
  {
    key: "apiKeys",
    flag: "api-key",
    kind: "list",
    help: "accepted API key; repeat the flag, or comma-separate in the env var",
  },
  { key: "apiKeyFile", flag: "api-key-file", kind: "string", help: "file with one API key per line" },
  {
    key: "noAuth",
    flag: "no-auth",
    kind: "bool",
    help: "allow serving without API keys on a non-loopback address",
  },
  { key: "modelsFile", flag: "models", kind: "string", help: "model registry file (JSON)" },
  { key: "chatModel", flag: "chat-model", kind: "string", help: "GGUF file served as the chat model" },
  {
    key: "embeddingModel",
    flag: "embedding-model",
    kind: "string",
    help: "GGUF or ONNX file served as the embedding model",
  },
  {
    key: "modelCache",
    flag: "model-cache",
    kind: "string",
    help: "directory for generated and downloaded models",
  },
  { key: "hubUrl", flag: "hub-url", kind: "string", help: "base URL of the model hub for hf: sources" },
  { key: "threads", flag: "threads", kind: "int", help: "CPU threads per engine (at most the cores)" },
  {
    key: "computeNice",
    flag: "compute-nice",
    kind: "int",
    help: "nice levels the compute threads run below the request thread, so it gets a core first " +
      "(Linux; 0 = off)",
  },
  { key: "gpu", flag: "gpu", kind: "string", help: "auto | cuda | vulkan | cpu" },
  {
    key: "gpuLayers",
    flag: "gpu-layers",
    kind: "gpuLayers",
    help: "layers to offload: a number, auto (the memory plan chooses) or max",
  },
  {
    key: "flashAttn",
    flag: "flash-attn",
    kind: "string",
    help: "llama.cpp flash attention: auto | on | off (off: batched = alone, bit for bit, on CPU)",
  },
  {
    key: "ctxSize",
    flag: "ctx-size",
    kind: "int",
    help: "chat context window in tokens (overrides the registry)",
  },
  {
    key: "parallel",
    flag: "parallel",
    kind: "int",
    help: "parallel sequences per model (overrides the registry)",
  },
  {
    key: "cacheRam",
    flag: "cache-ram",
    kind: "int",
    help:
      "host memory per chat model for saved prompt states, MiB (default 8192; 0 = off; overrides the registry)",
  },
  { key: "maxQueue", flag: "max-queue", kind: "int", help: "requests that may wait per model before 429" },
  { key: "requestTimeoutMs", flag: "request-timeout-ms", kind: "int", help: "per-request time limit" },
  {
    key: "drainTimeoutMs",
    flag: "drain-timeout-ms",
    kind: "int",
    help: "how long shutdown waits for in-flight work",
  },
  { key: "bodyLimitBytes", flag: "body-limit-bytes", kind: "int", help: "largest accepted request body" },
  {
    key: "bodyTimeoutMs",
    flag: "body-timeout-ms",
    kind: "int",
    help: "time to receive a request body before 408 (0 = none)",
  },
  {
    key: "idleTimeoutMs",
    flag: "idle-timeout-ms",
    kind: "int",
    help:
      "a connection with no request in a handler (headers unsent, or idle keep-alive) is closed after this (0 = never; Linux)",
  },
  {
    key: "maxQueuedEmbeddingTokens",
    flag: "max-queued-embedding-tokens",
    kind: "int",
    help: "per embedding model: tokens admitted at once; a request beyond it waits its turn or gets 429",
  },
  {
    key: "maxEmbeddingInputs",
    flag: "max-embedding-inputs",
    kind: "int",
    help: "entries per embeddings request",
  },
  {
    key: "computeWeights",
    flag: "compute-weight",
    kind: "list",
    help: "MODEL=WEIGHT: the model's share of compute against the others (default 1 each); repeatable",
  },
  {
    key: "corsOrigins",
    flag: "cors-origin",
    kind: "list",
    help: "allowed CORS origin; repeatable (default: CORS off)",
  },
  { key: "tlsCert", flag: "tls-cert", kind: "string", help: "PEM certificate (chain): serve HTTPS only" },
  { key: "tlsKey", flag: "tls-key", kind: "string", help: "PEM private key of --tls-cert" },
  {
    key: "opsAuth",
    flag: "ops-auth",
    kind: "string",
    help: "key for /metrics and /health/ready: auto (open on loopback) | on | off",
  },
  {
    key: "hostedTools",
    flag: "hosted-tools",
    kind: "string",
    help: "hosted tools (Responses: web_search, file_search, mcp, …; Anthropic: web_search_…, bash_…): " +
      "ignore (left out, named in x-vserve-ignored-tools) | refuse (400)",
  },
  {
    key: "reasoningKey",
    flag: "reasoning-key",
    kind: "string",
    help: "secret (32+ characters) sealing Responses reasoning.encrypted_content and Anthropic thinking " +
      "signatures; unset: a random key, " +
      "so blobs do not survive a restart or reach another replica",
  },
  { key: "logFormat", flag: "log-format", kind: "string", help: "json | pretty" },
  { key: "logLevel", flag: "log-level", kind: "string", help: "debug | info | warn | error" },
  {
    key: "cpuMoe",
    flag: "cpu-moe",
    kind: "bool",
    help: "keep every layer's MoE expert weights in host memory (overrides the registry)",
  },
  {
    key: "nCpuMoe",
    flag: "n-cpu-moe",
    kind: "int",
    help: "keep the MoE expert weights of the first N layers in host memory (overrides the registry)",
  },
  {
    key: "overrideTensor",
    flag: "override-tensor",
    kind: "list",
    help: "PATTERN=DEVICE: tensors whose name matches the regex go to DEVICE (CPU, CUDA0, …); repeatable",
  },
  {
    key: "tensorSplit",
    flag: "tensor-split",
    kind: "numbers",
    help: "proportions of the model per GPU, e.g. 3,1 (default: by free memory)",
  },
  {
    key: "mainGpu",
    flag: "main-gpu",
    kind: "int",
    help: "the GPU of --split-mode none (and row's small tensors)",
  },
  { key: "splitMode", flag: "split-mode", kind: "string", help: "several GPUs: none | layer | row" },
  {
    key: "plan",
    flag: "plan",
    kind: "bool",
    help: "print the memory plan of the configured models per device and exit (0: fits, 2: does not)",
  },
  { key: "json", flag: "json", kind: "bool", help: "with --plan: the plan as JSON" },
  {
    key: "vram",
    flag: "vram",
    kind: "numbers",
    help: "GiB per GPU, e.g. 24 or 24,24: --plan for GPUs that are not here; a VRAM budget on GPUs that are",
  },
  {
    key: "ram",
    flag: "ram",
    kind: "number",
    help: "GiB of host memory the models may use (default: MemTotal, or the cgroup limit)",
  },
];

/** Thrown for a configuration that must not start; the message names the setting. */
export class ConfigError extends Error {
  override name = "ConfigError";
}

/** The environment variable of a flag: `--api-key` → `VSERVE_API_KEY`. */
export function envName(flag: string): string {
  return `VSERVE_${flag.toUpperCase().replaceAll("-", "_")}`;
}

function convert(s: Setting, raw: string, origin: string): unknown {
  switch (s.kind) {
    case "string":
      return raw;
    case "int": {
      if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(`${origin}: '${raw}' is not an integer`);
      return Number(raw);
    }
    case "bool":
      if (/^(1|true|yes|on)$/i.test(raw)) return true;
      if (/^(0|false|no|off)$/i.test(raw)) return false;
      throw new ConfigError(`${origin}: '${raw}' is not a boolean (true/false)`);
    case "list":
      return raw.split(",").map((v) => v.trim()).filter((v) => v !== "");
    case "gpuLayers":
      return raw === "auto" || raw === "max" ? raw : convert({ ...s, kind: "int" }, raw, origin);
    case "number":
      if (!/^\s*\d+(\.\d+)?\s*$/.test(raw)) throw new ConfigError(`${origin}: '${raw}' is not a number`);
      return Number(raw);
    case "numbers":
      return raw.split(",").map((v) => convert({ ...s, kind: "number" }, v, origin));
  }
}

/** Parses command-line flags (`--flag value`, `--flag=value`, booleans bare). */
export function parseFlags(
  args: readonly string[],
): { values: Partial<Record<Key, unknown>>; config?: string; help: boolean } {
  const values: Partial<Record<Key, unknown>> = {};
  let config: string | undefined;
  let help = false;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--help" || arg === "-h") {
      help = true;
      continue;
    }
    const m = arg.match(/^--([a-z0-9-]+)(?:=(.*))?$/s);
    if (!m) throw new ConfigError(`unexpected argument '${arg}' (see --help)`);
    const [, name, inline] = m;
    const takeValue = () => {
      if (inline !== undefined) return inline;
      const next = args[++i];
      if (next === undefined) throw new ConfigError(`--${name} needs a value`);
      return next;
    };
    if (name === "config") {
      config = takeValue();
      continue;
    }
    const s = SETTINGS.find((x) => x.flag === name);
    if (!s) throw new ConfigError(`unknown flag --${name} (see --help)`);
    if (s.kind === "bool") {
      values[s.key] = inline === undefined ? true : convert(s, inline, `--${name}`);
    } else if (s.kind === "list") {
      const prev = (values[s.key] as string[] | undefined) ?? [];
      values[s.key] = [...prev, ...(convert(s, takeValue(), `--${name}`) as string[])];
    } else {
      values[s.key] = convert(s, takeValue(), `--${name}`);
    }
  }
  return { values, config, help };
}

/** Reads `VSERVE_*` variables. */
export function parseEnv(env: Record<string, string>): Partial<Record<Key, unknown>> {
  const values: Partial<Record<Key, unknown>> = {};
  for (const s of SETTINGS) {
    const raw = env[envName(s.flag)];
    if (raw !== undefined && raw !== "") values[s.key] = convert(s, raw, envName(s.flag));
  }
  return values;
}

/**
 * Builds the configuration from all layers; throws {@link ConfigError} naming the bad setting.
 *
 * @example
 * ```ts
 * const { config } = await loadConfig(["--port", "9000"], {});
 * config.port; // 9000
 * ```
 */
export async function loadConfig(
  args: readonly string[],
  env: Record<string, string>,
): Promise<{ config: Config; help: boolean }> {
  const flags = parseFlags(args);
  const configPath = flags.config ?? env["VSERVE_CONFIG"];
  let file: Record<string, unknown> = {};
  if (configPath) {
    let text: string;
    try {
      text = await Deno.readTextFile(configPath);
    } catch (e) {
      throw new ConfigError(`config file '${configPath}' cannot be read: ${(e as Error).message}`);
    }
    try {
      file = JSON.parse(text);
    } catch (e) {
      throw new ConfigError(`config file '${configPath}' is not valid JSON: ${(e as Error).message}`);
    }
    if (typeof file !== "object" || file === null || Array.isArray(file)) {
      throw new ConfigError(`config file '${configPath}' must hold a JSON object`);
    }
  }
  const merged = { ...file, ...parseEnv(env), ...flags.values };
  const parsed = ConfigSchema.strict().safeParse(merged);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const key = String(issue.path[0] ?? (issue as { keys?: string[] }).keys?.[0] ?? "");
    const s = SETTINGS.find((x) => x.key === key);
    const name = s ? `--${s.flag} / ${envName(s.flag)}` : `'${key}'`;
    throw new ConfigError(`invalid setting ${name}: ${issue.message}`);
  }
  const config = parsed.data;
  if ((config.tlsCert === undefined) !== (config.tlsKey === undefined)) {
    throw new ConfigError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (config.cpuMoe && config.nCpuMoe !== undefined) {
    throw new ConfigError("--cpu-moe and --n-cpu-moe: give one (--cpu-moe is every layer's experts)");
  }
  if (config.json && !config.plan) throw new ConfigError("--json goes with --plan");
  return { config, help: flags.help };
}

/**
 * Every configured key: `--api-key` / `VSERVE_API_KEY` and the key file (read again on SIGHUP).
 *
 * @example
 * ```ts
 * const { config } = await loadConfig(["--api-key", "secret"], {});
 * const keys = await loadApiKeys(config);
 * keys.length; // 1
 * ```
 */
export async function loadApiKeys(config: Config): Promise<ApiKey[]> {
  const keys = config.apiKeys.map(plainKey);
  if (!config.apiKeyFile) return keys;
  let text: string;
  try {
    text = await Deno.readTextFile(config.apiKeyFile);
  } catch (e) {
    throw new ConfigError(`--api-key-file '${config.apiKeyFile}' cannot be read: ${(e as Error).message}`);
  }
  try {
    return [...keys, ...parseKeyFile(text, `--api-key-file '${config.apiKeyFile}'`)];
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
}

/** True for addresses that only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host === "[::1]" || /^127\./.test(host);
}

/** The `--help` text, in the style of llama-server: flag, env var, default, meaning. */
export function helpText(): string {
  const defaults = ConfigSchema.parse({});
  const lines = [
    "vserve: OpenAI-compatible embeddings and chat completions server",
    "",
    "usage: deno task start [flags]",
    "",
    "  --config FILE                  (env VSERVE_CONFIG) JSON file with any of the settings below",
  ];
  for (const s of SETTINGS) {
    const value = (defaults as Record<string, unknown>)[s.key];
    const shown = value === undefined
      ? ""
      : ` [default: ${Array.isArray(value) ? value.join(",") || "none" : value}]`;
    const left = `  --${s.flag}${s.kind === "bool" ? "" : " VALUE"}`.padEnd(32);
    lines.push(`${left} (env ${envName(s.flag)}) ${s.help}${shown}`);
  }
  lines.push("  -h, --help                     this text");
  return lines.join("\n");
}
