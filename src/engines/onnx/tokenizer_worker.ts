/**
 * The ONNX embedding models' tokenizer, on a worker thread of its own: the tokenizer is JavaScript,
 * and building it from Qwen3's 11 MB `tokenizer.json` held the server's thread 0.3-0.4 s at start
 * (parse 80-120 ms, build 210-270 ms, the vocabulary's size 70 ms), `/health` with it; one 7.8 MB
 * input tokenized on that thread held it 10-15 s. Every text and id list goes through here, a
 * request's texts in one message (a round trip costs the server's thread 15-60 µs). Messages: see {@link TokenizerRequest} and
 * {@link TokenizerReply}.
 */
import { Tokenizer } from "@huggingface/tokenizers";
import { Markup, type MarkupToken } from "../markup.ts";

/**
 * What the engine asks of the worker. `tokenize`: the ids of each client text (see
 * {@link tokenize}); with `limit`, a text's ids stop once there are more than `limit`.
 */
export type TokenizerRequest =
  | { type: "load"; tokenizerPath: string }
  | { type: "tokenize"; id: number; texts: string[]; limit?: number }
  | { type: "decode"; id: number; ids: Int32Array };

/** What the tokenizer's files say, for the engine (answer to `load`). */
export interface TokenizerFacts {
  /** One past the largest id of the vocabulary and the added tokens. */
  vocabSize: number;
  /** The padding token (the config's `pad_token`, else `<|endoftext|>`, else 0). */
  pad: number;
  /** The added tokens: the tokenizer matches every one of them in text, special or not. */
  markup: MarkupToken[];
  /** The ids the tokenizer's post-processor puts before and after a text's own (e.g. BERT's [CLS] … [SEP]). */
  wrap: { before: number[]; after: number[] };
}

/** What the worker answers (`id` -1: to `load`). */
export type TokenizerReply =
  | { type: "loaded"; id: -1; facts: TokenizerFacts }
  /** Every text's ids one after the other; `lengths`: how many each. */
  | { type: "ids"; id: number; ids: Int32Array; lengths: Int32Array }
  | { type: "text"; id: number; text: string }
  | { type: "error"; id: number; message: string };

let tokenizer: Tokenizer | undefined;
let markup: Markup | undefined;
let wrap: TokenizerFacts["wrap"] = { before: [], after: [] };

/** The worker's global scope (Deno's default types describe a window). */
const scope = self as unknown as {
  onmessage: ((event: MessageEvent<TokenizerRequest>) => void) | null;
  postMessage(reply: TokenizerReply, transfer?: Transferable[]): void;
};

scope.onmessage = (e: MessageEvent<TokenizerRequest>) => {
  const req = e.data;
  const id = req.type === "load" ? -1 : req.id;
  try {
    if (req.type === "load") {
      scope.postMessage({ type: "loaded", id: -1, facts: load(req.tokenizerPath) } satisfies TokenizerReply);
      return;
    }
    if (req.type === "decode") {
      const text = tokenizer!.decode(Array.from(req.ids), { skip_special_tokens: false });
      scope.postMessage({ type: "text", id, text } satisfies TokenizerReply);
      return;
    }
    const all: number[] = [];
    const lengths = new Int32Array(req.texts.length);
    req.texts.forEach((text, i) => {
      const ids = tokenize(text, req.limit ?? Infinity);
      lengths[i] = ids.length;
      for (const t of ids) all.push(t);
    });
    const ids = Int32Array.from(all);
    scope.postMessage({ type: "ids", id, ids, lengths } satisfies TokenizerReply, [
      ids.buffer,
      lengths.buffer,
    ]);
  } catch (err) {
    scope.postMessage({ type: "error", id, message: (err as Error).message } satisfies TokenizerReply);
  }
};

/**
 * The ids of client text: text holding markup strings is cut into fragments that hold none (see
 * `Markup.fragments`), each encoded without special tokens, between the post-processor's own; other
 * text is encoded whole. Past `limit` only the first ids past it are wanted (a 7.6 MB text: 4
 * million ids to copy): at most `limit` + 1 are returned.
 */
function tokenize(text: string, limit: number): number[] {
  if (!markup!.holdsCut(text)) {
    const ids = tokenizer!.encode(text, { add_special_tokens: true }).ids;
    return ids.length > limit + 1 ? ids.slice(0, limit + 1) : ids;
  }
  const out = [...wrap.before];
  for (const fragment of markup!.fragments(text)) {
    if (out.length > limit) return out.slice(0, limit + 1);
    for (const id of tokenizer!.encode(fragment, { add_special_tokens: false }).ids) out.push(id);
  }
  out.push(...wrap.after);
  return out.length > limit + 1 ? out.slice(0, limit + 1) : out;
}

/** Builds the tokenizer from `tokenizer.json` (and a `tokenizer_config.json` beside it); its facts. */
function load(tokenizerPath: string): TokenizerFacts {
  const json = JSON.parse(Deno.readTextFileSync(tokenizerPath));
  let config: { pad_token?: string | { content: string } } = {};
  try {
    config = JSON.parse(
      Deno.readTextFileSync(tokenizerPath.replace(/tokenizer\.json$/, "tokenizer_config.json")),
    );
  } catch { /* none */ }
  tokenizer = new Tokenizer(json, config as object);
  const vocab: Record<string, number> = json.model?.vocab ?? {};
  const added: { id: number; content: string }[] = json.added_tokens ?? [];
  let vocabSize = 0;
  for (const k in vocab) vocabSize = Math.max(vocabSize, vocab[k] + 1);
  for (const a of added) vocabSize = Math.max(vocabSize, a.id + 1);
  const padName = config.pad_token ?? "<|endoftext|>";
  const pad =
    added.find((a) => a.content === (typeof padName === "string" ? padName : padName.content))?.id ?? 0;
  // The tokenizer matches every added token in text, special or not.
  const tokens = added.map((a) => ({ id: a.id, text: a.content, matchedInText: true }));
  markup = new Markup(tokens);
  wrap = postProcessorWrap(tokenizer);
  return { vocabSize, pad, markup: tokens, wrap };
}

/** The ids the tokenizer's post-processor adds before and after a text's own. */
function postProcessorWrap(tokenizer: Tokenizer): { before: number[]; after: number[] } {
  const full = tokenizer.encode("a").ids;
  const bare = tokenizer.encode("a", { add_special_tokens: false }).ids;
  const at = full.findIndex((_, i) => bare.every((id, k) => full[i + k] === id));
  if (at < 0) return { before: [], after: [] };
  return { before: full.slice(0, at), after: full.slice(at + bare.length) };
}
