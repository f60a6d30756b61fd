/** Picks and loads the engine implementation for a registry entry. */
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import type { ModelSpec } from "../model_spec.ts";
import type { ChatEngine, EmbeddingEngine } from "./types.ts";
import { resolveSource } from "../models/sources.ts";
import { qwen3TokenizerJsonPath } from "../models/qwen3_vocab.ts";
import { captureLlamaLog, engineThreads, llamaRuntime, resolveGpuLayers } from "./llama/runtime.ts";
import { backendDevices, type LlamaLibrary, openLlamaLibrary } from "./llama/ffi.ts";
import type { ModelPlacement } from "./llama/native.ts";
import { type ModelPlan, refusalMessage } from "../plan/memory.ts";
import { overrideRules } from "../plan/placement.ts";
import { hostDevice, loadSettings, planMiB, plannedGpus, planSpecs, presentGpus } from "../plan/run.ts";
import type { PlanDevice } from "../plan/memory.ts";
import { readGgufHeader } from "../plan/gguf_header.ts";
import { type LlamaAllocations, parseLlamaLog } from "../plan/llama_log.ts";
import { LlamaEmbeddingEngine } from "./llama/embedding.ts";
import { LlamaChatEngine } from "./llama/chat.ts";
import { OnnxEmbeddingEngine } from "./onnx/embedding.ts";
import { openUpstreamEngine } from "./upstream/load.ts";
import { VERSION_INFO } from "../version.ts";
import type { ComputeShare } from "./compute_share.ts";
import { releaseFreedMemory } from "./native_memory.ts";

/**
 * Loads the engine for `spec`; server-wide settings (threads, gpu, ctx size, parallel) override
 * the registry entry when given on the command line, in the environment or config file. Local
 * engines take their compute turns from `share` (by the spec's `computeWeight`) when given.
 */
export async function loadEngine(
  spec: ModelSpec,
  config: Config,
  log: Logger,
  report: (details: Record<string, unknown>) => void,
  plan?: ModelPlan,
  share?: ComputeShare,
): Promise<ChatEngine | EmbeddingEngine> {
  if (spec.backend === "openai") return await openUpstreamEngine(spec, log, report, Deno.env.toObject());
  if (!spec.source) throw new Error("a model file (source) is required");
  const path = await resolveSource(spec.source, {
    cacheDir: config.modelCache,
    hubUrl: config.hubUrl,
    log,
    sha256: spec.sha256,
    size: spec.size,
  });
  report({
    system_fingerprint: await modelFingerprint(
      path,
      spec.backend === "onnx"
        ? `onnxruntime-${VERSION_INFO.engines["onnxruntime-node"]}`
        : `llamacpp-${VERSION_INFO.engines["llama.cpp"]}`,
    ),
  });
  const threads = engineThreads(spec.threads ?? config.threads);
  const gpuLayers = config.gpuLayers ?? spec.gpuLayers;
  const parallel = config.parallel ?? spec.parallel;
  const compute = share?.client(spec.id, spec.computeWeight ?? 1);
  if (spec.backend === "onnx") {
    if (spec.kind !== "embedding") throw new Error("the onnx backend serves embedding models only");
    const tokenizer = !spec.tokenizer || spec.tokenizer === "builtin:qwen3"
      ? qwen3TokenizerJsonPath()
      : spec.tokenizer;
    const { engine, provider } = await OnnxEmbeddingEngine.load({
      modelPath: path,
      tokenizerPath: tokenizer,
      pooling: spec.pooling ?? "mean",
      threads,
      gpu: config.gpu === "vulkan" ? "cpu" : config.gpu,
      maxBatch: 64,
      compute,
      log,
    });
    report({ backend: "onnx", execution_provider: provider, threads, dims: engine.nativeDims });
    return engine;
  }
  const llama = await llamaRuntime(config.gpu, log);
  const lib = openLlamaLibrary();
  // A model whose file was not there at start (a download) is planned now, beside nothing else.
  const modelPlan = plan ?? await planAtLoad(spec, config, path, lib);
  const layers = !llama.gpu
    ? 0
    : modelPlan.gpuLayersChosen === "auto"
    ? modelPlan.gpuLayers
    : await resolveGpuLayers(llama, path, gpuLayers);
  const settings = loadSettings(spec, config);
  const placement = nativePlacement(lib, modelPlan, settings);
  report({
    backend: "llama",
    gpu: llama.gpu || "cpu",
    gpu_layers: layers,
    threads,
    parallel,
    flash_attn: config.flashAttn,
    placement: placementReport(modelPlan, settings, !!llama.gpu),
  });
  // llama.cpp's load log, read when this function returns or throws: where the tensors went and the
  // buffers llama.cpp allocated, for /health and the log.
  await using _loadLog = captureLlamaLog(llama, (lines) => {
    const allocated = parseLlamaLog(lines);
    report({
      placement: placementReport(modelPlan, settings, !!llama.gpu, allocated),
      memory_mib: memoryReport(modelPlan, allocated),
    });
    const moved = new Map<string, number>();
    for (const o of allocated.overridden) moved.set(o.bufferType, (moved.get(o.bufferType) ?? 0) + 1);
    if (moved.size) {
      log.info("tensor overrides applied", { model: spec.id, tensors: Object.fromEntries(moved) });
    }
  });
  if (spec.kind === "embedding") {
    const engine = await LlamaEmbeddingEngine.load(lib, {
      modelPath: path,
      gpuLayers: layers,
      placement,
      threads,
      maxInputTokens: spec.maxInputTokens ?? 8192,
      pooling: spec.pooling,
      flashAttention: config.flashAttn,
      compute,
    });
    report({ dims: engine.nativeDims, pooling: engine.pooling });
    // What the load freed (the file's parsing, the graph reservations) goes back to the system.
    await releaseFreedMemory();
    return engine;
  }
  const contextSize = config.ctxSize ?? spec.contextSize ?? 32768;
  const engine = await LlamaChatEngine.load(lib, {
    modelPath: path,
    gpuLayers: layers,
    placement,
    threads,
    parallel,
    contextSize,
    toolFormat: spec.toolFormat,
    batchSequences: spec.batchSequences,
    flashAttention: config.flashAttn,
    compute,
    promptCacheMiB: config.cacheRam ?? spec.cacheRam,
    log,
  });
  report({
    context_size: engine.contextSize,
    prompt_cache_mib: engine.promptCacheMiB,
    tool_format: engine.dialect.name,
    thinking_default: spec.thinking ?? engine.thinking.defaultOn,
    batched_decode: engine.batching,
  });
  await releaseFreedMemory();
  return engine;
}

/** The plan of one model at load time, from its file's header; throws the refusal when it cannot fit. */
async function planAtLoad(
  spec: ModelSpec,
  config: Config,
  path: string,
  lib: LlamaLibrary,
): Promise<ModelPlan> {
  const header = await readGgufHeader(path);
  const devices = [...presentGpus(backendDevices(lib), config), await hostDevice(config)];
  const { plan } = planSpecs(
    [spec],
    config,
    new Map([[spec.id, { kind: "gguf", header, origin: path }]]),
    devices,
  );
  if (!plan.fits) throw new Error(refusalMessage(plan));
  return plan.models[0];
}

/** llama.cpp model parameters for the plan's placement: override rules bound to device buffer types. */
function nativePlacement(
  lib: LlamaLibrary,
  plan: ModelPlan,
  s: ReturnType<typeof loadSettings>,
): ModelPlacement {
  const devices = backendDevices(lib);
  const overrides = overrideRules(plan.placement).map((rule) => {
    const device = devices.find((d) => d.bufferTypeName.toLowerCase() === rule.device.toLowerCase());
    if (!device) {
      throw new Error(
        `${rule.from} '${rule.pattern}=${rule.device}': no device '${rule.device}' here (devices: ${
          devices.map((d) => d.bufferTypeName).join(", ")
        })`,
      );
    }
    return { pattern: rule.pattern, bufferType: device.bufferType };
  });
  // Passed on CPU-only builds too: llama.cpp ignores them without GPUs.
  return { overrides, splitMode: s.splitMode, mainGpu: s.mainGpu, tensorSplit: s.tensorSplit };
}

/**
 * The placement facts `/health` shows for a llama model; after the load, each override also says
 * how many tensors llama.cpp's load log reports it moved (`placed`) and to which buffer types.
 */
function placementReport(
  plan: ModelPlan,
  s: ReturnType<typeof loadSettings>,
  gpu: boolean,
  allocated?: LlamaAllocations,
): Record<string, unknown> {
  const compiled = plan.overrides.map((o) => new RegExp(o.pattern));
  const placed = plan.overrides.map(() => new Map<string, number>());
  for (const moved of allocated?.overridden ?? []) {
    const i = compiled.findIndex((re) => re.test(moved.tensor));
    if (i >= 0) placed[i].set(moved.bufferType, (placed[i].get(moved.bufferType) ?? 0) + 1);
  }
  return {
    split_mode: s.splitMode,
    main_gpu: s.mainGpu,
    tensor_split: s.tensorSplit ?? (gpu ? "by free memory" : null),
    ...(plan.placement.cpuMoe ? { cpu_moe: true } : {}),
    ...(plan.placement.nCpuMoe ? { n_cpu_moe: plan.placement.nCpuMoe } : {}),
    overrides: plan.overrides.map((o) => ({
      pattern: o.pattern,
      device: o.device,
      from: o.from,
      tensors: o.tensors,
      bytes: o.bytes,
      ...(allocated ? { placed: Object.fromEntries(placed[plan.overrides.indexOf(o)]) } : {}),
    })),
  };
}

/** Planned and allocated memory of a model in MiB (`/health`). */
function memoryReport(plan: ModelPlan, a: LlamaAllocations): Record<string, unknown> {
  const mib = (r: Record<string, number>) =>
    Object.fromEntries(Object.entries(r).map(([k, v]) => [k, Math.round(v / 1024 / 1024 * 10) / 10]));
  return {
    planned: planMiB(plan.devices),
    allocated: {
      model: mib(a.model),
      kv: mib(a.kv),
      recurrent: mib(a.recurrent),
      output: mib(a.output),
      compute: mib(a.compute),
    },
  };
}

/**
 * `system_fingerprint`: the engine build and a digest of the model file (its size and first 4 MiB:
 * reading a 20 GB file at every start would take a minute), so clients see when either changes.
 */
async function modelFingerprint(path: string, engine: string): Promise<string> {
  const file = await Deno.open(path);
  try {
    const head = new Uint8Array(4 << 20);
    let n = 0;
    while (n < head.length) {
      const r = await file.read(head.subarray(n));
      if (r === null) break;
      n += r;
    }
    const size = (await file.stat()).size;
    const data = new Uint8Array(n + 8);
    data.set(head.subarray(0, n));
    new DataView(data.buffer).setBigUint64(n, BigInt(size), true);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
    const hex = [...digest.slice(0, 5)].map((b) => b.toString(16).padStart(2, "0")).join("");
    return `fp_${engine}_${hex}`;
  } finally {
    file.close();
  }
}

/**
 * The devices the server would load on: the GPUs of the `--gpu` build that are here (capped by
 * `--vram`) and host memory; or, with `--plan --vram`, GPUs that are not here.
 *
 * @example
 * ```ts
 * import type { Config } from "../config.ts";
 * import { silentLogger } from "../log.ts";
 * async function devicesFor(config: Config) {
 *   return await planDevices(config, silentLogger); // [...GPUs, host memory]
 * }
 * ```
 */
export async function planDevices(config: Config, log: Logger): Promise<PlanDevice[]> {
  const host = await hostDevice(config);
  if (config.plan && config.vram) return [...plannedGpus(config), host];
  if (config.gpu === "cpu") {
    if (config.vram) {
      throw new Error("--vram: --gpu cpu uses no GPU (with --plan, --vram plans GPUs that are not here)");
    }
    return [host];
  }
  const llama = await llamaRuntime(config.gpu, log);
  const gpus = llama.gpu ? presentGpus(backendDevices(openLlamaLibrary()), config) : [];
  if (config.vram && gpus.length === 0) {
    throw new Error("--vram: there is no GPU here (with --plan, --vram plans GPUs that are not here)");
  }
  return [...gpus, host];
}
