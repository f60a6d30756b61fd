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

/** One row of the report: a metric measured through vserve's HTTP API, in-process, and on a baseline. */
export interface Row {
  scenario: string;
  metric: string;
  unit: string;
  /** Larger is better (throughput) or smaller is better (latency). */
  better: "higher" | "lower";
  /** vserve, through HTTP. */
  http: Summary;
  inProcess?: Summary;
  /** Another server on the same work (llama-server, or any `--baseline-url`). */
  baseline?: Summary;
}

/** `a` relative to `b`, oriented so that 1.0 = same and > 1 = `a` better (faster, or lower latency). */
function relative(a: Summary, b: Summary | undefined, better: Row["better"]): number | undefined {
  if (!b || !Number.isFinite(b.median) || !Number.isFinite(a.median) || a.median === 0 || b.median === 0) {
    return undefined;
  }
  return better === "higher" ? a.median / b.median : b.median / a.median;
}

/** HTTP relative to in-process, oriented so that 1.0 = same speed and < 1 = HTTP slower. */
export function ratio(row: Row): number | undefined {
  return relative(row.http, row.inProcess, row.better);
}

/**
 * vserve (HTTP) relative to the baseline, oriented so that > 1 = vserve better, for throughput (higher
 * is better) and latency (lower is better) alike.
 *
 * @example
 * ```ts
 * // vserve 20 ms, llama-server 25 ms: vserve is 1.25× better
 * const row = { scenario: "s", metric: "m", unit: "ms", better: "lower" as const };
 * baselineRatio({ ...row, http: summarize([20]), baseline: summarize([25]) }); // 1.25
 * ```
 */
export function baselineRatio(row: Row): number | undefined {
  return relative(row.http, row.baseline, row.better);
}

const fmt = (s: Summary | undefined) =>
  !s || !Number.isFinite(s.median)
    ? "–"
    : s.n <= 1 || s.min === s.max
    ? num(s.median)
    : `${num(s.median)} (${num(s.min)}–${num(s.max)})`;

function num(x: number): string {
  if (Math.abs(x) >= 100) return x.toFixed(0);
  if (Math.abs(x) >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

const times = (q: number | undefined, digits: number) => q === undefined ? "–" : `${q.toFixed(digits)}×`;

/**
 * A markdown table of the rows, with the machine facts above it. The in-process columns appear when a
 * row has an in-process figure, the baseline columns (named `baselineLabel`) when a row has a baseline.
 */
export function markdownReport(
  meta: Record<string, unknown>,
  rows: readonly Row[],
  opts: { baselineLabel?: string } = {},
): string {
  const label = opts.baselineLabel ?? "baseline";
  const hasInProcess = rows.some((r) => r.inProcess);
  const hasBaseline = rows.some((r) => r.baseline);
  const header = ["scenario", "metric", "HTTP median (min–max)"];
  if (hasInProcess) header.push("in-process median (min–max)", "HTTP / in-process");
  if (hasBaseline) header.push(`${label} median (min–max)`, `vserve / ${label} (> 1: vserve better)`);
  const lines = [
    "| " + Object.entries(meta).map(([k, v]) => `${k}: ${v}`).join(" · ") + " |",
    "",
    `| ${header.join(" | ")} |`,
    `|${header.map(() => "---|").join("")}`,
  ];
  for (const r of rows) {
    const cells = [r.scenario, `${r.metric} (${r.unit})`, fmt(r.http)];
    if (hasInProcess) cells.push(fmt(r.inProcess), times(ratio(r), 3));
    if (hasBaseline) cells.push(fmt(r.baseline), times(baselineRatio(r), 2));
    lines.push(`| ${cells.join(" | ")} |`);
  }
  return lines.join("\n");
}
