/**
 * Reads a GGUF file's header (metadata key/values and tensor infos) without touching its tensor
 * data: a 37 GB model costs a few megabytes of reading. The memory plan works from this alone.
 */

/** One tensor as the header describes it: `dims` in ggml order (innermost first). */
export interface TensorInfo {
  name: string;
  dims: number[];
  /** ggml type id (`GGML_TYPE_*`). */
  type: number;
  /** Bytes of its data in the file. */
  bytes: number;
}

/** A GGUF header: metadata (arrays of strings kept as their length only) and tensors. */
export interface GgufHeader {
  metadata: Record<string, MetaScalar>;
  tensors: TensorInfo[];
}

/** Metadata values as the plan needs them; a string array is kept as its length (the vocabulary). */
export type MetaScalar = number | bigint | boolean | string | number[] | { arrayOf: number; length: number };

/** Block size (values) and block bytes of each ggml type, as ggml's type traits give them. */
const TYPE_SIZES: Record<number, readonly [number, number, string]> = {
  0: [1, 4, "F32"],
  1: [1, 2, "F16"],
  2: [32, 18, "Q4_0"],
  3: [32, 20, "Q4_1"],
  6: [32, 22, "Q5_0"],
  7: [32, 24, "Q5_1"],
  8: [32, 34, "Q8_0"],
  9: [32, 36, "Q8_1"],
  10: [256, 84, "Q2_K"],
  11: [256, 110, "Q3_K"],
  12: [256, 144, "Q4_K"],
  13: [256, 176, "Q5_K"],
  14: [256, 210, "Q6_K"],
  15: [256, 292, "Q8_K"],
  16: [256, 66, "IQ2_XXS"],
  17: [256, 74, "IQ2_XS"],
  18: [256, 98, "IQ3_XXS"],
  19: [256, 50, "IQ1_S"],
  20: [32, 18, "IQ4_NL"],
  21: [256, 110, "IQ3_S"],
  22: [256, 82, "IQ2_S"],
  23: [256, 136, "IQ4_XS"],
  24: [1, 1, "I8"],
  25: [1, 2, "I16"],
  26: [1, 4, "I32"],
  27: [1, 8, "I64"],
  28: [1, 8, "F64"],
  29: [256, 56, "IQ1_M"],
  30: [1, 2, "BF16"],
  34: [256, 54, "TQ1_0"],
  35: [256, 66, "TQ2_0"],
  39: [32, 17, "MXFP4"],
  40: [64, 36, "NVFP4"],
  41: [128, 18, "Q1_0"],
  42: [64, 18, "Q2_0"],
};

/** The name of ggml type `type` (`Q8_0`, `F16`, …). */
export function typeName(type: number): string {
  return TYPE_SIZES[type]?.[2] ?? `type${type}`;
}

/** The ggml type id of `name` (case-insensitive), or undefined. */
export function typeId(name: string): number | undefined {
  const upper = name.toUpperCase();
  const hit = Object.entries(TYPE_SIZES).find(([, v]) => v[2] === upper);
  return hit ? Number(hit[0]) : undefined;
}

/** Bytes of a tensor of `dims` in ggml type `type` (rows are whole blocks). */
export function tensorBytesOf(type: number, dims: readonly number[]): number {
  const size = TYPE_SIZES[type];
  if (!size) throw new Error(`unknown ggml tensor type ${type}`);
  const [block, bytes] = size;
  const rowValues = dims[0] ?? 1;
  if (rowValues % block !== 0) {
    throw new Error(`a row of ${rowValues} values is not a whole number of ${typeName(type)} blocks`);
  }
  const rows = dims.slice(1).reduce((a, b) => a * b, 1);
  return (rowValues / block) * bytes * rows;
}

/** GGUF value type ids. */
const V = {
  U8: 0,
  I8: 1,
  U16: 2,
  I16: 3,
  U32: 4,
  I32: 5,
  F32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  U64: 10,
  I64: 11,
  F64: 12,
} as const;
const SCALAR_BYTES: Record<number, number> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8,
};

/** Sequential reads over a file, a chunk at a time. */
class HeaderReader {
  #buf = new Uint8Array(0);
  #view = new DataView(this.#buf.buffer);
  #at = 0;
  #eof = false;
  constructor(readonly file: Deno.FsFile, readonly path: string) {}

  /** Whether `n` bytes are buffered (the common case: no await needed). */
  has(n: number): boolean {
    return this.#buf.length - this.#at >= n;
  }

  /** Skips a string if it is buffered; false when more must be read first. */
  skipStringIfBuffered(): boolean {
    if (!this.has(8)) return false;
    const n = Number(this.#view.getBigUint64(this.#at, true));
    if (!this.has(8 + n)) return false;
    this.#at += 8 + n;
    return true;
  }

  async #need(n: number): Promise<void> {
    while (this.#buf.length - this.#at < n) {
      if (this.#eof) throw new Error(`'${this.path}' ends inside its GGUF header`);
      const chunk = new Uint8Array(Math.max(1 << 20, n));
      const got = await this.file.read(chunk);
      if (got === null) {
        this.#eof = true;
        continue;
      }
      const rest = this.#buf.subarray(this.#at);
      const next = new Uint8Array(rest.length + got);
      next.set(rest);
      next.set(chunk.subarray(0, got), rest.length);
      this.#buf = next;
      this.#view = new DataView(next.buffer);
      this.#at = 0;
    }
  }
  async u32(): Promise<number> {
    await this.#need(4);
    const v = this.#view.getUint32(this.#at, true);
    this.#at += 4;
    return v;
  }
  async u64(): Promise<number> {
    await this.#need(8);
    const v = this.#view.getBigUint64(this.#at, true);
    this.#at += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`'${this.path}': a GGUF count is out of range`);
    return Number(v);
  }
  async string(): Promise<string> {
    const n = await this.u64();
    if (n > 1 << 26) throw new Error(`'${this.path}': a GGUF string of ${n} bytes is not plausible`);
    await this.#need(n);
    const s = new TextDecoder().decode(this.#buf.subarray(this.#at, this.#at + n));
    this.#at += n;
    return s;
  }
  async skip(n: number): Promise<void> {
    await this.#need(n);
    this.#at += n;
  }
  async scalar(type: number): Promise<number | bigint | boolean> {
    const n = SCALAR_BYTES[type];
    if (n === undefined) throw new Error(`'${this.path}': unknown GGUF value type ${type}`);
    await this.#need(n);
    const d = this.#view;
    const at = this.#at;
    this.#at += n;
    switch (type) {
      case V.U8:
        return d.getUint8(at);
      case V.I8:
        return d.getInt8(at);
      case V.U16:
        return d.getUint16(at, true);
      case V.I16:
        return d.getInt16(at, true);
      case V.U32:
        return d.getUint32(at, true);
      case V.I32:
        return d.getInt32(at, true);
      case V.F32:
        return d.getFloat32(at, true);
      case V.BOOL:
        return d.getUint8(at) !== 0;
      case V.U64:
        return d.getBigUint64(at, true);
      case V.I64:
        return d.getBigInt64(at, true);
      default:
        return d.getFloat64(at, true);
    }
  }
}

async function readValue(r: HeaderReader, type: number): Promise<MetaScalar> {
  if (type === V.STRING) return await r.string();
  if (type !== V.ARRAY) {
    const v = await r.scalar(type);
    return typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
  const itemType = await r.u32();
  const length = await r.u64();
  if (itemType === V.STRING) {
    // Vocabularies and merges: hundreds of thousands of strings, skipped from the buffer without awaits.
    for (let i = 0; i < length; i++) if (!r.skipStringIfBuffered()) await r.skip(await r.u64());
    return { arrayOf: itemType, length };
  }
  const bytes = SCALAR_BYTES[itemType];
  if (bytes === undefined) throw new Error(`'${r.path}': unknown GGUF array type ${itemType}`);
  // Small numeric arrays (rope sections, per-layer head counts) are kept; token scores are not.
  if (length > 4096) {
    await r.skip(length * bytes);
    return { arrayOf: itemType, length };
  }
  const out: number[] = [];
  for (let i = 0; i < length; i++) out.push(Number(await r.scalar(itemType)));
  return out;
}

/**
 * Reads the header of the GGUF file at `path`.
 *
 * @example
 * ```ts
 * async function architecture(path: string) {
 *   const { metadata } = await readGgufHeader(path);
 *   return metadata["general.architecture"]; // "qwen35moe"
 * }
 * ```
 */
export async function readGgufHeader(path: string): Promise<GgufHeader> {
  const file = await Deno.open(path).catch((e: Error) => {
    throw new Error(`model file '${path}' cannot be opened: ${e.message}`);
  });
  try {
    const r = new HeaderReader(file, path);
    if (await r.u32() !== 0x46554747) throw new Error(`'${path}' is not a GGUF file`);
    const version = await r.u32();
    if (version < 2 || version > 3) throw new Error(`'${path}': GGUF version ${version} is not supported`);
    const nTensors = await r.u64();
    const nKv = await r.u64();
    const metadata: Record<string, MetaScalar> = {};
    for (let i = 0; i < nKv; i++) {
      const key = await r.string();
      metadata[key] = await readValue(r, await r.u32());
    }
    const tensors: TensorInfo[] = [];
    for (let i = 0; i < nTensors; i++) {
      const name = await r.string();
      const nDims = await r.u32();
      if (nDims > 4) throw new Error(`'${path}': tensor '${name}' has ${nDims} dimensions`);
      const dims: number[] = [];
      for (let d = 0; d < nDims; d++) dims.push(await r.u64());
      const type = await r.u32();
      await r.u64(); // offset
      tensors.push({ name, dims, type, bytes: tensorBytesOf(type, dims) });
    }
    return { metadata, tensors };
  } finally {
    file.close();
  }
}
