// The sampler's SIMD kernels: their answers equal plain JavaScript's on every shape of logits, and the
// embedded module is the one its text source builds.
import assert from "node:assert/strict";
import { ABOVE_CAPACITY, f32AtLeast, LogitBuffer } from "../src/engines/llama/logit_scan.ts";
import { type SamplingParams, TokenSampler, topTokens } from "../src/engines/llama/sampler.ts";
import { mulberry32 } from "../src/random.ts";
import { compileWat, embeddedModule, generatedPath, watFiles } from "../scripts/wasm.ts";

const ROOT = new URL("..", import.meta.url).pathname;

let seed = 11;
const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);

/** Logit shapes, each at lengths that do and do not fill the kernels' 16-value rounds. */
const SHAPES: Record<string, (i: number, n: number) => number> = {
  spread: () => (random() - 0.5) * 40,
  ties: () => Math.round((random() - 0.5) * 6),
  masked: (i) => (i % 97 === 0 ? random() * 5 : -Infinity),
  allMasked: () => -Infinity,
  nan: (i) => (i % 13 === 0 ? NaN : random() * 3),
  ascending: (i, n) => i / n,
  descending: (i, n) => -i / n,
  peak: (i, n) => (i === n - 1 ? 50 : random()),
};

function fill(shape: string, n: number): LogitBuffer {
  const buf = new LogitBuffer(n);
  for (let i = 0; i < n; i++) buf.values[i] = SHAPES[shape](i, n);
  return buf;
}

Deno.test("logit scan: max and above agree with JavaScript on every shape and length", () => {
  for (const n of [1, 15, 16, 17, 1000, 151_669]) {
    for (const shape of Object.keys(SHAPES)) {
      const buf = fill(shape, n);
      assert.ok(buf.simd, "the WebAssembly kernels load");
      const x = buf.values;
      let max = -Infinity;
      for (const v of x) if (v > max) max = v;
      assert.equal(buf.max(), max, `${shape} ${n}: max`);
      for (const t of [max, max - 0.5, max - 3, 0.1, -Infinity]) {
        const expected = [...x.keys()].filter((i) => x[i] >= t);
        const got = buf.above(t, ABOVE_CAPACITY);
        if (expected.length > ABOVE_CAPACITY) assert.equal(got, undefined, `${shape} ${n} ${t}: too many`);
        else assert.deepEqual([...got!], expected, `${shape} ${n} ${t}`);
        if (expected.length > 3) assert.equal(buf.above(t, 3), undefined, `${shape} ${n} ${t}: limit`);
      }
    }
  }
});

Deno.test("logit scan: top-k agrees with the written-out rule on every shape, length and k", () => {
  for (const n of [1, 15, 16, 17, 1000, 151_669]) {
    for (const shape of Object.keys(SHAPES)) {
      const buf = fill(shape, n);
      const x = buf.values;
      // Best first, equal values by index; NaN and -Infinity never chosen.
      const ranked = [...x.keys()].filter((i) => x[i] > -Infinity).sort((a, b) => x[b] - x[a] || a - b);
      for (const k of [0, 1, 5, 40, 1024, n + 3]) {
        const got = buf.top(k);
        if (k > 1024) {
          assert.equal(got, undefined, "over the capacity: JavaScript does it");
          continue;
        }
        assert.deepEqual([...got!], ranked.slice(0, k), `${shape} ${n} k=${k}`);
        // The JavaScript path it replaces (its probe runs on vocabularies; small arrays take a heap).
        if (shape !== "nan" && n > 4096 && k <= 40) {
          assert.deepEqual(topTokens(x, k, (t, l) => buf.above(t, l)), [...got!], `${shape} ${n} k=${k}: JS`);
        }
      }
    }
  }
});

Deno.test("logit scan: a double threshold is compared exactly (float32 rounding never admits a value)", () => {
  for (const t of [0.1, -0.1, 1 / 3, -1 / 3, 1e-45, -1e-45, 0, 3.4e38, 16_777_217]) {
    const r = f32AtLeast(t);
    assert.ok(r >= t, `${t}`);
    assert.equal(Math.fround(r), r);
    // No float32 lies in [t, r): the one just below r is below t.
    const f = new Float32Array([r]);
    const bits = new Int32Array(f.buffer);
    if (r > 0) bits[0] -= 1;
    else if (r < 0) bits[0] += 1;
    else f[0] = -1e-45;
    assert.ok(f[0] < t, `${t}: ${f[0]} < ${t}`);
  }
  const buf = new LogitBuffer(3);
  buf.values.set([0.1, 0.2, 0.3]); // 0.1 as float32 is 0.10000000149…, above the double 0.1
  assert.deepEqual([...buf.above(0.1, 10)!], [0, 1, 2]);
  assert.deepEqual([...buf.above(0.10000000149011613, 10)!], [1, 2]);
});

Deno.test("logit scan: weights are exp within float32 rounding; pick, range, mass and clip agree with JavaScript", () => {
  for (const n of [1, 3, 4, 5, 1000, 151_669]) {
    for (const shape of ["spread", "ties", "masked", "nan", "peak"]) {
      const buf = fill(shape, n);
      const x = buf.values;
      const w = buf.weightValues;
      const best = buf.max();
      if (best === -Infinity) continue;
      for (const temperature of [0.3, 1, 2]) {
        const inv = 1 / temperature;
        const floor = best - 30 * temperature;
        const sum = buf.weights(best, inv, floor);
        let exact = 0;
        for (let i = 0; i < n; i++) {
          const y = (x[i] - best) * inv;
          const e = x[i] >= floor ? Math.exp(y) : 0;
          exact += e;
          if (e === 0) assert.equal(w[i], 0, `${shape} ${n} ${i}`);
          // float32 arithmetic: y itself carries a rounding error of about |y| × 6e-8
          else {assert.ok(
              Math.abs(w[i] - e) <= 3e-7 * (1 + Math.abs(y)) * e,
              `${shape} ${n} ${i}: ${w[i]} ${e}`,
            );}
        }
        assert.ok(Math.abs(sum - exact) <= 1e-6 * exact, `${shape} ${n}: sum ${sum} ${exact}`);
        for (const [lo, hi] of [[0.5, NaN], [0.01, 0.5], [0, 1e-3], [1, 2], [0.2, 0.2]]) {
          const inRange = [...w.keys()].filter((i) => w[i] >= lo && !(w[i] >= hi));
          const got = buf.weightsInRange(lo, hi, ABOVE_CAPACITY);
          if (inRange.length > ABOVE_CAPACITY) assert.equal(got, undefined);
          else assert.deepEqual([...got!], inRange, `${shape} ${n} [${lo}, ${hi})`);
          const mass = inRange.length === 0 && Number.isNaN(hi) ? 0 : [...w].filter((v) => v >= lo)
            .reduce((a, v) => a + v, 0);
          const gotMass = buf.weightsMass(lo);
          assert.ok(Math.abs(gotMass - mass) <= 1e-9 * Math.max(1, mass), `${shape} ${n} mass ≥ ${lo}`);
        }
        for (const u of [0, 1e-9, 0.3, 0.5, 0.999999, 1, 1.5]) {
          let r = u * sum;
          let expected = -1;
          for (let i = 0; i < n; i++) {
            if (w[i] === 0) continue;
            expected = i;
            r -= w[i];
            if (r <= 0) break;
          }
          assert.equal(buf.pick(u * sum), expected, `${shape} ${n} pick ${u}`);
        }
        // Last, as it changes the weights: clipping below a value keeps the rest and sums them.
        const clipped = Array.from(w, (v) => (v >= 0.3 ? v : 0));
        const kept = buf.clipWeights(0.3);
        assert.deepEqual([...w], clipped, `${shape} ${n}: clip`);
        const keptSum = clipped.reduce((a, v) => a + v, 0);
        assert.ok(Math.abs(kept - keptSum) <= 1e-9 * Math.max(1, keptSum), `${shape} ${n}: clip sum`);
      }
    }
  }
  const empty = new LogitBuffer(4);
  empty.weightValues.fill(0);
  assert.equal(empty.pick(0.5), -1);
});

Deno.test("logit scan: top-k through the kernels equals the sorted vocabulary", () => {
  for (const shape of Object.keys(SHAPES).filter((s) => s !== "nan")) {
    const buf = fill(shape, 151_669);
    const x = buf.values;
    const expected = [...x.keys()].sort((a, b) => x[b] - x[a] || a - b).slice(0, 40)
      .filter((i) => x[i] > -Infinity);
    assert.deepEqual(topTokens(x, 40, (t, l) => buf.above(t, l)), expected, shape);
  }
});

const params = (over: Partial<SamplingParams>): SamplingParams => ({
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  seed: 3,
  presencePenalty: 0,
  frequencyPenalty: 0,
  repeatPenalty: 1,
  logitBias: new Map(),
  ...over,
});

/**
 * Sampling over the whole vocabulary written out: weights of every logit within e^-30 of the best, in
 * index order; min-p drops weights under minP (the best weighs 1); top-p keeps the largest weights that
 * reach topP of the mass, found by sorting all of them.
 */
function reference(
  x: Float32Array,
  { temperature, topP = 1, minP = 0 }: { temperature: number; topP?: number; minP?: number },
  seedValue: number,
  draws: number,
): number[] {
  const next = mulberry32(seedValue);
  let best = -Infinity;
  for (const v of x) if (v > best) best = v;
  const inv = 1 / temperature;
  let w = Array.from(x, (v) => (v >= best - 30 * temperature ? Math.exp((v - best) * inv) : 0));
  w = w.map((v) => (v < minP ? 0 : v));
  let sum = w.reduce((s, v) => s + v, 0);
  if (topP < 1) {
    const sorted = w.filter((v) => v > 0).sort((a, b) => b - a);
    let kept = 0;
    let cut = 0;
    for (const v of sorted) {
      kept += v;
      cut = v;
      if (kept >= topP * sum) break;
    }
    w = w.map((v) => (v < cut ? 0 : v));
    sum = w.reduce((s, v) => s + v, 0);
  }
  return Array.from({ length: draws }, () => {
    let r = next() * sum;
    for (let i = 0; i < w.length; i++) {
      if (w[i] === 0) continue;
      r -= w[i];
      if (r <= 0) return i;
    }
    return w.findLastIndex((v) => v > 0);
  });
}

Deno.test("sampler: sampling over the whole vocabulary (temperature, min-p, top-p) draws what the written-out rule draws", async () => {
  // Few logits near the best (the kernels' candidates) and a flat vocabulary (every logit a candidate:
  // more than the kernels return, so the full pass runs).
  const peaked = Float32Array.from({ length: 151_669 }, (_, i) => (i % 1000 === 0 ? 20 + (i % 7) : random()));
  const flat = Float32Array.from({ length: 151_669 }, () => random() * 0.01);
  const spread = Float32Array.from({ length: 151_669 }, () => (random() - 0.5) * 16);
  const cases = [
    { temperature: 0.7 },
    { temperature: 1 },
    { temperature: 1, topP: 0.9 },
    { temperature: 0.8, topP: 0.5, minP: 0.05 },
    { temperature: 1, topP: 0.999 },
  ];
  for (const [name, x] of [["peaked", peaked], ["flat", flat], ["spread", spread]] as const) {
    for (const c of cases) {
      const s = new TokenSampler(params({ ...c, seed: 5 }), x.length);
      const got: number[] = [];
      for (let i = 0; i < 30; i++) got.push((await s.sample(x)).token);
      assert.deepEqual(got, reference(x, c, 5, 30), `${name} ${JSON.stringify(c)}`);
    }
  }
});

Deno.test("logit scan: the embedded WebAssembly is what its .wat source builds (deno task wasm)", async () => {
  const wats = watFiles(`${ROOT}src`);
  assert.ok(wats.length > 0);
  for (const wat of wats) {
    const name = wat.split("/").pop()!;
    const expected = embeddedModule(name, await compileWat(name, await Deno.readTextFile(wat)));
    assert.equal(await Deno.readTextFile(generatedPath(wat)), expected, `${name}: run deno task wasm`);
  }
});
