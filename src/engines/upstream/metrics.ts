/**
 * Per-upstream metrics of every model served by upstreams, labelled by model and upstream name
 * (names come from the registry, so the series are bounded by configuration).
 */
import type { Family } from "../../metrics.ts";
import type { PoolStats, UpstreamPool } from "./pool.ts";

const STATE_VALUE = { unknown: 0, healthy: 1, unhealthy: -1, ejected: -2 } as const;

/**
 * The metric families of the upstream pools that `pools` returns at scrape time.
 *
 * @example
 * ```ts
 * import { Metrics } from "../../metrics.ts";
 * import type { UpstreamPool } from "./pool.ts";
 * const pools: UpstreamPool[] = [];
 * new Metrics([...upstreamMetricFamilies(() => pools)]).render();
 * ```
 */
export function upstreamMetricFamilies(pools: () => UpstreamPool[]): Family[] {
  const merged = (
    stat: keyof PoolStats,
    type: "counter" | "histogram",
    help: string,
  ): Family => ({
    name: `vserve_upstream_${
      {
        requests: "requests_total",
        firstByte: "first_byte_seconds",
        duration: "request_duration_seconds",
        ejections: "ejections_total",
        retries: "retries_total",
      }[stat]
    }`,
    help,
    type,
    render: () => pools().flatMap((p) => p.stats[stat].render()),
  });
  const gauge = (name: string, help: string, value: (p: UpstreamPool) => [string, number][]): Family => ({
    name,
    help,
    type: "gauge",
    render: () =>
      pools().flatMap((p) =>
        value(p).map(([upstream, v]) =>
          `${name}{model="${escape(p.model)}",upstream="${escape(upstream)}"} ${v}`
        )
      ),
  });
  return [
    merged(
      "requests",
      "counter",
      "Requests sent to each upstream, by outcome (ok, rejected, busy, cancelled, failed).",
    ),
    merged(
      "firstByte",
      "histogram",
      "Time from sending a request to an upstream to the first byte of its answer.",
    ),
    merged("duration", "histogram", "Time from sending a request to an upstream to the end of its answer."),
    merged("ejections", "counter", "Times an upstream was taken out after failures in a row."),
    merged("retries", "counter", "Requests sent to another upstream after a failure before the first byte."),
    gauge(
      "vserve_upstream_in_flight",
      "Requests sent to the upstream and not yet finished.",
      (p) => p.upstreams.map((u) => [u.name, u.outstanding]),
    ),
    gauge(
      "vserve_upstream_state",
      "Upstream state: 1 healthy, 0 not yet checked, -1 failing its health check, -2 ejected.",
      (p) => p.upstreams.map((u) => [u.name, STATE_VALUE[u.state]]),
    ),
  ];
}

function escape(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}
