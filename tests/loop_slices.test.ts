/**
 * Large inputs and answers leave the event loop turns (issue 26's last stall ticks). Asserted by
 * order: a timer set before the work fires before it ends (it could not while the work ran in one
 * block), or by the size of what one step handles.
 */
import assert from "node:assert/strict";
import { type ApiError, slicedJsonResponse } from "../src/http/errors.ts";
import { detokenize } from "../src/services/tokens.ts";
import type { ChatEngine } from "../src/engines/types.ts";

Deno.test("/detokenize of 1.1 million ids checks them against the vocabulary with a turn before decoding", async () => {
  const tokens = Array.from({ length: 1_100_000 }, (_, i) => 9707 + (i % 50));
  let fired = false;
  let firedAtDecode: boolean | undefined;
  const engine = {
    vocabSize: 151_936,
    prompt: () => Promise.reject(new Error("not used")),
    detokenize: (ids: readonly number[]) => {
      firedAtDecode = fired;
      return Promise.resolve(`${ids.length} ids`);
    },
  } as unknown as ChatEngine;
  const timer = setTimeout(() => (fired = true), 0);
  const out = await detokenize({ model: "m", tokens }, engine);
  clearTimeout(timer);
  assert.equal(out.content, "1100000 ids");
  assert.equal(firedAtDecode, true, "a timer set before ran before the engine decoded");
  await assert.rejects(
    detokenize({ model: "m", tokens: [...tokens, 151_936] }, engine),
    (e: ApiError) => e.status === 400 && e.param === "tokens[1100000]",
  );
});

Deno.test("a sliced JSON answer is written in pieces of about a megabyte, however long its slices", async () => {
  const text = "hello world ".repeat(1_000_000); // 12 MB
  const res = slicedJsonResponse({ content: text, prompt: text }, { sliceMs: 60_000 });
  const sizes: number[] = [];
  const reader = res.body!.getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) sizes.push(r.value.length);
  assert.equal(sizes.reduce((a, b) => a + b, 0), JSON.stringify({ content: text, prompt: text }).length);
  assert.ok(sizes.length >= 20, `${sizes.length} pieces`);
  assert.ok(Math.max(...sizes) < 2 << 20, `largest piece ${Math.max(...sizes)} bytes`);
});
