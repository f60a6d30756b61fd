/**
 * The ONNX embedding models' tokenizer, in a worker of its own for long texts: the tokenizer is
 * JavaScript, and one 7.8 MB input tokenized on the server's thread held it (and `/health`) for
 * 10-15 s before its 400. Built from the same `tokenizer.json` as the engine's own, so a text gets
 * the same ids here as there. Messages: see {@link TokenizerRequest} and {@link TokenizerReply}.
 */
import { Tokenizer } from "@huggingface/tokenizers";

/** What the engine asks of the worker. */
export type TokenizerRequest =
  | { type: "load"; tokenizerJson: unknown; tokenizerConfig: unknown }
  | { type: "encode"; id: number; text: string; addSpecialTokens: boolean };

/** What the worker answers. */
export type TokenizerReply =
  | { type: "ids"; id: number; ids: Int32Array }
  | { type: "error"; id: number; message: string };

let tokenizer: Tokenizer | undefined;

/** The worker's global scope (Deno's default types describe a window). */
const scope = self as unknown as {
  onmessage: ((event: MessageEvent<TokenizerRequest>) => void) | null;
  postMessage(reply: TokenizerReply, transfer?: Transferable[]): void;
};

scope.onmessage = (e: MessageEvent<TokenizerRequest>) => {
  const req = e.data;
  if (req.type === "load") {
    tokenizer = new Tokenizer(req.tokenizerJson as object, req.tokenizerConfig as object);
    return;
  }
  try {
    const ids = Int32Array.from(
      tokenizer!.encode(req.text, { add_special_tokens: req.addSpecialTokens }).ids,
    );
    scope.postMessage({ type: "ids", id: req.id, ids } satisfies TokenizerReply, [ids.buffer]);
  } catch (err) {
    scope.postMessage(
      { type: "error", id: req.id, message: (err as Error).message } satisfies TokenizerReply,
    );
  }
};
