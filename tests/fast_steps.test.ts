/**
 * Fast steps (issue 28): short decodes on the JavaScript thread in bounded bursts, SSE chunk
 * coalescing, and what keeps the event loop serving meanwhile. No wall-clock assertions: order and
 * counters only.
 */
import assert from "node:assert/strict";
import { ComputeShare } from "../src/engines/compute_share.ts";
import { decodeKind, DecodePace } from "../src/engines/llama/pace.ts";
import { enableLoopTurns, loopTurn } from "../src/event_loop.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { Batch, NativeContext, NativeModel } from "../src/engines/llama/native.ts";
import { Scheduler } from "../src/engines/llama/scheduler.ts";
import { shortPassDue } from "../src/engines/llama/embedding.ts";
import { TokenSampler } from "../src/engines/llama/sampler.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;

Deno.test("decode pace: a kind runs on the thread once measured short, in bursts that a wait ends", () => {
  const pace = new DecodePace(4, 8);
  assert.equal(pace.onThread("a"), false, "never measured: off the thread, to measure it");
  pace.record("a", 2, false);
  assert.equal(pace.onThread("a"), true);
  pace.record("b", 30, false);
  assert.equal(pace.onThread("b"), false, "a long decode stays off the thread");
  // Synchronous compute adds up: 2 + 2 + 2 = 6 ms, and another 2 ms step would pass the 8 ms burst.
  pace.record("a", 2, true);
  pace.record("a", 2, true);
  assert.equal(pace.onThread("a"), true);
  pace.record("a", 2, true);
  pace.record("a", 2, true);
  assert.equal(pace.onThread("a"), false, "the burst is used up: the next decode lets the loop wait");
  pace.record("a", 2, false);
  assert.equal(pace.onThread("a"), true, "a decode off the thread starts a new burst");
  pace.record("a", 2, true);
  pace.record("a", 2, true);
  pace.record("a", 2, true);
  pace.record("a", 2, true);
  assert.equal(pace.onThread("a"), false);
  pace.rest();
  assert.equal(pace.onThread("a"), true, "the engine ran out of work: the loop waited");
  pace.endBurst();
  assert.equal(pace.onThread("a"), false, "a burst ended early (a first token to send)");
  pace.record("a", 2, false);
  assert.equal(pace.onThread("a"), true);
  // A moving average: one slow step moves it a quarter of the way; slow steps send the kind off.
  pace.record("a", 30, true);
  assert.equal(pace.expected("a"), 2 + (30 - 2) / 4);
  assert.equal(pace.onThread("a"), false);
  assert.equal(new DecodePace(0).onThread("a"), false);
  // The first decodes of a kind pay one-time costs: the least of the first three counts.
  const first = new DecodePace(4, 8);
  first.record("c", 40, false);
  assert.equal(first.expected("c"), 40);
  first.record("c", 2, false);
  first.record("c", 3, false);
  assert.equal(first.expected("c"), 2);
  assert.equal(first.samples("c"), 3);
  first.record("c", 6, false);
  assert.equal(first.expected("c"), 3, "then a moving average");
  const off = new DecodePace(0);
  off.record("a", 0.5, false);
  assert.equal(off.onThread("a"), false, "0: never on the thread");
});

Deno.test("decode pace: choices go by the median of recent durations, not by one lucky sample", () => {
  const pace = new DecodePace(4, 8);
  assert.equal(pace.median("a"), undefined);
  // The first decode paid one-time costs; then mostly 7.4 ms, once 1.2 (the 2-vCPU EPYC, two threads).
  for (const ms of [40, 7.4, 1.2, 7.5, 7.3]) pace.record("a", ms, false);
  assert.equal(pace.least("a"), 1.2);
  assert.equal(pace.median("a"), 7.35, "the first decode left out, then the median of four");
  // A kind that always takes 1.4 ms is the faster one by the median, not by the least.
  for (const ms of [1.5, 1.4, 1.4]) pace.record("b", ms, false);
  assert.ok(pace.median("b")! < pace.median("a")!);
  assert.ok(pace.least("b")! > pace.least("a")!);
  // Past eight decodes, the eight most recent count (the first no longer among them).
  for (let i = 0; i < 8; i++) pace.record("a", 2, false);
  assert.equal(pace.median("a"), 2);
  const one = new DecodePace(4, 8);
  one.record("c", 5, false);
  assert.equal(one.median("c"), 5, "a single decode is its own median");
});

Deno.test("short embedding pass: an unmeasured shape is tried once the main context's live figures allow", () => {
  const base = { samples: 0, median: NaN, n: 1, tried: false, mainMs: NaN, limitMs: 6 };
  // Probes at load short enough: tried at once, whatever the main context says.
  assert.equal(shortPassDue({ ...base, tried: true }), true);
  // Probes at load too long to try (a machine busy at load): tried once the main context's decodes of
  // the step are within twice the thread's limit. (Before, never: the short context, made, sat unused.)
  assert.equal(shortPassDue(base), false, "nothing measured yet");
  assert.equal(shortPassDue({ ...base, mainMs: 13 }), false, "the main context's figures too long");
  assert.equal(shortPassDue({ ...base, mainMs: 3 }), true);
  assert.equal(shortPassDue({ ...base, samples: 1, mainMs: 3 }), true, "its second decode too");
  // Measured: by its median, and again every 64th step when too long.
  const measured = { ...base, samples: 2, mainMs: 3 };
  assert.equal(shortPassDue({ ...measured, median: 5 }), true);
  assert.equal(shortPassDue({ ...measured, median: 7, n: 63 }), false);
  assert.equal(shortPassDue({ ...measured, median: 7, n: 64 }), true);
});

Deno.test("decode pace: the least of a kind's recent durations, and which kinds are short", () => {
  const pace = new DecodePace(4, 8);
  assert.equal(pace.least("a"), undefined);
  assert.equal(pace.short("a"), false, "never measured");
  for (const ms of [3, 90, 2.5, 40]) pace.record("a", ms, false);
  assert.equal(pace.least("a"), 2.5, "what slowed the others down only added time");
  assert.equal(pace.short("a"), false, "the average is past 4 ms");
  for (let i = 0; i < 8; i++) pace.record("a", 10, false);
  assert.equal(pace.least("a"), 10, "only the last eight count");
  pace.record("b", 3, false);
  pace.record("b", 3, true);
  pace.record("b", 3, true);
  assert.equal(pace.onThread("b"), false, "the burst is used up");
  assert.equal(pace.short("b"), true, "but the kind is short: a turn of the loop, then the thread");
});

Deno.test("decode pace: kinds by token count (exact to 16, then powers of two) and mode", () => {
  assert.equal(decodeKind(1, false), "g1");
  assert.equal(decodeKind(16, false), "g16");
  assert.equal(decodeKind(17, false), "g32");
  assert.equal(decodeKind(512, true), "e512");
  assert.notEqual(decodeKind(3, true), decodeKind(3, false));
  assert.equal(decodeKind(11, false, 1024), "g11", "the start of the context");
  assert.equal(decodeKind(11, false, 32_071), "g11@32768", "a long context is a kind of its own");
  assert.equal(decodeKind(11, true, 32_071), "e11");
});

Deno.test({
  name: "decode pace: a short shape far into the context is measured off the thread before it runs on it",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // Found by the adversarial pass: 11 tokens at position 32,070 took 202 ms on the JavaScript
    // thread, their kind measured at 1.8 ms at the start of the context.
    const model = await tinyChat();
    const seen: { kind: string; onThread: boolean }[] = [];
    const ctx = await NativeContext.create(model, {
      nCtx: 2048,
      nBatch: 512,
      nUbatch: 512,
      nSeqMax: 1,
      threads: 1,
      embeddings: false,
      kvUnified: false,
      // Every decode counts as 1 ms and as one that let the loop wait (no burst ends): where a decode
      // runs depends on its kind alone.
      pace: new (class extends DecodePace {
        override record(kind: string, _ms: number, onThread: boolean) {
          seen.push({ kind, onThread });
          super.record(kind, 1, false);
        }
      })(1000, 8),
    });
    const batch = new Batch(model.lib, 512);
    try {
      const step = async (from: number, n: number) => {
        batch.clear();
        for (let i = from; i < from + n; i++) batch.add(100 + (i % 50), i, 0, i === from + n - 1);
        await ctx.decode(batch);
        return seen.at(-1)!;
      };
      let pos = 0;
      for (let i = 0; i < 3; i++, pos += 11) await step(pos, 11);
      assert.deepEqual(seen.map((s) => s.onThread), [false, true, true], "measured, then on the thread");
      while (pos < 1500 - 500) pos += (await step(pos, 500), 500);
      await step(pos, 1500 - pos);
      pos = 1500;
      const far = await step(pos, 11);
      assert.equal(far.onThread, false, "the same shape at position 1,500: off the thread, to measure it");
      assert.notEqual(far.kind, seen[0].kind);
      assert.equal((await step(pos + 11, 11)).onThread, true, "then on it (measured short)");
    } finally {
      batch.free();
      ctx.free();
      model.free();
    }
  },
});

Deno.test({
  name: "state snapshots: a small one is written on the JavaScript thread, and restores to the same logits",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await tinyChat();
    const ctx = await NativeContext.create(model, {
      nCtx: 2 * 512,
      nBatch: 512,
      nUbatch: 512,
      nSeqMax: 2,
      threads: 1,
      embeddings: false,
      kvUnified: false,
    });
    const batch = new Batch(model.lib, 512);
    try {
      const prompt = Array.from({ length: 40 }, (_, i) => 100 + i);
      batch.clear();
      prompt.forEach((t, i) => batch.add(t, i, 0, i === prompt.length - 1));
      await ctx.decode(batch);
      const logits = ctx.logits(prompt.length - 1).slice();
      const state = await ctx.saveState(0, 0);
      assert.deepEqual(ctx.saves, { onThread: 1, offThread: 0 }, `${state.length} bytes: no hand-off`);
      // The snapshot is whole: restored into the other sequence, its next token's logits are those of
      // the same token decoded on the original.
      await ctx.restoreState(1, state, 0);
      for (const seq of [0, 1]) {
        batch.clear();
        batch.add(7, prompt.length, seq, true);
        await ctx.decode(batch);
        if (seq === 0) logits.set(ctx.logits(0));
        else assert.deepEqual(ctx.logits(0), logits);
      }
    } finally {
      batch.free();
      ctx.free();
      model.free();
    }
  },
});

/** The built-in tiny-chat model, loaded on the CPU build of llama.cpp (generated on first use). */
async function tinyChat(): Promise<NativeModel> {
  await llamaRuntime("cpu", silentLogger);
  const path = await resolveSource("builtin:tiny-chat", { cacheDir: CACHE, hubUrl: "", log: silentLogger });
  return await NativeModel.load(openLlamaLibrary(), path, 0);
}

/**
 * Generates `tokens` tokens of tiny-chat with every measured step on the thread (bursts of 8),
 * calling `onToken` with the count so far; returns the context's decode counters of the run.
 */
async function generateOnThread(
  tokens: number,
  onToken: (generated: number) => void,
): Promise<{ onThread: number; offThread: number; turns: number }> {
  const model = await tinyChat();
  const ctx = await NativeContext.create(model, {
    nCtx: 2 * 1024,
    nBatch: 516,
    nUbatch: 516,
    nSeqMax: 2,
    threads: 1,
    embeddings: false,
    kvUnified: false,
    // Every measured step on the thread, in bursts of 8: each decode counts as 1 ms, however slow the
    // machine (a loaded one took steps of over 8 ms, which go off the thread).
    pace: new (class extends DecodePace {
      override record(kind: string, _ms: number, onThread: boolean) {
        super.record(kind, 1, onThread);
      }
    })(1000, 8),
  });
  const batch = new Batch(model.lib, 516);
  const scheduler = new Scheduler(model, ctx, batch, {
    chunk: 512,
    maxCheckpoints: 4,
    checkpointSpacing: 256,
  });
  // No end of text: every run decodes its whole length.
  const eog = new Map<number, number>();
  for (let t = 0; t < model.nVocab; t++) if (model.isEog(t)) eog.set(t, -Infinity);
  const params = {
    temperature: 0.8,
    topK: 40,
    topP: 0.95,
    minP: 0.05,
    seed: 1,
    presencePenalty: 0,
    frequencyPenalty: 0,
    repeatPenalty: 1,
    logitBias: eog,
  };
  try {
    let generated = 0;
    const before = { ...ctx.decodes };
    await scheduler.run({
      prompt: model.tokenize("the river carries light across stones", false),
      choices: [{ sampler: new TokenSampler(params, model.nVocab), grammar: null }],
      maxTokens: tokens,
      signal: new AbortController().signal,
      onPrompt: () => {},
      onToken: () => {
        onToken(++generated);
        return true;
      },
      onEnd: () => {},
    });
    assert.equal(generated, tokens);
    return {
      onThread: ctx.decodes.onThread - before.onThread,
      offThread: ctx.decodes.offThread - before.offThread,
      turns: ctx.decodes.turns - before.turns,
    };
  } finally {
    batch.free();
    ctx.free();
    model.free();
  }
}

/**
 * Generates as {@link generateOnThread}, asking a server of this process once at token 10; returns
 * the decode counters and the token count when the answer came (-1: not during the run).
 */
async function askedDuring(tokens: number) {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => new Response("ok"));
  const url = `http://127.0.0.1:${server.addr.port}/`;
  try {
    let count = 0;
    let answeredAt = -1;
    const decodes = await generateOnThread(tokens, (generated) => {
      count = generated;
      if (generated !== 10) return;
      void fetch(url).then(async (r) => {
        await r.text();
        answeredAt = count;
      });
    });
    return { ...decodes, answeredAt };
  } finally {
    await server.shutdown();
  }
}

Deno.test({
  name: "scheduler: short steps decode on the JavaScript thread, and the event loop still turns",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const tokens = 300;
    const { onThread, offThread, turns, answeredAt } = await askedDuring(tokens);
    assert.ok(onThread > 0, `no decode ran on the JavaScript thread (${offThread} off it)`);
    // (Off the thread without a burst limit: the prompt's decode and the first step, to measure them.)
    assert.ok(offThread > 2, "bursts end with a decode off the thread");
    assert.equal(turns, 0, "no loop turns unless enabled");
    assert.ok(answeredAt >= 10 && answeredAt < tokens, `the client was answered after token ${answeredAt}`);
  },
});

// From here on this process takes its loop turns through a loopback pair (as the server does).
Deno.test({
  name: "loop turns: blocks of synchronous work with a turn between them serve sockets and timers",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    assert.ok(await enableLoopTurns(), "a loopback pair");
    const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => new Response("ok"));
    try {
      let answered = false;
      let fired = false;
      setTimeout(() => (fired = true), 0);
      const asked = fetch(`http://127.0.0.1:${server.addr.port}/`).then(async (r) => {
        assert.equal(await r.text(), "ok");
        answered = true;
      });
      let turns = 0;
      while (!(answered && fired) && turns < 500) {
        const end = performance.now() + 1;
        while (performance.now() < end) { /* a decode on this thread */ }
        // Concurrent callers take one turn each.
        await Promise.all([loopTurn(), loopTurn()]);
        turns++;
      }
      await asked;
      assert.ok(answered && fired, `after ${turns} turns: answered ${answered}, timer ${fired}`);
    } finally {
      await server.shutdown();
    }
  },
});

Deno.test({
  name: "scheduler: with loop turns, bursts end with a turn that serves sockets, not a decode off the thread",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    assert.ok(await enableLoopTurns(), "a loopback pair for the turns");
    const tokens = 300;
    const { onThread, offThread, turns, answeredAt } = await askedDuring(tokens);
    // Only the prompt's decode and the first step, to measure them: every later one on the thread.
    assert.equal(offThread, 2, `${offThread} decodes off the thread (${onThread} on it)`);
    assert.ok(turns >= Math.floor((tokens - 2) / 8) - 1, `${turns} turns for bursts of 8 decodes`);
    assert.ok(answeredAt >= 10 && answeredAt < tokens, `the client was answered after token ${answeredAt}`);
  },
});

Deno.test("compute share: a synchronous step runs at once only when the turn is free, and is charged", async () => {
  let t = 0;
  const share = new ComputeShare({ now: () => t, setTimer: () => 0, clearTimer: () => {} });
  const a = share.client("a");
  const b = share.client("b");
  assert.deepEqual(a.runNow(() => (t += 5, 7)), { result: 7 }, "nothing else: at once");
  assert.equal(a.steps, 1);
  assert.equal(a.seconds, 0.005, "charged like a step through run");
  let finish!: () => void;
  const running = b.run(() => new Promise<void>((resolve) => (finish = resolve)));
  assert.equal(a.runNow(() => 1), undefined, "not while another model's step runs");
  finish();
  await running;
  // b is owed compute and a takes longer steps than b's gaps: the turn is held for b.
  assert.equal(a.runNow(() => 1), undefined, "not while the turn is held for another model");
  b.idle();
  assert.deepEqual(a.runNow(() => 2), { result: 2 }, "the hold ended: at once again");
  assert.equal(a.steps, 2);
});

Deno.test({
  name: "decode pace: the decode after a sequence copy runs off the thread and is not taken as its shape's",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await tinyChat();
    const pace = new DecodePace(1000, 1000);
    const ctx = await NativeContext.create(model, {
      nCtx: 2 * 512,
      nBatch: 64,
      nUbatch: 64,
      nSeqMax: 2,
      threads: 1,
      embeddings: false,
      kvUnified: false,
      pace,
    });
    const batch = new Batch(model.lib, 64);
    const step = async (seq: number, pos: number) => {
      batch.clear();
      batch.add(model.bos >= 0 ? model.bos : 0, pos, seq, true);
      await ctx.decode(batch);
    };
    try {
      await step(0, 0); // measured off the thread
      await step(0, 1);
      assert.deepEqual(ctx.decodes, { onThread: 1, offThread: 1, turns: 0, fewerThreads: 0, hostBusy: 0 });
      // (This pace serves this context alone: its one kind is a one-token step, keyed by context.)
      const kind = Array.from({ length: 100 }, (_, i) => `${i}:g1`).find((k) =>
        pace.expected(k) !== undefined
      );
      const expected = pace.expected(kind!);
      ctx.copySequence(0, 1);
      await step(1, 2);
      assert.deepEqual(
        ctx.decodes,
        { onThread: 1, offThread: 2, turns: 0, fewerThreads: 0, hostBusy: 0 },
        "the copy's decode went off the thread",
      );
      assert.equal(pace.expected(kind!), expected, "its time (the copy's too) is not the shape's");
      await step(1, 3);
      assert.deepEqual(
        ctx.decodes,
        { onThread: 2, offThread: 2, turns: 0, fewerThreads: 0, hostBusy: 0 },
        "then on the thread again",
      );
    } finally {
      batch.free();
      ctx.free();
      model.free();
    }
  },
});
