/**
 * The schema of one registry entry (a model: its source, engine settings, placement), shared by the
 * registry, the engines and the memory plan; with the fields of a model served by remote
 * OpenAI-compatible engines (`backend: "openai"`): the upstream servers and how requests are routed
 * among them.
 */
import { z } from "zod";
import { checkOverrides } from "./tensor_override.ts";

/** One upstream server of a model. */
export const UpstreamSpecSchema = z.object({
  /**
   * The API base as OpenAI clients take it, e.g. `http://10.0.0.5:8000/v1`; a bare origin gets `/v1`.
   * Chat goes to `<url>/chat/completions`, embeddings to `<url>/embeddings`.
   */
  url: z.url({ protocol: /^https?$/, error: "url must be an http:// or https:// URL" }),
  /** Label in metrics, logs, /health and /v1/models (default `upstream-<n>`); never the URL. */
  name: z.string().regex(/^[\w.:-]{1,64}$/, "names are 1-64 characters of letters, digits and . _ : -")
    .optional(),
  /** The upstream's own API key (sent as a bearer token). Prefer `keyEnv`: no secret in the file. */
  key: z.string().min(1).optional(),
  /** The environment variable holding the upstream's API key. */
  keyEnv: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/).optional(),
  /** The upstream's own name of the model (vLLM's `--served-model-name`); default: our id. */
  model: z.string().min(1).optional(),
  /** Health check: a path on the upstream's origin or a full URL (default `/health`). */
  health: z.string().min(1).optional(),
}).strict();
export type UpstreamSpec = z.infer<typeof UpstreamSpecSchema>;

/** How requests are spread over the upstreams and when one is taken out. */
export const RoutingSchema = z.object({
  /** An upstream that cannot be connected to within this is given up (and the request retried). */
  connectTimeoutMs: z.number().int().min(1).default(2_000),
  /** Time to the first byte of the answer (the first stream event; a whole embeddings body). */
  firstByteTimeoutMs: z.number().int().min(1).default(60_000),
  /**
   * A stream that has started and then sends no event for this long (time spent waiting for the
   * upstream, not for a slow client) is given up: the request is aborted and counted as failed, the
   * client gets an error event and `[DONE]` (0 = no limit).
   */
  streamIdleTimeoutMs: z.number().int().min(0).default(60_000),
  /**
   * Active health checks: every this often, ejected upstreams included (0 = none; an ejected upstream
   * is then probed at the end of its back-off only).
   */
  healthIntervalMs: z.number().int().min(0).default(5_000),
  healthTimeoutMs: z.number().int().min(1).default(2_000),
  /** Consecutive failed requests after which an upstream is ejected. */
  failures: z.number().int().min(1).default(3),
  /** First ejection period; it doubles with each ejection in a row, up to `maxEjectMs`. */
  ejectMs: z.number().int().min(1).default(10_000),
  maxEjectMs: z.number().int().min(1).default(300_000),
  /** Attempts on other upstreams after a failure before the first byte. */
  retries: z.number().int().min(0).max(4).default(1),
  /**
   * Prefix affinity (chat): requests whose rendered conversation shares its first this many
   * characters go to the same upstream while it is healthy and not overloaded (0 = off).
   */
  affinityPrefixChars: z.number().int().min(0).default(1_024),
  /** An upstream keeps its affine requests while it holds fewer than max(2, this × the mean load). */
  affinityLoadFactor: z.number().min(1).default(1.5),
  /** How embeddings are fetched: `base64` is 4× smaller on the wire (vLLM, llama-server, vserve). */
  embeddingEncoding: z.enum(["float", "base64"]).default("float"),
}).strict();
export type Routing = z.infer<typeof RoutingSchema>;

/** One entry of `models/models.json` (or of a config file's `models`). */
export const ModelSpecSchema = z.object({
  id: z.string().min(1).regex(/^[\w.:\/-]+$/, "ids use letters, digits and . _ : / -"),
  aliases: z.array(z.string().min(1)).default([]),
  kind: z.enum(["chat", "embedding"]),
  /** `openai`: served by the remote OpenAI-compatible servers in `upstreams`. */
  backend: z.enum(["llama", "onnx", "openai"]).default("llama"),
  /** A file path, `hf:<owner>/<repo>/<file>[@<revision>]`, or `builtin:<preset>` (not for `openai`). */
  source: z.string().min(1).optional(),
  /** Backend `openai`: the servers that serve this model, and how requests are routed to them. */
  upstreams: z.array(UpstreamSpecSchema).min(1).max(64).optional(),
  routing: RoutingSchema.partial().optional(),
  /** Expected SHA-256 (hex) of a downloaded file. */
  sha256: z.string().regex(/^[0-9a-f]{64}$/).optional(),
  /** Expected size in bytes of a downloaded file. */
  size: z.number().int().positive().optional(),
  /** For ONNX models: the tokenizer.json (path or builtin:qwen3). */
  tokenizer: z.string().optional(),
  owned_by: z.string().default("vserve"),
  /** Logged loudly at start: e.g. generated weights whose output is meaningless. */
  warning: z.string().optional(),
  contextSize: z.number().int().min(256).optional(),
  threads: z.number().int().min(1).optional(),
  gpuLayers: z.union([z.number().int().min(0), z.literal("auto"), z.literal("max")]).optional(),
  /** MoE expert weights of every layer (`cpuMoe`) or of the first N layers (`nCpuMoe`) in host memory. */
  cpuMoe: z.boolean().optional(),
  nCpuMoe: z.number().int().min(0).max(10_000).optional(),
  /** `PATTERN=DEVICE` tensor overrides (llama-server's `-ot`), applied before the expert placement. */
  overrideTensor: z.array(z.string()).superRefine(checkOverrides).optional(),
  /** Several GPUs: proportions per GPU, the main GPU, and how the model is split. */
  tensorSplit: z.array(z.number().min(0)).min(1).max(64).optional(),
  mainGpu: z.number().int().min(0).max(63).optional(),
  splitMode: z.enum(["none", "layer", "row"]).optional(),
  parallel: z.number().int().min(1).max(256).default(4),
  /** Chat models: host memory for saved prompt states (the prompt cache), MiB; 0 = none. */
  cacheRam: z.number().int().min(0).max(16 * 1024 * 1024).optional(),
  pooling: z.enum(["last", "mean", "cls"]).optional(),
  maxInputTokens: z.number().int().min(1).optional(),
  nativeDims: z.number().int().min(1).optional(),
  /** Matryoshka support: `dimensions` accepted from `minDims` to the native size. */
  matryoshka: z.boolean().default(true),
  minDims: z.number().int().min(1).default(32),
  /** Default of `chat_template_kwargs.enable_thinking`; absent: what the chat template does. */
  thinking: z.boolean().optional(),
  /**
   * Embedding models: the default task of queries (`input_type: "query"`); absent: queries are
   * embedded as sent unless the request gives an `instruction`.
   */
  queryInstruction: z.string().min(1).max(4096).optional(),
  /** How a query is formatted: `{instruction}` and `{text}` (Qwen3-Embedding's format by default). */
  queryFormat: z.string().refine((f) => f.includes("{instruction}") && f.includes("{text}"), {
    message: "queryFormat must contain {instruction} and {text}",
  }).default("Instruct: {instruction}\nQuery:{text}"),
  /** Tool-call dialect; absent: read from the chat template (`<function=…>` = xml, else json). */
  toolFormat: z.enum(["json", "xml"]).optional(),
  /**
   * Chat models: decode concurrent sequences in one batch. `auto` (default): yes, unless a check at
   * load finds that the backend computes a batch of sequences differently from one at a time
   * (recurrent and hybrid models); `off`: one sequence per decode.
   */
  batchSequences: z.enum(["auto", "off"]).default("auto"),
  /**
   * The model's weight in the machine's compute share: models busy at once get compute time in
   * proportion to their weights (default 1: equal shares).
   */
  computeWeight: z.number().positive().max(1000).optional(),
}).strict().superRefine((m, ctx) => {
  const remote = m.backend === "openai";
  if (m.cpuMoe && m.nCpuMoe !== undefined) {
    ctx.addIssue({ code: "custom", path: ["nCpuMoe"], message: "give cpuMoe or nCpuMoe, not both" });
  }
  if (remote && !m.upstreams) {
    ctx.addIssue({ code: "custom", path: ["upstreams"], message: "the openai backend needs upstreams" });
  }
  if (!remote && m.upstreams) {
    ctx.addIssue({ code: "custom", path: ["upstreams"], message: "upstreams need backend 'openai'" });
  }
  if (!remote && !m.source) {
    ctx.addIssue({ code: "custom", path: ["source"], message: "a model file (source) is required" });
  }
  const names = new Set<string>();
  m.upstreams?.forEach((u, i) => {
    const name = u.name ?? `upstream-${i}`;
    if (names.has(name)) {
      ctx.addIssue({
        code: "custom",
        path: ["upstreams", i, "name"],
        message: `the name '${name}' is taken`,
      });
    }
    names.add(name);
  });
});
export type ModelSpec = z.infer<typeof ModelSpecSchema>;
