/**
 * How an exchange with an upstream failed, shared by the pool (health, retries) and the wire (the
 * HTTP exchange): neither imports the other for it.
 */
import { EngineUpstreamError } from "../types.ts";

/** How a request to an upstream ended, for metrics (`outcome` label) and health. */
export type Outcome =
  | "ok"
  /** The upstream refused the request itself (4xx): not the upstream's fault. */
  | "rejected"
  /** 429 from the upstream: busy, not broken. */
  | "busy"
  /** The client went away or the time limit passed. */
  | "cancelled"
  /** Connection refused or reset, connect timeout, 5xx, broken or stalled stream: counts towards ejection. */
  | "failed";

/**
 * A failed exchange with an upstream: what the log says (`message`, which may name the upstream),
 * whether another upstream may be tried, and what the client is told (never naming it).
 *
 * @example
 * ```ts
 * const failure = UpstreamFailure.broken("connection failed: reset"); // 502 upstream_error to the client
 * failure.retryable; // true: nothing reached the upstream's model
 * ```
 */
export class UpstreamFailure extends Error {
  override name = "UpstreamFailure";
  constructor(
    message: string,
    readonly outcome: Outcome,
    readonly retryable: boolean,
    /** The error the client receives, without the model id (filled in by `toEngineError`). */
    readonly client: (model: string) => EngineUpstreamError,
    /** The upstream's HTTP status, when it answered with one. */
    readonly status?: number,
  ) {
    super(message);
  }

  /** The client's error for model `model`. */
  toEngineError(model: string): EngineUpstreamError {
    return this.client(model);
  }

  /** No upstream of the model can take requests now. */
  static noUpstream(model: string): UpstreamFailure {
    return new UpstreamFailure(
      `no upstream of '${model}' is routable`,
      "failed",
      false,
      (m) =>
        new EngineUpstreamError(
          `No engine serving '${m}' is available right now; retry shortly.`,
          503,
          "service_unavailable_error",
          "model",
          "no_upstream_available",
          { "retry-after": "5" },
        ),
    );
  }

  /** A broken connection or stream, or a 5xx: 502, retryable. */
  static broken(message: string, retryable = true, status?: number): UpstreamFailure {
    return new UpstreamFailure(message, "failed", retryable, badGateway, status);
  }

  /** No answer within a time limit (`what` says which): 504, retryable, counts towards ejection. */
  static timeout(what: string): UpstreamFailure {
    return new UpstreamFailure(what, "failed", true, gatewayTimeout);
  }
}

const badGateway = (model: string) =>
  new EngineUpstreamError(
    `The engine serving '${model}' failed to answer; retry shortly.`,
    502,
    "server_error",
    null,
    "upstream_error",
  );

const gatewayTimeout = (model: string) =>
  new EngineUpstreamError(
    `The engine serving '${model}' did not answer in time; retry shortly.`,
    504,
    "timeout_error",
    null,
    "upstream_timeout",
  );
