/** Prometheus metrics: counters, gauges and histograms rendered in the text exposition format. */

type Labels = Record<string, string>;

/** Characters a label value must escape. */
const ESCAPED = /[\\"\n]/;

/** The series key of a label set: its pairs sorted by name, values escaped (hot: every request). */
function key(labels: Labels): string {
  const names = Object.keys(labels);
  if (names.length > 1) names.sort();
  let out = "";
  for (const name of names) {
    const v = labels[name];
    const value = ESCAPED.test(v) ? v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n") : v;
    out += `${out ? "," : ""}${name}="${value}"`;
  }
  return out;
}

/** A metric family: its name, help, type and series lines (without the HELP and TYPE lines). */
export interface Family {
  name: string;
  help: string;
  type: "counter" | "gauge" | "histogram";
  render(): string[];
}

/** A monotonically increasing count per label set. */
export class Counter implements Family {
  readonly type = "counter";
  readonly #values = new Map<string, number>();
  constructor(readonly name: string, readonly help: string) {}
  inc(labels: Labels = {}, by = 1): void {
    const k = key(labels);
    this.#values.set(k, (this.#values.get(k) ?? 0) + by);
  }
  render(): string[] {
    return [...this.#values].map(([k, v]) => `${this.name}${k ? `{${k}}` : ""} ${v}`);
  }
}

/** A value per label set, set directly or read from a callback at scrape time. */
export class Gauge implements Family {
  readonly type = "gauge";
  readonly #values = new Map<string, number>();
  constructor(
    readonly name: string,
    readonly help: string,
    readonly collect?: () => [Labels, number][],
  ) {}
  set(labels: Labels, value: number): void {
    this.#values.set(key(labels), value);
  }
  render(): string[] {
    const fresh = this.collect?.().map(([l, v]) => [key(l), v] as const) ?? [];
    return [...this.#values, ...fresh].map(([k, v]) => `${this.name}${k ? `{${k}}` : ""} ${v}`);
  }
}

/** A count kept elsewhere (e.g. by an engine), read at scrape time. */
export class CounterReader implements Family {
  readonly type = "counter";
  constructor(readonly name: string, readonly help: string, readonly collect: () => [Labels, number][]) {}
  render(): string[] {
    return this.collect().map(([l, v]) => `${this.name}${Object.keys(l).length ? `{${key(l)}}` : ""} ${v}`);
  }
}

/** Observations counted into cumulative buckets, with sum and count. */
export class Histogram implements Family {
  readonly type = "histogram";
  readonly #series = new Map<string, { buckets: number[]; sum: number; count: number }>();
  constructor(readonly name: string, readonly help: string, readonly bounds: readonly number[]) {}
  observe(labels: Labels, value: number): void {
    const k = key(labels);
    let s = this.#series.get(k);
    if (!s) this.#series.set(k, s = { buckets: this.bounds.map(() => 0), sum: 0, count: 0 });
    for (let i = 0; i < this.bounds.length; i++) if (value <= this.bounds[i]) s.buckets[i]++;
    s.sum += value;
    s.count++;
  }
  render(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.#series) {
      const sep = k ? `${k},` : "";
      this.bounds.forEach((b, i) => out.push(`${this.name}_bucket{${sep}le="${b}"} ${s.buckets[i]}`));
      out.push(`${this.name}_bucket{${sep}le="+Inf"} ${s.count}`);
      out.push(`${this.name}_sum${k ? `{${k}}` : ""} ${s.sum}`);
      out.push(`${this.name}_count${k ? `{${k}}` : ""} ${s.count}`);
    }
    return out;
  }
}

const SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
const STALL_SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];

/** The server's metrics. */
export class Metrics {
  readonly requests = new Counter("vserve_http_requests_total", "HTTP requests by route and status.");
  readonly duration = new Histogram(
    "vserve_http_request_duration_seconds",
    "Time from request to the response (for streams, to their last byte).",
    SECONDS,
  );
  readonly ttft = new Histogram(
    "vserve_time_to_first_token_seconds",
    "Time to the first generated token.",
    SECONDS,
  );
  readonly queueWait = new Histogram(
    "vserve_queue_wait_seconds",
    "Time a request waited for a free sequence (a model served by upstreams: until it was sent upstream).",
    SECONDS,
  );
  readonly promptTokens = new Counter("vserve_prompt_tokens_total", "Prompt tokens processed, by model.");
  readonly completionTokens = new Counter(
    "vserve_completion_tokens_total",
    "Completion tokens generated, by model.",
  );
  readonly rejected = new Counter(
    "vserve_rejected_requests_total",
    "Requests refused by backpressure, by model.",
  );
  readonly eventLoopStall = new Histogram(
    "vserve_event_loop_stall_seconds",
    "CPU time of the JavaScript thread between two event-loop ticks (25 ms apart while it works, 250 ms while it idles): how long our own work held the loop.",
    STALL_SECONDS,
  );
  readonly eventLoopLag = new Histogram(
    "vserve_event_loop_lag_seconds",
    "How late an event-loop tick fired (our own work, or no free core on the host).",
    STALL_SECONDS,
  );
  readonly #families: Family[];

  constructor(collectors: Family[] = []) {
    this.#families = [
      this.requests,
      this.duration,
      this.ttft,
      this.queueWait,
      this.promptTokens,
      this.completionTokens,
      this.rejected,
      this.eventLoopStall,
      this.eventLoopLag,
      ...collectors,
      new Gauge(
        "vserve_process_resident_memory_bytes",
        "Resident memory of the process.",
        () => [[{}, Deno.memoryUsage().rss]],
      ),
      new Gauge(
        "vserve_process_heap_used_bytes",
        "JavaScript heap in use.",
        () => [[{}, Deno.memoryUsage().heapUsed]],
      ),
    ];
  }

  /** The text exposition format (version 0.0.4). */
  render(): string {
    const lines: string[] = [];
    for (const f of this.#families) {
      lines.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`, ...f.render());
    }
    return lines.join("\n") + "\n";
  }
}
