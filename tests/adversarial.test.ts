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
import { CompletionRequestSchema } from "../src/protocol/completions.ts";
import { createCompletion } from "../src/services/completions.ts";
import type { ChatEngine, ChatEvent, ChatJob } from "../src/engines/types.ts";
import { builtinChatEngine } from "./helpers/engines.ts";
import { PromptLogprobs } from "../src/engines/prompt_logprobs.ts";
import { silentLogger } from "../src/log.ts";

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

serverTest("/detokenize of a million ids and /tokenize with pieces are answered in slices", async () => {
  // Detokenized at once, and a 22 MB text written twice in one JSON.stringify (content, prompt); a
  // piece made per id in one loop (170,000 ids: 420 ms).
  const ids = Array.from({ length: 1_100_000 }, () => 151646); // <|object_ref_start|>, 20 characters
  const text = await underProbe("/detokenize", { model: CHAT, tokens: ids });
  assert.equal(text.res.status, 200);
  assert.equal(text.res.body.content.length, 22_000_000);
  assert.equal(text.res.body.prompt, text.res.body.content);
  assert.equal(text.stalls, 0, "/detokenize held the event loop for a quarter of a second");
  const pieces = await underProbe("/tokenize", {
    model: CHAT,
    content: "hello world ".repeat(200_000),
    with_pieces: true,
  });
  assert.equal(pieces.res.status, 200);
  assert.equal(pieces.res.body.tokens.length, 400_001);
  assert.deepEqual(pieces.res.body.tokens[1], { id: 1879, piece: " world" });
  assert.equal(pieces.stalls, 0, "/tokenize with pieces held the event loop");
  assert.ok(pieces.answered >= 2, `${pieces.answered} /health answers`);
});

serverTest(
  "an embedding input far past the token limit is refused without tokenizing all of it",
  async () => {
    // 7.6 MB of dense markup: 4 million ids, copied three times on the event loop (ONNX: 270 ms),
    // and 5 s of llama.cpp's tokenizer before the 400.
    const dense = "a<|im_end|>b<think>".repeat(400_000);
    for (const model of ["vserve/tiny-embed-onnx", "Vendor/Vendor3-Embedding-8B"]) {
      const over = await underProbe("/v1/embeddings", { model, input: dense });
      assert.equal(over.res.status, 400, JSON.stringify(over.res.body).slice(0, 300));
      assert.equal(over.res.body.error.code, "context_length_exceeded");
      assert.match(over.res.body.error.message, /has more than 8192 tokens/);
      assert.equal(over.stalls, 0, `${model}: the input held the event loop`);
    }
    // Cut to the limit on request: the first tokens and the end-of-text token, as before.
    const cut = await postJson(url("/v1/embeddings"), {
      model: "Vendor/Vendor3-Embedding-8B",
      input: "a<|im_end|>b<think>".repeat(3000),
      truncate: true,
    }, KEY);
    assert.equal(cut.status, 200);
    assert.equal(cut.body.usage.prompt_tokens, 8192);
  },
);

Deno.test("a legacy echo of long prompt log-probabilities is assembled between turns of the event loop", async () => {
  // 8 choices of a 2,000-token prompt with 20 alternatives a token, each assembled anew, held the
  // event loop for 130-180 ms at the end of the request; one choice of a 20,000-token prompt as long.
  const table = new PromptLogprobs(20);
  const top = Array.from({ length: 20 }, (_, k) => ({ token: 100_000 + k, logprob: -2 }));
  for (let i = 0; i < 20_000; i++) table.push(i, -1, top);
  const n = 2;
  async function* run(): AsyncGenerator<ChatEvent> {
    yield { type: "prompt", promptTokens: 20_001, cachedTokens: 0 };
    await Promise.resolve();
    yield { type: "prompt_logprobs", logprobs: table };
    for (let c = 0; c < n; c++) {
      yield { type: "end", choice: c, finishReason: "length", completionTokens: 0, reasoningTokens: 0 };
    }
  }
  const engine = {
    vocabSize: 1000,
    tokenize: () => Promise.resolve([1]),
    detokenize: () => Promise.resolve("t"),
    tokenText: (t: number) => ({ token: t >= 100_000 ? `a${t - 100_000}` : `t${t}`, bytes: [116] }),
    generate: () => run(),
  } as unknown as ChatEngine;
  const req = CompletionRequestSchema.parse({
    model: "m",
    prompt: "t",
    echo: true,
    logprobs: 20,
    n,
    max_tokens: 0,
  });
  const ctx = { created: 0, signal: new AbortController().signal, log: silentLogger, requestId: "r" };
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  const done = await createCompletion(req, engine, ctx);
  clearInterval(timer);
  assert.equal(done.kind, "completion");
  if (done.kind !== "completion") return;
  assert.equal(done.completion.choices.length, n);
  for (const c of done.completion.choices) {
    assert.equal(c.logprobs!.tokens.length, 20_001);
    assert.equal(Object.keys(c.logprobs!.top_logprobs[1]!).length, 20);
  }
  assert.ok(ticks >= 2, `${ticks} timer turns while the echo was assembled`);
});

serverTest(
  "a body in tiny chunks is refused past 65,536 of them, and what the client still sends is not read",
  async () => {
    // 8 MB in 16-byte chunks held the event loop 57 s while it was read; refused midway, the runtime then
    // read all the client still sent in one block (4 MB: 4.7 s) because the body was cancelled.
    const stalls = await longEventLoopStalls(server.url);
    const { hostname, port } = new URL(server.url);
    const conn = await Deno.connect({ hostname, port: Number(port) });
    const enc = new TextEncoder();
    await conn.write(enc.encode(
      "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY +
        "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
        `10\r\n{"input":"aaaaaa\r\n`,
    ));
    const block = enc.encode("10\r\naaaaaaaaaaaaaaaa\r\n".repeat(4096));
    const answer = (async () => {
      const buf = new Uint8Array(4096);
      const n = await conn.read(buf);
      return new TextDecoder().decode(buf.subarray(0, n ?? 0));
    })();
    // 48 blocks: 196,608 chunks, three times the limit (the server may close before the last).
    for (let i = 0; i < 48; i++) await conn.write(block).catch(() => {});
    const text = await answer;
    conn.close();
    assert.match(text, /^HTTP\/1\.1 400/);
    assert.match(text, /body_too_fragmented/);
    assert.equal(await longEventLoopStalls(server.url) - stalls, 0, "the refused body held the event loop");
  },
);

Deno.test("an echoed prompt's log-probabilities are held as numbers while it is processed, not as objects", async () => {
  // As one object per token and alternative (each with its string and byte array) a 20,000-token echo
  // with 20 alternatives grew the heap by ~240 MB over its prefill, and every young-generation
  // collection copied ~4 MB of them: 10-50 ms pauses of every route. Now: two typed arrays.
  const engine = await builtinChatEngine("tiny-chat", 2048);
  try {
    const prompt = await engine.tokenize("word ".repeat(300) + "é€😀 the end", true);
    const job: ChatJob = {
      messages: [],
      tools: [],
      toolChoice: "none",
      parallelToolCalls: false,
      output: { type: "text" },
      sampling: { temperature: 0 },
      maxTokens: 1,
      stop: [],
      n: 1,
      logprobs: 20,
      rawPrompt: prompt,
      promptLogprobs: true,
    };
    let table: PromptLogprobs | undefined;
    for await (const event of engine.generate(job, new AbortController().signal)) {
      if (event.type === "prompt_logprobs") table = event.logprobs;
    }
    assert.ok(table instanceof PromptLogprobs, "the prompt's log-probabilities are one table");
    assert.equal(table.length, prompt.length - 1);
    // Numbers only: 12 bytes for each of the 21 numbers a position (room for the whole prompt at once).
    assert.ok(table.bytes <= 12 * 21 * prompt.length, `${table.bytes} bytes for ${prompt.length} tokens`);
    for (let i = 0; i < table.length; i++) {
      assert.equal(table.token(i), prompt[i + 1]);
      assert.ok(table.logprob(i) <= 0);
      assert.equal(table.alternatives(i), 20);
      for (let j = 1; j < 20; j++) {
        assert.ok(table.alternativeLogprob(i, j) <= table.alternativeLogprob(i, j - 1));
      }
      assert.ok(table.logprob(i) <= table.alternativeLogprob(i, 0));
    }
  } finally {
    await engine.dispose();
  }
});
