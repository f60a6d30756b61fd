/**
 * Fair scheduling through a real server (issue 26, item 4): a small embedding is not queued behind
 * max-size ones, and models on one machine share its compute by weight (equal by default). Order
 * and counters only: the share is read from /metrics over a window, never from wall time.
 */
import assert from "node:assert/strict";
import { postJson, runMain, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { type MetricsScrape, scrapeMetrics } from "./helpers/metrics.ts";
import { poll } from "./helpers/poll.ts";
import { SseReader } from "./helpers/sse.ts";

const KEY = "test-key";
const EMBED = "Vendor/Vendor3-Embedding-8B";
const CHAT = "vserve/tiny-chat";
const MOE = "Vendor/Vendor3.6-35B-A3B";
// tiny-moe (the spec chat model's stand-in) weighs 3, the others 1 (the default).
const server = await startServer(["--api-key", KEY, "--compute-weight", "tiny-moe=3"], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = (path: string) => `${server.url}${path}`;

const scrape = () => scrapeMetrics(server.url);

const engineCounter = (m: MetricsScrape, name: string, model: string) =>
  m.value(`vserve_engine_${name}_total`, { model });

/** Compute seconds charged to `model` (its steps and the holds between them). */
const charged = (m: MetricsScrape, model: string) =>
  m.value("vserve_compute_seconds_total", { model }) +
  m.value("vserve_compute_held_seconds_total", { model });

/** Keeps the embedding model saturated (4 clients of 64 inputs) until the returned function is called. */
async function saturateEmbeddings(): Promise<() => Promise<void>> {
  const stop = new AbortController();
  const input = Array.from(
    { length: 64 },
    (_, i) => `passage ${i}: ` + "the river runs past stones ".repeat(40),
  );
  const clients = Array.from({ length: 4 }, async () => {
    while (!stop.signal.aborted) {
      await fetch(url("/v1/embeddings"), {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ model: EMBED, input }),
        signal: stop.signal,
      }).then((r) => r.body?.cancel()).catch(() => {});
    }
  });
  const before = engineCounter(await scrape(), "tokens_evaluated", EMBED);
  await poll(
    "the embedding model is busy",
    async () => engineCounter(await scrape(), "tokens_evaluated", EMBED) > before + 1000,
  );
  return async () => {
    stop.abort();
    await Promise.all(clients);
  };
}

/**
 * Streams a long greedy chat completion of `model` while embeddings saturate the machine. The
 * window opens at its 100th event (both models busy) and closes once the embedding model has run
 * `embedSteps` decodes more (every 50 events a look): over it, returns the chat tokens generated,
 * the embedding decodes and (a function, to be asserted after those) the chat model's part of the
 * compute charged to the two models.
 */
async function chatBesideEmbeddings(model: string, embedSteps: number) {
  const stopEmbeddings = await saturateEmbeddings();
  try {
    const stream = await SseReader.open(url("/v1/chat/completions"), {
      model,
      messages: [{ role: "user", content: "Tell me a very long story about rivers." }],
      max_tokens: 10_000,
      temperature: 0,
    });
    let events = 0;
    let m0: MetricsScrape | undefined;
    let m1: MetricsScrape | undefined;
    for (let e = await stream.next(); e && !m1; e = await stream.next()) {
      if (!e.data.startsWith("{")) continue;
      events++;
      if (events === 100) m0 = await scrape();
      if (m0 && events % 50 === 0) {
        const m = await scrape();
        if (engineCounter(m, "decodes", EMBED) - engineCounter(m0, "decodes", EMBED) >= embedSteps) m1 = m;
      }
    }
    await stream.cancel();
    assert.ok(m0 && m1, `the stream had ${events} events`);
    const tokens = engineCounter(m1, "tokens_generated", model) -
      engineCounter(m0, "tokens_generated", model);
    const embedDecodes = engineCounter(m1, "decodes", EMBED) - engineCounter(m0, "decodes", EMBED);
    const part = () => {
      const chatSeconds = charged(m1, model) - charged(m0, model);
      return chatSeconds / (chatSeconds + charged(m1, EMBED) - charged(m0, EMBED));
    };
    return { tokens, embedDecodes, part };
  } finally {
    await stopEmbeddings();
  }
}

serverTest("a one-word embedding completes while 8 max-size inputs run, before any of them", async () => {
  // 8,190 words + end of text: 8,192 tokens, the model's limit. One fills the KV cache but its reserve.
  const big = "alpha ".repeat(8190);
  const stop = new AbortController();
  const m0 = await scrape();
  const finished: string[] = [];
  const bigs = Array.from({ length: 8 }, (_, i) =>
    fetch(url("/v1/embeddings"), {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: EMBED, input: big }),
      signal: stop.signal,
    }).then(async (r) => {
      assert.equal(r.status, 200);
      await r.body?.cancel();
      finished.push(`big ${i}`);
    }).catch(() => {}));
  try {
    await poll("the max-size inputs are running", async () => {
      const m = await scrape();
      return engineCounter(m, "tokens_evaluated", EMBED) > engineCounter(m0, "tokens_evaluated", EMBED);
    });
    assert.equal(finished.length, 0, "no max-size input has finished yet");
    const small = await postJson(url("/v1/embeddings"), { model: EMBED, input: "hello" }, KEY);
    assert.equal(small.status, 200);
    finished.push("small");
    const m1 = await scrape();
    assert.deepEqual(finished, ["small"], "the one-word request finished first");
    assert.equal(
      engineCounter(m1, "inputs_embedded", EMBED) - engineCounter(m0, "inputs_embedded", EMBED),
      1,
      "no max-size input was done before it",
    );
  } finally {
    stop.abort();
    await Promise.all(bigs);
  }
});

/** The equal-weights window, measured once for the two tests that read it. */
let equalRun: ReturnType<typeof chatBesideEmbeddings> | undefined;
const equalWeights = () => equalRun ??= chatBesideEmbeddings(CHAT, 10);

serverTest(
  "chat keeps its share of compute while embeddings saturate the machine (equal weights)",
  async () => {
    const { tokens, embedDecodes, part } = await equalWeights();
    // First come, first served ran one embedding step (of up to 128 tokens) per chat token.
    assert.ok(embedDecodes * 4 <= tokens, `${embedDecodes} embedding decodes beside ${tokens} chat tokens`);
    assert.ok(part() > 0.3 && part() < 0.7, `chat's part of the compute: ${part().toFixed(3)} (weights 1:1)`);
  },
);

serverTest("weights change the split: a chat model weighing 3 gets about 3/4 beside embeddings", async () => {
  const equal = await equalWeights();
  const weighted = await chatBesideEmbeddings(MOE, 6);
  const [w, e] = [weighted.part(), equal.part()];
  assert.ok(w > 0.6, `the weighted model's part: ${w.toFixed(3)} (weights 3:1)`);
  assert.ok(w > e + 0.1, `weight 3: ${w.toFixed(3)}, weight 1: ${e.toFixed(3)}`);
  const health = await (await fetch(url("/health"))).json();
  const moe = health.models.find((m: { id: string }) => m.id === MOE);
  const embed = health.models.find((m: { id: string }) => m.id === EMBED);
  assert.equal(moe.compute.weight, 3);
  assert.equal(embed.compute.weight, 1);
  assert.equal(moe.compute.share, 3 / 6, "3 of the four local models' weights 3+1+1+1");
});

Deno.test("a --compute-weight for no configured model, or not above 0, exits 2 naming it", async () => {
  for (
    const [arg, reason] of [
      ["nosuch=2", /no model 'nosuch' is configured/],
      ["tiny-chat=0", /must be above 0/],
      ["tiny-chat", /expected MODEL=WEIGHT/],
    ] as const
  ) {
    const { code, stdout, stderr } = await runMain(["--port", "0", "--compute-weight", arg]);
    assert.equal(code, 2, arg);
    assert.match(stdout + stderr, reason);
  }
});

serverTest(
  "a grammar's full masks do not hold another generation on the same model to their pace",
  async () => {
    // Neither request may end early: both ends of text banned.
    const noEnd = { "151643": -100, "151645": -100 };
    const off = { chat_template_kwargs: { enable_thinking: false } };
    // Integers only: the random stand-in's draws are nearly all refused, so nearly every token of this
    // request takes the grammar's full mask over the vocabulary (15-25 ms at 151,936 tokens; seconds
    // with hundreds of open alternatives), many times a decode step of tiny-chat (2-4 ms).
    const start = await scrape();
    const masked = await SseReader.open(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: "Numbers, please." }],
      max_tokens: 2000,
      logit_bias: noEnd,
      seed: 3,
      stream: true,
      response_format: {
        type: "json_schema",
        json_schema: { name: "n", schema: { type: "array", items: { type: "integer" }, minItems: 1000 } },
      },
      ...off,
    }, { key: KEY });
    try {
      for (let events = 0; events < 5;) {
        const e = await masked.next();
        assert.ok(e, "the masked stream ended early");
        if (e.data.startsWith("{")) events++;
      }
      const m0 = await scrape();
      const plain = await postJson(url("/v1/chat/completions"), {
        model: CHAT,
        messages: [{ role: "user", content: "Anything." }],
        max_tokens: 64,
        logit_bias: noEnd,
        seed: 4,
        ...off,
      }, KEY);
      const m1 = await scrape();
      assert.equal(plain.status, 200, JSON.stringify(plain.body));
      assert.equal(plain.body.usage.completion_tokens, 64);
      const generated = engineCounter(m1, "tokens_generated", CHAT) -
        engineCounter(m0, "tokens_generated", CHAT);
      // Waiting for each mask in the decode step gave the two requests a token each per step: the
      // masked one had 63-64 of its own while the other made 64.
      assert.ok(
        generated - 64 < 32,
        `the masked request made ${generated - 64} tokens beside the other's 64`,
      );
      const drawsOff = engineCounter(m1, "draws_off_loop", CHAT) -
        engineCounter(start, "draws_off_loop", CHAT);
      assert.ok(drawsOff > 0, "no token was drawn off the event loop");
    } finally {
      await masked.cancel();
    }
    // The masked request left while a token of it was being drawn: the server goes on.
    const after = await postJson(url("/v1/chat/completions"), {
      model: CHAT,
      messages: [{ role: "user", content: "Still there?" }],
      max_tokens: 4,
    }, KEY);
    assert.equal(after.status, 200, JSON.stringify(after.body));
  },
);

serverTest("a short chat beside a long echo of prompt log-probabilities finishes first", async () => {
  // Each 64-token chunk of an echoed prompt computes and reads 64 rows of 151,936 logits; counted by
  // its tokens, 8 such chunks ran between two decode steps, and a chat waited for the whole echo.
  const noEnd = { "151643": -100, "151645": -100 };
  const before = await scrape();
  const finished: string[] = [];
  const echo = postJson(url("/v1/completions"), {
    model: CHAT,
    prompt: "echo these words back ".repeat(600),
    echo: true,
    logprobs: 2,
    max_tokens: 1,
  }, KEY).then((r) => (finished.push("echo"), r));
  await poll(
    "the echo is under way",
    async () =>
      engineCounter(await scrape(), "prompt_tokens_evaluated", CHAT) >
        engineCounter(before, "prompt_tokens_evaluated", CHAT) + 128,
  );
  const chat = await postJson(url("/v1/chat/completions"), {
    model: CHAT,
    messages: [{ role: "user", content: "Short, please." }],
    max_tokens: 8,
    logit_bias: noEnd,
    chat_template_kwargs: { enable_thinking: false },
  }, KEY);
  finished.push("chat");
  assert.equal(chat.status, 200, JSON.stringify(chat.body));
  const e = await echo;
  assert.equal(e.status, 200, JSON.stringify(e.body));
  assert.ok(e.body.usage.prompt_tokens > 2000, `${e.body.usage.prompt_tokens} prompt tokens`);
  assert.deepEqual(finished, ["chat", "echo"]);
});
