/**
 * GGUF headers for the plan, from every kind of model source, without loading (or generating, or
 * downloading) weights: a file's header is read; a built-in preset's and a shipped `shape:` header
 * are built in memory from the same code that writes the generated GGUF files.
 *
 * `shape:` sources are header-only descriptions of the spec's production models, for planning a
 * GPU before their weights are downloaded. They can be planned, never served.
 */
import { type GgufHeader, type MetaScalar, readGgufHeader, tensorBytesOf } from "./gguf_header.ts";
import { type MetaValue, TENSOR_TYPES, type TensorSpec, type TensorType } from "../models/gguf_writer.ts";
import { GENERATOR_VERSION, PRESETS, QWEN36_35B_A3B } from "../models/presets.ts";
import { ONNX_PRESETS } from "../models/onnx_writer.ts";
import { loadQwen3Vocab } from "../models/qwen3_vocab.ts";
import { qwen35moeGguf, type Qwen35MoePreset } from "../models/qwen35moe_gguf.ts";
import { qwen3Gguf, type Qwen3Preset } from "../models/qwen3_gguf.ts";
import { hubCachePath, parseHubRef } from "../models/hub.ts";

/**
 * The production models' shapes (checked against their published `config.json`):
 * Qwen3.6-35B-A3B (`Qwen3_5MoeForConditionalGeneration` text config) and Qwen3-Embedding-8B
 * (`Qwen3ForCausalLM`, no LM head: llama.cpp uses the token table as the head).
 */
export const SHAPES: Record<string, Qwen35MoePreset | Qwen3Preset> = {
  /** 40 layers (30 Gated DeltaNet + 10 gated attention), 256 experts of 512, 8 routed + 1 shared. */
  "qwen3.6-35b-a3b": { ...QWEN36_35B_A3B },
  /** 36 layers, hidden 4096, 32 Q / 8 KV heads of 128, FFN 12,288, 40,960 positions. */
  "qwen3-embedding-8b": {
    arch: "qwen3",
    kind: "embedding",
    dim: 4096,
    layers: 36,
    heads: 32,
    kvHeads: 8,
    headDim: 128,
    ffn: 12288,
    contextLength: 40960,
    type: "Q8_0",
    seed: 0,
  },
};

/** The generator's metadata and tensors as a header (no data produced). */
export function headerOf(metadata: Record<string, MetaValue>, tensors: readonly TensorSpec[]): GgufHeader {
  const meta: Record<string, MetaScalar> = {};
  for (const [k, v] of Object.entries(metadata)) {
    meta[k] = v.type === "string[]"
      ? { arrayOf: 8, length: v.value.length }
      : v.type === "i32[]"
      ? Array.from(v.value)
      : v.value;
  }
  return {
    metadata: meta,
    tensors: tensors.map((t) => {
      const type = TENSOR_TYPES[t.type];
      return { name: t.name, dims: [...t.dims], type, bytes: tensorBytesOf(type, t.dims) };
    }),
  };
}

/** The in-memory header of a generator preset at weight type `type` (default: its own). */
export async function presetHeader(
  name: string,
  p: Qwen35MoePreset | Qwen3Preset,
  type?: TensorType,
): Promise<GgufHeader> {
  const preset = type ? { ...p, type } : p;
  const vocab = await loadQwen3Vocab();
  const { metadata, tensors } = preset.arch === "qwen35moe"
    ? qwen35moeGguf(name, preset, vocab)
    : qwen3Gguf(name, preset, vocab);
  return headerOf(metadata, tensors);
}

/** Parses `shape:NAME[@TYPE]`; throws listing the shapes. */
export function parseShapeSource(
  source: string,
): { name: string; preset: Qwen35MoePreset | Qwen3Preset; type?: TensorType } {
  const m = source.match(/^shape:([\w.-]+?)(?:@(\w+))?$/);
  const preset = m ? SHAPES[m[1].toLowerCase()] : undefined;
  if (!m || !preset) {
    throw new Error(
      `unknown shape '${source}' (known: ${Object.keys(SHAPES).map((s) => `shape:${s}`).join(", ")})`,
    );
  }
  const type = m[2]?.toUpperCase();
  if (type !== undefined && !(type in TENSOR_TYPES)) {
    throw new Error(`'${source}': a shape's weight type is one of ${Object.keys(TENSOR_TYPES).join(", ")}`);
  }
  return { name: m[1].toLowerCase(), preset, type: type as TensorType | undefined };
}

/** Where a model's header comes from, for the plan. */
export type HeaderSource =
  | { kind: "gguf"; header: GgufHeader; origin: string }
  | { kind: "onnx"; bytes?: number; origin: string }
  /** An `hf:` file not downloaded yet (or a header that cannot be read: `reason`): planned at its load. */
  | { kind: "pending"; origin: string; reason?: string };

/**
 * The header of `source` (a file path, `builtin:`, `shape:` or `hf:` reference) without loading,
 * generating or downloading weights.
 *
 * @example
 * ```ts
 * const h = await headerForSource("shape:qwen3.6-35b-a3b", "models/cache");
 * ```
 */
export async function headerForSource(source: string, cacheDir: string): Promise<HeaderSource> {
  if (source.startsWith("shape:")) {
    const { name, preset, type } = parseShapeSource(source);
    return {
      kind: "gguf",
      header: await presetHeader(name, preset, type),
      origin: `${source} (header only)`,
    };
  }
  if (source.startsWith("builtin:")) {
    const name = source.slice("builtin:".length);
    if (ONNX_PRESETS[name]) {
      const path = `${cacheDir}/builtin/${name}-g${GENERATOR_VERSION}.onnx`;
      return { kind: "onnx", bytes: (await Deno.stat(path).catch(() => null))?.size, origin: source };
    }
    const preset = PRESETS[name];
    if (!preset) throw new Error(`unknown builtin preset '${name}'`);
    // Generated already: its header (the same as the preset's, and faster than building the vocabulary).
    const path = `${cacheDir}/builtin/${name}-g${GENERATOR_VERSION}.gguf`;
    if ((await Deno.stat(path).catch(() => null))?.isFile) {
      return { kind: "gguf", header: await readGgufHeader(path), origin: path };
    }
    return { kind: "gguf", header: await presetHeader(name, preset), origin: `${source} (to be generated)` };
  }
  let path = source.startsWith("file:") ? new URL(source).pathname : source;
  if (source.startsWith("hf:")) {
    path = hubCachePath(cacheDir, parseHubRef(source));
    if (!(await Deno.stat(path).catch(() => null))?.isFile) return { kind: "pending", origin: source };
  }
  if (/\.onnx$/i.test(path)) return { kind: "onnx", bytes: (await Deno.stat(path)).size, origin: path };
  return { kind: "gguf", header: await readGgufHeader(path), origin: path };
}
