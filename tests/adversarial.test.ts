/**
 * Findings of the last adversarial pass (issue 26), one test each: request shapes that held the
 * event loop (and `/health`) past a quarter of a second. Each test counts the server's long stalls
 * (its JavaScript thread's CPU time between two ticks, which a busy machine does not inflate) and
 * the `/health` answers given while the request ran; it never times anything.
 */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { longEventLoopStalls } from "./helpers/metrics.ts";

const KEY = "test-key";
const CHAT = "vserve/tiny-chat";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = (path: string) => `${server.url}${path}`;

/**
 * Posts `body` to `path` while GETting `/health` one request after another; returns the answer,
 * how many probes were answered meanwhile and how many long stalls the server counted.
 */
async function underProbe(path: string, body: unknown) {
  const stalls = await longEventLoopStalls(server.url);
  let settled = false;
  const work = postJson(url(path), body, KEY).finally(() => (settled = true));
  let answered = 0;
  while (!settled) {
    await (await fetch(url("/health"))).text();
    if (!settled) answered++;
  }
  return { res: await work, answered, stalls: await longEventLoopStalls(server.url) - stalls };
}

serverTest("text dense with special-token strings is tokenized without holding the event loop", async () => {
  // llama.cpp's own special-token parsing is quadratic in their count: 7.6 MB holding 800,000 of
  // them held the event loop for over 16 minutes (/tokenize of text, a legacy prompt).
  const unit = "a<|im_end|>b<think>";
  const dense = unit.repeat(50_000);
  const special = await underProbe("/tokenize", { model: CHAT, content: dense });
  assert.equal(special.res.status, 200, JSON.stringify(special.res.body).slice(0, 300));
  // Per unit: a, <|im_end|>, b, <think>: the strings are the client's own template here.
  assert.equal(special.res.body.count, 4 * 50_000);
  assert.deepEqual(special.res.body.tokens.slice(0, 4), [64, 151645, 65, 151667]);
  assert.equal(special.stalls, 0, "the tokenization held the event loop for a quarter of a second");
  assert.ok(special.answered >= 3, `${special.answered} /health answers`);

  const plain = await underProbe("/tokenize", { model: CHAT, content: dense, add_special: false });
  assert.equal(plain.res.status, 200);
  assert.ok(!plain.res.body.tokens.includes(151645) && !plain.res.body.tokens.includes(151667));
  assert.equal(plain.stalls, 0, "the plain tokenization held the event loop");

  const legacy = await underProbe("/v1/completions", { model: CHAT, max_tokens: 1, prompt: dense });
  assert.equal(legacy.res.status, 400);
  assert.equal(legacy.res.body.error.code, "context_length_exceeded");
  assert.match(legacy.res.body.error.message, /the prompt takes 200000 tokens/);
  assert.equal(legacy.stalls, 0, "the legacy prompt held the event loop");
});

serverTest("a long text is tokenized off the event loop on /tokenize and legacy completions", async () => {
  // One llama_tokenize call of 7.8 MB held the event loop for 2.2 s.
  const text = "hello world ".repeat(200_000);
  const tokenized = await underProbe("/tokenize", { model: CHAT, content: text });
  assert.equal(tokenized.res.status, 200);
  assert.equal(tokenized.res.body.count, 400_001); // and the trailing space
  assert.equal(tokenized.stalls, 0, "the tokenization held the event loop for a quarter of a second");
  for (const body of [{ prompt: text }, { prompt: "a", suffix: text }]) {
    const legacy = await underProbe("/v1/completions", { model: CHAT, max_tokens: 1, ...body });
    assert.equal(legacy.res.status, 400, JSON.stringify(legacy.res.body).slice(0, 300));
    assert.equal(legacy.res.body.error.code, "context_length_exceeded");
    assert.equal(legacy.stalls, 0, `${Object.keys(body).join("+")} held the event loop`);
  }
});

serverTest(
  "a million token ids or strings are checked in one pass, and a body only up to its first fault",
  async () => {
    // zod checked each id (~75 ms a million) and, in a union that tries an array of strings first,
    // collected an issue per id: 1.1M ids held the event loop for 1-3 s; a million invalid content
    // parts took as long to collect an issue each.
    const ids = Array.from({ length: 1_000_000 }, (_, i) => 9707 + (i % 50));
    const legacy = await underProbe("/v1/completions", { model: CHAT, max_tokens: 1, prompt: ids });
    assert.equal(legacy.res.status, 400);
    assert.match(legacy.res.body.error.message, /the prompt takes 1000000 tokens/);
    assert.equal(legacy.stalls, 0, "the legacy prompt's ids held the event loop");
    const embed = await underProbe("/v1/embeddings", {
      model: "Vendor/Vendor3-Embedding-8B",
      input: [...ids, "x"],
    });
    assert.equal(embed.res.status, 400);
    assert.equal(embed.res.body.error.param, "input");
    assert.equal(embed.stalls, 0, "the embedding input's ids held the event loop");
    const parts = await underProbe("/v1/chat/completions", {
      model: CHAT,
      max_tokens: 1,
      messages: [{ role: "user", content: Array.from({ length: 1_000_000 }, () => "a") }],
    });
    assert.equal(parts.res.status, 400);
    assert.equal(parts.res.body.error.param, "messages[0].content");
    assert.equal(parts.stalls, 0, "a million invalid content parts held the event loop");
  },
);

serverTest("logit_bias takes at most 65,536 entries; a body at most 100,000 arrays and objects", async () => {
  const bias = Object.fromEntries(Array.from({ length: 65_537 }, (_, i) => [String(i), -1]));
  const over = await postJson(url("/v1/chat/completions"), {
    model: CHAT,
    max_tokens: 1,
    messages: [{ role: "user", content: "hi" }],
    logit_bias: bias,
  }, KEY);
  assert.equal(over.status, 400);
  assert.equal(over.body.error.param, "logit_bias");
  assert.match(over.body.error.message, /more than 65536 entries/);
  const parts = Array.from({ length: 100_000 }, () => ({ type: "text", text: "a" }));
  const many = await postJson(url("/v1/chat/completions"), {
    model: CHAT,
    max_tokens: 1,
    messages: [{ role: "user", content: parts }],
  }, KEY);
  assert.equal(many.status, 400);
  assert.equal(many.body.error.code, "json_too_large");
});
