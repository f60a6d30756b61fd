/**
 * Qwen3-architecture (`qwen3`) GGUF models with random deterministic weights: the chat and
 * embedding stand-ins (tiny-*, bench-*, spec-embed).
 */
import type { MetaValue, TensorSpec, TensorType } from "./gguf_writer.ts";
import { type Qwen3Vocab, tokenizerMetadata } from "./qwen3_vocab.ts";
import { matrix, vector } from "./weights.ts";

/** The shape of a generated Qwen3 model. */
export interface Qwen3Preset {
  arch: "qwen3";
  kind: "chat" | "embedding";
  dim: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  ffn: number;
  contextLength: number;
  type: TensorType;
  seed: number;
}

/**
 * The tensors of a Qwen3 model.
 *
 * Embedding models zero the q/k norms, so causal attention is uniform and the last token carries
 * the mean of the values: last-token pooling then reflects the whole text instead of collapsing
 * every input onto the EOS token's vector. Their token table stays tied (no `output.weight`).
 *
 * Chat models get an untied output head: with a tied one the residual stream keeps the last
 * token's own embedding on top, so greedy decoding repeats the last prompt token (a newline)
 * forever. Rows of tokens that print nothing (special, whitespace-only) are small there, so the
 * argmax is visible text; the logit spread (std ≈ 2) keeps sampling at temperature 1 varied.
 */
function qwen3Tensors(p: Qwen3Preset, vocab: Qwen3Vocab): TensorSpec[] {
  const q = p.heads * p.headDim;
  const kv = p.kvHeads * p.headDim;
  const embed = p.kind === "embedding";
  const n = vocab.tokens.length;
  const isSpecial = (row: number) => vocab.tokenTypes[row] !== 1;
  const tensors: TensorSpec[] = [
    // Special tokens get small embeddings so that they do not dominate pooled vectors.
    matrix(p, "token_embd.weight", [p.dim, n], 1, (row) => isSpecial(row) ? 0.05 : 1),
  ];
  for (let l = 0; l < p.layers; l++) {
    const b = `blk.${l}`;
    tensors.push(
      vector(`${b}.attn_norm.weight`, p.dim, 1),
      matrix(p, `${b}.attn_q.weight`, [p.dim, q], 1 / Math.sqrt(p.dim)),
      matrix(p, `${b}.attn_k.weight`, [p.dim, kv], 1 / Math.sqrt(p.dim)),
      matrix(p, `${b}.attn_v.weight`, [p.dim, kv], 1 / Math.sqrt(p.dim)),
      vector(`${b}.attn_q_norm.weight`, p.headDim, embed ? 0 : 1),
      vector(`${b}.attn_k_norm.weight`, p.headDim, embed ? 0 : 1),
      matrix(p, `${b}.attn_output.weight`, [q, p.dim], (embed ? 2 : 1) / Math.sqrt(q)),
      vector(`${b}.ffn_norm.weight`, p.dim, 1),
      matrix(p, `${b}.ffn_gate.weight`, [p.dim, p.ffn], 1 / Math.sqrt(p.dim)),
      matrix(p, `${b}.ffn_up.weight`, [p.dim, p.ffn], 1 / Math.sqrt(p.dim)),
      matrix(p, `${b}.ffn_down.weight`, [p.ffn, p.dim], (embed ? 0.1 : 1) / Math.sqrt(p.ffn)),
    );
  }
  tensors.push(vector("output_norm.weight", p.dim, 1));
  if (!embed) {
    tensors.push(
      matrix(p, "output.weight", [p.dim, n], 2 / Math.sqrt(p.dim), (row) => vocab.quiet[row] ? 0.1 : 1),
    );
  }
  return tensors;
}

/**
 * The metadata and tensors of Qwen3 preset `p` named `name`.
 *
 * @example
 * ```ts
 * import { loadQwen3Vocab } from "./qwen3_vocab.ts";
 * import { writeGguf } from "./gguf_writer.ts";
 * async function write(preset: Qwen3Preset) {
 *   const { metadata, tensors } = qwen3Gguf("tiny-chat", preset, await loadQwen3Vocab());
 *   await writeGguf("tiny-chat.gguf", metadata, tensors);
 * }
 * ```
 */
export function qwen3Gguf(
  name: string,
  p: Qwen3Preset,
  vocab: Qwen3Vocab,
): { metadata: Record<string, MetaValue>; tensors: TensorSpec[] } {
  const u32 = (value: number): MetaValue => ({ type: "u32", value });
  const f32 = (value: number): MetaValue => ({ type: "f32", value });
  const str = (value: string): MetaValue => ({ type: "string", value });
  const embed = p.kind === "embedding";
  const metadata: Record<string, MetaValue> = {
    "general.architecture": str("qwen3"),
    "general.name": str(`vserve ${name} (generated weights, meaningless output)`),
    "general.type": str("model"),
    "general.file_type": u32(p.type === "Q8_0" ? 7 : p.type === "F16" ? 1 : 0),
    "general.license": str("apache-2.0"),
    "general.alignment": u32(32),
    "qwen3.context_length": u32(p.contextLength),
    "qwen3.embedding_length": u32(p.dim),
    "qwen3.block_count": u32(p.layers),
    "qwen3.feed_forward_length": u32(p.ffn),
    "qwen3.attention.head_count": u32(p.heads),
    "qwen3.attention.head_count_kv": u32(p.kvHeads),
    "qwen3.attention.key_length": u32(p.headDim),
    "qwen3.attention.value_length": u32(p.headDim),
    "qwen3.attention.layer_norm_rms_epsilon": f32(1e-6),
    "qwen3.rope.freq_base": f32(1_000_000),
    ...(embed ? { "qwen3.pooling_type": u32(3) } : {}),
    ...tokenizerMetadata(vocab, {
      eos: embed ? vocab.endOfText : vocab.imEnd,
      chatTemplate: vocab.chatTemplate,
    }),
  };
  return { metadata, tensors: qwen3Tensors(p, vocab) };
}
