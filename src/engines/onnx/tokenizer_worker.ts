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
  | { type: "load"; tokenizerJson: unknown; tokenizerConfig: unknown; markup: readonly MarkupToken[] }
  | { type: "encode"; id: number; text: string; addSpecialTokens: boolean; plain?: boolean };

/** What the worker answers. */
export type TokenizerReply =
  | { type: "ids"; id: number; ids: Int32Array }
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
    tokenizer = new Tokenizer(req.tokenizerJson as object, req.tokenizerConfig as object);
    markup = new Markup(req.markup);
    return;
  }
  try {
    const out: number[] = [];
    for (const text of req.plain ? markup!.fragments(req.text) : [req.text]) {
      for (const id of tokenizer!.encode(text, { add_special_tokens: req.addSpecialTokens }).ids) {
        out.push(id);
      }
    }
    const ids = Int32Array.from(out);
    scope.postMessage({ type: "ids", id: req.id, ids } satisfies TokenizerReply, [ids.buffer]);
  } catch (err) {
    scope.postMessage(
      { type: "error", id: req.id, message: (err as Error).message } satisfies TokenizerReply,
    );
  }
};
