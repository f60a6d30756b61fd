/** `GET /v1/models` and `GET /v1/models/{id}`. */
import { z } from "zod";

/** One model as listed; `status` and `kind` are extensions OpenAI clients ignore. */
export const ModelObjectSchema = z.object({
  id: z.string(),
  object: z.literal("model"),
  created: z.number().int(),
  owned_by: z.string(),
  kind: z.enum(["chat", "embedding"]).optional(),
  /** `degraded` / `unavailable`: a model served by upstreams of which only some / none can take requests. */
  status: z.enum(["loading", "loaded", "failed", "degraded", "unavailable"]).optional(),
  alias_of: z.string().optional(),
  /** A model served by upstreams: each one's state (by its configured name). */
  upstreams: z.array(z.object({
    name: z.string(),
    state: z.enum(["unknown", "healthy", "unhealthy", "ejected"]),
  })).optional(),
});
export type ModelObject = z.infer<typeof ModelObjectSchema>;

/** The list response. */
export const ModelListSchema = z.object({ object: z.literal("list"), data: z.array(ModelObjectSchema) });
export type ModelList = z.infer<typeof ModelListSchema>;
