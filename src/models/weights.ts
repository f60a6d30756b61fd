/**
 * Deterministic random weights for the generated models: a seeded PRNG, float fills for F32
 * tensors and a direct Q8_0 block writer for the large quantised ones.
 */
import type { BlockFill, FloatFill, TensorSpec, TensorType } from "./gguf_writer.ts";
import { mulberry32, mulberry32u } from "../random.ts";

/**
 * A 32-bit FNV-1a hash, to derive one seed per tensor name.
 *
 * @example
 * ```ts
 * const seed = 7 ^ hashString("blk.0.attn_q.weight");
 * ```
 */
export function hashString(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

/**
 * A float fill of uniform noise with standard deviation `std`, seeded by `seed` and tensor name.
 *
 * @example
 * ```ts
 * const spec = { name: "x", dims: [32], type: "F32", fill: noise(1, "x", 0.02) };
 * ```
 */
export function noise(seed: number, name: string, std: number): FloatFill {
  const rand = mulberry32(seed ^ hashString(name));
  const half = std * Math.sqrt(3);
  return (_start, out) => {
    for (let i = 0; i < out.length; i++) out[i] = (rand() * 2 - 1) * half;
  };
}

/**
 * A float fill of one value.
 *
 * @example
 * ```ts
 * const norm = { name: "output_norm.weight", dims: [64], type: "F32", fill: constant(1) };
 * ```
 */
export function constant(value: number): FloatFill {
  return (_start, out) => out.fill(value);
}

/** The standard deviation of an int8 drawn uniformly from [-127, 127]. */
const INT8_STD = Math.sqrt((127 * 128) / 3);

/**
 * Q8_0 blocks of uniform noise with standard deviation `std`, written directly as int8 values
 * (four per PRNG draw) with one scale per block: the distribution that quantising uniform float
 * noise gives, at a fraction of the cost, which keeps multi-GB models quick to generate.
 * `rowScale(row)` (rows of `rowLength` values) scales whole rows, e.g. to shrink special tokens.
 * Like {@link noise}, it draws from one stream: request a tensor's blocks once, in order.
 *
 * @example
 * ```ts
 * import type { TensorSpec } from "./gguf_writer.ts";
 * const t: TensorSpec = { name: "w", dims: [64, 8], type: "Q8_0", encode: q8Noise(1, "w", 0.1, 64) };
 * ```
 */
export function q8Noise(
  seed: number,
  name: string,
  std: number,
  rowLength: number,
  rowScale?: (row: number) => number,
): BlockFill {
  if (rowLength % 32 !== 0) throw new Error(`${name}: Q8_0 rows must be a multiple of 32, got ${rowLength}`);
  const next = mulberry32u(seed ^ hashString(name));
  const blocksPerRow = rowLength / 32;
  const scaleBytes = new DataView(new ArrayBuffer(2));
  let lastScale = NaN, lo = 0, hi = 0;
  return (startBlock, out) => {
    const blocks = out.length / 34;
    for (let b = 0; b < blocks; b++) {
      const scale = rowScale ? rowScale(Math.floor((startBlock + b) / blocksPerRow)) : 1;
      if (scale !== lastScale) {
        lastScale = scale;
        scaleBytes.setFloat16(0, (std * scale) / INT8_STD, true);
        lo = scaleBytes.getUint8(0);
        hi = scaleBytes.getUint8(1);
      }
      let at = b * 34;
      out[at++] = lo;
      out[at++] = hi;
      for (let w = 0; w < 8; w++) {
        const r = next();
        // A byte b in 1..255 is the int8 b - 128 (two's complement: b ^ 0x80); 0 maps to 1 so
        // the values stay symmetric in [-127, 127] as a real Q8_0 quantiser writes them.
        out[at++] = Math.max(r & 0xff, 1) ^ 0x80;
        out[at++] = Math.max((r >>> 8) & 0xff, 1) ^ 0x80;
        out[at++] = Math.max((r >>> 16) & 0xff, 1) ^ 0x80;
        out[at++] = Math.max(r >>> 24, 1) ^ 0x80;
      }
    }
  };
}

/** The preset fields every weight helper needs. */
export interface WeightSource {
  seed: number;
  type: TensorType;
}

/**
 * A matrix of noise in the preset's type: direct Q8_0 blocks, or a float fill for F32/F16.
 *
 * @example
 * ```ts
 * const q = matrix({ seed: 1, type: "Q8_0" }, "blk.0.attn_q.weight", [64, 128], 1 / 8);
 * ```
 */
export function matrix(
  p: WeightSource,
  name: string,
  dims: number[],
  std: number,
  rowScale?: (row: number) => number,
): TensorSpec {
  if (p.type === "Q8_0") {
    return { name, dims, type: "Q8_0", encode: q8Noise(p.seed, name, std, dims[0], rowScale) };
  }
  const fill = noise(p.seed, name, std);
  return {
    name,
    dims,
    type: p.type,
    fill: rowScale
      ? (start, out) => {
        fill(start, out);
        for (let i = 0; i < out.length; i++) out[i] *= rowScale(Math.floor((start + i) / dims[0]));
      }
      : fill,
  };
}

/**
 * An F32 vector (norms, biases, per-head constants) filled with `value` or by `fill`.
 *
 * @example
 * ```ts
 * const norm = vector("blk.0.attn_norm.weight", 64, 1);
 * ```
 */
export function vector(name: string, n: number | number[], value: number | FloatFill): TensorSpec {
  return {
    name,
    dims: typeof n === "number" ? [n] : n,
    type: "F32",
    fill: typeof value === "number" ? constant(value) : value,
  };
}
