/** Vector maths and encodings of embeddings. */

/**
 * Keeps the first `dims` components and rescales them to unit L2 length (Matryoshka truncation), as a
 * vector that serialises as a JSON array ({@link JsonFloats}).
 *
 * @example
 * ```ts
 * truncateAndNormalize(new Float32Array([3, 4, 12]), 2); // → [0.6, 0.8]
 * ```
 */
export function truncateAndNormalize(vector: Float32Array, dims: number): JsonFloats {
  const out = new JsonFloats(Math.min(dims, vector.length));
  out.set(vector.subarray(0, out.length));
  let sum = 0;
  for (let i = 0; i < out.length; i++) sum += out[i] * out[i];
  const norm = Math.sqrt(sum);
  if (norm > 0) { for (let i = 0; i < out.length; i++) out[i] /= norm; }
  return out;
}

/**
 * A float32 vector that serialises as a JSON array of numbers (`JSON.stringify` calls its `toJSON`)
 * but stays float32 until then: 2,048 vectors of 4,096 held as JavaScript arrays are 67 MB of heap
 * for the collector to walk while the answer is written; as float32 they are 33 MB outside it, and
 * each array lives only while its own piece is written.
 *
 * @example
 * ```ts
 * JSON.stringify({ v: new JsonFloats([0.5, 1]) }); // '{"v":[0.5,1]}'
 * ```
 */
export class JsonFloats extends Float32Array {
  toJSON(): number[] {
    return Array.from(this);
  }
}

/** Whether this machine stores numbers little-endian (the wire order of base64 embeddings). */
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Little-endian float32 bytes as base64, the OpenAI `encoding_format: "base64"` form.
 *
 * @example
 * ```ts
 * float32ToBase64(new Float32Array([1])); // "AACAPw=="
 * ```
 */
export function float32ToBase64(vector: Float32Array): string {
  if (LITTLE_ENDIAN) return new Uint8Array(vector.buffer, vector.byteOffset, vector.byteLength).toBase64();
  const bytes = new Uint8Array(vector.length * 4);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < vector.length; i++) view.setFloat32(i * 4, vector[i], true);
  return bytes.toBase64();
}

/** The inverse of {@link float32ToBase64}; throws on text that is not base64 of whole float32s. */
export function base64ToFloat32(text: string): Float32Array {
  const bytes = Uint8Array.fromBase64(text);
  if (bytes.length % 4 !== 0) throw new RangeError(`${bytes.length} bytes are not whole float32 values`);
  if (LITTLE_ENDIAN) return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** Cosine similarity of two vectors of equal length. */
export function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}
