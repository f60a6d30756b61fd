/**
 * Registry fields of a model served by remote OpenAI-compatible engines (`backend: "openai"`):
 * the upstream servers and how requests are routed among them.
 */
import { z } from "zod";

/** One upstream server of a model. */
export const UpstreamSpecSchema = z.object({
  /**
   * The API base as OpenAI clients take it, e.g. `http://10.0.0.5:8000/v1`; a bare origin gets `/v1`.
   * Chat goes to `<url>/chat/completions`, embeddings to `<url>/embeddings`.
   */
  url: z.url({ protocol: /^https?$/, error: "url must be an http:// or https:// URL" }),
  /** Label in metrics, logs, /health and /v1/models (default `upstream-<n>`); never the URL. */
  name: z.string().regex(/^[\w.:-]{1,64}$/, "names are 1-64 characters of letters, digits and . _ : -")
    .optional(),
  /** The upstream's own API key (sent as a bearer token). Prefer `keyEnv`: no secret in the file. */
  key: z.string().min(1).optional(),
  /** The environment variable holding the upstream's API key. */
  keyEnv: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/).optional(),
  /** The upstream's own name of the model (vLLM's `--served-model-name`); default: our id. */
  model: z.string().min(1).optional(),
  /** Health check: a path on the upstream's origin or a full URL (default `/health`). */
  health: z.string().min(1).optional(),
}).strict();
export type UpstreamSpec = z.infer<typeof UpstreamSpecSchema>;

/** How requests are spread over the upstreams and when one is taken out. */
export const RoutingSchema = z.object({
  /** An upstream that cannot be connected to within this is given up (and the request retried). */
  connectTimeoutMs: z.number().int().min(1).default(2_000),
  /** Time to the first byte of the answer (the first stream event; a whole embeddings body). */
  firstByteTimeoutMs: z.number().int().min(1).default(60_000),
  /**
   * A stream that has started and then sends no event for this long (time spent waiting for the
   * upstream, not for a slow client) is given up: the request is aborted and counted as failed, the
   * client gets an error event and `[DONE]` (0 = no limit).
   */
  streamIdleTimeoutMs: z.number().int().min(0).default(60_000),
  /**
   * Active health checks: every this often, ejected upstreams included (0 = none; an ejected upstream
   * is then probed at the end of its back-off only).
   */
  healthIntervalMs: z.number().int().min(0).default(5_000),
  healthTimeoutMs: z.number().int().min(1).default(2_000),
  /** Consecutive failed requests after which an upstream is ejected. */
  failures: z.number().int().min(1).default(3),
  /** First ejection period; it doubles with each ejection in a row, up to `maxEjectMs`. */
  ejectMs: z.number().int().min(1).default(10_000),
  maxEjectMs: z.number().int().min(1).default(300_000),
  /** Attempts on other upstreams after a failure before the first byte. */
  retries: z.number().int().min(0).max(4).default(1),
  /**
   * Prefix affinity (chat): requests whose rendered conversation shares its first this many
   * characters go to the same upstream while it is healthy and not overloaded (0 = off).
   */
  affinityPrefixChars: z.number().int().min(0).default(1_024),
  /** An upstream keeps its affine requests while it holds fewer than max(2, this × the mean load). */
  affinityLoadFactor: z.number().min(1).default(1.5),
  /** How embeddings are fetched: `base64` is 4× smaller on the wire (vLLM, llama-server, vserve). */
  embeddingEncoding: z.enum(["float", "base64"]).default("float"),
}).strict();
export type Routing = z.infer<typeof RoutingSchema>;
