/** Reading a server's Prometheus `/metrics` in tests. */

/** One sample line: its family name, labels and value. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/**
 * A scrape of `/metrics`. A series is named by its metric name and the labels it must carry (others
 * may be there too): `value("vserve_engine_tokens_generated_total", { model })`.
 *
 * @example
 * ```ts
 * const m = new MetricsScrape('vserve_requests_total{route="/x",status="200"} 3\nup 1\n');
 * m.value("vserve_requests_total", { route: "/x" }); // 3
 * m.find("vserve_requests_total", { route: "/y" }); // undefined
 * ```
 */
export class MetricsScrape {
  readonly samples: Sample[] = [];

  constructor(readonly text: string) {
    for (const line of text.split("\n")) {
      if (line === "" || line.startsWith("#")) continue;
      const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
      if (!m) throw new Error(`not a metrics sample line: ${line}`);
      const labels: Record<string, string> = {};
      for (const [, k, v] of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
        labels[k] = v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
      }
      this.samples.push({ name: m[1], labels, value: Number(m[3]) });
    }
  }

  /** The value of the first series `name` whose labels include `labels`; undefined when there is none. */
  find(name: string, labels: Record<string, string> = {}): number | undefined {
    return this.samples.find((s) =>
      s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)
    )
      ?.value;
  }

  /** A counter's value: 0 when the series is absent (a labelled counter appears on its first increment). */
  counter(name: string, labels: Record<string, string> = {}): number {
    return this.find(name, labels) ?? 0;
  }

  /** {@link find}, but a missing series fails the test (it is not read as 0). */
  value(name: string, labels: Record<string, string> = {}): number {
    const v = this.find(name, labels);
    if (v === undefined) throw new Error(`/metrics has no ${name} ${JSON.stringify(labels)}`);
    return v;
  }
}

/** Scrapes `${baseUrl}/metrics` (with `init`'s headers, for a server that wants a key). */
export async function scrapeMetrics(baseUrl: string, init: RequestInit = {}): Promise<MetricsScrape> {
  const res = await fetch(`${baseUrl}/metrics`, init);
  const text = await res.text();
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}: ${text.slice(0, 300)}`);
  return new MetricsScrape(text);
}

/** One engine counter of `model` (`vserve_engine_<name>_total`); a missing series fails the test. */
export async function engineCounter(baseUrl: string, name: string, model: string): Promise<number> {
  return (await scrapeMetrics(baseUrl)).value(`vserve_engine_${name}_total`, { model });
}

/**
 * Event-loop ticks of the server at `baseUrl` that found its JavaScript thread had run over a quarter
 * of a second without a turn (its CPU time, which a busy machine does not inflate): a block of work
 * far beyond a slice (10 ms), a body parse or a garbage collection, as a whole grammar build, a
 * tokenization or an ONNX run on the thread was.
 */
export async function longEventLoopStalls(baseUrl: string): Promise<number> {
  const m = await scrapeMetrics(baseUrl);
  return m.value("vserve_event_loop_stall_seconds_count") -
    m.value("vserve_event_loop_stall_seconds_bucket", { le: "0.25" });
}
