/**
 * Prompts under concurrency, on the generated models with real inference: a prompt starts from a
 * prefix another sequence holds (a copy), from the prefix a prompt arriving with it computes (it
 * waits, then copies), or from the host-memory prompt cache (a restore); each computes its prompt
 * exactly as alone (the first token's numbers, bit for bit; with flash attention off every number).
 * Prompts that arrive together finish one after another, shortest first. The prompt cache's
 * bookkeeping is tested on its own.
 */
import assert from "node:assert/strict";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { loadConfig } from "../src/config.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { Batch, type FlashAttention, NativeContext, NativeModel } from "../src/engines/llama/native.ts";
import { checkpointMarks, exactResume, Scheduler } from "../src/engines/llama/scheduler.ts";
import { TokenSampler } from "../src/engines/llama/sampler.ts";
import { PromptCache, type SavedPrompt, usablePrefix } from "../src/engines/llama/prompt_cache.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;
const GREEDY = {
  temperature: 0,
  topK: 0,
  topP: 1,
  minP: 0,
  seed: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  repeatPenalty: 1,
  logitBias: new Map(),
};

const saved = (tokens: number[], bytes: number, checkpoints: number[] = []): SavedPrompt => ({
  tokens,
  state: new Uint8Array(bytes),
  checkpoints: checkpoints.map((pos) => ({ pos, data: new Uint8Array(1) })),
});

Deno.test("prompt cache: a KV prefix is usable anywhere, a recurrent one at its end or a checkpoint", () => {
  const holder = saved([1, 2, 3, 4, 5, 6], 0, [2, 4]);
  assert.equal(usablePrefix(holder, [1, 2, 3, 4, 9], false), 4);
  assert.equal(usablePrefix(holder, [1, 2, 3, 9], false), 3);
  assert.equal(usablePrefix(holder, [1, 2, 3, 9], true), 2, "the checkpoint at or before the divergence");
  assert.equal(usablePrefix(holder, [1, 2, 3, 4, 5, 6, 7], true), 6, "the state at its end");
  // The prompt's last token is always computed (its logits are needed).
  assert.equal(usablePrefix(holder, [1, 2, 3, 4, 5, 6], false), 5);
  assert.equal(usablePrefix(holder, [1, 2, 3, 4, 5, 6], true), 4);
  assert.equal(usablePrefix(holder, [9, 1, 2], true), 0);
});

Deno.test("prompt cache: bounded in bytes, least recently used out, entries a newer one holds replaced", () => {
  const cache = new PromptCache(100, false);
  assert.ok(cache.put(saved([1, 2, 3], 40)));
  assert.ok(cache.put(saved([7, 8, 9], 40)));
  assert.equal(cache.best([1, 2, 3, 4])?.tokens, 3);
  cache.hit(cache.best([1, 2, 3, 4])!.entry, 3); // [1, 2, 3] is now the most recently used
  assert.ok(cache.put(saved([5, 6], 40)), "a third entry evicts the least recently used one");
  assert.equal(cache.best([7, 8, 9, 1]), undefined, "[7, 8, 9] went");
  assert.equal(cache.best([1, 2, 3, 4])?.tokens, 3, "[1, 2, 3] stayed");
  assert.deepEqual([cache.stats.bytes, cache.stats.entries, cache.stats.evictions], [80, 2, 1]);
  assert.deepEqual([cache.stats.hits, cache.stats.tokensRestored], [1, 3]);
  // A longer conversation holds all of its earlier state: the earlier entry goes.
  assert.ok(cache.put(saved([1, 2, 3, 4, 5], 50)));
  assert.equal(cache.stats.replaced, 1);
  assert.ok(cache.covers([1, 2, 3]) && cache.covers([1, 2, 3, 4, 5]) && !cache.covers([1, 2, 4]));
  assert.equal(cache.put(saved([4, 4, 4], 101)), false, "larger than the whole cache: refused");
  assert.equal(new PromptCache(0, false).put(saved([1], 1)), false, "0 = off");
  // Recurrent: a longer entry holds a shorter one only with a checkpoint where the shorter one ends.
  const recurrent = new PromptCache(1000, true);
  recurrent.put(saved([1, 2, 3], 10));
  recurrent.put(saved([1, 2, 3, 4, 5], 10));
  assert.equal(recurrent.stats.entries, 2);
  recurrent.put(saved([1, 2, 3, 4, 5, 6], 10, [3, 5]));
  assert.equal(recurrent.stats.entries, 1);
});

Deno.test("exact resumption: a dense prompt resumes where its next chunk takes the attention path of alone", () => {
  // Alone, 512-721 is one chunk of 210 rows (tiled): resumed, at least 64 rows.
  assert.equal(exactResume([512], 722, 708), 658);
  assert.equal(exactResume([512], 722, 600), 600);
  // Alone, 512-539 is a chunk of 28 rows (row by row): resumed, at least 2 rows (one row splits).
  assert.equal(exactResume([512], 540, 539), 538);
  assert.equal(exactResume([512], 540, 530), 530);
  // Alone, 512-512 is one row: resumed, the same row.
  assert.equal(exactResume([512], 513, 512), 512);
  // Held up to a cut: the chunk after it is the chunk alone.
  assert.equal(exactResume([512, 1024], 1100, 1024), 1024);
  assert.equal(exactResume([512, 1024], 1100, 1060), 1036);
  assert.equal(exactResume([], 40, 30), 30);
});

Deno.test("checkpoint marks: turn starts past the first chunk, spaced, and the same for a prompt that extends another", () => {
  assert.deepEqual(checkpointMarks([100, 600, 650, 900, 1000], 1200, 512, 256), [600, 900]);
  assert.deepEqual(checkpointMarks([600, 1200], 1200, 512, 256), [600], "none at the prompt's end");
  // 3,000 short turns: a mark every 256 tokens or so, not one a turn.
  const turns = Array.from({ length: 3000 }, (_, i) => 20 * i);
  const marks = checkpointMarks(turns, 60_000, 512, 256);
  assert.ok(marks.length <= 60_000 / 256, `${marks.length} marks`);
  assert.ok(marks.every((p, i) => i === 0 || p - marks[i - 1] >= 256));
  // Extended by more turns, a prompt keeps every mark it had (resumed = alone).
  const shorter = checkpointMarks(turns.slice(0, 1234), 24_700, 512, 256);
  assert.deepEqual(marks.filter((p) => p < 24_700), shorter);
});

Deno.test("settings: --cache-ram / VSERVE_CACHE_RAM in MiB, 0 turns the cache off, negative is refused", async () => {
  assert.equal(
    (await loadConfig([], {})).config.cacheRam,
    undefined,
    "the registry's or the engine's default",
  );
  assert.equal((await loadConfig(["--cache-ram", "0"], {})).config.cacheRam, 0);
  assert.equal((await loadConfig([], { VSERVE_CACHE_RAM: "2048" })).config.cacheRam, 2048);
  await assert.rejects(loadConfig(["--cache-ram", "-1"], {}), /--cache-ram/);
});

/** A built-in chat model with its chat markup, and schedulers over it. */
async function modelSetup(name: string) {
  await llamaRuntime("cpu", silentLogger);
  const path = await resolveSource(`builtin:${name}`, { cacheDir: CACHE, hubUrl: "", log: silentLogger });
  const lib = openLlamaLibrary();
  const model = await NativeModel.load(lib, path, 0);
  const marker = model.tokenize("<|im_start|>", true)[0];
  const words = (n: number, seed: number) =>
    Array.from(
      { length: n },
      (_, i) => ["river", "stone", "light", "bell", "town", "hour", "quiet"][(i * seed + i) % 7],
    )
      .join(" ");
  /** A chat prompt: a system turn and a user turn. */
  const chat = (system: string, user: string) =>
    model.tokenize(
      `<|im_start|>system\n${system}<|im_end|>\n<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`,
      true,
    );
  const frees: (() => void)[] = [];
  /** A scheduler of `sequences` sequences, with a prompt cache of `cacheBytes`. */
  const scheduler = async (
    sequences: number,
    opts: {
      cacheBytes?: number;
      flashAttention?: FlashAttention;
      trace?: (event: Record<string, unknown>) => void;
      promptWorkPerDecode?: number;
    } = {},
  ) => {
    const chunk = 512;
    const ctx = await NativeContext.create(model, {
      nCtx: sequences * 2048,
      nBatch: chunk + sequences,
      nUbatch: chunk + sequences,
      nSeqMax: sequences,
      threads: 2,
      embeddings: false,
      kvUnified: false,
      flashAttention: opts.flashAttention,
    });
    const batch = new Batch(lib, chunk + sequences);
    const cache = new PromptCache(opts.cacheBytes ?? 0, model.recurrent);
    const s = new Scheduler(model, ctx, batch, {
      chunk,
      maxCheckpoints: 4,
      checkpointSpacing: 256,
      promptCache: cache,
      trace: opts.trace,
      promptWorkPerDecode: opts.promptWorkPerDecode,
    });
    frees.push(() => {
      batch.free();
      ctx.free();
    });
    return { s, cache };
  };
  /** A greedy job: log-probabilities (chosen, top 3) of each token, cached tokens, what was evaluated. */
  const run = (
    s: Scheduler,
    prompt: number[],
    opts: {
      reuse?: boolean;
      maxTokens?: number;
      signal?: AbortSignal;
      onPrompt?: (info: { cachedTokens: number }) => void;
    } = {},
  ) => {
    const logprobs: number[] = [];
    let cached = -1;
    return s.run({
      prompt,
      choices: [{ sampler: new TokenSampler(GREEDY, model.nVocab), grammar: null }],
      maxTokens: opts.maxTokens ?? 4,
      logprobs: 3,
      checkpoints: prompt.flatMap((t, i) => t === marker && i > 0 ? [i] : []),
      reusePrefix: opts.reuse ?? true,
      signal: opts.signal ?? new AbortController().signal,
      onPrompt: (info) => {
        cached = info.cachedTokens;
        opts.onPrompt?.(info);
      },
      onToken: (_choice, _token, lp) => {
        logprobs.push(lp!.logprob, ...lp!.top.map((t) => t.logprob));
        return true;
      },
      onEnd: () => {},
    }).then(() => ({ logprobs, first: logprobs.slice(0, 4), cached }));
  };
  /** The numbers of `prompt` computed alone from nothing. */
  const fresh = async (prompt: number[]) => await run((await scheduler(1)).s, prompt, { reuse: false });
  /** The numbers of `prompt` resumed from its own sequence after `before`. */
  const resumedAlone = async (before: number[], prompt: number[]) => {
    const { s } = await scheduler(1);
    await run(s, before);
    return await run(s, prompt);
  };
  const free = () => {
    for (const f of frees) f();
    model.free();
  };
  return { model, words, chat, scheduler, run, fresh, resumedAlone, free };
}

/** The same numbers, bit for bit. */
function assertSame(actual: number[], expected: number[], what: string) {
  assert.ok(actual.length > 0 && actual.length === expected.length, `${what}: ${actual.length} numbers`);
  assert.ok(actual.every((x, i) => Object.is(x, expected[i])), `${what}: ${actual} against ${expected}`);
}

for (const name of ["tiny-chat", "tiny-moe"]) {
  Deno.test({
    name: `scheduler (${name}): a prompt sharing a busy sequence's prefix starts from a copy of it`,
    fn: async () => {
      const m = await modelSetup(name);
      try {
        const system = m.words(700, 3);
        const first = m.chat(system, "First question about the river?");
        const second = m.chat(system, "Second question, about the bells and more?");
        const { s } = await m.scheduler(3);
        let copied: ReturnType<typeof m.run> | undefined;
        // The second prompt arrives while the first one is generating on its sequence.
        await m.run(s, first, { maxTokens: 24, onPrompt: () => void (copied = m.run(s, second)) });
        const result = await copied!;
        assert.equal(s.stats.prefixCopies, 1, "one copy");
        assert.ok(result.cached > 600, `the system turn came from the copy (${result.cached} tokens)`);
        assert.equal(s.stats.promptTokensCopied, result.cached);
        assert.equal(
          s.stats.promptTokensEvaluated,
          first.length + second.length - result.cached,
          "only the rest was computed",
        );
        const alone = await m.resumedAlone(first, second);
        assert.equal(alone.cached, result.cached, "the same prefix as when resumed from its own sequence");
        assertSame(result.first, (await m.fresh(second)).first, "the first token's numbers alone");
      } finally {
        m.free();
      }
    },
  });

  Deno.test({
    name: `scheduler (${name}): prompts arriving together with a shared prefix compute it once`,
    fn: async () => {
      const m = await modelSetup(name);
      try {
        const system = m.words(700, 3);
        const prompts = [
          "First question about the river?",
          "Second, the bells?",
          "Third: the town, the hour?",
        ]
          .map((q) => m.chat(system, q));
        const { s } = await m.scheduler(4);
        const results = await Promise.all(prompts.map((p) => m.run(s, p)));
        assert.equal(results[0].cached, 0);
        assert.equal(s.stats.prefixWaits, 2, "the other two waited for the first one's prefix");
        assert.equal(s.stats.prefixCopies, 2);
        const cached = results.map((r) => r.cached);
        assert.ok(cached[1] > 600 && cached[2] > 600, `the system turn was shared (${cached})`);
        assert.equal(
          s.stats.promptTokensEvaluated,
          prompts[0].length + prompts[1].length + prompts[2].length - cached[1] - cached[2],
          "the shared prefix was computed once",
        );
        for (const i of [1, 2]) {
          assert.equal((await m.resumedAlone(prompts[0], prompts[i])).cached, cached[i]);
          assertSame(results[i].first, (await m.fresh(prompts[i])).first, `prompt ${i}'s first token alone`);
        }
      } finally {
        m.free();
      }
    },
  });

  Deno.test({
    name: `scheduler (${name}): a conversation whose sequence another took is restored from the prompt cache`,
    fn: async () => {
      const m = await modelSetup(name);
      try {
        const system = m.words(700, 3);
        const first = m.chat(system, "First question about the river?");
        const other = m.chat(m.words(600, 5), "Something else entirely.");
        const next = m.chat(system, "Second question, about the bells and more?");
        for (const cacheBytes of [0, 64 << 20]) {
          // One sequence: the other conversation takes it, and the first one's state is lost or saved.
          const { s, cache } = await m.scheduler(1, { cacheBytes });
          await m.run(s, first);
          await m.run(s, other);
          const evaluated = s.stats.promptTokensEvaluated;
          const result = await m.run(s, next);
          if (cacheBytes === 0) {
            assert.ok(result.cached < 16, `no cache: computed again (${result.cached} template tokens kept)`);
            continue;
          }
          // Each conversation was saved when the other one took the sequence.
          assert.deepEqual([cache.stats.saves, cache.stats.hits], [2, 1], "saved twice, restored once");
          assert.ok(result.cached > 600, `the system turn came from the cache (${result.cached} tokens)`);
          assert.equal(cache.stats.tokensRestored, result.cached);
          assert.equal(s.stats.promptTokensEvaluated - evaluated, next.length - result.cached);
          assert.ok(cache.stats.bytes > 0 && cache.stats.bytes <= 64 << 20);
          assert.equal((await m.resumedAlone(first, next)).cached, result.cached);
          assertSame(result.first, (await m.fresh(next)).first, "the first token's numbers alone");
        }
      } finally {
        m.free();
      }
    },
  });
}

Deno.test({
  name:
    "scheduler (flash attention off): prompts resumed from a copy, a shared prefix or the cache compute as alone",
  fn: async () => {
    // Without flash attention a batched decode step computes as alone, so every number must match
    // the prompt computed alone from nothing.
    const m = await modelSetup("tiny-chat");
    try {
      const system = m.words(700, 3);
      const first = m.chat(system, "First question about the river?");
      const second = m.chat(system, "Second question, about the bells and more?");
      const fresh = await m.run((await m.scheduler(1, { flashAttention: "off" })).s, second, {
        reuse: false,
        maxTokens: 8,
      });
      const busy = (await m.scheduler(3, { flashAttention: "off" })).s;
      let copied: ReturnType<typeof m.run> | undefined;
      await m.run(busy, first, {
        maxTokens: 24,
        onPrompt: () => void (copied = m.run(busy, second, { maxTokens: 8 })),
      });
      const together = (await m.scheduler(2, { flashAttention: "off" })).s;
      const [, shared] = await Promise.all([
        m.run(together, first),
        m.run(together, second, { maxTokens: 8 }),
      ]);
      const { s: cached } = await m.scheduler(1, { cacheBytes: 64 << 20, flashAttention: "off" });
      await m.run(cached, first);
      await m.run(cached, m.chat(m.words(600, 5), "Something else entirely."));
      const restored = await m.run(cached, second, { maxTokens: 8 });
      for (const [what, r] of [["copy", await copied!], ["shared", shared], ["cache", restored]] as const) {
        assert.ok(r.cached > 600, `${what}: resumed (${r.cached})`);
        assertSame(r.logprobs, fresh.logprobs, what);
      }
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: a leader's first token comes before its followers start (and save what they replace)",
  fn: async () => {
    // Followers waiting for a leader's prefix start when it is done: each may first save the sequence
    // it takes to the prompt cache (on bench-chat 7 saves of 97 MB held the leader's first token 1.8 s).
    const m = await modelSetup("tiny-chat");
    try {
      const events: string[] = [];
      const { s } = await m.scheduler(3, {
        cacheBytes: 256 << 20,
        trace: (e) => events.push(String(e.ev)),
      });
      // Every sequence holds a conversation of its own, which a newcomer's prompt would replace.
      await Promise.all([1, 2, 3].map((k) => m.run(s, m.chat(m.words(300, k), `Old question ${k}?`))));
      const system = m.words(900, 7);
      const leader = m.run(s, m.chat(system, "First question?"), {
        onPrompt: () => events.push("leader prompted"),
      });
      const follower = m.run(s, m.chat(system, "Second question?"));
      const [, f] = await Promise.all([leader, follower]);
      assert.ok(f.cached > 600, `the follower took the leader's prefix (${f.cached})`);
      const take = events.indexOf("take");
      assert.ok(take >= 0 && events.includes("follow"), events.join(","));
      assert.ok(events.indexOf("leader prompted") < take, `order: ${events.join(",")}`);
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: prompts arriving together finish one after another, shortest first",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      // Three prompts of 3, 2 and 3 chunks with nothing in common.
      const prompts = [[1100, 3], [600, 5], [1100, 9]].map(([n, seed]) =>
        m.model.tokenize(m.words(n * 2, seed), false).slice(0, n)
      );
      const { s } = await m.scheduler(4);
      const done: [number, number][] = [];
      await Promise.all(
        prompts.map((p, i) => m.run(s, p, { onPrompt: () => done.push([i, s.stats.promptTokensEvaluated]) })),
      );
      // Each prompt's first token came as soon as its own chunks were done: none waited for the others'.
      assert.deepEqual(done, [[1, 600], [0, 1700], [2, 2800]]);
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: beside a generating sequence, a step runs one chunk or several by the decode step's cost",
  fn: async () => {
    // A long prompt arrives while another sequence generates: with prompt work bounded at 0 decode
    // steps' time, each of its chunks is followed by a decode step (as llama.cpp's micro-batch would
    // have it); unbounded, its four chunks (2,048 tokens: llama-server's n_batch) run in one step.
    const m = await modelSetup("tiny-chat");
    try {
      const between = async (promptWorkPerDecode: number) => {
        const events: { ev: string; ids?: number[] }[] = [];
        const { s } = await m.scheduler(2, {
          promptWorkPerDecode,
          trace: (e) => events.push(e as { ev: string; ids?: number[] }),
        });
        const stop = new AbortController();
        let tokens = 0;
        let started!: () => void;
        const generating = new Promise<void>((r) => (started = r));
        const eog = new Map([[m.model.eos, -Infinity], [m.model.tokenize("<|im_end|>", true)[0], -Infinity]]);
        const stream = s.run({
          prompt: m.chat("Be brief.", "Count."),
          choices: [{
            sampler: new TokenSampler({ ...GREEDY, logitBias: eog }, m.model.nVocab),
            grammar: null,
          }],
          maxTokens: 1500,
          signal: stop.signal,
          onPrompt: () => {},
          onToken: () => {
            if (++tokens === 3) started();
            return true;
          },
          onEnd: () => {},
        }).catch(() => {});
        await generating;
        const long = m.model.tokenize(m.words(4000, 11), false).slice(0, 2048);
        await m.run(s, long, { reuse: false, maxTokens: 1 });
        stop.abort();
        await stream;
        const chunks = events.flatMap((e, i) => e.ev === "chunk" && e.ids!.length === 1 ? [i] : []);
        const longChunks = chunks.slice(-4);
        assert.equal(longChunks.length, 4, JSON.stringify(events.slice(-40)));
        return events.slice(longChunks[0], longChunks[3]).filter((e) => e.ev === "decode").length;
      };
      assert.equal(await between(0), 3, "a decode step after each chunk");
      assert.equal(await between(1e9), 0, "the four chunks in one step");
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name:
    "scheduler: a prompt waiting for another's prefix goes on when that one is cancelled; a waiting one leaves",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      const system = m.words(1000, 3);
      const [a, b, c] = ["First question?", "Second question?", "Third question?"].map((q) =>
        m.chat(system, q)
      );
      const [leader, gone] = [new AbortController(), new AbortController()];
      let waits = -1;
      const holder: { s?: Scheduler } = {};
      // The leader's first chunk is done (its trace event comes as the decode returns, before the next
      // chunk): both others wait for its prefix; the leader's client leaves, and another's, right then,
      // whatever the machine's speed (a poll of the counters let a busy machine finish the leader first).
      const { s } = await m.scheduler(4, {
        trace: (e) => {
          if (e.ev !== "chunk" || waits >= 0) return;
          waits = holder.s!.stats.prefixWaits;
          gone.abort(new Error("client left"));
          leader.abort(new Error("client left"));
        },
      });
      holder.s = s;
      const evaluated: number[] = [];
      const cancelled = assert.rejects(m.run(s, a, { signal: leader.signal }), /left/);
      const leaving = assert.rejects(m.run(s, c, { signal: gone.signal }), /left/);
      const follower = m.run(s, b, { onPrompt: () => evaluated.push(s.stats.promptTokensEvaluated) });
      // (Every job settles before the model is freed, whatever fails.)
      const settled = Promise.allSettled([cancelled, leaving, follower]);
      await Promise.all([leaving, cancelled]);
      await settled;
      const result = await follower;
      assert.equal(waits, 2, "both others waited for the leader's prefix");
      assert.ok(result.cached >= 512, `the follower took what the leader had computed (${result.cached})`);
      const leaderWork = evaluated[0] - (b.length - result.cached);
      assert.equal(leaderWork, 512, "the leader computed its first chunk only");
      assert.equal(s.stats.busySequences, 0, "every sequence is free again");
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: prompts of several chunks each go to their end before the next one starts",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      const words = m.model.tokenize(m.words(1600, 3), false);
      const { s } = await m.scheduler(4);
      await m.run(s, words.slice(0, 500));
      // Three prompts that share 440, 420 and 400 tokens with what a sequence holds: each computes
      // two chunks (to 512, then to 620), of lengths no other one has next.
      const prompts = [440, 420, 400].map((n, i) =>
        [...words.slice(0, n), ...m.model.tokenize(`Question ${i}: ${m.words(400, 5 + i)}`, false)]
          .slice(0, 620)
      );
      const base = s.stats.promptTokensEvaluated;
      const done: [number, number, number][] = [];
      await Promise.all(prompts.map((p, i) =>
        m.run(s, p, {
          onPrompt: (info) => done.push([i, s.stats.promptTokensEvaluated - base, info.cachedTokens]),
        })
      ));
      // Each one's first token came right after its own chunks (180, then 200, then 220 tokens):
      // one chunk of each in turn had given [384, 492, 600].
      assert.deepEqual(done, [[0, 180, 440], [1, 380, 420], [2, 600, 400]]);
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: a prompt's last chunk has at least 64 tokens; resumed before it, it computes as alone",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      const words = m.model.tokenize(m.words(1600, 3), false);
      const prompt = words.slice(0, 540);
      const chunks: [number, number][] = [];
      const trace = (e: Record<string, unknown>) => {
        if (e.ev === "chunk") chunks.push([e.from as number, e.to as number]);
      };
      const fresh = await m.run((await m.scheduler(1, { trace })).s, prompt, { reuse: false });
      // Cut at 512, the last 28 tokens took flash attention's row-by-row path (twice the cost of
      // a token in a tile of 64 rows on CPU): the last chunk starts 64 tokens before the end.
      assert.deepEqual(chunks, [[0, 476], [476, 540]]);
      chunks.length = 0;
      const { s } = await m.scheduler(1, { trace });
      await m.run(s, words.slice(0, 500));
      chunks.length = 0;
      const resumed = await m.run(s, prompt);
      assert.deepEqual(chunks, [[476, 540]], "resumed where the chunk alone starts");
      assert.equal(resumed.cached, 476);
      assertSame(resumed.first, fresh.first, "the first token's numbers alone");
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: a conversation going on in its sequence saves nothing; another one taking it saves it",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      const first = m.chat(m.words(300, 3), "First question about the river?");
      const { s, cache } = await m.scheduler(1, { cacheBytes: 64 << 20 });
      const reply = await m.run(s, first, { maxTokens: 100 });
      assert.ok(reply.logprobs.length / 4 >= 80, `a long reply (${reply.logprobs.length / 4} tokens)`);
      // The client sends the conversation back with the reply in another form (here: left out).
      const next = [
        ...first,
        ...m.model.tokenize(
          "<|im_end|>\n<|im_start|>user\nAnd the bells?<|im_end|>\n<|im_start|>assistant\n",
          true,
        ),
      ];
      const second = await m.run(s, next);
      assert.ok(second.cached >= first.length - 64, `the conversation went on (${second.cached} cached)`);
      assert.equal(cache.stats.saves, 0, "its generated tail, which no request starts with, was not saved");
      await m.run(s, m.chat(m.words(300, 5), "Something else entirely."));
      assert.equal(cache.stats.saves, 1, "another conversation took the sequence: the first one was saved");
      const back = await m.run(s, [...next, ...m.model.tokenize("Third.", false)]);
      assert.ok(back.cached >= next.length - 64, `and came back from the cache (${back.cached} cached)`);
    } finally {
      m.free();
    }
  },
});

Deno.test({
  name: "scheduler: a request whose last token came settles before the next prompt chunk",
  fn: async () => {
    const m = await modelSetup("tiny-chat");
    try {
      const words = m.model.tokenize(m.words(3000, 3), false);
      const events: string[] = [];
      const { s } = await m.scheduler(2, {
        // One chunk a step beside a generating sequence, whatever the decode step costs.
        promptWorkPerDecode: 0,
        trace: (e) => {
          if (e.ev === "end") events.push(`end ${e.id}`);
          if (e.ev === "chunk") events.push(`chunk ${e.ids} from ${e.from}`);
        },
      });
      await Promise.all([m.run(s, words.slice(0, 20), { maxTokens: 3 }), m.run(s, words.slice(100, 1600))]);
      // The short request's third token came in the decode before the long prompt's second chunk:
      // it ended (its client got the end of the stream, its sequence was free) before that chunk.
      assert.deepEqual(events.slice(0, 4), ["chunk 1 from 0", "chunk 2 from 0", "end 1", "chunk 2 from 512"]);
    } finally {
      m.free();
    }
  },
});
