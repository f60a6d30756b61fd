/** A small seeded PRNG (mulberry32): the same seed gives the same stream on every machine. */

/**
 * The raw 32-bit stream.
 *
 * @example
 * ```ts
 * const word = mulberry32u(42)(); // an integer in [0, 2^32)
 * ```
 */
export function mulberry32u(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/**
 * Floats in [0, 1) from the same stream.
 *
 * @example
 * ```ts
 * const rand = mulberry32(42);
 * rand(); // a float in [0, 1)
 * ```
 */
export function mulberry32(seed: number): () => number {
  const next = mulberry32u(seed);
  return () => next() / 4294967296;
}
