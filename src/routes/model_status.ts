/** What `/v1/models` and `/health` say about a model served by upstreams. */
import type { UpstreamStatus } from "../engines/types.ts";
import type { LoadState } from "../registry.ts";

/** A model's status: its load state, or for a loaded model served by upstreams, how many can take requests. */
export type ModelStatus = LoadState | "degraded" | "unavailable";

/**
 * The status of a model in load state `state` whose engine reports `upstreams` (none for a local
 * model): `loaded` while every upstream can take requests, `degraded` while only some can,
 * `unavailable` while none can (its requests get 503 `no_upstream_available`).
 *
 * @example
 * ```ts
 * modelStatus("loaded", [{ name: "a", state: "ejected", routable: false, inFlight: 0, failures: 3 }]); // "unavailable"
 * ```
 */
export function modelStatus(state: LoadState, upstreams?: readonly UpstreamStatus[]): ModelStatus {
  if (state !== "loaded" || !upstreams || upstreams.length === 0) return state;
  const routable = upstreams.filter((u) => u.routable).length;
  return routable === upstreams.length ? "loaded" : routable === 0 ? "unavailable" : "degraded";
}
