/** Error bodies and the operational endpoints' answers (`/health`, `/version`), for the OpenAPI document. */
import { z } from "zod";

/** The OpenAI error `type` values this server emits. */
const ERROR_TYPES = [
  "invalid_request_error",
  "authentication_error",
  "permission_error",
  "not_found_error",
  "rate_limit_error",
  "server_error",
  "service_unavailable_error",
  "timeout_error",
] as const;
export type ApiErrorType = (typeof ERROR_TYPES)[number];

/** Every error: `{"error":{"message","type","param","code"}}`, as OpenAI shapes it. */
export const ErrorBodySchema = z.object({
  error: z.object({
    message: z.string(),
    type: z.enum(ERROR_TYPES),
    /** The offending field as a JSON path, e.g. `messages[2].role`. */
    param: z.string().nullable(),
    code: z.string().nullable(),
  }),
});
/** The wire shape of an error body. */
export type ErrorBody = z.infer<typeof ErrorBodySchema>;

/** `GET /health` and `GET /health/ready`. */
export const HealthSchema = z.object({
  status: z.enum(["ok", "draining"]),
  ready: z.boolean(),
  models: z.array(z.looseObject({
    id: z.string(),
    kind: z.enum(["chat", "embedding"]),
    status: z.enum(["loading", "loaded", "failed"]),
    error: z.string().optional(),
    load_seconds: z.number().optional(),
    in_flight: z.number().int(),
    /** A model served by upstreams: each one's state and load. */
    upstreams: z.array(z.object({
      name: z.string(),
      state: z.enum(["unknown", "healthy", "unhealthy", "ejected"]),
      in_flight: z.number().int(),
      failures: z.number().int(),
    })).optional(),
  })),
});
export type Health = z.infer<typeof HealthSchema>;

/** `GET /version`. */
export const VersionSchema = z.object({
  name: z.string(),
  version: z.string(),
  deno: z.string(),
  engines: z.record(z.string(), z.string()),
});
