/**
 * Engine paths that the built-in models do not take under their default settings, exercised on
 * the generated models with real inference: a step of short embedding inputs as one decode (what
 * 0.6B-and-larger models do) must give the vectors of the two-decode path.
 */
import assert from "node:assert/strict";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { LlamaEmbeddingEngine } from "../src/engines/llama/embedding.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;

Deno.test({
  name: "embeddings: short inputs in one decode give the vectors of bodies and last tokens decoded apart",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    await llamaRuntime("cpu", silentLogger);
    const lib = openLlamaLibrary();
    const modelPath = await resolveSource("builtin:tiny-embed", {
      cacheDir: CACHE,
      hubUrl: "",
      log: silentLogger,
    });
    const load = (onePassTokens: number) =>
      LlamaEmbeddingEngine.load(lib, {
        modelPath,
        gpuLayers: 0,
        threads: 2,
        maxInputTokens: 512,
        onePassTokens,
      });
    const [apart, together] = [await load(0), await load(512)];
    try {
      const texts = [
        "hello",
        "a somewhat longer sentence about rivers and stones",
        "¿dónde está la estación?",
      ];
      const ids = await Promise.all(texts.map((t) => apart.tokenize(t)));
      const cosine = (a: Float32Array, b: Float32Array) => {
        let ab = 0, aa = 0, bb = 0;
        for (let i = 0; i < a.length; i++) {
          [ab, aa, bb] = [ab + a[i] * b[i], aa + a[i] * a[i], bb + b[i] * b[i]];
        }
        return ab / Math.sqrt(aa * bb);
      };
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
