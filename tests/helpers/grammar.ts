/** llama.cpp's grammar engine on the tiny-chat stand-in's vocabulary, for the grammar tests. */
import assert from "node:assert/strict";
import { llamaRuntime } from "../../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../../src/engines/llama/ffi.ts";
import { NativeModel } from "../../src/engines/llama/native.ts";
import { GrammarConstraint } from "../../src/engines/llama/grammar.ts";
import { resolveSource } from "../../src/models/sources.ts";
import { silentLogger } from "../../src/log.ts";

/**
 * The tiny-chat model (weights and vocabulary), freed when the test process unloads.
 *
 * @example
 * ```ts
 * async function vocabulary() {
 *   return (await loadGrammarModel()).tokenize("<tool_call>", true); // [151657]
 * }
 * ```
 */
export async function loadGrammarModel(): Promise<NativeModel> {
  await llamaRuntime("cpu", silentLogger);
  const path = await resolveSource("builtin:tiny-chat", {
    cacheDir: "models/cache",
    hubUrl: "",
    log: silentLogger,
  });
  const model = await NativeModel.load(openLlamaLibrary(), path, 0);
  globalThis.addEventListener("unload", () => model.free());
  return model;
}

/**
 * Whether llama.cpp's grammar engine takes exactly `tokens` under `gbnf`, then the end of generation.
 *
 * @example
 * ```ts
 * import type { NativeModel } from "../../src/engines/llama/native.ts";
 * function takesHi(model: NativeModel) {
 *   return acceptsTokens(model, 'root ::= "hi"', model.tokenize("hi", false));
 * }
 * ```
 */
export function acceptsTokens(model: NativeModel, gbnf: string, tokens: Iterable<number>): boolean {
  const g = GrammarConstraint.create(model, gbnf);
  assert.ok(g, `llama.cpp parses the grammar:\n${gbnf}`);
  try {
    for (const t of tokens) {
      if (!g.allows(t)) return false;
      g.accept(t);
    }
    return g.allows(model.eos);
  } finally {
    g.free();
  }
}

/**
 * Whether the grammar accepts exactly `text`, fed character by character: the grammar must accept
 * every prefix, whatever the tokenization.
 *
 * @example
 * ```ts
 * import type { NativeModel } from "../../src/engines/llama/native.ts";
 * function takesHi(model: NativeModel) {
 *   return acceptsText(model, 'root ::= "hi"', "hi");
 * }
 * ```
 */
export function acceptsText(model: NativeModel, gbnf: string, text: string): boolean {
  return acceptsTokens(model, gbnf, [...text].flatMap((ch) => model.tokenize(ch, false)));
}
