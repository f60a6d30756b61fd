/**
 * Token sampling in JavaScript over the logits llama.cpp returns: logit bias, penalties, an
 * optional grammar mask, then greedy or temperature sampling with top-k, min-p and top-p, and
 * log-probabilities when asked. One instance per generated sequence (it holds the seeded RNG and
 * the penalty counts). The passes over the whole vocabulary run as SIMD kernels (logit_scan.ts).
 */
import { ABOVE_CAPACITY, f32Midpoint, indexesInRange, LogitBuffer } from "./logit_scan.ts";
import { mulberry32 } from "../../random.ts";

/** Sampling settings of one sequence. */
export interface SamplingParams {
  /** 0 = greedy. */
  temperature: number;
  /** 0 = off. */
  topK: number;
  /** 1 = off. */
  topP: number;
  /** 0 = off. */
  minP: number;
  seed: number;
  /** OpenAI presence penalty: subtracted once from every token already generated. */
  presencePenalty: number;
  /** OpenAI frequency penalty: subtracted per occurrence in the generated text. */
  frequencyPenalty: number;
  /** llama.cpp repeat penalty over the last {@link REPEAT_WINDOW} generated tokens (1 = off). */
  repeatPenalty: number;
  /** Token id → additive logit bias; -Infinity = never. */
  logitBias: ReadonlyMap<number, number>;
}

/**
 * Working arrays of the sampling steps, reused across tokens and sequences: every step that uses one
 * runs synchronously to its end, and a fresh typed array per token costs an ArrayBuffer (allocation,
 * external-memory accounting and sweeping on the JavaScript thread) several times a token.
 */
const scratch = new class {
  readonly #arrays = new Map<string, Float32Array | Float64Array | Int32Array>();
  #get<T extends Float32Array | Float64Array | Int32Array>(
    name: string,
    n: number,
    make: (n: number) => T,
  ): T {
    let a = this.#arrays.get(name) as T | undefined;
    if (!a || a.length < n) this.#arrays.set(name, a = make(Math.max(n, 2 * (a?.length ?? 0))));
    return a.subarray(0, n) as T;
  }
  f32 = (name: string, n: number) => this.#get(name, n, (m) => new Float32Array(m));
  f64 = (name: string, n: number) => this.#get(name, n, (m) => new Float64Array(m));
  i32 = (name: string, n: number) => this.#get(name, n, (m) => new Int32Array(m));
}();

/** Tokens the repeat penalty looks back at. */
export const REPEAT_WINDOW = 64;

/** Logits this far below the best one (scaled by temperature) carry under e^-30 of its weight. */
const CUTOFF = 30;

/** One token's log-probability, and the most likely alternatives when asked. */
export interface TokenLogprob {
  token: number;
  logprob: number;
  top: { token: number; logprob: number }[];
}

/** A drawn token, with its log-probabilities when they were asked for. */
export interface SampledToken {
  token: number;
  logprob?: TokenLogprob;
}

/** What restricts the next token (a grammar); applied lazily, see {@link TokenSampler.sample}. */
export interface TokenFilter {
  /** Whether `token` may come next (cheap). */
  allows(token: number): boolean;
  /** Sets the logit of every token that may not come next to -Infinity (expensive: off the event loop). */
  mask(logits: Float32Array): Promise<void>;
  /** The error to end with when no token may come next (thrown by {@link TokenSampler.sample}). */
  deadEnd(): Error;
}

/**
 * Draws a sampler makes before a filter's full mask: each costs a pass over the vocabulary (~0.1 ms
 * at 151k, SIMD) and one cheap check.
 */
export const FILTER_TRIES = 8;

/** Samples the tokens of one sequence. */
export class TokenSampler {
  readonly #params: SamplingParams;
  readonly #random: () => number;
  readonly #counts = new Map<number, number>();
  readonly #recent: number[] = [];
  #scratch: LogitBuffer;
  readonly #above = (t: number, limit: number) => this.#scratch.above(t, limit);
  /** The weights' passes, for top-p over the whole vocabulary. */
  readonly #nucleus: NucleusSearch = {
    inRange: (lo, hi, limit) => this.#scratch.weightsInRange(lo, hi, limit),
    massAtLeast: (t) => this.#scratch.weightsMass(t),
    clip: (t) => this.#scratch.clipWeights(t),
  };

  readonly #simd: boolean;

  /** `simd: false`: the whole-vocabulary passes in plain JavaScript (for benchmarks). */
  constructor(params: SamplingParams, nVocab: number, opts: { simd?: boolean } = {}) {
    this.#params = params;
    this.#random = mulberry32(params.seed);
    this.#simd = opts.simd !== false;
    this.#scratch = new LogitBuffer(nVocab, { simd: this.#simd });
  }

  /**
   * Picks the next token from `logits` (left unchanged). With a `filter`, a drawn token is kept
   * when the filter allows it, else it is taken out and a token drawn again, up to
   * {@link FILTER_TRIES} times; then the filter's full mask is applied and the token drawn from what
   * is left. Without top-k/top-p/min-p the result has exactly the filtered distribution (each draw
   * is from the tokens not yet refused), greedy gives the best allowed token, and the expensive mask
   * (15-25 ms over a 151k vocabulary with a JSON grammar, seconds with hundreds of open grammar
   * alternatives) runs only when few allowed tokens are likely. `logprobs`: how many alternatives
   * to report (undefined: none).
   */
  async sample(
    logits: Float32Array,
    filter?: TokenFilter,
    logprobs?: number,
  ): Promise<SampledToken> {
    return await this.sampleNow(logits, filter, logprobs);
  }

  /**
   * {@link sample}, with its result at once unless the filter's full mask is needed: then a promise
   * (the mask runs off the event loop). `logits` is read before this returns, so the caller may
   * reuse it at once (the next decode may overwrite llama.cpp's buffer while the mask runs).
   */
  sampleNow(
    logits: Float32Array,
    filter?: TokenFilter,
    logprobs?: number,
  ): SampledToken | Promise<SampledToken> {
    const x = this.#adjusted(logits);
    let token = this.#pick(x);
    if (filter) {
      for (let tries = 1; !filter.allows(token); tries++) {
        if (tries >= FILTER_TRIES) return filter.mask(x).then(() => this.#drawnAllowed(x, filter, logprobs));
        x[token] = -Infinity;
        token = this.#pick(x);
      }
      // The log-probabilities are over what the grammar allows: the mask is needed for them.
      if (logprobs !== undefined) return filter.mask(x).then(() => this.#drawn(x, token, logprobs));
    }
    return this.#drawn(x, token, logprobs);
  }

  /**
   * A draw from `x` once the filter's mask is applied; throws the filter's {@link TokenFilter.deadEnd}
   * when it left no token (a draw would then be one it refuses, which llama.cpp's grammar cannot take).
   */
  #drawnAllowed(x: Float32Array, filter: TokenFilter, logprobs: number | undefined): SampledToken {
    const token = this.#pick(x);
    if (!(x[token] > -Infinity)) throw filter.deadEnd();
    return this.#drawn(x, token, logprobs);
  }

  /**
   * `token` and, when asked, the log-probabilities of the distribution it was drawn from (`x`) at
   * temperature 1 (after bias, penalties and, when it applied, the grammar), as OpenAI reports them.
   */
  #drawn(x: Float32Array, token: number, logprobs: number | undefined): SampledToken {
    return logprobs === undefined
      ? { token }
      : { token, logprob: logprobsOf(x, token, logprobs, this.#scratch) };
  }

  /** Records a generated token (penalties). */
  accept(token: number): void {
    this.#counts.set(token, (this.#counts.get(token) ?? 0) + 1);
    if (this.#params.repeatPenalty !== 1) {
      this.#recent.push(token);
      if (this.#recent.length > REPEAT_WINDOW) this.#recent.shift();
    }
  }

  /** A copy with the same state and a different seed (for n > 1 choices). */
  fork(seed: number): TokenSampler {
    const s = new TokenSampler({ ...this.#params, seed }, this.#scratch.values.length, { simd: this.#simd });
    for (const [t, c] of this.#counts) s.#counts.set(t, c);
    s.#recent.push(...this.#recent);
    return s;
  }

  /** The logits with bias and penalties applied, in a reused buffer. */
  #adjusted(logits: Float32Array): Float32Array {
    if (this.#scratch.values.length !== logits.length) {
      this.#scratch = new LogitBuffer(logits.length, { simd: this.#simd });
    }
    const x = this.#scratch.values;
    x.set(logits);
    const p = this.#params;
    for (const [t, bias] of p.logitBias) if (t < x.length) x[t] += bias;
    if (p.presencePenalty !== 0 || p.frequencyPenalty !== 0) {
      for (const [t, c] of this.#counts) x[t] -= p.presencePenalty + p.frequencyPenalty * c;
    }
    if (p.repeatPenalty !== 1) {
      for (const t of new Set(this.#recent)) {
        x[t] = x[t] > 0 ? x[t] / p.repeatPenalty : x[t] * p.repeatPenalty;
      }
    }
    return x;
  }

  /** Draws from `x`, which is the scratch buffer's values. */
  #pick(x: Float32Array): number {
    const p = this.#params;
    if (p.temperature > 0 && p.topK > 0) {
      const top = this.#scratch.top(p.topK) ?? topTokens(x, p.topK, this.#above);
      // Nothing ranks when every logit is -Infinity or NaN: the same fallback as greedy's.
      return top.length > 0 ? this.#pickAmong(x, top) : argmax(x);
    }
    if (p.temperature <= 0) {
      // Greedy: the best token, the lowest index among equals (one pass).
      const top = this.#scratch.top(1);
      if (top) return top.length > 0 ? top[0] : argmax(x);
    }
    const best = this.#scratch.max();
    if (best === -Infinity) return argmax(x);
    if (p.temperature <= 0) return this.#scratch.above(best, ABOVE_CAPACITY)?.[0] ?? argmax(x);
    const inv = 1 / p.temperature;
    const floor = best - CUTOFF * p.temperature;
    // Usually few logits lie within the cutoff: only they get weights (in index order, as below).
    const near = this.#scratch.above(floor, ABOVE_CAPACITY);
    if (near) return this.#pickAmong(x, near, best);
    // The whole vocabulary: weights by the SIMD kernel, in the buffer's own memory.
    let sum = this.#scratch.weights(best, inv, floor);
    const w = this.#scratch.weightValues;
    if (p.minP > 0) sum = this.#scratch.clipWeights(p.minP);
    if (p.topP < 1) sum = keepTopMass(w, p.topP, sum, this.#nucleus);
    const token = this.#scratch.pick(this.#random() * sum);
    return token >= 0 ? token : argmax(x);
  }

  /**
   * Temperature sampling among candidates (top-k, best first; or every token within the cutoff, in
   * index order, with the `best` logit), with min-p and top-p.
   */
  #pickAmong(x: Float32Array, candidates: ArrayLike<number>, best = x[candidates[0]]): number {
    const p = this.#params;
    const w = scratch.f32("weights", candidates.length);
    if (best === -Infinity) return candidates[0];
    const inv = 1 / p.temperature;
    let sum = 0;
    for (let i = 0; i < candidates.length; i++) {
      w[i] = Math.exp((x[candidates[i]] - best) * inv);
      sum += w[i];
    }
    if (p.minP > 0) sum = keepAtLeast(w, p.minP, sum);
    if (p.topP < 1) sum = keepTopMass(w, p.topP, sum);
    let r = this.#random() * sum;
    for (let i = 0; i < w.length; i++) {
      if (w[i] === 0) continue;
      r -= w[i];
      if (r <= 0) return candidates[i];
    }
    return candidates[0];
  }
}

/** min-p: zeroes weights under `minP` times the largest (which is 1 here); returns the new sum. */
function keepAtLeast(w: Float32Array, minP: number, sum: number): number {
  for (let i = 0; i < w.length; i++) {
    if (w[i] > 0 && w[i] < minP) {
      sum -= w[i];
      w[i] = 0;
    }
  }
  return sum;
}

/** Passes over the weights that find a whole vocabulary's top-p nucleus without sorting it. */
interface NucleusSearch {
  /** The indexes of the weights in [lo, hi) (hi NaN: no upper bound); undefined when more than `limit`. */
  inRange(lo: number, hi: number, limit: number): ArrayLike<number> | undefined;
  /** The sum of the weights at or above `t`. */
  massAtLeast(t: number): number;
  /** Sets the weights below `t` to 0; returns the sum of those left. */
  clip(t: number): number;
}

/**
 * top-p: keeps the largest weights that reach `topP` of the mass (ties kept); returns the new sum.
 * With `search` a whole vocabulary's nucleus is found without sorting every weight (10 ms a token over
 * 151,669): see {@link nucleusCut}.
 */
function keepTopMass(w: Float32Array, topP: number, sum: number, search?: NucleusSearch): number {
  let cut = search ? nucleusCut(w, topP * sum, search) : undefined;
  if (cut === undefined) {
    const positive = scratch.f32("nucleus", w.length);
    let n = 0;
    for (let i = 0; i < w.length; i++) if (w[i] > 0) positive[n++] = w[i];
    cut = massCut(positive.subarray(0, n), topP * sum) ?? (n > 0 ? positive.subarray(0, n).sort()[0] : 0);
  }
  if (search) return search.clip(cut);
  let total = 0;
  for (let i = 0; i < w.length; i++) {
    if (w[i] < cut) w[i] = 0;
    total += w[i];
  }
  return total;
}

/**
 * The top-p cut among weights at most 1 (the best token's), or undefined (then every weight is sorted).
 * First the weights at or above e^-2, e^-4, … of the best: they are exactly the first ones in descending
 * order, so when they reach the mass the cut is the one a full sort gives (a peaked distribution stops
 * here). Else a bisection on the weights' values keeps [lo, hi) around the cut (the weights at or above
 * lo reach the mass, those at or above hi do not) until it holds few enough to sort; the weights above
 * hi then count as one sum.
 */
function nucleusCut(w: Float32Array, mass: number, search: NucleusSearch): number | undefined {
  const sorted = (found: ArrayLike<number>) => {
    const values = scratch.f32("nucleus", found.length);
    for (let i = 0; i < found.length; i++) values[i] = w[found[i]];
    return values;
  };
  for (let d = 2; d <= 16; d *= 2) {
    const found = search.inRange(Math.exp(-d), NaN, ABOVE_CAPACITY);
    if (!found) break;
    const cut = massCut(sorted(found), mass);
    if (cut !== undefined) return cut;
  }
  // Weights within the cutoff are at least e^-30: starting there saves a dozen rounds over 0.
  let lo = 1e-14;
  let hi = 2;
  if (search.massAtLeast(lo) < mass) return undefined;
  for (let round = 0; round < 64; round++) {
    const found = search.inRange(lo, hi, ABOVE_CAPACITY);
    if (found) {
      const values = sorted(found);
      // Rounding can leave the sum short of the mass: then every weight in the range is kept.
      return massCut(values, mass, search.massAtLeast(hi)) ?? (values.length > 0 ? values[0] : lo);
    }
    const mid = f32Midpoint(lo, hi);
    if (mid === lo || mid === hi) return undefined;
    if (search.massAtLeast(mid) >= mass) lo = mid;
    else hi = mid;
  }
  return undefined;
}

/**
 * The smallest of the largest `values` whose sum, added to `start`, reaches `mass` (sorting `values` in
 * place), or undefined when all of them do not reach it.
 */
function massCut(values: Float32Array, mass: number, start = 0): number | undefined {
  const ascending = values.sort();
  let kept = start;
  for (let i = ascending.length - 1; i >= 0; i--) {
    kept += ascending[i];
    if (kept >= mass) return ascending[i];
  }
  return undefined;
}

/** Index of the largest value. */
export function argmax(x: Float32Array): number {
  let best = 0;
  let value = x[0];
  for (let i = 1; i < x.length; i++) {
    if (x[i] > value) {
      value = x[i];
      best = i;
    }
  }
  return best;
}

/** Sampled positions per scan in {@link topTokens}' threshold estimate. */
const PROBE_STRIDE = 31;

/**
 * The `k` indexes with the largest values, best first, in JavaScript (where the one-pass kernel,
 * {@link LogitBuffer.top}, is unavailable or k is over its capacity). On a vocabulary a strided sample first
 * estimates a value that about 4k entries exceed; one tight pass then keeps those, and only they are
 * sorted (a heap over every entry costs twice as much per token). Exact: when the estimate keeps
 * fewer than `k` (or too many), the heap does the work.
 */
export function topTokens(
  x: Float32Array,
  k: number,
  above: (t: number, limit: number) => ArrayLike<number> | undefined = (t, limit) => aboveJs(x, t, limit),
): number[] {
  k = Math.min(k, x.length);
  if (k > 0 && x.length >= 4096 && k * PROBE_STRIDE * 8 < x.length) {
    // About 4k entries of the whole lie above the sample's (4k / stride)-th largest value: the
    // smallest of the sample's m largest, kept in a small descending array.
    const m = Math.ceil((4 * k) / PROBE_STRIDE) + 1;
    const best = scratch.f32("probe", m).fill(-Infinity);
    for (let i = 0; i < x.length; i += PROBE_STRIDE) {
      const v = x[i];
      if (v <= best[m - 1]) continue;
      let j = m - 1;
      while (j > 0 && best[j - 1] < v) {
        best[j] = best[j - 1];
        j--;
      }
      best[j] = v;
    }
    const threshold = best[m - 1];
    if (threshold > -Infinity) {
      const found = above(threshold, 64 * k);
      if (found && found.length >= k) return bestOf(x, found, k);
    }
  }
  return topTokensByHeap(x, k);
}

/**
 * The `k` of `found` (indexes of `x`, ascending) with the largest values, best first, ties by index:
 * insertion into a sorted array of k, which allocates nothing per candidate (a sort comparator
 * returning `x[b] - x[a]` boxes a number per comparison: 25 KB of garbage a token).
 */
function bestOf(x: Float32Array, found: ArrayLike<number>, k: number): number[] {
  const values = scratch.f64("bestValues", k);
  const indexes = scratch.i32("bestIndexes", k);
  let n = 0;
  for (let f = 0; f < found.length; f++) {
    const i = found[f];
    const v = x[i];
    if (n === k && !(v > values[k - 1])) continue; // an equal value already kept has a lower index
    let j = n < k ? n++ : k - 1;
    while (j > 0 && values[j - 1] < v) {
      values[j] = values[j - 1];
      indexes[j] = indexes[j - 1];
      j--;
    }
    values[j] = v;
    indexes[j] = i;
  }
  const out: number[] = [];
  for (let j = 0; j < n; j++) if (values[j] > -Infinity) out.push(indexes[j]);
  return out;
}

/** The indexes with `x[i] >= t`, ascending (a reused array); undefined when more than `limit`. */
function aboveJs(x: Float32Array, t: number, limit: number): Int32Array | undefined {
  const out = scratch.i32("above", Math.min(limit, x.length));
  const n = indexesInRange(x, t, NaN, out, limit);
  return n < 0 ? undefined : out.subarray(0, n);
}

/** {@link topTokens} with a heap over every entry. */
function topTokensByHeap(x: Float32Array, k: number): number[] {
  const heapV = new Float32Array(k).fill(-Infinity);
  const heapI = new Int32Array(k).fill(-1);
  let floor = -Infinity;
  for (let i = 0; i < x.length; i++) {
    const v = x[i];
    if (v <= floor) continue;
    heapV[0] = v;
    heapI[0] = i;
    let j = 0;
    for (;;) {
      const l = 2 * j + 1, r = l + 1;
      let s = j;
      if (l < k && heapV[l] < heapV[s]) s = l;
      if (r < k && heapV[r] < heapV[s]) s = r;
      if (s === j) break;
      const tv = heapV[j];
      heapV[j] = heapV[s];
      heapV[s] = tv;
      const ti = heapI[j];
      heapI[j] = heapI[s];
      heapI[s] = ti;
      j = s;
    }
    floor = heapV[0];
  }
  const out: number[] = [];
  for (let i = 0; i < k; i++) if (heapI[i] >= 0 && heapV[i] > -Infinity) out.push(heapI[i]);
  return out.sort((a, b) => x[b] - x[a] || a - b);
}

/** Log-softmax of `x` at `token`, with the `k` most likely tokens (`buffer`: `x`'s, for its passes). */
export function logprobsOf(x: Float32Array, token: number, k: number, buffer?: LogitBuffer): TokenLogprob {
  let best = -Infinity;
  if (buffer?.values === x) best = buffer.max();
  else for (let i = 0; i < x.length; i++) if (x[i] > best) best = x[i];
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += Math.exp(x[i] - best);
  const logZ = best + Math.log(sum);
  const lp = (t: number) => Math.max(-9999, x[t] - logZ);
  return {
    token,
    logprob: lp(token),
    top: k > 0
      ? Array.from(
        (buffer?.values === x ? buffer.top(k) : undefined) ??
          topTokens(x, k, buffer?.values === x ? (t, l) => buffer.above(t, l) : undefined),
        (t) => ({ token: t, logprob: lp(t) }),
      )
      : [],
  };
}
