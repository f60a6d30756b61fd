/**
 * The ONNX embedding models' tokenizer, in a worker of its own for long texts: the tokenizer is
 * JavaScript, and one 7.8 MB input tokenized on the server's thread held it (and `/health`) for
 * 10-15 s before its 400. Built from the same `tokenizer.json` as the engine's own, so a text gets
 * the same ids here as there. Messages: see {@link TokenizerRequest} and {@link TokenizerReply}.
 */
import { Tokenizer } from "@huggingface/tokenizers";
import { Markup, type MarkupToken } from "../markup.ts";

/**
 * What the engine asks of the worker. `plain`: the text is client text, cut into fragments that
 * hold no markup string (see `Markup.fragments`), each encoded without special tokens.
 */
export type TokenizerRequest =
  | { type: "load"; tokenizerPath: string; tokenizerConfig: unknown; markup: readonly MarkupToken[] }
  | { type: "encode"; id: number; text: string; addSpecialTokens: boolean; plain?: boolean; limit?: number }
  | { type: "decode"; id: number; ids: Int32Array };

/** What the worker answers. */
export type TokenizerReply =
  | { type: "ids"; id: number; ids: Int32Array }
  | { type: "text"; id: number; text: string }
  | { type: "error"; id: number; message: string };

let tokenizer: Tokenizer | undefined;
let markup: Markup | undefined;

/** The worker's global scope (Deno's default types describe a window). */
const scope = self as unknown as {
  onmessage: ((event: MessageEvent<TokenizerRequest>) => void) | null;
  postMessage(reply: TokenizerReply, transfer?: Transferable[]): void;
};

scope.onmessage = (e: MessageEvent<TokenizerRequest>) => {
  const req = e.data;
  if (req.type === "load") {
    tokenizer = new Tokenizer(
      JSON.parse(Deno.readTextFileSync(req.tokenizerPath)),
      req.tokenizerConfig as object,
    );
    markup = new Markup(req.markup);
    return;
  }
  try {
    if (req.type === "decode") {
      const text = tokenizer!.decode(Array.from(req.ids), { skip_special_tokens: false });
      scope.postMessage({ type: "text", id: req.id, text } satisfies TokenizerReply);
      return;
    }
    // With a limit, only the first ids past it are wanted (a 7.6 MB text: 4 million ids to copy).
    const limit = req.limit ?? Infinity;
    const out: number[] = [];
    for (const text of req.plain ? markup!.fragments(req.text) : [req.text]) {
      if (out.length > limit) break;
      for (const id of tokenizer!.encode(text, { add_special_tokens: req.addSpecialTokens }).ids) {
        out.push(id);
      }
    }
    const ids = Int32Array.from(out.length > limit + 1 ? out.slice(0, limit + 1) : out);
    scope.postMessage({ type: "ids", id: req.id, ids } satisfies TokenizerReply, [ids.buffer]);
  } catch (err) {
    scope.postMessage(
      { type: "error", id: req.id, message: (err as Error).message } satisfies TokenizerReply,
    );
  }
};
