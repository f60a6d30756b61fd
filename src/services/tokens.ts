/**
 * `POST /tokenize` and `/detokenize`, in the shapes llama-server and vLLM use: text (`content` or
 * `prompt`) or chat `messages` (through the model's chat template) → token ids, and back.
 */
import { badRequest } from "../http/errors.ts";
import type { DetokenizeRequest, TokenizeRequest, TokenizeResponse } from "../protocol/completions.ts";
import type { ChatEngine, EmbeddingEngine } from "../engines/types.ts";
import { parseHistoryArguments, toEngineMessages } from "./chat.ts";
import { Slicer } from "../event_loop.ts";

export type { TokenizeResponse };

/** Ids looked at between two looks at the clock. */
const ID_RUN = 16_384;

function isChat(engine: ChatEngine | EmbeddingEngine): engine is ChatEngine {
  return "prompt" in engine;
}

/**
 * Tokenizes text, or renders messages with the chat template and tokenizes the prompt. The
 * messages' text is text: only the template's markup becomes special tokens, as for generation.
 * Text (`content` / `prompt`) is the client's own: its special-token strings are special tokens
 * unless `add_special` / `add_special_tokens` is false.
 *
 * @example
 * ```ts
 * import type { ChatEngine } from "../engines/types.ts";
 * async function count(engine: ChatEngine) {
 *   return await tokenize({ model: "m", content: "Hello" }, engine); // { tokens: [9707], count: 1, … }
 * }
 * ```
 */
export async function tokenize(
  req: TokenizeRequest,
  engine: ChatEngine | EmbeddingEngine,
  defaultThinking?: boolean,
  signal?: AbortSignal,
): Promise<TokenizeResponse> {
  const given = [req.content, req.prompt, req.messages].filter((x) => x != null).length;
  if (given !== 1) {
    throw badRequest("Send exactly one of content, prompt or messages.", "content", "invalid_value");
  }
  const special = req.add_special_tokens ?? req.add_special ?? true;
  let ids: number[];
  let prompt: string | undefined;
  if (req.tools?.length && !req.messages) {
    throw badRequest("tools are rendered with messages: send messages too.", "tools", "invalid_value");
  }
  if (req.messages) {
    if (!isChat(engine)) {
      throw badRequest("messages need a chat model (its chat template).", "messages", "wrong_model_kind");
    }
    const tools = (req.tools ?? []).map((t) => ({
      name: t.function.name,
      description: t.function.description ?? undefined,
      parameters: t.function.parameters ?? undefined,
    }));
    await parseHistoryArguments(req.messages, signal);
    ({ text: prompt, tokens: ids } = await engine.prompt({
      messages: toEngineMessages(req.messages),
      tools,
      toolChoice: tools.length > 0 ? "auto" : "none",
      enableThinking: req.chat_template_kwargs?.enable_thinking ?? defaultThinking,
    }, signal));
  } else {
    const text = (req.content ?? req.prompt)!;
    ids = isChat(engine) ? await engine.tokenize(text, special, signal) : await engine.tokenize(text);
  }
  let tokens: TokenizeResponse["tokens"] = ids;
  if (req.with_pieces && isChat(engine)) {
    // A piece per id: 170,000 of them took 420 ms in one block.
    const pieces: { id: number; piece: string }[] = [];
    const slices = new Slicer(10, signal);
    for (const id of ids) {
      if (slices.due) await slices.pause();
      pieces.push({ id, piece: engine.tokenText(id).token });
    }
    tokens = pieces;
  }
  return {
    tokens,
    count: ids.length,
    ...(isChat(engine) ? { max_model_len: engine.contextSize } : {}),
    ...(prompt !== undefined ? { prompt } : {}),
  };
}

/**
 * Token ids → text (`content` as llama-server, `prompt` as vLLM).
 *
 * @example
 * ```ts
 * import type { ChatEngine } from "../engines/types.ts";
 * function text(engine: ChatEngine) {
 *   return detokenize({ model: "m", tokens: [9707] }, engine); // { content: "Hello", prompt: "Hello" }
 * }
 * ```
 */
export async function detokenize(
  req: DetokenizeRequest,
  engine: ChatEngine | EmbeddingEngine,
  signal?: AbortSignal,
): Promise<{ content: string; prompt: string }> {
  const vocab = engine.vocabSize;
  // An engine without a vocabulary of its own (a remote one) says itself that it cannot detokenize.
  // A million ids are looked at between turns of the event loop.
  let bad = -1;
  const slices = new Slicer(10, signal);
  for (let at = 0; vocab > 0 && bad < 0 && at < req.tokens.length; at += ID_RUN) {
    if (slices.due) await slices.pause();
    const end = Math.min(req.tokens.length, at + ID_RUN);
    for (let i = at; i < end; i++) {
      if (req.tokens[i] >= vocab) {
        bad = i;
        break;
      }
    }
  }
  if (bad >= 0) {
    throw badRequest(
      `tokens[${bad}] is ${req.tokens[bad]}; this model's vocabulary has ids 0..${vocab - 1}.`,
      `tokens[${bad}]`,
      "invalid_value",
    );
  }
  // The engine's own slices start after a turn, not part-way through this one.
  if (req.tokens.length > ID_RUN) await slices.pause();
  const text = isChat(engine)
    ? await engine.detokenize(req.tokens, signal)
    : await engine.detokenize?.(req.tokens, signal);
  if (text === undefined) throw badRequest("This model cannot turn tokens back into text.", "model");
  return { content: text, prompt: text };
}
