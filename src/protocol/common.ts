/** Wire pieces shared by several endpoints. */
import { z } from "zod";

/** `usage` of embeddings responses. */
export const EmbeddingUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
});

/** `usage` of chat completions. */
export const CompletionUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  completion_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
});
export type CompletionUsage = z.infer<typeof CompletionUsageSchema>;

/** The model `id` field, named in every request. */
export const ModelIdSchema = z.string({ error: "model must be a string naming a served model" })
  .min(1, "model must not be empty");
