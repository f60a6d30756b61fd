/** Statistics and the report of the benchmark: medians of repetitions, ratios, markdown. */

/** Median, minimum and maximum of repeated measurements. */
export interface Summary {
  median: number;
  min: number;
  max: number;
  n: number;
}

/**
 * Summarises repetitions.
 *
 * @example
 * ```ts
 * summarize([3, 1, 2]); // { median: 2, min: 1, max: 3, n: 3 }
 * ```
 */
export function summarize(values: readonly number[]): Summary {
  if (values.length === 0) return { median: NaN, min: NaN, max: NaN, n: 0 };
  const sorted = [...values].sort((a, b) => a - b);
  return { median: percentile(sorted, 50), min: sorted[0], max: sorted.at(-1)!, n: values.length };
}

/** The p-th percentile (linear interpolation) of sorted values. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

/** One row of the report: a metric measured through HTTP and in-process. */
export interface Row {
  scenario: string;
  metric: string;
  unit: string;
  /** Larger is better (throughput) or smaller is better (latency). */
  better: "higher" | "lower";
  http: Summary;
  inProcess?: Summary;
  baseline?: Summary;
}

/** HTTP relative to in-process, oriented so that 1.0 = same speed and < 1 = HTTP slower. */
export function ratio(row: Row): number | undefined {
  if (!row.inProcess || !Number.isFinite(row.inProcess.median) || row.http.median === 0) return undefined;
  return row.better === "higher"
    ? row.http.median / row.inProcess.median
    : row.inProcess.median / row.http.median;
}

const fmt = (s: Summary | undefined) =>
  !s || !Number.isFinite(s.median) ? "–" : `${num(s.median)} (${num(s.min)}–${num(s.max)})`;

function num(x: number): string {
  if (Math.abs(x) >= 100) return x.toFixed(0);
  if (Math.abs(x) >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

/** A markdown table of the rows, with the machine facts above it. */
export function markdownReport(meta: Record<string, unknown>, rows: readonly Row[]): string {
  const hasBaseline = rows.some((r) => r.baseline);
  const lines = [
    "| " + Object.entries(meta).map(([k, v]) => `${k}: ${v}`).join(" · ") + " |",
    "",
    `| scenario | metric | HTTP median (min–max) | in-process median (min–max) | HTTP / in-process |${
      hasBaseline ? " baseline |" : ""
    }`,
    `|---|---|---|---|---|${hasBaseline ? "---|" : ""}`,
  ];
  for (const r of rows) {
    const q = ratio(r);
    lines.push(
      `| ${r.scenario} | ${r.metric} (${r.unit}) | ${fmt(r.http)} | ${fmt(r.inProcess)} | ${
        q === undefined ? "–" : `${q.toFixed(3)}×`
      } |${hasBaseline ? ` ${fmt(r.baseline)} |` : ""}`,
    );
  }
  return lines.join("\n");
}
