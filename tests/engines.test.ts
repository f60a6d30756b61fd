/**
 * Engine paths that the built-in models do not take under their default settings, exercised on
 * the generated models with real inference: a step of short embedding inputs as one decode (what
 * 0.6B-and-larger models do) must give the vectors of the two-decode path, and a request cancelled
 * between its two decodes gets no second one; the logits of a decode's
 * outputs are rows of one view of llama.cpp's buffer, not an ArrayBuffer per token (which cost a
 * garbage collection every few tokens); prompts of one length that arrive together share a decode
 * and compute exactly as alone.
 */
import assert from "node:assert/strict";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { nativeView, openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { Batch, type FlashAttention, NativeContext, NativeModel } from "../src/engines/llama/native.ts";
import { LlamaEmbeddingEngine } from "../src/engines/llama/embedding.ts";
import { OnnxEmbeddingEngine } from "../src/engines/onnx/embedding.ts";
import { qwen3TokenizerJsonPath } from "../src/models/qwen3_vocab.ts";
import { Tokenizer } from "@huggingface/tokenizers";
import { Scheduler } from "../src/engines/llama/scheduler.ts";
import type { GrammarConstraint } from "../src/engines/llama/grammar.ts";
import { TokenSampler } from "../src/engines/llama/sampler.ts";
import { settles } from "./helpers/poll.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;

/** The bound libllama (CPU) and the path of built-in model `name`, generated on first use. */
async function nativeSetup(name: string) {
  await llamaRuntime("cpu", silentLogger);
  const path = await resolveSource(`builtin:${name}`, { cacheDir: CACHE, hubUrl: "", log: silentLogger });
  return { lib: openLlamaLibrary(), path };
}

/**
 * The built-in tiny-embed model (last-token pooling); `onePassTokens` 0: always two decodes;
 * undefined: short steps choose by measured decode times. The short context is off unless asked for:
 * these tests are about the main context's paths.
 */
async function tinyEmbed(
  onePassTokens: number | undefined,
  threads = 2,
  more: { shortPass?: "on" | "off"; pooling?: "last" | "mean" | "cls" } = {},
) {
  const { lib, path: modelPath } = await nativeSetup("tiny-embed");
  return await LlamaEmbeddingEngine.load(lib, {
    modelPath,
    gpuLayers: 0,
    threads,
    maxInputTokens: 512,
    onePassTokens,
    shortPass: more.shortPass ?? "off",
    pooling: more.pooling,
  });
}

/** The cosine of two vectors. */
function cosine(a: Float32Array, b: Float32Array): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) [ab, aa, bb] = [ab + a[i] * b[i], aa + a[i] * a[i], bb + b[i] * b[i]];
  return ab / Math.sqrt(aa * bb);
}

for (const pooling of ["last", "mean", "cls"] as const) {
  Deno.test({
    name: `embeddings (${pooling} pooling): a short request alone is one decode of the short context, ` +
      "on this thread, computed only up to the embeddings, with the main context's vectors",
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async () => {
      const short = await tinyEmbed(undefined, 2, { shortPass: "on", pooling });
      const main = await tinyEmbed(0, 2, { pooling });
      try {
        const texts = ["hello", "a sentence about rivers", "¿dónde está la estación?"];
        const ids = await Promise.all(texts.map((t) => short.tokenize(t)));
        for (let round = 0; round < 3; round++) {
          for (const input of ids) {
            const before = short.counters();
            const [vector] = await short.embed([input]);
            const after = short.counters();
            assert.equal(after.decodes - before.decodes, 1, JSON.stringify(after));
            assert.equal(after.decodes_short_pass - before.decodes_short_pass, 1, JSON.stringify(after));
            const [reference] = await main.embed([input]);
            assert.ok(cosine(vector, reference) > 0.9999, `${cosine(vector, reference)}`);
          }
        }
        // Several short inputs of one request (16 tokens at most in all): one decode for all of them.
        const few = ids.slice(0, 2);
        assert.ok(few.reduce((n, x) => n + x.length, 0) <= 16);
        const before = short.counters();
        const together = await short.embed(few);
        assert.equal(short.counters().decodes_short_pass - before.decodes_short_pass, 1);
        const reference = await main.embed(few);
        together.forEach((v, i) => assert.ok(cosine(v, reference[i]) > 0.9999, `input ${i}`));
        assert.equal(main.counters().decodes_short_pass, 0, "off: never");
      } finally {
        await short.dispose();
        await main.dispose();
      }
    },
  });
}

Deno.test({
  name: "a context stopped at the embeddings: the same embedding bits as a whole graph, its vocabulary " +
    "projection not computed (its logits are not the model's)",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const { lib, path } = await nativeSetup("tiny-embed");
    const model = await NativeModel.load(lib, path, 0);
    const open = (stopAtEmbeddings: boolean) =>
      NativeContext.create(model, {
        nCtx: 256,
        nBatch: 16,
        nUbatch: 16,
        nSeqMax: 2,
        threads: 1,
        embeddings: true,
        pooling: "none",
        kvUnified: true,
        stopAtEmbeddings,
      });
    const [stopped, whole] = [await open(true), await open(false)];
    const batch = new Batch(lib, 16);
    try {
      const fill = (n: number) => {
        batch.clear();
        for (let i = 0; i < n; i++) batch.add(100 + 37 * i, i, 0, true);
      };
      fill(16);
      await stopped.warmUp(batch);
      stopped.clear();
      const row = (ctx: NativeContext, i: number) =>
        nativeView(Float32Array, lib.symbols.llama_get_embeddings_ith(ctx.ptr, i), model.nEmbd).slice();
      for (const n of [1, 7, 16]) {
        const out = [];
        for (const ctx of [stopped, whole]) {
          fill(n);
          await ctx.decode(batch);
          out.push({ embd: row(ctx, n - 1), logits: ctx.logits(n - 1).slice(0, 64) });
          ctx.clear();
        }
        assert.deepEqual(out[0].embd, out[1].embd, `${n} tokens: the embeddings`);
        assert.notDeepEqual(out[0].logits, out[1].logits, `${n} tokens: the projection was computed`);
      }
      assert.equal(stopped.decodes.offThread, 0, "every decode of the stopped context on this thread");
      assert.equal(stopped.decodes.onThread, 3);
    } finally {
      batch.free();
      stopped.free();
      whole.free();
      model.free();
    }
  },
});

Deno.test({
  name: "embeddings: inputs past the short step, or in a step with a long one, take the main context's path",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const engine = await tinyEmbed(undefined, 2, { shortPass: "on" });
    try {
      const long = await engine.tokenize("about rivers and stones ".repeat(8));
      const word = await engine.tokenize("hello");
      assert.ok(long.length > 16 && word.length <= 16);
      let before = engine.counters();
      await engine.embed([long]);
      assert.equal(engine.counters().decodes_short_pass, before.decodes_short_pass, "17 tokens or more");
      // With the long input in one step: the main context's step for both.
      before = engine.counters();
      await engine.embed([long, word]);
      assert.equal(engine.counters().decodes_short_pass, before.decodes_short_pass);
      before = engine.counters();
      await engine.embed([word]);
      assert.equal(engine.counters().decodes_short_pass - before.decodes_short_pass, 1, "alone again");
    } finally {
      await engine.dispose();
    }
  },
});

/**
 * Starts `engine` on `ids`, cancels at once (its first decode or run is already under way), and
 * checks that only `decodes` decodes ran and that the engine goes on serving.
 */
async function assertCancelStops(
  engine: LlamaEmbeddingEngine | OnnxEmbeddingEngine,
  ids: number[][],
  decodes: number,
) {
  const before = engine.counters().decodes;
  const controller = new AbortController();
  const result = engine.embed(ids, controller.signal);
  controller.abort(new Error("client left"));
  await assert.rejects(result, /client left/);
  assert.equal(engine.counters().decodes - before, decodes);
  const [vector] = await engine.embed([ids[0]]);
  assert.equal(vector.length, engine.nativeDims, "the engine goes on serving");
}

Deno.test({
  name: "embeddings: short inputs in one decode give the vectors of bodies and last tokens decoded apart",
  fn: async () => {
    const [apart, together] = [await tinyEmbed(0), await tinyEmbed(512)];
    try {
      const texts = [
        "hello",
        "a somewhat longer sentence about rivers and stones",
        "¿dónde está la estación?",
      ];
      const ids = await Promise.all(texts.map((t) => apart.tokenize(t)));
      const before = together.counters().decodes;
      // One input alone, then all three in one call: each a single decode on `together`.
      const alone = await together.embed([ids[1]]);
      const all = await together.embed(ids);
      assert.equal(together.counters().decodes - before, 2, "one decode per call");
      const reference = await apart.embed(ids);
      assert.ok(apart.counters().decodes >= 2, "the reference decodes bodies and last tokens apart");
      for (let i = 0; i < ids.length; i++) {
        assert.ok(cosine(all[i], reference[i]) > 0.9999, `input ${i}: ${cosine(all[i], reference[i])}`);
      }
      assert.ok(cosine(alone[0], reference[1]) > 0.9999);
    } finally {
      await apart.dispose();
      await together.dispose();
    }
  },
});

Deno.test({
  name: "embeddings: a short decode tries all threads and one, and both give the same bits",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const engine = await tinyEmbed(undefined, 2);
    try {
      const ids = await engine.tokenize("a sentence about rivers");
      const vectors: Float32Array[] = [];
      for (let i = 0; i < 10; i++) vectors.push((await engine.embed([ids]))[0]);
      // Each short shape is measured with both thread counts before one is chosen (which one wins is
      // the machine's business, not asserted).
      assert.ok(engine.counters().decodes_fewer_threads > 0, JSON.stringify(engine.counters()));
      for (const v of vectors) assert.deepEqual(v, vectors[0], "the same bits whatever the thread count");
      // An input of 256 tokens or more: every decode with every thread (the attention over a long KV
      // range is split between threads, and one thread would round it differently).
      const long = await engine.tokenize("word ".repeat(300));
      assert.ok(long.length >= 256);
      const before = engine.counters();
      await engine.embed([long]);
      const after = engine.counters();
      assert.ok(after.decodes > before.decodes);
      assert.equal(after.decodes_fewer_threads, before.decodes_fewer_threads, JSON.stringify(after));
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "embeddings: a short step's shape tries one decode and two before choosing by their times",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const engine = await tinyEmbed(undefined);
    try {
      const ids = await engine.tokenize("a sentence about rivers");
      const decodes: number[] = [];
      const vectors: Float32Array[] = [];
      for (let i = 0; i < 8; i++) {
        const before = engine.counters().decodes;
        vectors.push((await engine.embed([ids]))[0]);
        decodes.push(engine.counters().decodes - before);
      }
      // Measured twice each, then the path measured cheaper (no timing asserted: which one wins, and
      // whether a later figure turns the choice, is the machine's business).
      assert.deepEqual(decodes.slice(0, 4), [1, 1, 2, 2], `decodes per call: ${decodes}`);
      assert.ok(decodes.every((d) => d === 1 || d === 2), `decodes per call: ${decodes}`);
      let [ab, aa, bb] = [0, 0, 0];
      for (let d = 0; d < vectors[0].length; d++) {
        [ab, aa, bb] = [ab + vectors[0][d] * vectors[2][d], aa + vectors[0][d] ** 2, bb + vectors[2][d] ** 2];
      }
      assert.ok(ab / Math.sqrt(aa * bb) > 0.9999, "both paths give the same vector");
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "embeddings: a request cancelled during its body decode gets no output decode",
  fn: async () => {
    // Two decodes a step (the path of long inputs): the body decode runs, the output decode must not.
    const engine = await tinyEmbed(0);
    try {
      const ids = await Promise.all(
        ["a sentence about rivers", "another about stones"].map((t) => engine.tokenize(t)),
      );
      await assertCancelStops(engine, ids, 1);
      assert.equal(engine.counters().inputs_embedded, 1, "only the input embedded afterwards");
    } finally {
      await engine.dispose();
    }
  },
});

/** The built-in ONNX embedding model on CPU, batches of at most 8 inputs. */
async function onnxSetup() {
  const modelPath = await resolveSource("builtin:tiny-embed-onnx", {
    cacheDir: CACHE,
    hubUrl: "",
    log: silentLogger,
  });
  const { engine } = await OnnxEmbeddingEngine.load({
    modelPath,
    tokenizerPath: qwen3TokenizerJsonPath(),
    pooling: "mean",
    threads: 2,
    gpu: "cpu",
    maxBatch: 8,
    log: silentLogger,
  });
  const ids = await Promise.all(
    Array.from({ length: 64 }, (_, i) => engine.tokenize(`sentence ${i} about rivers`)),
  );
  return { engine, ids };
}

/**
 * 64 clients each sending one input after another until `total` are done; returns the most
 * requests that came after one of them and finished before it (how far a request was passed).
 */
async function mostOvertaken(embed: (ids: number[]) => Promise<unknown>, ids: number[][], total: number) {
  let arrived = 0;
  const finished: number[] = []; // arrival numbers, in order of finishing
  let most = 0;
  await Promise.all(Array.from({ length: 64 }, async (_, c) => {
    while (arrived < total) {
      const me = arrived++;
      await embed(ids[(me + c) % ids.length]);
      most = Math.max(most, finished.filter((a) => a > me).length);
      finished.push(me);
    }
  }));
  return most;
}

Deno.test({
  name: "embeddings: 64 clients in a closed loop: no request is passed by more than 2 rounds of newer ones",
  fn: async () => {
    const engine = await tinyEmbed(0, 1);
    try {
      const ids = await Promise.all(
        Array.from(
          { length: 16 },
          (_, i) => engine.tokenize(`request ${i} ` + "about rivers ".repeat(i % 5)),
        ),
      );
      const most = await mostOvertaken((x) => engine.embed([x]), ids, 1000);
      // Newcomers placed level with the least-served request kept passing one fed part-way (976 of 1,000
      // here), and so did shortest-first feeding before (775).
      assert.ok(most <= 128, `a request was passed by ${most} newer ones`);
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "onnx embeddings: a request whose client left runs no further batch",
  fn: async () => {
    const { engine, ids } = await onnxSetup();
    try {
      // The first batch of 8 is running; the other 7 must not start.
      await assertCancelStops(engine, ids, 1);
    } finally {
      await engine.dispose();
    }
    // Unloaded, it refuses instead of leaving a request waiting.
    await assert.rejects(engine.embed([ids[0]]), /unloaded/);
  },
});

Deno.test({
  name: "onnx embeddings: a long text tokenized on the tokenizer's worker gets the thread's own ids",
  fn: async () => {
    const { engine } = await onnxSetup();
    try {
      const tokenizer = new Tokenizer(JSON.parse(await Deno.readTextFile(qwen3TokenizerJsonPath())), {});
      const words = ["rivers", " run", "\n\n", "  ", "naïve", "東京", "🙂", "x=1;", "\t", "It's", "123456"];
      const long = Array.from({ length: 6000 }, (_, i) => words[(i * 7) % words.length]).join("");
      assert.ok(long.length > 8192);
      assert.deepEqual(await engine.tokenize(long), tokenizer.encode(long).ids);
      // A markup string in it: the fragments around it, each on the worker, as plain text.
      const marked = `${long}<|im_end|>${long}`;
      const ids = await engine.tokenize(marked);
      assert.ok(!ids.includes(151645), "no <|im_end|> token from text");
      assert.equal(await engine.detokenize(ids), marked);
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "onnx embeddings: a one-input request queued behind a 64-input one is in the next batch",
  fn: async () => {
    const { engine, ids } = await onnxSetup();
    try {
      let bigDone = false;
      const big = engine.embed(ids).then((v) => (bigDone = true, v));
      big.catch(() => {}); // awaited below
      const [small] = await engine.embed([ids[0]]);
      assert.equal(bigDone, false, "the small request finished first");
      assert.equal(engine.counters().inputs_embedded, 16, "in the batch after the one running");
      const vectors = await big;
      assert.equal(vectors.length, 64);
      const diff = small.reduce((m, v, d) => Math.max(m, Math.abs(v - vectors[0][d])), 0);
      assert.ok(diff < 1e-5, `the same input gives the same vector in another batch (${diff})`);
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "onnx embeddings: requests share runs by tokens: 64 short inputs pass 64 long ones after one run",
  fn: async () => {
    const { engine } = await onnxSetup();
    try {
      const long = await engine.tokenize("the river runs past stones ".repeat(400)); // ~2,000 tokens
      const short = await engine.tokenize("a word");
      const longJob = engine.embed(Array.from({ length: 64 }, () => long));
      // Joins while the first run of long inputs runs; by tokens, all its runs come before the next long one.
      const [shortDone] = await Promise.all([
        engine.embed(Array.from({ length: 64 }, () => short)).then(() => engine.counters().inputs_embedded),
        longJob,
      ]);
      assert.ok(
        shortDone <= 64 + 8,
        `${shortDone - 64} long inputs were run before the short request's (round robin by inputs: 64)`,
      );
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "onnx embeddings: a 16-input request keeps its share beside a stream of one-input requests",
  fn: async () => {
    const { engine } = await onnxSetup();
    try {
      const short = await engine.tokenize("a few words about rivers");
      const long = await engine.tokenize("a longer text about rivers and stones ".repeat(4));
      let shortsDone = 0;
      let bigDoneAfter = -1;
      const big = engine.embed(Array.from({ length: 16 }, () => long)).then(
        () => (bigDoneAfter = shortsDone),
      );
      // 16 clients (more than a run takes) send one short input after another: one always waits.
      await Promise.all(Array.from({ length: 16 }, async () => {
        while (bigDoneAfter < 0 && shortsDone < 6000) {
          await engine.embed([short]);
          shortsDone++;
        }
      }));
      await big;
      // Placed level with the least-served request, each newcomer went first: the big one waited for all.
      assert.ok(
        bigDoneAfter >= 0 && bigDoneAfter < 6000,
        `the big request finished after ${bigDoneAfter} short ones`,
      );
    } finally {
      await engine.dispose();
    }
  },
});

Deno.test({
  name: "logits: rows of one view of llama.cpp's output buffer, equal to its own rows, kept across decodes",
  fn: async () => {
    const { lib, path } = await nativeSetup("tiny-chat");
    const model = await NativeModel.load(lib, path, 0);
    const ctx = await NativeContext.create(model, {
      nCtx: 256,
      nBatch: 64,
      nUbatch: 64,
      nSeqMax: 3,
      threads: 2,
      embeddings: false,
      kvUnified: true,
    });
    const batch = new Batch(lib, 64);
    try {
      const prompts = ["hello there", "a river of stones", "¿dónde está?"].map((t) =>
        model.tokenize(t, false)
      );
      const outs = prompts.map((ids, seq) => {
        let out = -1;
        ids.forEach((id, pos) => (out = batch.add(id, pos, seq, pos === ids.length - 1)));
        return out;
      });
      await ctx.decode(batch);
      const check = (rows: number[]) => {
        // The first call for a later row may widen the view; after that one buffer serves them all.
        rows.forEach((i) => ctx.logits(i));
        const views = rows.map((i) => ctx.logits(i));
        rows.forEach((i, k) => {
          const own = nativeView(Float32Array, lib.symbols.llama_get_logits_ith(ctx.ptr, i), model.nVocab);
          assert.equal(views[k].length, model.nVocab);
          assert.ok(views[k].every((x, j) => Object.is(x, own[j])), `row ${i} differs from llama.cpp's`);
        });
        assert.ok(views.every((v) => v.buffer === views[0].buffer), "one ArrayBuffer for every row");
        assert.notDeepEqual(views[0], views[1]);
        return views[0].buffer;
      };
      const first = check(outs);
      // The next token of each sequence, in the order 2, 0, 1: other rows, the same buffer.
      batch.clear();
      const next = [2, 0, 1].map((seq) => batch.add(7 + seq, prompts[seq].length, seq, true));
      await ctx.decode(batch);
      assert.equal(check(next), first, "no new ArrayBuffer over the same output buffer");
    } finally {
      batch.free();
      ctx.free();
      model.free();
    }
  },
});

/** The first `tokens` tokens of a pseudo-random run of words (`seed`), at least that long. */
function wordPrompt(model: NativeModel, seed: number, tokens: number): number[] {
  const words = ["river", "stone", "light", "bell", "town", "hour", "quiet", "field", "cloud", "north"];
  let s = seed;
  const text = Array.from({ length: tokens * 2 }, () => words[(s = (s * 1103515245 + 12345) >>> 0) % 10]);
  const ids = model.tokenize(text.join(" "), false).slice(0, tokens);
  if (ids.length !== tokens) throw new Error(`a prompt of ${tokens} tokens: got ${ids.length}`);
  return ids;
}

/** A scheduler over built-in chat model `name` (4 sequences) and a greedy run of one prompt on it. */
async function schedulerSetup(
  name: string,
  flashAttention?: FlashAttention,
  sharePromptChunks?: "measured" | "always",
) {
  const { lib, path } = await nativeSetup(name);
  const model = await NativeModel.load(lib, path, 0);
  const chunk = 512;
  const ctx = await NativeContext.create(model, {
    nCtx: 4 * 1024,
    nBatch: chunk + 4,
    nUbatch: chunk + 4,
    nSeqMax: 4,
    threads: 2,
    embeddings: false,
    kvUnified: false,
    flashAttention,
  });
  const batch = new Batch(lib, chunk + 4);
  const scheduler = new Scheduler(model, ctx, batch, {
    chunk,
    maxCheckpoints: 4,
    checkpointSpacing: 256,
    sharePromptChunks,
  });
  const greedy = {
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
  /** The log-probabilities (chosen and top 3) of each token, and the decodes after the prompt's. */
  const run = async (prompt: number[], maxTokens = 6) => {
    const logprobs: number[] = [];
    let decodes = 0;
    await scheduler.run({
      prompt,
      choices: [{ sampler: new TokenSampler(greedy, model.nVocab), grammar: null }],
      maxTokens,
      logprobs: 3,
      reusePrefix: false,
      signal: new AbortController().signal,
      onPrompt: () => {},
      onToken: (_choice, _token, logprob) => {
        logprobs.push(logprob!.logprob, ...logprob!.top.map((t) => t.logprob));
        return true;
      },
      onEnd: (_choice, cause) => (decodes = logprobs.length / 4 - 1 + (cause === "eog" ? 1 : 0)),
    });
    return { logprobs, decodes };
  };
  const free = () => {
    batch.free();
    ctx.free();
    model.free();
  };
  return { model, scheduler, run, free, greedy };
}

for (const name of ["tiny-chat", "tiny-moe"]) {
  Deno.test({
    name:
      `scheduler (${name}): same-length prompts arriving together share one decode, each computed as alone`,
    fn: async () => {
      // (Sharing on whenever possible: by default it depends on measured decode times.)
      const { model, scheduler, run, free } = await schedulerSetup(name, undefined, "always");
      try {
        const prompts = ["river stone light bell", "town hour quiet river", "bell stone town light"]
          .map((t) => model.tokenize(t, false));
        assert.ok(prompts.every((p) => p.length === prompts[0].length), "the prompts have one length");
        const before = scheduler.stats.decodes;
        const together = await Promise.all(prompts.map((p) => run(p)));
        const steps = Math.max(...together.map((r) => r.decodes));
        assert.equal(scheduler.stats.decodes - before, 1 + steps, "one decode for the three prompts");
        for (const [i, prompt] of prompts.entries()) {
          const alone = await run(prompt);
          assert.ok(alone.logprobs.length >= 4);
          assert.deepEqual(together[i].logprobs, alone.logprobs, `prompt ${i}: the numbers of a run alone`);
        }
      } finally {
        free();
      }
    },
  });
}

Deno.test({
  name:
    "scheduler: a token waiting for its grammar's mask holds only its own choice; the job settles after the mask",
  fn: async () => {
    const { model, scheduler, free, greedy } = await schedulerSetup("tiny-chat");
    try {
      const order: string[] = [];
      let release!: (why: string) => void;
      const gate = new Promise<string>((r) => release = r);
      let masks = 0;
      // Refuses every draw, so each token takes the full mask: one that waits for the test.
      const grammar = {
        allows: () => false,
        mask: async () => {
          masks++;
          order.push(`mask released (${await gate})`);
        },
        accept: () => {},
      } as unknown as GrammarConstraint;
      const job = (prompt: number[], g: GrammarConstraint | null, maxTokens: number, signal: AbortSignal) =>
        scheduler.run({
          prompt,
          choices: [{ sampler: new TokenSampler(greedy, model.nVocab), grammar: g }],
          maxTokens,
          reusePrefix: false,
          signal,
          onPrompt: () => {},
          onToken: () => true,
          onEnd: () => {},
        });
      const stop = new AbortController();
      const masked = job(wordPrompt(model, 1, 8), grammar, 4, stop.signal).then(
        () => order.push("masked settled"),
        (e) => order.push(`masked settled: ${(e as Error).name}`),
      );
      // Without the mask's own pace: the plain job's tokens come while the mask waits. (Had the steps
      // waited for it, the plain job could not end: the gate also opens after 2,000 timer turns.)
      let fallback = true;
      void (async () => {
        for (let i = 0; i < 2000 && fallback; i++) await new Promise((r) => setTimeout(r, 0));
        if (fallback) release("fallback");
      })();
      const before = scheduler.stats.tokensGenerated;
      await job(wordPrompt(model, 2, 8), null, 16, new AbortController().signal);
      fallback = false;
      order.push("plain done");
      assert.ok(scheduler.stats.tokensGenerated - before >= 1, "the plain job generated");
      assert.equal(masks, 1, "the masked choice is still at its first token");
      // Cancelled mid-mask: its sequence is freed at once, but the job settles only after the mask
      // (the owner frees the grammar once it has settled).
      stop.abort();
      while (scheduler.stats.busySequences > 0) await new Promise((r) => setTimeout(r, 0));
      order.push("sequences free");
      release("by the test");
      await masked;
      assert.deepEqual(order, [
        "plain done",
        "sequences free",
        "mask released (by the test)",
        "masked settled: AbortError",
      ]);
    } finally {
      free();
    }
  },
});

Deno.test({
  name: "scheduler: prompt log-probabilities give the event loop turns within a chunk",
  fn: async () => {
    // Each position's log-probabilities are passes over the whole vocabulary; an echoed legacy
    // prompt asks for them at every position. They ran for a whole 64-token chunk without a turn of
    // the event loop (200-300 ms on a 151k vocabulary), so a long echoed prompt held /health for its
    // whole prefill. Here each position spins a little, and a timer set at the first must fire
    // before the chunk's last position is reached (order, not time).
    const { model, scheduler, greedy, free } = await schedulerSetup("tiny-chat");
    try {
      const prompt = wordPrompt(model, 5, 64);
      const seen: number[] = [];
      let firedAt = -1;
      await scheduler.run({
        prompt,
        choices: [{ sampler: new TokenSampler(greedy, model.nVocab), grammar: null }],
        maxTokens: 1,
        reusePrefix: false,
        signal: new AbortController().signal,
        onPromptLogits: (position) => {
          if (seen.length === 0) setTimeout(() => (firedAt = seen.length), 0);
          seen.push(position);
          const until = performance.now() + 2;
          while (performance.now() < until) { /* the work of a large vocabulary */ }
        },
        onPrompt: () => {},
        onToken: () => true,
        onEnd: () => {},
      });
      assert.equal(seen.length, 63, "every position after the first");
      assert.ok(firedAt > 0 && firedAt < 62, `the timer fired after position ${firedAt} of 63`);
    } finally {
      free();
    }
  },
});

Deno.test({
  name: "scheduler: one-token prompt chunks of long prompts run alone, and compute as alone",
  fn: async () => {
    const { model, scheduler, run, free } = await schedulerSetup("tiny-chat");
    try {
      // 513 tokens: a 512-token chunk, then a one-token chunk whose sequence holds 513 KV cells.
      // Alone, such a step can take CPU flash attention's split-KV path; in a batch of two
      // sequences it cannot, and the first token's numbers would differ.
      const prompts = [3, 7].map((seed) => wordPrompt(model, seed, 513));
      const before = scheduler.stats.decodes;
      const together = await Promise.all(prompts.map((p) => run(p, 1)));
      const decodes = scheduler.stats.decodes - before;
      for (const [i, prompt] of prompts.entries()) {
        const alone = await run(prompt, 1);
        assert.equal(alone.logprobs.length, 4);
        assert.deepEqual(together[i].logprobs, alone.logprobs, `prompt ${i}: the numbers of a run alone`);
      }
      assert.equal(decodes, 4, "two chunks each, none shared");
    } finally {
      free();
    }
  },
});

Deno.test({
  name: "scheduler (flash attention off): long prompts decoded together give each one's numbers alone",
  fn: async () => {
    // With flash attention on, a sequence decoding alone with 512 KV cells or more takes llama.cpp's
    // split-KV path on CPU (one query row, one KV stream), which rounds otherwise than a batch.
    const { model, scheduler, run, free } = await schedulerSetup("tiny-chat", "off");
    try {
      const prompts = [5, 11].map((seed) => wordPrompt(model, seed, 420));
      const before = scheduler.stats.decodes;
      const together = await Promise.all(prompts.map((p) => run(p)));
      const steps = Math.max(...together.map((r) => r.decodes));
      assert.ok(scheduler.stats.decodes - before < 2 * steps, "decode steps were shared");
      for (const [i, prompt] of prompts.entries()) {
        const alone = await run(prompt);
        assert.ok(alone.logprobs.length >= 8, "a few decode steps");
        assert.deepEqual(together[i].logprobs, alone.logprobs, `prompt ${i}: the numbers of a run alone`);
      }
    } finally {
      free();
    }
  },
});

Deno.test({
  name: "scheduler: a prompt whose client leaves during another prompt's chunk gets no chunk of its own",
  fn: async () => {
    const { model, scheduler, free, greedy } = await schedulerSetup("tiny-chat");
    try {
      // Three short prompts of three lengths: three decodes in one step, in arrival order.
      const prompts = [5, 6, 7].map((n, i) => wordPrompt(model, i + 1, n));
      const third = new AbortController();
      const job = (prompt: number[], signal: AbortSignal, onPrompt = () => {}) =>
        scheduler.run({
          prompt,
          choices: [{ sampler: new TokenSampler(greedy, model.nVocab), grammar: null }],
          maxTokens: 1,
          reusePrefix: false,
          signal,
          onPrompt,
          onToken: () => true,
          onEnd: () => {},
        });
      const before = scheduler.stats.promptTokensEvaluated;
      // The first prompt's chunk done, the third one's client leaves.
      const first = job(
        prompts[0],
        new AbortController().signal,
        () => third.abort(new Error("client left")),
      );
      const second = job(prompts[1], new AbortController().signal);
      const gone = assert.rejects(job(prompts[2], third.signal), /client left/);
      await Promise.all([first, second, gone]);
      assert.equal(
        scheduler.stats.promptTokensEvaluated - before,
        5 + 6,
        "the third prompt was not evaluated",
      );
    } finally {
      free();
    }
  },
});

Deno.test({
  name: "scheduler: a job submitted as the last running one settles is run, not left waiting",
  fn: async () => {
    const { model, run, free } = await schedulerSetup("tiny-chat");
    try {
      const prompt = model.tokenize("river stone light bell", false);
      // The continuation of the last job's promise submits the next one, a few microtasks after the
      // loop found nothing left to do: it must start a new loop.
      const chained = (async () => {
        await Promise.all([run(prompt)]);
        return await run(prompt);
      })();
      const second = await settles("the second job ran", chained);
      assert.ok(second.logprobs.length >= 4);
    } finally {
      free();
    }
  },
});
