/**
 * A long text tokenized with a limit (an embedding input past the model's tokens per entry): its ids
 * are kept only as far as the limit needs. Every id of a 7.8 MB input (3.9 M) used to be copied on
 * the JavaScript thread before the input was refused, holding the event loop for 300 ms.
 */
import assert from "node:assert/strict";
import { loadGrammarModel } from "./helpers/grammar.ts";

const model = await loadGrammarModel();
// Over LONG_TEXT (8 KB): tokenized on a thread of its own.
const long = "hello world ".repeat(20_000);

Deno.test("a long text past the limit keeps limit + 1 ids, the text's first ones, and says it is not complete", async () => {
  const all = await model.tokenizeAsync(long, false);
  assert.ok(all.length > 20_000);
  const cut = await model.tokenizePieces([long], { limit: 8192 });
  assert.equal(cut.complete, false);
  assert.equal(cut.tokens.length, 8193);
  assert.deepEqual(cut.tokens, all.slice(0, 8193));
  // The same when the long text is not the last piece, or after other pieces.
  const mid = await model.tokenizePieces([7, long, "tail"], { limit: 100 });
  assert.deepEqual([mid.complete, mid.tokens.length, mid.tokens[0]], [false, 101, 7]);
});

Deno.test("without a limit, or within it, a long text's ids are all there", async () => {
  const all = await model.tokenizeAsync(long, false);
  const free = await model.tokenizePieces([long, "!"]);
  assert.equal(free.complete, true);
  assert.deepEqual(free.tokens, [...all, ...model.tokenize("!", false)]);
  const within = await model.tokenizePieces([long], { limit: all.length });
  assert.deepEqual([within.complete, within.tokens.length], [true, all.length]);
});

Deno.test("short texts tokenize through the buffers kept for them as a whole text does on its own thread", async () => {
  // 2,048 UTF-16 units fill the kept buffers at 3 bytes each; 2,049 take the other way; 😀 is a pair.
  const texts = [
    "a",
    "hello world",
    "漢".repeat(2048),
    "漢".repeat(2049),
    "😀".repeat(1024),
    "x\uD800y",
    "<|im_end|> <think>".repeat(100),
  ];
  for (const text of texts) {
    assert.deepEqual(model.tokenize(text, false), await model.tokenizeAsync(text, false), text.slice(0, 20));
    assert.deepEqual(model.tokenize(text, true), await model.tokenizeAsync(text, true), text.slice(0, 20));
  }
});
