/**
 * The memory plan: where each model's weights, KV cache, recurrent state, checkpoints and compute
 * buffers go and how much each takes, per device, before anything is loaded; whether that fits;
 * and, if not, the nearest settings that do. Pure: shapes and capacities in, a plan out.
 * How each figure is computed: docs/gpu-planning.md.
 */
import { type ModelShape, type TensorGroup } from "./shape.ts";
import { typeName } from "./gguf_header.ts";
import { overrideRules, type PlacementSettings, ruleFor } from "./placement.ts";
import type { OverrideRule } from "../tensor_override.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** Prompt tokens per chat decode step (the chat engine's micro-batch is this + its sequences). */
export const CHAT_CHUNK = 512;
/** State checkpoints the chat scheduler keeps per sequence of a recurrent model (chat.ts). */
export const CHECKPOINTS_PER_SEQUENCE = 4;
/** The prompt cache's default size, MiB (llama-server's `--cache-ram` default). */
export const DEFAULT_PROMPT_CACHE_MIB = 8192;
/** The llama embedding engine: sequences, extra KV cells beyond the longest input, batch tokens. */
export const EMBEDDING_SEQUENCES = 64;
export const EMBEDDING_RESERVE = 2048;
/** Memory kept free on each GPU: the CUDA/Vulkan context, cuBLAS workspaces, fragmentation. */
export const GPU_RUNTIME_BYTES = 512 * MiB;
/** Host memory for the server process itself (runtime, JS heap, tokenizer tables). */
export const HOST_RUNTIME_BYTES = 1 * GiB;

/** A device the plan places memory on. */
export interface PlanDevice {
  /** `CPU` for host memory; a GPU's buffer type name (`CUDA0`, `Vulkan0`) otherwise. */
  name: string;
  kind: "host" | "gpu";
  /** Bytes the plan may use. */
  capacity: number;
  /** Where the capacity comes from (`--vram`, `free VRAM`, `MemTotal`, `cgroup memory.max`, `--ram`). */
  source: string;
}

/** One model to plan, with the settings it will be loaded with. */
export interface ModelRequest {
  id: string;
  kind: "chat" | "embedding";
  backend: "llama" | "onnx" | "openai";
  source: string;
  /** llama models: the shape from the GGUF header. */
  shape?: ModelShape;
  /** onnx models: the file's size, if known. */
  fileBytes?: number;
  /** Chat: tokens per sequence and sequences. */
  contextSize: number;
  parallel: number;
  /** Embedding: longest input. */
  maxInputTokens: number;
  pooling?: "last" | "mean" | "cls";
  gpuLayers?: number | "auto" | "max";
  placement: PlacementSettings;
  splitMode: "none" | "layer" | "row";
  mainGpu: number;
  tensorSplit?: readonly number[];
  flashAttn: "auto" | "on" | "off";
  /** Chat (llama): host memory the prompt cache may fill, MiB (`--cache-ram`; 0 = none). */
  promptCacheMiB?: number;
}

/** What one model puts on one device (bytes). */
export interface DeviceUse {
  weights: Partial<Record<TensorGroup, number>>;
  kv: number;
  recurrent: number;
  checkpoints: number;
  /**
   * Host memory the prompt cache may fill with saved prompt states: a ceiling, filled as prompts
   * come and given back under it, so not in the total the fit is judged on (a note says when it
   * cannot fill it all).
   */
  promptCache: number;
  output: number;
  compute: number;
}

/** The plan of one model. */
export interface ModelPlan {
  id: string;
  kind: "chat" | "embedding";
  backend: string;
  arch?: string;
  type?: string;
  /** Repeating layers (llama.cpp counts one more: the output layer). */
  layers?: number;
  /** KV cells in all, per sequence, sequences; the micro-batch. */
  context?: { cells: number; perSequence: number; sequences: number; ubatch: number; unified: boolean };
  /** Layers offloaded as llama.cpp counts them (layers + output), and how it was chosen. */
  gpuLayers: number;
  gpuLayersChosen: "all" | "auto" | "set" | "none";
  /** The expert placement in effect (`nCpuMoe` possibly chosen by auto). */
  placement: PlacementSettings;
  /** The tensor overrides and what they match. */
  overrides: { pattern: string; device: string; from: string; tensors: number; bytes: number }[];
  devices: Record<string, DeviceUse>;
  notes: string[];
}

/** A device's total and room. */
export interface DeviceTotal {
  name: string;
  kind: "host" | "gpu";
  capacity: number;
  source: string;
  runtime: number;
  used: number;
  fits: boolean;
}

/** The whole plan. */
export interface Plan {
  models: ModelPlan[];
  devices: DeviceTotal[];
  fits: boolean;
  /** The nearest settings that fit, when it does not. */
  suggestions: string[];
}

/** A device use with nothing in it. */
function emptyUse(): DeviceUse {
  return { weights: {}, kv: 0, recurrent: 0, checkpoints: 0, promptCache: 0, output: 0, compute: 0 };
}

/** Total bytes of a device use. */
export function useTotal(u: DeviceUse): number {
  return Object.values(u.weights).reduce((a, b) => a + (b ?? 0), 0) + u.kv + u.recurrent + u.checkpoints +
    u.output + u.compute;
}

const pad256 = (n: number) => Math.ceil(n / 256) * 256;

/** The context an engine creates for `req` (mirrors the chat and embedding engines and llama.cpp's padding). */
export function engineContext(req: ModelRequest): NonNullable<ModelPlan["context"]> {
  if (req.kind === "chat") {
    const sequences = Math.max(1, req.parallel);
    const perSequence = pad256(Math.floor(pad256(req.contextSize * sequences) / sequences));
    return {
      cells: perSequence * sequences,
      perSequence,
      sequences,
      ubatch: CHAT_CHUNK + sequences,
      unified: false,
    };
  }
  const cells = pad256(req.maxInputTokens + EMBEDDING_RESERVE);
  const pooling = req.pooling ?? req.shape?.pooling ?? "last";
  return {
    cells,
    perSequence: cells,
    sequences: EMBEDDING_SEQUENCES,
    ubatch: pooling === "last" ? 1024 : 256,
    unified: true,
  };
}

/** Layer → device for a llama model, as llama.cpp's `load_tensors` assigns them. */
function layerDevices(
  shape: ModelShape,
  gpuLayers: number,
  gpus: readonly PlanDevice[],
  req: ModelRequest,
): { of: (layer: number) => string; used: PlanDevice[]; shares: number[] } {
  const host = "CPU";
  if (gpus.length === 0 || gpuLayers === 0) return { of: () => host, used: [], shares: [] };
  const used = req.splitMode === "none" ? [gpus[req.mainGpu] ?? gpus[0]] : [...gpus];
  const given = req.splitMode !== "none" && req.tensorSplit?.some((x) => x > 0)
    ? used.map((_, i) => req.tensorSplit![i] ?? 0)
    : used.map((d) => d.capacity);
  const sum = given.reduce((a, b) => a + b, 0) || 1;
  const shares = given.map((x) => x / sum);
  const splits: number[] = [];
  shares.reduce((acc, x) => (splits.push(acc + x), acc + x), 0);
  const nAll = shape.nLayer;
  const start = Math.max(nAll + 1 - gpuLayers, 0);
  const active = Math.min(gpuLayers, nAll + 1);
  return {
    of: (il: number) => {
      if (il < start || il - start >= active) return host;
      const x = (il - start) / active;
      const i = splits.findIndex((s) => s > x);
      return used[i < 0 ? used.length - 1 : i].name;
    },
    used,
    shares,
  };
}

/** The plan of one llama model on `devices` with `gpuLayers` offloaded. */
function planLlama(
  req: ModelRequest,
  shape: ModelShape,
  devices: readonly PlanDevice[],
  gpuLayers: number,
  placement: PlacementSettings,
): ModelPlan {
  const gpus = devices.filter((d) => d.kind === "gpu");
  const ctx = engineContext(req);
  const uses: Record<string, DeviceUse> = {};
  const at = (name: string) => (uses[name] ??= emptyUse());
  const addWeight = (device: string, group: TensorGroup, bytes: number) => {
    const w = at(device).weights;
    w[group] = (w[group] ?? 0) + bytes;
  };
  const layout = layerDevices(shape, gpuLayers, gpus, req);
  const rules: OverrideRule[] = overrideRules(placement);
  const compiled = rules.map((r) => new RegExp(r.pattern));
  const deviceNamed = (r: OverrideRule) => {
    if (r.device.toUpperCase() === "CPU") return "CPU";
    const hit = gpus.find((g) => g.name.toLowerCase() === r.device.toLowerCase());
    if (!hit) {
      throw new Error(
        `${r.from} '${r.pattern}=${r.device}': no device '${r.device}' (devices: ${
          ["CPU", ...gpus.map((g) => g.name)].join(", ")
        })`,
      );
    }
    return hit.name;
  };
  const matched = rules.map((r) => ({ ...r, device: deviceNamed(r), tensors: 0, bytes: 0 }));
  const outputDevice = layout.of(shape.nLayer);
  /**
   * Per GPU: the largest expert tensor kept in host memory. For batches of 32+ tokens llama.cpp
   * runs the expert matmul on the GPU and copies the weight in; each such weight starts a new
   * graph split, so one copy at a time is live.
   */
  const hostExperts = new Map<string, number>();

  for (const t of shape.tensors) {
    const rule = ruleFor(rules, compiled, t.name);
    const layerDevice = t.layer === "input"
      ? "CPU"
      : layout.of(t.layer === "output" ? shape.nLayer : t.layer);
    let device = layerDevice;
    if (rule) {
      const m = matched[rules.indexOf(rule)];
      m.tensors++;
      m.bytes += t.bytes;
      device = m.device;
    }
    if (
      req.splitMode === "row" && !rule && device !== "CPU" && t.dims.length === 2 &&
      ["attention", "linear_attention", "ffn", "shared_expert"].includes(t.group)
    ) {
      layout.used.forEach((d, i) => addWeight(d.name, t.group, t.bytes * layout.shares[i]));
    } else addWeight(device, t.group, t.bytes);
    if (t.group === "experts" && t.dims.length === 3 && device === "CPU" && layerDevice !== "CPU") {
      hostExperts.set(layerDevice, Math.max(hostExperts.get(layerDevice) ?? 0, t.bytes));
    }
  }
  // A tied head: llama.cpp loads the token table a second time where the output layer is offloaded.
  if (shape.tiedOutput && outputDevice !== "CPU") {
    const table = shape.tensors.find((t) => t.name === "token_embd.weight");
    if (table) addWeight(outputDevice, "output", table.bytes);
  }

  // KV cache (f16 K and V) and recurrent state (f32) live with their layer.
  for (const a of shape.attentionLayers) {
    at(layout.of(a.layer)).kv += ctx.cells * (a.kValues + a.vValues) * 2;
  }
  let statePerSequence = 0;
  for (const r of shape.recurrentLayers) {
    const bytes = (r.convValues + r.stateValues) * 4;
    statePerSequence += bytes;
    at(layout.of(r.layer)).recurrent += bytes * ctx.sequences;
  }
  if (req.kind === "chat" && statePerSequence > 0) {
    at("CPU").checkpoints += statePerSequence * ctx.sequences * CHECKPOINTS_PER_SEQUENCE;
  }
  if (req.kind === "chat") at("CPU").promptCache += (req.promptCacheMiB ?? DEFAULT_PROMPT_CACHE_MIB) * MiB;
  at("CPU").output += ctx.sequences * (shape.nVocab + (req.kind === "embedding" ? shape.nEmbd : 0)) * 4;

  // Compute buffers (see docs/gpu-planning.md): the largest phase of the graph on each device.
  const u = ctx.ubatch;
  const d = shape.nEmbd;
  const streams = ctx.unified ? 1 : ctx.sequences;
  const tokensPerStream = Math.ceil(u / streams);
  const kvPerStream = ctx.unified ? ctx.cells : ctx.perSequence;
  const flash = req.flashAttn !== "off";
  const hasAttention = shape.attentionLayers.length > 0;
  const mask = flash && hasAttention ? kvPerStream * tokensPerStream * streams * 2 : 0;
  const scores = !flash && hasAttention ? 1.1 * kvPerStream * tokensPerStream * shape.nHead * streams * 4 : 0;
  const width = shape.experts
    ? shape.experts.used * shape.experts.width + shape.experts.sharedWidth
    : shape.ffnWidth;
  const convWidth = shape.recurrentLayers.length
    ? Math.max(...shape.recurrentLayers.map((r) => r.convValues)) / 3
    : 0;
  const layerPhase = Math.max(
    scores,
    mask + 4 * u * d * 4,
    u * width * 4 * 3 + 4 * u * d * 4,
    u * convWidth * 4 * 3,
  );
  // The logits of a whole micro-batch (llama.cpp reserves for one output per token) dominate.
  const outputPhase = u * shape.nVocab * 4 + 2 * u * d * 4;
  const layerHolders = new Set<string>();
  for (let l = 0; l < shape.nLayer; l++) layerHolders.add(layout.of(l));
  for (const name of new Set([...layerHolders, outputDevice, "CPU"])) {
    let bytes = 0;
    if (name === outputDevice) bytes = Math.max(outputPhase, layerHolders.has(name) ? layerPhase : 0);
    else if (layerHolders.has(name)) bytes = layerPhase;
    else bytes = 2 * u * d * 4; // the host side of a fully offloaded model: the embedded inputs
    at(name).compute += bytes + (hostExperts.get(name) ?? 0);
  }

  const notes: string[] = [];
  if (hostExperts.size) {
    notes.push(
      "experts in host memory run on the CPU for small batches; for batches of 32+ tokens llama.cpp copies " +
        "each expert tensor to the GPU in turn (one copy is counted in its compute buffer)",
    );
  }
  if (req.flashAttn === "off" && hasAttention) {
    notes.push("flash attention off: attention scores are materialised");
  }
  return {
    id: req.id,
    kind: req.kind,
    backend: req.backend,
    arch: shape.arch,
    type: typeName(shape.mainType),
    layers: shape.nLayer,
    context: ctx,
    gpuLayers,
    gpuLayersChosen: "set",
    placement,
    overrides: matched.map(({ pattern, device, from, tensors, bytes }) => ({
      pattern,
      device,
      from,
      tensors,
      bytes,
    })),
    devices: uses,
    notes,
  };
}

/** The plan of a model that is not a llama model (ONNX on the host; a remote fleet needs nothing). */
function planOther(req: ModelRequest): ModelPlan {
  const devices: Record<string, DeviceUse> = {};
  const notes: string[] = [];
  if (req.backend === "onnx") {
    devices.CPU = { ...emptyUse(), weights: { ffn: req.fileBytes ?? 0 } };
    notes.push(
      req.fileBytes === undefined
        ? "ONNX model: its file is not there yet, so its size is not counted"
        : "ONNX model: weights counted at the file's size; onnxruntime's arena is not planned",
    );
  } else notes.push("served by remote upstreams: no local memory");
  return {
    id: req.id,
    kind: req.kind,
    backend: req.backend,
    gpuLayers: 0,
    gpuLayersChosen: "none",
    placement: {},
    overrides: [],
    devices,
    notes,
  };
}

/** Totals per device for a set of model plans. */
function totals(models: readonly ModelPlan[], devices: readonly PlanDevice[]): DeviceTotal[] {
  return devices.map((d) => {
    const used = models.reduce((sum, m) => sum + (m.devices[d.name] ? useTotal(m.devices[d.name]) : 0), 0);
    const inUse = d.kind === "host" || used > 0;
    const runtime = d.kind === "host" ? HOST_RUNTIME_BYTES : inUse ? GPU_RUNTIME_BYTES : 0;
    return { ...d, runtime, used, fits: used + runtime <= d.capacity };
  });
}

/** True when every device holds what `models` put on it. */
function fitsOn(models: readonly ModelPlan[], devices: readonly PlanDevice[]): boolean {
  return totals(models, devices).every((t) => t.fits);
}

/** The smallest n in [lo, hi] for which `ok` holds (`ok` monotone: false … false true … true), or undefined. */
function smallest(lo: number, hi: number, ok: (n: number) => boolean): number | undefined {
  if (lo > hi || !ok(hi)) return undefined;
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (ok(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** The largest n in [lo, hi] for which `ok` holds (`ok` monotone: true … true false … false), or undefined. */
function largest(lo: number, hi: number, ok: (n: number) => boolean): number | undefined {
  const flipped = smallest(-hi, -lo, (n) => ok(-n));
  return flipped === undefined ? undefined : -flipped;
}

/** Whether every GPU holds what `models` put on it (host aside). */
function gpusFit(models: readonly ModelPlan[], devices: readonly PlanDevice[]): boolean {
  return totals(models, devices).every((t) => t.kind === "host" || t.fits);
}

/** Resolves a model's layer setting without auto: llama.cpp's count (layers + output layer). */
function fixedLayers(req: ModelRequest, shape: ModelShape, gpus: number): number | undefined {
  if (gpus === 0) return 0;
  if (req.gpuLayers === "max") return shape.nLayer + 1;
  if (typeof req.gpuLayers === "number") return Math.min(req.gpuLayers, shape.nLayer + 1);
  return undefined;
}

/**
 * Auto placement of one model beside `others`: every layer on the GPUs if that fits; else, for a
 * MoE model without an expert placement of its own, the fewest layers' experts in host memory
 * (`--n-cpu-moe N`); else the most layers that fit.
 */
function autoPlan(
  r: ModelRequest,
  shape: ModelShape,
  others: readonly ModelPlan[],
  devices: readonly PlanDevice[],
): ModelPlan {
  const all = shape.nLayer + 1;
  const fits = (p: ModelPlan) => fitsOn([...others, p], devices);
  const gpuFits = (p: ModelPlan) => gpusFit([...others, p], devices);
  const full = planLlama(r, shape, devices, all, r.placement);
  if (fits(full)) return full;
  const explicit = r.placement.cpuMoe || r.placement.nCpuMoe || r.placement.overrideTensor?.length;
  const withExperts = (n: number) => ({ ...r.placement, cpuMoe: false, nCpuMoe: n });
  let placement = r.placement;
  if (shape.experts && !explicit) {
    const n = smallest(1, shape.nLayer, (n) => gpuFits(planLlama(r, shape, devices, all, withExperts(n))));
    if (n !== undefined) {
      const plan = planLlama(r, shape, devices, all, withExperts(n));
      if (fits(plan)) return plan;
    }
    placement = withExperts(shape.nLayer);
  }
  const layers = largest(0, all, (l) => gpuFits(planLlama(r, shape, devices, l, placement)));
  if (layers !== undefined) {
    const plan = planLlama(r, shape, devices, layers, placement);
    if (fits(plan)) return plan;
  }
  return full;
}

/** Plans every model with its settings (auto layers resolved greedily, dense models first). */
function planAll(requests: readonly ModelRequest[], devices: readonly PlanDevice[]): ModelPlan[] {
  const gpus = devices.filter((d) => d.kind === "gpu").length;
  const plans: (ModelPlan | undefined)[] = requests.map((req) => {
    if (req.backend !== "llama" || !req.shape) return planOther(req);
    const layers = fixedLayers(req, req.shape, gpus);
    if (layers === undefined) return undefined;
    const plan = planLlama(req, req.shape, devices, layers, req.placement);
    plan.gpuLayersChosen = gpus === 0 ? "none" : req.gpuLayers === "max" ? "all" : "set";
    return plan;
  });
  const pending = requests.map((r, i) => ({ r, i })).filter(({ i }) => !plans[i])
    .sort((a, b) => Number(!!a.r.shape?.experts) - Number(!!b.r.shape?.experts));
  for (const { r, i } of pending) {
    const chosen = autoPlan(r, r.shape!, plans.filter((p): p is ModelPlan => !!p), devices);
    chosen.gpuLayersChosen = "auto";
    plans[i] = chosen;
  }
  return plans as ModelPlan[];
}

/**
 * Plans `requests` on `devices`: each model's memory per device, the totals, whether it fits and,
 * if not, the nearest settings that do.
 *
 * @example
 * ```ts
 * function onOneL4(chatRequest: ModelRequest, host: PlanDevice) {
 *   const gpu: PlanDevice = { name: "CUDA0", kind: "gpu", capacity: 24 * 2 ** 30, source: "--vram" };
 *   const plan = planMemory([chatRequest], [gpu, host]);
 *   return plan.fits ? [] : plan.suggestions;
 * }
 * ```
 */
export function planMemory(requests: readonly ModelRequest[], devices: readonly PlanDevice[]): Plan {
  const models = planAll(requests, devices);
  const deviceTotals = totals(models, devices);
  const fits = deviceTotals.every((t) => t.fits);
  const host = deviceTotals.find((t) => t.kind === "host");
  const cached = models.reduce((sum, m) => sum + (m.devices.CPU?.promptCache ?? 0), 0);
  if (host && cached > 0 && host.used + host.runtime + cached > host.capacity) {
    const room = Math.max(0, host.capacity - host.used - host.runtime);
    for (const m of models.filter((m) => m.devices.CPU?.promptCache)) {
      m.notes.push(
        `the prompt cache may fill ${Math.round(m.devices.CPU.promptCache / MiB)} MiB of host memory, and ` +
          `${Math.floor(room / MiB)} MiB is left beside the rest: lower --cache-ram (MiB) to what is left`,
      );
    }
  }
  return { models, devices: deviceTotals, fits, suggestions: fits ? [] : suggest(requests, devices) };
}

/** The nearest settings that fit, one knob at a time (each checked with a whole plan). */
function suggest(requests: readonly ModelRequest[], devices: readonly PlanDevice[]): string[] {
  const out: string[] = [];
  const gpus = devices.filter((d) => d.kind === "gpu").length;
  const planWith = (i: number, change: Partial<ModelRequest>) =>
    planAll(requests.map((r, j) => (j === i ? { ...r, ...change } : r)), devices);
  const fitsWith = (i: number, change: Partial<ModelRequest>) => fitsOn(planWith(i, change), devices);
  requests.forEach((r, i) => {
    if (r.backend !== "llama" || !r.shape) return;
    const shape = r.shape;
    const name = requests.length > 1 ? `${r.id}: ` : "";
    if (gpus > 0 && shape.experts && !r.placement.cpuMoe) {
      const withN = (n: number) => ({ placement: { ...r.placement, nCpuMoe: n } });
      const n = smallest(
        (r.placement.nCpuMoe ?? 0) + 1,
        shape.nLayer,
        (n) => gpusFit(planWith(i, withN(n)), devices),
      );
      if (n !== undefined && fitsWith(i, withN(n))) {
        out.push(`${name}--n-cpu-moe ${n} (experts of layers 0-${n - 1} in host memory)`);
      }
    }
    if (r.kind === "chat") {
      const p = largest(1, r.parallel - 1, (p) => fitsWith(i, { parallel: p }));
      if (p !== undefined) out.push(`${name}--parallel ${p} (${p} sequences of ${r.contextSize} tokens)`);
      const steps = Math.floor((r.contextSize - 1) / 1024);
      const c = largest(1, steps, (k) => fitsWith(i, { contextSize: k * 1024 }));
      if (c !== undefined) {
        out.push(`${name}--ctx-size ${c * 1024} (${r.parallel} sequences of ${c * 1024} tokens)`);
      }
    }
    if (gpus > 0 && (typeof r.gpuLayers === "number" || r.gpuLayers === "max")) {
      const now = typeof r.gpuLayers === "number"
        ? Math.min(r.gpuLayers, shape.nLayer + 1)
        : shape.nLayer + 1;
      const l = largest(0, now - 1, (l) => gpusFit(planWith(i, { gpuLayers: l }), devices));
      if (l !== undefined && fitsWith(i, { gpuLayers: l })) out.push(`${name}--gpu-layers ${l}`);
    }
  });
  return out;
}

/** Bytes as GiB (or MiB below 1 GiB), for messages and tables. */
export function formatBytes(bytes: number): string {
  if (bytes >= GiB) return `${(bytes / GiB).toFixed(2)} GiB`;
  if (bytes >= MiB || bytes === 0) return `${(bytes / MiB).toFixed(bytes === 0 ? 0 : 1)} MiB`;
  return `${(bytes / 1024).toFixed(1)} KiB`;
}

/**
 * The one-paragraph verdict of a plan that does not fit: which device overflows by how much, and
 * the nearest settings that fit. The server refuses to start with this message.
 */
export function refusalMessage(plan: Plan): string {
  const over = plan.devices.filter((d) => !d.fits).map((d) =>
    `${d.name} needs ${formatBytes(d.used + d.runtime)} of ${formatBytes(d.capacity)} (${d.source})`
  );
  const fix = plan.suggestions.length
    ? `; nearest settings that fit: ${plan.suggestions.join("; ")}`
    : "; no single setting makes it fit (fewer models, a smaller quantization or more memory)";
  return `the configured models do not fit: ${
    over.join(", ")
  }${fix} (deno task start --plan shows the whole plan)`;
}
