/**
 * The memory plan wired to the server's settings: the same per-model settings the engines load
 * with, the devices (GPUs that are here, or `--vram` ones that are not; host memory), the
 * `--plan` command's output, and the check the server runs before it loads anything.
 */
import type { Config } from "../config.ts";
import type { ModelSpec } from "../model_spec.ts";
import { headerForSource, type HeaderSource } from "./headers.ts";
import { modelShape } from "./shape.ts";
import {
  type DeviceUse,
  formatBytes,
  type ModelRequest,
  type Plan,
  type PlanDevice,
  planMemory,
  useTotal,
} from "./memory.ts";
import { describeExperts, type PlacementSettings } from "./placement.ts";
import { GROUPS } from "./shape.ts";

const GiB = 1024 ** 3;

/** The settings a model is loaded with: command line over registry entry over defaults. */
export interface LoadSettings {
  contextSize: number;
  parallel: number;
  maxInputTokens: number;
  gpuLayers?: number | "auto" | "max";
  placement: PlacementSettings;
  splitMode: "none" | "layer" | "row";
  mainGpu: number;
  tensorSplit?: number[];
}

/**
 * The settings `spec` loads with under `config` (the engines and the plan both use this).
 *
 * @example
 * ```ts
 * import type { Config } from "../config.ts";
 * import type { ModelSpec } from "../model_spec.ts";
 * function placementOf(spec: ModelSpec, config: Config) {
 *   return loadSettings(spec, config).placement; // { cpuMoe: true, … } with --cpu-moe
 * }
 * ```
 */
export function loadSettings(spec: ModelSpec, config: Config): LoadSettings {
  const expertsFromFlags = config.cpuMoe !== undefined || config.nCpuMoe !== undefined;
  return {
    contextSize: config.ctxSize ?? spec.contextSize ?? 32768,
    parallel: config.parallel ?? spec.parallel,
    maxInputTokens: spec.maxInputTokens ?? 8192,
    gpuLayers: config.gpuLayers ?? spec.gpuLayers,
    placement: {
      cpuMoe: expertsFromFlags ? config.cpuMoe : spec.cpuMoe,
      nCpuMoe: expertsFromFlags ? config.nCpuMoe : spec.nCpuMoe,
      overrideTensor: config.overrideTensor ?? spec.overrideTensor,
    },
    splitMode: config.splitMode ?? spec.splitMode ?? "layer",
    mainGpu: config.mainGpu ?? spec.mainGpu ?? 0,
    tensorSplit: config.tensorSplit ?? spec.tensorSplit,
  };
}

/** The plan request of `spec`, from its header. */
export function modelRequest(spec: ModelSpec, config: Config, source: HeaderSource): ModelRequest {
  const s = loadSettings(spec, config);
  return {
    id: spec.id,
    kind: spec.kind,
    backend: spec.backend,
    source: spec.source ?? "",
    shape: source.kind === "gguf" ? modelShape(source.header) : undefined,
    fileBytes: source.kind === "onnx" ? source.bytes : undefined,
    contextSize: s.contextSize,
    parallel: s.parallel,
    maxInputTokens: s.maxInputTokens,
    pooling: spec.pooling,
    gpuLayers: s.gpuLayers,
    placement: s.placement,
    splitMode: s.splitMode,
    mainGpu: s.mainGpu,
    tensorSplit: s.tensorSplit,
    flashAttn: config.flashAttn,
    promptCacheMiB: config.cacheRam ?? spec.cacheRam,
  };
}

/** Host memory the plan may use: `--ram`, else the machine's (capped by a cgroup limit). */
export async function hostDevice(config: Config): Promise<PlanDevice> {
  if (config.ram !== undefined) {
    return { name: "CPU", kind: "host", capacity: config.ram * GiB, source: "--ram" };
  }
  const total = Deno.systemMemoryInfo().total;
  const limit = await Deno.readTextFile("/sys/fs/cgroup/memory.max").then((t) => Number(t.trim()))
    .catch(() => NaN);
  if (Number.isFinite(limit) && limit > 0 && limit < total) {
    return { name: "CPU", kind: "host", capacity: limit, source: "cgroup memory.max" };
  }
  return { name: "CPU", kind: "host", capacity: total, source: "MemTotal" };
}

/** GPUs that are not here, as `--vram` describes them (named as the `--gpu` backend names its devices). */
export function plannedGpus(config: Config): PlanDevice[] {
  const prefix = config.gpu === "vulkan" ? "Vulkan" : "CUDA";
  return (config.vram ?? []).map((gib, i) => ({
    name: `${prefix}${i}`,
    kind: "gpu",
    capacity: gib * GiB,
    source: "--vram",
  }));
}

/** A GPU as the loaded llama.cpp build reports it. */
export interface GpuFacts {
  bufferTypeName: string;
  type: string;
  free: number;
}

/** The GPUs that are here (llama.cpp's order; integrated ones only without a discrete one), capped by `--vram`. */
export function presentGpus(devices: readonly GpuFacts[], config: Config): PlanDevice[] {
  const discrete = devices.filter((d) => d.type === "GPU");
  const gpus = discrete.length ? discrete : devices.filter((d) => d.type === "IGPU");
  return gpus.map((d, i) => {
    const budget = config.vram?.[i];
    return budget !== undefined && budget * GiB < d.free
      ? { name: d.bufferTypeName, kind: "gpu", capacity: budget * GiB, source: "--vram" }
      : { name: d.bufferTypeName, kind: "gpu", capacity: d.free, source: "free VRAM" };
  });
}

/**
 * Headers of every local model (pending `hf:` files aside), by model id. A header that cannot be read
 * is an error naming the model (`strict`, for `--plan`), or leaves the model out of the plan, to fail
 * at its load with the reason while the others are served (the server's start).
 */
export async function modelHeaders(
  specs: readonly ModelSpec[],
  config: Config,
  strict = true,
): Promise<Map<string, HeaderSource>> {
  const out = new Map<string, HeaderSource>();
  for (const spec of specs) {
    if (spec.backend === "openai" || !spec.source) continue;
    try {
      out.set(spec.id, await headerForSource(spec.source, config.modelCache));
    } catch (e) {
      const reason = `model '${spec.id}': ${(e as Error).message}`;
      if (strict) throw new Error(reason);
      out.set(spec.id, { kind: "pending", origin: spec.source, reason });
    }
  }
  return out;
}

/**
 * Plans `specs` on `devices`: models whose file is not there yet (an `hf:` download) are left out
 * and named in `pending`.
 */
export function planSpecs(
  specs: readonly ModelSpec[],
  config: Config,
  headers: ReadonlyMap<string, HeaderSource>,
  devices: readonly PlanDevice[],
): { plan: Plan; pending: string[] } {
  const pending: string[] = [];
  const requests: ModelRequest[] = [];
  for (const spec of specs) {
    const source = headers.get(spec.id);
    if (source?.kind === "pending") pending.push(spec.id);
    else if (source || spec.backend === "openai") {
      requests.push(modelRequest(spec, config, source ?? { kind: "onnx", origin: "" }));
    }
  }
  for (const r of requests) checkGpuSettings(r, devices.filter((d) => d.kind === "gpu").length);
  return { plan: planMemory(requests, devices), pending };
}

/** `--main-gpu` and `--tensor-split` must fit the GPUs there are (planned or present). */
function checkGpuSettings(r: ModelRequest, gpus: number): void {
  if (r.backend !== "llama" || gpus === 0) return;
  if (r.mainGpu >= gpus) {
    throw new Error(
      `--main-gpu ${r.mainGpu}: there ${gpus === 1 ? "is 1 GPU" : `are ${gpus} GPUs`} (0-${gpus - 1})`,
    );
  }
  if (r.tensorSplit && r.tensorSplit.length > gpus) {
    throw new Error(`--tensor-split has ${r.tensorSplit.length} proportions for ${gpus} GPU(s)`);
  }
}

const ROW_NAMES: Record<string, string> = {
  embeddings: "weights: embeddings",
  attention: "weights: attention",
  linear_attention: "weights: linear attention",
  ffn: "weights: dense FFN",
  experts: "weights: experts",
  shared_expert: "weights: shared expert",
  norms: "weights: norms",
  output: "weights: output",
  kv: "KV cache",
  recurrent: "recurrent state",
  checkpoints: "state checkpoints",
  output_buffer: "logits buffer",
  compute: "compute buffers",
};

function rowsOf(u: DeviceUse): Record<string, number> {
  const out: Record<string, number> = {};
  for (const g of GROUPS) if (u.weights[g]) out[g] = u.weights[g]!;
  if (u.kv) out.kv = u.kv;
  if (u.recurrent) out.recurrent = u.recurrent;
  if (u.checkpoints) out.checkpoints = u.checkpoints;
  if (u.output) out.output_buffer = u.output;
  if (u.compute) out.compute = u.compute;
  return out;
}

/** The plan as a human table (what `--plan` prints). */
export function formatPlan(plan: Plan, pending: readonly string[] = []): string {
  const names = plan.devices.map((d) => d.name);
  const width = 12;
  const cell = (b: number | undefined) => (b ? formatBytes(b) : "-").padStart(width);
  const lines: string[] = [];
  for (const m of plan.models) {
    const c = m.context;
    const head = [m.id, m.arch, m.type].filter(Boolean).join("  ");
    lines.push(head);
    if (c) {
      lines.push(
        m.kind === "chat"
          ? `  context: ${c.sequences} sequences × ${c.perSequence} tokens (${c.cells} KV cells), micro-batch ${c.ubatch}`
          : `  context: ${c.cells} KV cells shared by ${c.sequences} inputs, micro-batch ${c.ubatch}`,
      );
    }
    if (m.backend === "llama") {
      const gpuNames = plan.devices.filter((d) => d.kind === "gpu").map((d) => d.name);
      const layers = gpuNames.length === 0
        ? "host only (no GPU)"
        : `${m.gpuLayers}/${(m.layers ?? 0) + 1} layers (with the output layer) on ${gpuNames.join(", ")}${
          m.gpuLayersChosen === "auto" ? " (auto)" : ""
        }`;
      const experts = describeExperts(m.placement);
      lines.push(`  placement: ${layers}${experts ? `; ${experts}` : ""}`);
      for (const o of m.overrides.filter((o) => o.from === "--override-tensor")) {
        lines.push(`  override: ${o.pattern} → ${o.device}: ${o.tensors} tensors, ${formatBytes(o.bytes)}`);
      }
    }
    lines.push(`  ${"".padEnd(26)}${names.map((n) => n.padStart(width)).join("")}`);
    const rows = new Map<string, Record<string, number>>();
    for (const n of names) if (m.devices[n]) rows.set(n, rowsOf(m.devices[n]));
    const keys = [...GROUPS, "kv", "recurrent", "checkpoints", "output_buffer", "compute"]
      .filter((k) => [...rows.values()].some((r) => r[k]));
    for (const k of keys) {
      lines.push(`  ${ROW_NAMES[k].padEnd(26)}${names.map((n) => cell(rows.get(n)?.[k])).join("")}`);
    }
    lines.push(
      `  ${"total".padEnd(26)}${names.map((n) => cell(m.devices[n] ? useTotal(m.devices[n]) : 0)).join("")}`,
    );
    if (m.devices.CPU?.promptCache) {
      lines.push(
        `  ${"prompt cache, at most".padEnd(26)}${
          names.map((n) => cell(m.devices[n]?.promptCache)).join("")
        }  (filled as prompts come: --cache-ram)`,
      );
    }
    for (const note of m.notes) lines.push(`  note: ${note}`);
    lines.push("");
  }
  lines.push("devices:");
  for (const d of plan.devices) {
    lines.push(
      `  ${d.name.padEnd(8)} ${formatBytes(d.used).padStart(11)} + ${formatBytes(d.runtime)} runtime of ${
        formatBytes(d.capacity)
      } (${d.source}): ${d.fits ? "fits" : "DOES NOT FIT"}`,
    );
  }
  for (const id of pending) lines.push(`  (${id}: its file is not there yet; planned when it loads)`);
  lines.push("");
  if (plan.fits) lines.push("fits");
  else {
    lines.push("does not fit");
    if (plan.suggestions.length) {
      lines.push("nearest settings that fit:");
      for (const s of plan.suggestions) lines.push(`  ${s}`);
    } else lines.push("no single setting makes it fit (fewer models, a smaller quantization or more memory)");
  }
  return lines.join("\n");
}

/** The plan as JSON (what `--plan --json` prints): bytes throughout. */
export function planJson(plan: Plan, pending: readonly string[] = []): unknown {
  return {
    fits: plan.fits,
    suggestions: plan.suggestions,
    pending,
    devices: plan.devices,
    models: plan.models.map((m) => ({
      ...m,
      devices: Object.fromEntries(
        Object.entries(m.devices).map(([name, u]) => [name, { ...u, total: useTotal(u) }]),
      ),
    })),
  };
}

/** One model's plan per device and kind of memory, in MiB (for `/health`). */
export function planMiB(devices: Record<string, DeviceUse>): Record<string, Record<string, number>> {
  const mib = (b: number) => Math.round(b / 1024 / 1024 * 10) / 10;
  return Object.fromEntries(
    Object.entries(devices).map(([n, u]) => [n, {
      weights: mib(Object.values(u.weights).reduce((a, b) => a + (b ?? 0), 0)),
      kv: mib(u.kv),
      recurrent: mib(u.recurrent),
      checkpoints: mib(u.checkpoints),
      prompt_cache: mib(u.promptCache),
      output: mib(u.output),
      compute: mib(u.compute),
      total: mib(useTotal(u)),
    }]),
  );
}
