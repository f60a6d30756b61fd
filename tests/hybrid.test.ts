/**
 * The spec model's family on its built-in stand-in (tiny-moe: qwen35moe, 3 recurrent Gated
 * DeltaNet layers per attention layer, MoE): the conditions that break recurrent state (shared
 * prefixes, cancellation mid-prompt, concurrent streams, the context limit) must give exactly the
 * output of the same requests run one at a time without any cache (greedy); thinking by default;
 * and the spec embedding model's dimensions.
 */
import assert from "node:assert/strict";
import { type Json, postJson, startServer, type TestServer, writeJsonFile } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { postStream } from "./helpers/sse.ts";
import { engineCounter, scrapeMetrics } from "./helpers/metrics.ts";
import { poll } from "./helpers/poll.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
/** The dense Qwen3 stand-in: batches several prompts at once, and must be just as exact. */
const DENSE = "vserve/tiny-chat";
const PER_SEQUENCE = "test/tiny-moe-per-sequence";
const registry = await writeJsonFile({
  models: [
    { id: MODEL, kind: "chat", source: "builtin:tiny-moe", contextSize: 4096, parallel: 8 },
    { id: DENSE, kind: "chat", source: "builtin:tiny-chat", contextSize: 4096, parallel: 8 },
    // The same hybrid model decoding one sequence at a time (what a failed batching check selects).
    {
      id: PER_SEQUENCE,
      kind: "chat",
      source: "builtin:tiny-moe",
      contextSize: 4096,
      parallel: 8,
      batchSequences: "off",
    },
  ],
});
const start = (...args: string[]) =>
  startServer(["--api-key", KEY, "--models", registry, ...args], { waitReady: true });
// `live` serves everything concurrently with prompt reuse; `cold` answers one request at a time,
// recomputing every prompt; `single` has one sequence, so every request reuses the same state.
const [live, cold, single] = await Promise.all([start(), start(), start("--parallel", "1")]);
globalThis.addEventListener("unload", () => {
  for (const s of [live, cold, single]) void s.stop();
});

const words = (n: number, seed: number) =>
  Array.from(
    { length: n },
    (_, i) => ["river", "stone", "light", "bell", "town", "hour", "quiet"][(i * seed + i) % 7],
  )
    .join(" ");

function request(messages: Json[], more: Record<string, unknown> = {}) {
  return {
    model: MODEL,
    messages,
    max_tokens: 24,
    temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
    ...more,
  };
}

async function ask(server: TestServer, body: Record<string, unknown>) {
  const res = await postJson(`${server.url}/v1/chat/completions`, body, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

/** The reference answer: a cold, uncached run. */
async function reference(body: Record<string, unknown>) {
  return (await ask(cold, { ...body, cache_prompt: false })).choices[0].message.content as string;
}

const counter = (server: TestServer, name: string, model = MODEL) => engineCounter(server.url, name, model);

serverTest(
  "hybrid: a shared long prefix, then diverging requests, reuse the prefix and match cold runs",
  async () => {
    const system = { role: "system", content: `Context: ${words(700, 3)}` };
    const a = request([system, { role: "user", content: "First question about the river?" }]);
    const b = request([system, { role: "user", content: "Second question, about the bells?" }]);
    const restored = await counter(single, "checkpoints_restored");
    const first = await ask(single, a);
    const second = await ask(single, b);
    assert.equal(first.choices[0].message.content, await reference(a));
    assert.equal(second.choices[0].message.content, await reference(b));
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > 600, `the shared system turn is reused (${cached} of ${second.usage.prompt_tokens})`);
    assert.ok(
      await counter(single, "checkpoints_restored") > restored,
      "the recurrent state came from a checkpoint",
    );
    // The same prompt again: all but its last turn's tail is reused, and the answer is unchanged.
    const again = await ask(single, b);
    assert.equal(again.choices[0].message.content, second.choices[0].message.content);
    assert.ok(again.usage.prompt_tokens_details.cached_tokens >= cached);
  },
);

serverTest(
  "hybrid: a conversation of many short turns is computed in long chunks, resumes from a checkpoint and matches cold runs",
  async () => {
    // 120 short turns (~1,400 tokens): a cut at every turn start past 512 tokens made ~100 chunks of a few
    // tokens (3,000 turns took over 5 minutes); checkpoints at least 256 tokens apart make a few.
    const history: Json[] = [];
    for (let i = 0; i < 60; i++) {
      history.push({ role: "user", content: `Note ${i}: ${words(3, i + 2)}` });
      history.push({ role: "assistant", content: `Noted ${i}.` });
    }
    const first = request([...history, { role: "user", content: "Which note was about the river?" }]);
    const decodes = await counter(single, "decodes");
    const restored = await counter(single, "checkpoints_restored");
    const answer = await ask(single, first);
    const steps = await counter(single, "decodes") - decodes - answer.usage.completion_tokens;
    assert.ok(answer.usage.prompt_tokens > 1400, `${answer.usage.prompt_tokens} prompt tokens`);
    assert.ok(steps <= 12, `the prompt took ${steps} decodes`);
    assert.equal(answer.choices[0].message.content, await reference(first));
    // The next turn resumes from a checkpoint and still computes as alone.
    const next = request([
      ...history,
      { role: "user", content: "Which note was about the river?" },
      answer.choices[0].message,
      { role: "user", content: "And the bells?" },
    ]);
    const second = await ask(single, next);
    assert.ok(await counter(single, "checkpoints_restored") > restored, "resumed from a checkpoint");
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > 1200);
    assert.equal(second.choices[0].message.content, await reference(next));
  },
);

for (const model of [MODEL, DENSE]) {
  serverTest(
    `${model}: concurrent requests with a shared system prompt compute it once and match cold runs`,
    async () => {
      const system = { role: "system", content: `Context: ${words(700, 11)}` };
      const bodies = ["river", "bells", "town", "stones"].map((topic) =>
        request([system, { role: "user", content: `A question about the ${topic}?` }], { model })
      );
      const evaluated = await counter(live, "prompt_tokens_evaluated", model);
      const copies = await counter(live, "prefix_copies", model);
      const answers = await Promise.all(bodies.map((body) => ask(live, body)));
      const cached = answers.map((a) => a.usage.prompt_tokens_details.cached_tokens);
      assert.ok(cached.filter((c) => c > 600).length >= 3, `the others took the system turn (${cached})`);
      assert.ok(await counter(live, "prefix_copies", model) - copies >= 3, "copied from another sequence");
      const computed = await counter(live, "prompt_tokens_evaluated", model) - evaluated;
      assert.ok(computed < 1.5 * answers[0].usage.prompt_tokens, `computed once (${computed} tokens in all)`);
      for (const [i, body] of bodies.entries()) {
        assert.equal(answers[i].choices[0].message.content, await reference(body), `request ${i}`);
      }
    },
  );
}

serverTest(
  "hybrid: a conversation whose sequence another took is restored from the prompt cache and matches cold runs",
  async () => {
    const system = { role: "system", content: `Context: ${words(700, 13)}` };
    const first = request([system, { role: "user", content: "First question about the river?" }]);
    const other = request([{ role: "user", content: `Elsewhere: ${words(600, 17)}` }]);
    const next = request([system, { role: "user", content: "Second question, about the bells?" }]);
    const hits = await counter(single, "prompt_cache_hits");
    await ask(single, first);
    await ask(single, other); // takes the only sequence: the first conversation is saved
    const answer = await ask(single, next);
    assert.ok(answer.usage.prompt_tokens_details.cached_tokens > 600, "the system turn came from the cache");
    assert.equal(await counter(single, "prompt_cache_hits") - hits, 1);
    const bytes = (await scrapeMetrics(single.url)).value("vserve_engine_prompt_cache_bytes", {
      model: MODEL,
    });
    assert.ok(bytes > 0, `the cache holds saved states (${bytes} bytes)`);
    assert.equal(answer.choices[0].message.content, await reference(next));
  },
);

serverTest(
  "hybrid: a request cancelled mid-prompt, then new ones on the same sequence, match cold runs",
  async () => {
    const long = request([{ role: "user", content: `Summarise: ${words(3000, 5)}` }], { stream: true });
    const evaluated = await counter(single, "prompt_tokens_evaluated");
    const abort = new AbortController();
    const pending = fetch(`${single.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
      body: JSON.stringify(long),
      signal: abort.signal,
    }).then((r) => r.text()).catch(() => "aborted");
    // Cancel while the prompt is still being processed (512 tokens a step).
    await poll(
      "the first prompt chunk was evaluated",
      async () => (await counter(single, "prompt_tokens_evaluated")) - evaluated >= 512,
      { everyMs: 5 },
    );
    abort.abort();
    await pending;
    const done = (await counter(single, "prompt_tokens_evaluated")) - evaluated;
    assert.ok(done < 3000, `the prompt was cut short (${done} tokens evaluated)`);
    const full = { ...long, stream: false };
    const other = request([{ role: "user", content: `Summarise: ${words(1500, 5)} and more` }]);
    for (const body of [full, other, full]) {
      assert.equal((await ask(single, body)).choices[0].message.content, await reference(body));
    }
  },
);

serverTest("hybrid: batched decoding is checked at load against one sequence at a time", async () => {
  const health = await (await fetch(`${live.url}/health`)).json();
  const details = (id: string) => health.models.find((m: Json) => m.id === id);
  assert.equal(details(MODEL).batched_decode, "batched (checked)");
  assert.equal(details(DENSE).batched_decode, "batched");
  assert.equal(details(PER_SEQUENCE).batched_decode, "per sequence");
});

for (const model of [MODEL, DENSE, PER_SEQUENCE]) {
  serverTest(`${model}: 8 concurrent streams give the same text as one at a time`, async () => {
    const bodies = Array.from(
      { length: 8 },
      (_, i) =>
        request([{ role: "user", content: `Stream ${i}: ${words(20 + i * 30, i + 1)}` }], {
          model,
          max_tokens: 32,
        }),
    );
    const streamed = await Promise.all(bodies.map(async (body) => {
      const { data } = await postStream(`${live.url}/v1/chat/completions`, body, { key: KEY });
      return data.filter((c) => c !== "[DONE]").map((c) => c.choices[0]?.delta?.content ?? "").join("");
    }));
    for (let i = 0; i < bodies.length; i++) {
      assert.equal(streamed[i], await reference(bodies[i]), `stream ${i}`);
    }
  });
}

serverTest("hybrid: prompt + max_tokens exactly at the context limit works; one more is a 400", async () => {
  const body = request([{ role: "user", content: words(3800, 7) }]);
  const probe = await ask(live, { ...body, max_tokens: 1 });
  const room = 4096 - probe.usage.prompt_tokens;
  assert.ok(room > 8 && room < 400, `the prompt nearly fills the context (${probe.usage.prompt_tokens})`);
  const exact = await ask(live, { ...body, max_tokens: room });
  assert.equal(exact.usage.prompt_tokens + room, 4096);
  assert.ok(exact.usage.total_tokens <= 4096);
  assert.equal(exact.choices[0].message.content, await reference({ ...body, max_tokens: room }));
  const over = await postJson(`${live.url}/v1/chat/completions`, { ...body, max_tokens: room + 1 }, KEY);
  assertApiError(over, 400, { param: "messages", code: "context_length_exceeded" });
});

serverTest(
  "thinking is on by default on the Qwen3.6 format; reasoning never leaks into content",
  async () => {
    const body = {
      model: MODEL,
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 16,
      temperature: 0,
    };
    const plain = await ask(live, body);
    const m = plain.choices[0].message;
    assert.ok(m.reasoning_content.trim().length > 0, "greedy reasoning is visible");
    assert.equal(m.content, "");
    assert.equal(plain.usage.completion_tokens_details.reasoning_tokens, 16);
    const { data } = await postStream(`${live.url}/v1/chat/completions`, body, { key: KEY });
    const deltas = data.filter((c) => c !== "[DONE]").map((c) => c.choices[0]?.delta ?? {});
    assert.equal(deltas.map((d: Json) => d.reasoning_content ?? "").join(""), m.reasoning_content);
    assert.equal(deltas.map((d: Json) => d.content ?? "").join(""), "");
    const off = await ask(live, { ...body, chat_template_kwargs: { enable_thinking: false } });
    assert.ok(off.choices[0].message.content.trim().length > 0);
    assert.equal(off.choices[0].message.reasoning_content, undefined);
  },
);
