/** Wire pieces shared by several endpoints. */
import { z } from "zod";

/** `usage` of embeddings responses. */
export const EmbeddingUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
});

/** `usage` of chat completions, with the details cost and observability tools read. */
export const CompletionUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  completion_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
  /** Prompt tokens served from an earlier request's state instead of being recomputed. */
  prompt_tokens_details: z.object({ cached_tokens: z.number().int().min(0) }).optional(),
  /** Completion tokens spent on reasoning (`reasoning_content`). */
  completion_tokens_details: z.object({ reasoning_tokens: z.number().int().min(0) }).optional(),
});
export type CompletionUsage = z.infer<typeof CompletionUsageSchema>;

/** The model `id` field, named in every request. */
export const ModelIdSchema = z.string({ error: "model must be a string naming a served model" })
  .min(1, "model must not be empty");

/**
 * Most messages (or input items) one request may hold on any chat-shaped API: far more than any
 * context takes (4 tokens a message at least), and checked before the messages themselves
 * (validating 100,000 of them took 130 ms).
 */
export const MAX_MESSAGES = 16_384;
