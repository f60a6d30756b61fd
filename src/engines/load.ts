/** Picks and loads the engine implementation for a registry entry. */
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import type { ModelSpec } from "../registry.ts";
import type { ChatEngine, EmbeddingEngine } from "./types.ts";
import { resolveSource } from "../models/sources.ts";
import { qwen3TokenizerJsonPath } from "../models/qwen3_vocab.ts";
import { engineThreads, llamaRuntime, resolveGpuLayers } from "./llama/runtime.ts";
import { openLlamaLibrary } from "./llama/ffi.ts";
import { LlamaEmbeddingEngine } from "./llama/embedding.ts";
import { LlamaChatEngine } from "./llama/chat.ts";
import { OnnxEmbeddingEngine } from "./onnx/embedding.ts";
import { openUpstreamEngine } from "../upstream/load.ts";

/**
 * Loads the engine for `spec`; server-wide settings (threads, gpu, ctx size, parallel) override
 * the registry entry when given on the command line, in the environment or config file.
 */
export async function loadEngine(
  spec: ModelSpec,
  config: Config,
  log: Logger,
  report: (details: Record<string, unknown>) => void,
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
      spec.backend === "onnx" ? "onnxruntime-1.30.0" : "llamacpp-v0.4.0",
    ),
  });
  const threads = engineThreads(spec.threads ?? config.threads);
  const gpuLayers = config.gpuLayers ?? spec.gpuLayers;
  const parallel = config.parallel ?? spec.parallel;
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
      log,
    });
    report({ backend: "onnx", execution_provider: provider, threads, dims: engine.nativeDims });
    return engine;
  }
  const llama = await llamaRuntime(config.gpu, log);
  const lib = openLlamaLibrary();
  const layers = await resolveGpuLayers(llama, path, gpuLayers);
  report({
    backend: "llama",
    gpu: llama.gpu || "cpu",
    gpu_layers: layers,
    threads,
    parallel,
    flash_attn: config.flashAttn,
  });
  if (spec.kind === "embedding") {
    const engine = await LlamaEmbeddingEngine.load(lib, {
      modelPath: path,
      gpuLayers: layers,
      threads,
      maxInputTokens: spec.maxInputTokens ?? 8192,
      pooling: spec.pooling,
      flashAttention: config.flashAttn,
    });
    report({ dims: engine.nativeDims, pooling: engine.pooling });
    return engine;
  }
  const contextSize = config.ctxSize ?? spec.contextSize ?? 32768;
  const engine = await LlamaChatEngine.load(lib, {
    modelPath: path,
    gpuLayers: layers,
    threads,
    parallel,
    contextSize,
    toolFormat: spec.toolFormat,
    batchSequences: spec.batchSequences,
    flashAttention: config.flashAttn,
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
  return engine;
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
