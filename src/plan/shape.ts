/**
 * What the memory plan needs to know about a model, read from its GGUF header: the tensors by
 * layer and group, which layers keep a KV cache and which keep a recurrent state, and the widths
 * that size the compute buffers.
 */
import type { GgufHeader, MetaScalar } from "./gguf_header.ts";

/** Weight groups the plan reports. */
export const GROUPS = [
  "embeddings",
  "attention",
  "linear_attention",
  "ffn",
  "experts",
  "shared_expert",
  "norms",
  "output",
] as const;
export type TensorGroup = (typeof GROUPS)[number];

/** A tensor with its layer (`input`: token table; `output`: head and final norm) and group. */
export interface ShapeTensor {
  name: string;
  bytes: number;
  type: number;
  dims: number[];
  layer: number | "input" | "output";
  group: TensorGroup;
}

/** A model's shape, as the plan uses it. */
export interface ModelShape {
  arch: string;
  nLayer: number;
  nEmbd: number;
  nVocab: number;
  nHead: number;
  nCtxTrain: number;
  /** Layers with a KV cache, and the K and V values one token takes in each (elements). */
  attentionLayers: { layer: number; kValues: number; vValues: number }[];
  /** Layers with a recurrent state, and its two parts per sequence (F32 elements). */
  recurrentLayers: { layer: number; convValues: number; stateValues: number }[];
  /** Routed experts: count, used per token, width; absent for dense models. */
  experts?: { count: number; used: number; width: number; sharedWidth: number };
  /** Dense FFN width (0 for MoE layers). */
  ffnWidth: number;
  /** The GGUF's own pooling (`last`, `mean`, `cls`), if it says. */
  pooling?: "last" | "mean" | "cls";
  /** No `output.weight`: llama.cpp uses the token table as the head (a copy where the head is offloaded). */
  tiedOutput: boolean;
  tensors: ShapeTensor[];
  /** The most common weight type (`Q8_0`, …), for the report. */
  mainType: number;
}

function num(v: MetaScalar | undefined): number | undefined {
  if (typeof v === "number") return v;
  if (typeof v === "bigint") return Number(v);
  return undefined;
}

/** A per-layer value that GGUF stores as one number or an array. */
function perLayer(v: MetaScalar | undefined, layer: number, fallback: number): number {
  if (Array.isArray(v)) return v[layer] ?? fallback;
  return num(v) ?? fallback;
}

function groupOf(name: string, recurrentLayer: boolean): TensorGroup {
  if (/^token_embd\./.test(name)) return "embeddings";
  if (/^output(_norm)?\./.test(name)) return "output";
  if (/_(ch)?exps\b|\.ffn_gate_inp\.|\.ffn_exp_probs_b/.test(name)) return "experts";
  if (/shexp/.test(name)) return "shared_expert";
  if (/\.ffn_(gate|up|down)\./.test(name)) return "ffn";
  if (/norm/.test(name) && !/\.ssm_norm\./.test(name) && !/attn_[qk]_norm/.test(name)) return "norms";
  if (/\.ssm_/.test(name) || (recurrentLayer && /\.attn_(qkv|gate)\./.test(name))) return "linear_attention";
  return "attention";
}

const POOLING: Record<number, "mean" | "cls" | "last"> = { 1: "mean", 2: "cls", 3: "last" };

/**
 * The shape of the model whose header is `header`; throws naming what is missing.
 *
 * @example
 * ```ts
 * import { readGgufHeader } from "./gguf_header.ts";
 * async function attentionLayers(path: string) {
 *   const shape = modelShape(await readGgufHeader(path));
 *   return shape.attentionLayers.length; // 10 for a Qwen3.6-35B-A3B
 * }
 * ```
 */
export function modelShape(header: GgufHeader): ModelShape {
  const m = header.metadata;
  const arch = m["general.architecture"];
  if (typeof arch !== "string") throw new Error("the GGUF header has no general.architecture");
  const key = (k: string) => m[`${arch}.${k}`];
  const nLayer = num(key("block_count"));
  const nEmbd = num(key("embedding_length"));
  if (!nLayer || !nEmbd) throw new Error(`the GGUF header has no ${arch}.block_count / embedding_length`);
  const nHead = perLayer(key("attention.head_count"), 0, 1);
  const headKv = key("attention.head_count_kv");
  const kLen = num(key("attention.key_length")) ?? Math.floor(nEmbd / nHead);
  const vLen = num(key("attention.value_length")) ?? kLen;
  const tokenTable = header.tensors.find((t) => t.name === "token_embd.weight");
  const tokens = m["tokenizer.ggml.tokens"];
  const nVocab = tokenTable?.dims[1] ??
    (typeof tokens === "object" && !Array.isArray(tokens) ? tokens.length : 0);

  const layerOf = (name: string): number | "input" | "output" => {
    const hit = name.match(/^blk\.(\d+)\./);
    if (hit) return Number(hit[1]);
    return /^(token_embd|token_types|position_embd)\./.test(name) ? "input" : "output";
  };
  const names = new Map<number, string[]>();
  for (const t of header.tensors) {
    const l = layerOf(t.name);
    if (typeof l === "number") names.set(l, [...(names.get(l) ?? []), t.name]);
  }
  const isRecurrent = (l: number) => (names.get(l) ?? []).some((n) => /\.ssm_/.test(n));
  const hasAttention = (l: number) => (names.get(l) ?? []).some((n) => /\.attn_(k|kv_a_mqa|qkv)\./.test(n));

  // Mamba-2 style state (Qwen3-Next / Qwen3.5 Gated DeltaNet, Mamba-2): llama.cpp's n_embd_r / n_embd_s.
  const dConv = num(key("ssm.conv_kernel")) ?? 0;
  const dState = num(key("ssm.state_size")) ?? 0;
  const dInner = num(key("ssm.inner_size")) ?? 0;
  const nGroup = num(key("ssm.group_count")) ?? 0;
  const attentionLayers: ModelShape["attentionLayers"] = [];
  const recurrentLayers: ModelShape["recurrentLayers"] = [];
  for (let l = 0; l < nLayer; l++) {
    if (isRecurrent(l)) {
      recurrentLayers.push({
        layer: l,
        convValues: Math.max(0, dConv - 1) * (dInner + 2 * nGroup * dState),
        stateValues: dState * dInner,
      });
    } else if (hasAttention(l)) {
      const kv = perLayer(headKv, l, nHead);
      attentionLayers.push({ layer: l, kValues: kv * kLen, vValues: kv * vLen });
    }
  }

  const tensors: ShapeTensor[] = header.tensors.map((t) => {
    const layer = layerOf(t.name);
    return {
      name: t.name,
      bytes: t.bytes,
      type: t.type,
      dims: t.dims,
      layer,
      group: groupOf(t.name, typeof layer === "number" && isRecurrent(layer)),
    };
  });
  const expertCount = num(key("expert_count")) ?? 0;
  const typeBytes = new Map<number, number>();
  for (const t of tensors) typeBytes.set(t.type, (typeBytes.get(t.type) ?? 0) + t.bytes);
  const mainType = [...typeBytes.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? 0;
  return {
    arch,
    nLayer,
    nEmbd,
    nVocab,
    nHead,
    nCtxTrain: num(key("context_length")) ?? 0,
    attentionLayers,
    recurrentLayers,
    experts: expertCount > 0
      ? {
        count: expertCount,
        used: perLayer(key("expert_used_count"), 0, 1),
        width: num(key("expert_feed_forward_length")) ?? 0,
        sharedWidth: num(key("expert_shared_feed_forward_length")) ?? 0,
      }
      : undefined,
    ffnWidth: expertCount > 0 ? 0 : perLayer(key("feed_forward_length"), 0, 4 * nEmbd),
    pooling: POOLING[num(key("pooling_type")) ?? -1],
    tiedOutput: !header.tensors.some((t) => t.name === "output.weight"),
    tensors,
    mainType,
  };
}
