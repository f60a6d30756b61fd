/**
 * A vocabulary's logits in WebAssembly memory, with 128-bit SIMD passes over them
 * (`wasm/logit_scan.wat`): the indexes at or above a value (top-k candidates, the sampling cutoff)
 * and the largest value. A pass over Qwen3's 151,669 logits takes about 28 µs this way against about
 * 150 µs for the tightest JavaScript loop, and the sampler makes one or two of them per token, on the
 * thread that serves HTTP and holds up the next decode. Where WebAssembly cannot be compiled, the same
 * passes run in JavaScript.
 */
import { WASM_BASE64 } from "./wasm/logit_scan_wasm.ts";

/** The module's exports (see logit_scan.wat). */
interface Kernels {
  memory: WebAssembly.Memory;
  above(p: number, n: number, t: number, out: number, max: number): number;
  max(p: number, n: number): number;
}

/** Most indexes one {@link LogitBuffer.above} call can return. */
export const ABOVE_CAPACITY = 16384;

const PAGE = 65536;

let compiled: WebAssembly.Module | null | undefined;

/** The compiled kernels (once per process); null where WebAssembly (with SIMD) is unavailable. */
function kernelModule(): WebAssembly.Module | null {
  if (compiled === undefined) {
    try {
      compiled = new WebAssembly.Module(Uint8Array.fromBase64(WASM_BASE64));
    } catch {
      compiled = null;
    }
  }
  return compiled;
}

/**
 * The smallest 32-bit float at or above `t`: for any float32 `v`, `v >= f32AtLeast(t)` exactly when
 * `v >= t`, so a double threshold can be handed to the float32 kernels without changing a result.
 *
 * @example
 * ```ts
 * f32AtLeast(0.1) >= 0.1; // true, and no float32 lies between 0.1 and it
 * ```
 */
export function f32AtLeast(t: number): number {
  const r = Math.fround(t);
  if (r >= t || Number.isNaN(t)) return r;
  // Rounded down: step to the next float32 up through its bit pattern.
  const f = new Float32Array([r]);
  const bits = new Int32Array(f.buffer);
  if (r === 0) bits[0] = 1; // -0 and +0: the smallest positive subnormal
  else bits[0] += r > 0 ? 1 : -1;
  return f[0];
}

/**
 * One sequence's logits and the passes over them. `values` is where the sampler writes (and adjusts)
 * the logits; {@link above} and {@link max} read it.
 *
 * @example
 * ```ts
 * const buf = new LogitBuffer(4);
 * buf.values.set([0.5, 2, -1, 2]);
 * buf.max(); // 2
 * [...buf.above(1, 10)!]; // [1, 3]
 * ```
 */
export class LogitBuffer {
  readonly values: Float32Array;
  readonly #kernels: Kernels | undefined;
  readonly #out: Int32Array;
  readonly #outOffset: number;

  constructor(size: number) {
    const module = kernelModule();
    let kernels: Kernels | undefined;
    if (module) {
      try {
        kernels = new WebAssembly.Instance(module).exports as unknown as Kernels;
      } catch {
        kernels = undefined;
      }
    }
    // The logits at 0, then the output indexes (16-byte aligned).
    this.#outOffset = Math.ceil((size * 4) / 16) * 16;
    if (kernels) {
      const pages = Math.ceil((this.#outOffset + ABOVE_CAPACITY * 4) / PAGE);
      const have = kernels.memory.buffer.byteLength / PAGE;
      if (pages > have) kernels.memory.grow(pages - have);
      // The memory never grows again, so these views stay attached.
      this.values = new Float32Array(kernels.memory.buffer, 0, size);
      this.#out = new Int32Array(kernels.memory.buffer, this.#outOffset, ABOVE_CAPACITY);
    } else {
      this.values = new Float32Array(size);
      this.#out = new Int32Array(ABOVE_CAPACITY);
    }
    this.#kernels = kernels;
  }

  /** Whether the passes run in WebAssembly (false: the JavaScript fallback). */
  get simd(): boolean {
    return this.#kernels !== undefined;
  }

  /**
   * The indexes `i` with `values[i] >= t`, ascending, or undefined when there are more than `limit`
   * (at most {@link ABOVE_CAPACITY}). The array is a view that the next call overwrites.
   */
  above(t: number, limit: number): Int32Array | undefined {
    limit = Math.min(limit, ABOVE_CAPACITY);
    const n = this.#kernels
      ? this.#kernels.above(0, this.values.length, f32AtLeast(t), this.#outOffset, limit)
      : aboveJs(this.values, t, this.#out, limit);
    return n < 0 ? undefined : this.#out.subarray(0, n);
  }

  /** The largest value (NaN ignored; -Infinity when there is none). */
  max(): number {
    if (this.#kernels) return this.#kernels.max(0, this.values.length);
    let best = -Infinity;
    for (const v of this.values) if (v > best) best = v;
    return best;
  }
}

function aboveJs(x: Float32Array, t: number, out: Int32Array, limit: number): number {
  let n = 0;
  for (let i = 0; i < x.length; i++) {
    if (x[i] >= t) {
      if (n >= limit) return -1;
      out[n++] = i;
    }
  }
  return n;
}
