/**
 * What llama.cpp says it allocated, read from its load log: model, KV, recurrent-state, output
 * and compute buffers per buffer type, and each tensor a buffer-type override moved. This is the
 * ground truth the plan is checked against, and what `/health` reports after a load.
 */

const MiB = 1024 * 1024;

/** Bytes per buffer type (`CPU`, `CPU_Mapped`, `CUDA0`, `CUDA_Host`, …) for each kind of buffer. */
export interface LlamaAllocations {
  model: Record<string, number>;
  kv: Record<string, number>;
  /** llama.cpp's own total of the KV cache (also printed by a `no_alloc` dry run). */
  kvTotal?: number;
  recurrent: Record<string, number>;
  /** llama.cpp's own total of the recurrent state. */
  recurrentTotal?: number;
  output: Record<string, number>;
  compute: Record<string, number>;
  /** Tensors moved by a buffer-type override, and where to. */
  overridden: { tensor: string; bufferType: string }[];
}

const LINES: [RegExp, keyof Omit<LlamaAllocations, "overridden" | "kvTotal" | "recurrentTotal">][] = [
  [/^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB/, "model"],
  [/^llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB/, "kv"],
  [/^llama_memory_recurrent:\s+(\S+) RS buffer size =\s+([\d.]+) MiB/, "recurrent"],
  [/^llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB/, "output"],
  [/^sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB/, "compute"],
];

/**
 * Parses llama.cpp log lines (as its logger delivers them) into allocations.
 *
 * @example
 * ```ts
 * parseLlamaLog(["sched_reserve:        CPU compute buffer size =   302.97 MiB"]).compute; // { CPU: 317689364 }
 * ```
 */
export function parseLlamaLog(lines: readonly string[]): LlamaAllocations {
  const out: LlamaAllocations = { model: {}, kv: {}, recurrent: {}, output: {}, compute: {}, overridden: [] };
  for (const raw of lines) {
    const line = raw.trim();
    for (const [re, kind] of LINES) {
      const m = line.match(re);
      if (m) out[kind][m[1]] = (out[kind][m[1]] ?? 0) + Math.round(Number(m[2]) * MiB);
    }
    const kv = line.match(/^llama_kv_cache: size =\s+([\d.]+) MiB/);
    if (kv) out.kvTotal = (out.kvTotal ?? 0) + Math.round(Number(kv[1]) * MiB);
    const rs = line.match(/^llama_memory_recurrent: size =\s+([\d.]+) MiB/);
    if (rs) out.recurrentTotal = (out.recurrentTotal ?? 0) + Math.round(Number(rs[1]) * MiB);
    const moved = line.match(/^tensor (\S+) \(.*\) buffer type overridden to (\S+)$/);
    if (moved) out.overridden.push({ tensor: moved[1], bufferType: moved[2] });
  }
  return out;
}

/** Sum of a per-buffer-type record. */
export function sumOf(r: Record<string, number>): number {
  return Object.values(r).reduce((a, b) => a + b, 0);
}
