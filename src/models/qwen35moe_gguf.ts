/**
 * Qwen3.5/Qwen3.6 MoE (llama.cpp architecture `qwen35moe`) GGUF models with random deterministic
 * weights. Layers repeat (full_attention_interval − 1) Gated DeltaNet linear-attention layers and
 * one gated full-attention layer; every layer's FFN is a softmax-routed MoE plus one gated shared
 * expert. Tensor names, shapes and stored forms follow llama.cpp's loader
 * (`src/models/qwen35moe.cpp`) and converter: `ssm_a` holds −exp(A_log), RMS-norm weights hold
 * the multiplier itself (the converter's +1 already applied), except the gated `ssm_norm`.
 */
import type { MetaValue, TensorSpec, TensorType } from "./gguf_writer.ts";
import { type Qwen3Vocab, tokenizerMetadata } from "./qwen3_vocab.ts";
import { QWEN35_CHAT_TEMPLATE } from "./qwen35_chat_template.ts";
import { matrix, vector } from "./weights.ts";

/** The shape of a generated qwen35moe model. */
export interface Qwen35MoePreset {
  arch: "qwen35moe";
  kind: "chat";
  dim: number;
  layers: number;
  /** Every n-th layer (1-based) is full attention; the others are linear attention. */
  fullAttentionInterval: number;
  /** Full attention: query heads, KV heads, head size, rotated dims and their IMRoPE sections. */
  heads: number;
  kvHeads: number;
  headDim: number;
  ropeDims: number;
  ropeSections: [number, number, number, number];
  ropeBase: number;
  /** Gated DeltaNet: key (= query) heads, value heads, head size (keys and values), conv width. */
  linearKeyHeads: number;
  linearValueHeads: number;
  linearHeadDim: number;
  convKernel: number;
  /** MoE: routed experts in total and per token, expert width, shared expert width. */
  experts: number;
  expertsUsed: number;
  expertFfn: number;
  sharedFfn: number;
  contextLength: number;
  /** Token table rows: the tokenizer's size, or more with unused padding tokens. */
  vocabSize?: number;
  /**
   * Storage of the routers (`ffn_gate_inp`, `ffn_gate_inp_shexp`). Real files keep them F32, and
   * llama.cpp multiplies F32 matrices in a different order for one token (vec_dot) than for
   * several (tinyBLAS): a sequence decoded beside others then differs in the last bits from the
   * same sequence decoded alone. Quantized routers (Q8_0, whose kernels agree) make the tiny
   * stand-in exactly batch-invariant, so tests can compare concurrent output with solo output.
   */
  routerType?: TensorType;
  type: TensorType;
  seed: number;
}

/** Whether layer `l` is a linear-attention (recurrent) layer. */
export function isRecurrentLayer(p: Qwen35MoePreset, l: number): boolean {
  return (l + 1) % p.fullAttentionInterval !== 0;
}

function attentionTensors(p: Qwen35MoePreset, b: string): TensorSpec[] {
  const q = p.heads * p.headDim;
  const kv = p.kvHeads * p.headDim;
  return [
    // One projection gives each head's query followed by its output gate.
    matrix(p, `${b}.attn_q.weight`, [p.dim, q * 2], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.attn_k.weight`, [p.dim, kv], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.attn_v.weight`, [p.dim, kv], 1 / Math.sqrt(p.dim)),
    vector(`${b}.attn_q_norm.weight`, p.headDim, 1),
    vector(`${b}.attn_k_norm.weight`, p.headDim, 1),
    matrix(p, `${b}.attn_output.weight`, [q, p.dim], 1 / Math.sqrt(q)),
  ];
}

function deltaNetTensors(p: Qwen35MoePreset, b: string): TensorSpec[] {
  const keyDim = p.linearKeyHeads * p.linearHeadDim;
  const valueDim = p.linearValueHeads * p.linearHeadDim;
  const conv = keyDim * 2 + valueDim;
  const hv = p.linearValueHeads;
  return [
    matrix(p, `${b}.attn_qkv.weight`, [p.dim, conv], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.attn_gate.weight`, [p.dim, valueDim], 1 / Math.sqrt(p.dim)),
    vector(`${b}.ssm_conv1d.weight`, [p.convKernel, conv], (start, out) => {
      // A causal conv that mostly passes the current step through, plus some history.
      for (let i = 0; i < out.length; i++) out[i] = (start + i) % p.convKernel === p.convKernel - 1 ? 1 : 0.2;
    }),
    // Per value head: dt bias = softplus⁻¹(dt) for dt spread over [0.001, 0.1], and
    // A = −exp(A_log) spread over [−1, −16], as the reference initialisation draws them.
    vector(`${b}.ssm_dt.bias`, hv, (_s, out) => {
      for (let h = 0; h < hv; h++) out[h] = Math.log(Math.expm1(0.001 * Math.pow(100, (h + 0.5) / hv)));
    }),
    vector(`${b}.ssm_a`, hv, (_s, out) => {
      for (let h = 0; h < hv; h++) out[h] = -(1 + (15 * (h + 0.5)) / hv);
    }),
    matrix(p, `${b}.ssm_beta.weight`, [p.dim, hv], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.ssm_alpha.weight`, [p.dim, hv], 1 / Math.sqrt(p.dim)),
    vector(`${b}.ssm_norm.weight`, p.linearHeadDim, 1),
    matrix(p, `${b}.ssm_out.weight`, [valueDim, p.dim], 1 / Math.sqrt(valueDim)),
  ];
}

function moeTensors(p: Qwen35MoePreset, b: string): TensorSpec[] {
  const e = p.experts;
  return [
    // The router and the shared expert's gate stay F32, as llama.cpp's quantiser leaves them
    // (unless the preset says otherwise, see routerType).
    matrix(
      { ...p, type: p.routerType ?? "F32" },
      `${b}.ffn_gate_inp.weight`,
      [p.dim, e],
      1 / Math.sqrt(p.dim),
    ),
    matrix(p, `${b}.ffn_gate_exps.weight`, [p.dim, p.expertFfn, e], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.ffn_up_exps.weight`, [p.dim, p.expertFfn, e], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.ffn_down_exps.weight`, [p.expertFfn, p.dim, e], 1 / Math.sqrt(p.expertFfn)),
    matrix(
      { ...p, type: p.routerType ?? "F32" },
      `${b}.ffn_gate_inp_shexp.weight`,
      [p.dim],
      1 / Math.sqrt(p.dim),
    ),
    matrix(p, `${b}.ffn_gate_shexp.weight`, [p.dim, p.sharedFfn], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.ffn_up_shexp.weight`, [p.dim, p.sharedFfn], 1 / Math.sqrt(p.dim)),
    matrix(p, `${b}.ffn_down_shexp.weight`, [p.sharedFfn, p.dim], 1 / Math.sqrt(p.sharedFfn)),
  ];
}

/**
 * The tensors of a qwen35moe model. The output head is untied, with small rows for tokens that
 * print nothing (see `Qwen3Vocab.quiet`), so greedy decoding writes visible text and reasoning.
 */
function qwen35moeTensors(p: Qwen35MoePreset, vocab: Qwen3Vocab): TensorSpec[] {
  const n = p.vocabSize ?? vocab.tokens.length;
  const known = vocab.tokens.length;
  const special = (row: number) => row >= known || vocab.tokenTypes[row] !== 1;
  const quiet = (row: number) => row >= known || vocab.quiet[row] === 1;
  const tensors: TensorSpec[] = [
    matrix(p, "token_embd.weight", [p.dim, n], 1, (row) => special(row) ? 0.05 : 1),
  ];
  for (let l = 0; l < p.layers; l++) {
    const b = `blk.${l}`;
    tensors.push(
      vector(`${b}.attn_norm.weight`, p.dim, 1),
      ...(isRecurrentLayer(p, l) ? deltaNetTensors(p, b) : attentionTensors(p, b)),
      vector(`${b}.post_attention_norm.weight`, p.dim, 1),
      ...moeTensors(p, b),
    );
  }
  tensors.push(
    vector("output_norm.weight", p.dim, 1),
    matrix(p, "output.weight", [p.dim, n], 2 / Math.sqrt(p.dim), (row) => quiet(row) ? 0.1 : 1),
  );
  return tensors;
}

/**
 * The metadata and tensors of qwen35moe preset `p` named `name`, with our Qwen3.5-format chat
 * template.
 *
 * @example
 * ```ts
 * import { loadQwen3Vocab } from "./qwen3_vocab.ts";
 * import { writeGguf } from "./gguf_writer.ts";
 * async function write(preset: Qwen35MoePreset) {
 *   const { metadata, tensors } = qwen35moeGguf("tiny-moe", preset, await loadQwen3Vocab());
 *   await writeGguf("tiny-moe.gguf", metadata, tensors);
 * }
 * ```
 */
export function qwen35moeGguf(
  name: string,
  p: Qwen35MoePreset,
  vocab: Qwen3Vocab,
): { metadata: Record<string, MetaValue>; tensors: TensorSpec[] } {
  const u32 = (value: number): MetaValue => ({ type: "u32", value });
  const f32 = (value: number): MetaValue => ({ type: "f32", value });
  const str = (value: string): MetaValue => ({ type: "string", value });
  const a = "qwen35moe";
  const metadata: Record<string, MetaValue> = {
    "general.architecture": str(a),
    "general.name": str(`vserve ${name} (generated weights, meaningless output)`),
    "general.type": str("model"),
    "general.file_type": u32(p.type === "Q8_0" ? 7 : p.type === "F16" ? 1 : 0),
    "general.license": str("apache-2.0"),
    "general.alignment": u32(32),
    [`${a}.context_length`]: u32(p.contextLength),
    [`${a}.embedding_length`]: u32(p.dim),
    [`${a}.block_count`]: u32(p.layers),
    [`${a}.attention.head_count`]: u32(p.heads),
    [`${a}.attention.head_count_kv`]: u32(p.kvHeads),
    [`${a}.attention.key_length`]: u32(p.headDim),
    [`${a}.attention.value_length`]: u32(p.headDim),
    [`${a}.attention.layer_norm_rms_epsilon`]: f32(1e-6),
    [`${a}.rope.freq_base`]: f32(p.ropeBase),
    [`${a}.rope.dimension_count`]: u32(p.ropeDims),
    [`${a}.rope.dimension_sections`]: { type: "i32[]", value: p.ropeSections },
    [`${a}.expert_count`]: u32(p.experts),
    [`${a}.expert_used_count`]: u32(p.expertsUsed),
    [`${a}.expert_feed_forward_length`]: u32(p.expertFfn),
    [`${a}.expert_shared_feed_forward_length`]: u32(p.sharedFfn),
    [`${a}.ssm.conv_kernel`]: u32(p.convKernel),
    [`${a}.ssm.state_size`]: u32(p.linearHeadDim),
    [`${a}.ssm.group_count`]: u32(p.linearKeyHeads),
    [`${a}.ssm.time_step_rank`]: u32(p.linearValueHeads),
    [`${a}.ssm.inner_size`]: u32(p.linearValueHeads * p.linearHeadDim),
    [`${a}.full_attention_interval`]: u32(p.fullAttentionInterval),
    ...tokenizerMetadata(vocab, {
      eos: vocab.imEnd,
      chatTemplate: QWEN35_CHAT_TEMPLATE,
      vocabSize: p.vocabSize,
    }),
  };
  return { metadata, tensors: qwen35moeTensors(p, vocab) };
}
