/**
 * The sampler's cost per token over Qwen3's 151,669 logits, with its WebAssembly SIMD kernels against the
 * same steps in plain JavaScript, alternating in one run. Logits are drawn from a normal distribution
 * (standard deviation 3, the spread of a random-weight model's), fresh per sequence; "cold" evicts the
 * caches before each token, as the logits arrive after a decode that ran on other cores.
 */
import { type SamplingParams, TokenSampler } from "../src/engines/llama/sampler.ts";

const VOCAB = 151_669;

/** The settings measured: the benchmark's chat sampling, greedy, and OpenAI's defaults. */
const CASES: { name: string; params: Partial<SamplingParams> }[] = [
  {
    name: "top-k 40, top-p 0.95, min-p 0.05, temperature 0.8 (llama.cpp's defaults)",
    params: { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05 },
  },
  { name: "greedy (temperature 0)", params: { temperature: 0 } },
  { name: "OpenAI's defaults: temperature 1, no top-k, top-p 1", params: { temperature: 1 } },
  { name: "temperature 1, top-p 0.95, no top-k", params: { temperature: 1, topP: 0.95 } },
];

/** Records one row per case and cache state; `values` are µs a token, one per repetition. */
export type SamplerRecord = (metric: string, values: number[]) => void;

/**
 * Runs every case `reps` times (`tokens` tokens each) with and without the kernels and records the
 * kernels' µs per token, the plain JavaScript figure and the ratio in the metric name.
 */
export async function samplerCost(reps: number, tokens: number, record: SamplerRecord): Promise<void> {
  const logits = Array.from({ length: 8 }, (_, j) => normalLogits(VOCAB, j + 1));
  const evict = new Float32Array(8 << 20); // 32 MiB: more than this CPU's caches
  for (const c of CASES) {
    for (const cold of [false, true]) {
      const perRep: Record<"simd" | "js", number[]> = { simd: [], js: [] };
      for (let rep = 0; rep < reps; rep++) {
        for (const simd of rep % 2 ? [false, true] : [true, false]) {
          const params: SamplingParams = {
            temperature: 1,
            topK: 0,
            topP: 1,
            minP: 0,
            seed: rep,
            presencePenalty: 0,
            frequencyPenalty: 0,
            repeatPenalty: 1,
            logitBias: new Map(),
            ...c.params,
          };
          const samplers = logits.map(() => new TokenSampler(params, VOCAB, { simd }));
          for (let i = 0; i < 16; i++) await samplers[i % 8].sample(logits[i % 8]); // warm up
          let ms = 0;
          for (let i = 0; i < tokens; i++) {
            if (cold) evict.fill(i);
            const t0 = performance.now();
            await samplers[i % 8].sample(logits[i % 8]);
            ms += performance.now() - t0;
          }
          perRep[simd ? "simd" : "js"].push((ms / tokens) * 1000);
        }
      }
      const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1];
      const ratio = median(perRep.js) / median(perRep.simd);
      record(
        `${c.name}, ${cold ? "cold" : "warm"} caches: µs a token (plain JavaScript ${
          median(perRep.js).toFixed(0)
        } µs: ${ratio.toFixed(1)}× faster)`,
        perRep.simd,
      );
    }
  }
}

/** `n` logits from a normal distribution (σ 3), seeded. */
function normalLogits(n: number, seed: number): Float32Array {
  let s = seed;
  const next = () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32) || 1e-9;
  return Float32Array.from(
    { length: n },
    () => Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next()) * 3,
  );
}
