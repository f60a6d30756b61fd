/**
 * A GGUF v3 writer: metadata key/values, tensor infos and aligned tensor data in F32, F16 or
 * Q8_0. Tensor data is produced in chunks by a callback (float values, or ready Q8_0 blocks), so
 * large models stream to disk.
 */

/** GGUF metadata value types. */
const T = { U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10 } as const;

/** A metadata value with its GGUF type. */
export type MetaValue =
  | { type: "u32" | "i32" | "f32" | "u64"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "string[]"; value: readonly string[] }
  | { type: "i32[]"; value: ArrayLike<number> };

/** Tensor storage types (ggml_type ids). */
export const TENSOR_TYPES = { F32: 0, F16: 1, Q8_0: 8 } as const;
export type TensorType = keyof typeof TENSOR_TYPES;

/**
 * A tensor to write; `dims` in ggml order (innermost first). Exactly one producer: `fill` writes
 * float values from index `start` (encoded to `type` here), or, for Q8_0, `encode` writes ready
 * 34-byte blocks from block `startBlock`.
 */
export interface TensorSpec {
  name: string;
  dims: readonly number[];
  type: TensorType;
  fill?: FloatFill;
  encode?: BlockFill;
}

/** Writes a tensor's float values from index `start` into `out`. */
export type FloatFill = (start: number, out: Float32Array) => void;
/** Writes a tensor's Q8_0 blocks (34 bytes each) from block `startBlock` into `out`. */
export type BlockFill = (startBlock: number, out: Uint8Array) => void;

const ALIGNMENT = 32;
const CHUNK = 1 << 20; // values generated per step: a multiple of the Q8_0 block size

/** Bytes a tensor of `count` values takes in `type`. */
export function tensorBytes(type: TensorType, count: number): number {
  if (type === "F32") return count * 4;
  if (type === "F16") return count * 2;
  if (count % 32 !== 0) throw new Error(`Q8_0 needs a multiple of 32 values, got ${count}`);
  return (count / 32) * 34;
}

class ByteSink {
  #buf = new Uint8Array(1 << 16);
  #view = new DataView(this.#buf.buffer);
  length = 0;
  #ensure(n: number) {
    if (this.length + n <= this.#buf.length) return;
    const next = new Uint8Array(Math.max(this.#buf.length * 2, this.length + n));
    next.set(this.#buf.subarray(0, this.length));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }
  #put(size: number, write: (view: DataView, at: number) => void) {
    this.#ensure(size);
    write(this.#view, this.length);
    this.length += size;
  }
  u32(v: number) {
    this.#put(4, (d, at) => d.setUint32(at, v, true));
  }
  i32(v: number) {
    this.#put(4, (d, at) => d.setInt32(at, v, true));
  }
  u64(v: number) {
    this.#put(8, (d, at) => d.setBigUint64(at, BigInt(v), true));
  }
  f32(v: number) {
    this.#put(4, (d, at) => d.setFloat32(at, v, true));
  }
  u8(v: number) {
    this.#put(1, (d, at) => d.setUint8(at, v));
  }
  string(s: string) {
    const bytes = new TextEncoder().encode(s);
    this.u64(bytes.length);
    this.#ensure(bytes.length);
    this.#buf.set(bytes, this.length);
    this.length += bytes.length;
  }
  pad(alignment: number) {
    while (this.length % alignment !== 0) this.u8(0);
  }
  bytes(): Uint8Array {
    return this.#buf.subarray(0, this.length);
  }
}

function writeValue(sink: ByteSink, v: MetaValue) {
  switch (v.type) {
    case "u32":
      sink.u32(T.U32);
      return sink.u32(v.value);
    case "i32":
      sink.u32(T.I32);
      return sink.i32(v.value);
    case "f32":
      sink.u32(T.F32);
      return sink.f32(v.value);
    case "u64":
      sink.u32(T.U64);
      return sink.u64(v.value);
    case "bool":
      sink.u32(T.BOOL);
      return sink.u8(v.value ? 1 : 0);
    case "string":
      sink.u32(T.STRING);
      return sink.string(v.value);
    case "string[]":
      sink.u32(T.ARRAY);
      sink.u32(T.STRING);
      sink.u64(v.value.length);
      for (const s of v.value) sink.string(s);
      return;
    case "i32[]":
      sink.u32(T.ARRAY);
      sink.u32(T.I32);
      sink.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) sink.i32(v.value[i]);
      return;
  }
}

/** Encodes `values` as Q8_0 blocks (f16 scale + 32 int8) into `out`. */
export function quantizeQ8_0(values: Float32Array, out: Uint8Array): void {
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let b = 0; b < values.length / 32; b++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(values[b * 32 + i]));
    const d = amax / 127;
    const inv = d > 0 ? 1 / d : 0;
    view.setFloat16(b * 34, d, true);
    for (let i = 0; i < 32; i++) view.setInt8(b * 34 + 2 + i, Math.round(values[b * 32 + i] * inv));
  }
}

function encodeChunk(type: TensorType, values: Float32Array): Uint8Array {
  const out = new Uint8Array(tensorBytes(type, values.length));
  if (type === "F32") out.set(new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
  else if (type === "F16") {
    const view = new DataView(out.buffer);
    for (let i = 0; i < values.length; i++) view.setFloat16(i * 2, values[i], true);
  } else quantizeQ8_0(values, out);
  return out;
}

function produceChunk(t: TensorSpec, start: number, count: number): Uint8Array {
  if (t.encode) {
    if (t.type !== "Q8_0") throw new Error(`${t.name}: encode() produces Q8_0 blocks, not ${t.type}`);
    const out = new Uint8Array(tensorBytes("Q8_0", count));
    t.encode(start / 32, out);
    return out;
  }
  if (!t.fill) throw new Error(`${t.name}: a tensor needs fill() or encode()`);
  const values = new Float32Array(count);
  t.fill(start, values);
  return encodeChunk(t.type, values);
}

/**
 * Writes a GGUF v3 file.
 *
 * @example
 * ```ts
 * async function write(tensors: TensorSpec[]) {
 *   await writeGguf("m.gguf", { "general.architecture": { type: "string", value: "qwen3" } }, tensors);
 * }
 * ```
 */
export async function writeGguf(
  path: string,
  metadata: Record<string, MetaValue>,
  tensors: readonly TensorSpec[],
): Promise<void> {
  const { head } = ggufHead(metadata, tensors);
  const file = await Deno.open(path, { write: true, create: true, truncate: true });
  try {
    await writeAll(file, head);
    for (const t of tensors) {
      const count = t.dims.reduce((a, b) => a * b, 1);
      let written = 0;
      for (let start = 0; start < count; start += CHUNK) {
        const bytes = produceChunk(t, start, Math.min(CHUNK, count - start));
        await writeAll(file, bytes);
        written += bytes.length;
      }
      const pad = (ALIGNMENT - (written % ALIGNMENT)) % ALIGNMENT;
      if (pad) await writeAll(file, new Uint8Array(pad));
    }
  } finally {
    file.close();
  }
}

/**
 * Writes only the header of a GGUF file and extends the file to its full size without writing the
 * tensor data (a sparse file on Linux file systems: no disk blocks). llama.cpp accepts it for
 * loads that never read weights (`no_alloc`), which is how the memory plan is checked against
 * llama.cpp on shapes whose weights would take tens of gigabytes.
 *
 * @example
 * ```ts
 * async function writeShape(path: string, metadata: Record<string, MetaValue>, tensors: TensorSpec[]) {
 *   await writeGgufHeaderOnly(path, metadata, tensors); // a header; the data is a hole
 * }
 * ```
 */
export async function writeGgufHeaderOnly(
  path: string,
  metadata: Record<string, MetaValue>,
  tensors: readonly TensorSpec[],
): Promise<void> {
  const { head, dataBytes } = ggufHead(metadata, tensors);
  const file = await Deno.open(path, { write: true, create: true, truncate: true });
  try {
    await writeAll(file, head);
    await file.truncate(head.length + dataBytes);
  } finally {
    file.close();
  }
}

/** The header bytes (padded to the alignment) and the size of the data section that follows. */
function ggufHead(
  metadata: Record<string, MetaValue>,
  tensors: readonly TensorSpec[],
): { head: Uint8Array; dataBytes: number } {
  const head = new ByteSink();
  head.u32(0x46554747); // "GGUF"
  head.u32(3);
  head.u64(tensors.length);
  const entries = Object.entries(metadata);
  head.u64(entries.length);
  for (const [key, value] of entries) {
    head.string(key);
    writeValue(head, value);
  }
  let offset = 0;
  for (const t of tensors) {
    head.string(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(TENSOR_TYPES[t.type]);
    head.u64(offset);
    offset += tensorBytes(t.type, t.dims.reduce((a, b) => a * b, 1));
    offset = Math.ceil(offset / ALIGNMENT) * ALIGNMENT;
  }
  head.pad(ALIGNMENT);
  return { head: head.bytes(), dataBytes: offset };
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array) {
  let at = 0;
  while (at < bytes.length) at += await file.write(bytes.subarray(at));
}
