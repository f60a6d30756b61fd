/** `POST /v1/embeddings`: the request and response as the OpenAI v1 family shapes them. */
import { z } from "zod";
import {
  EmbeddingUsageSchema,
  ModelIdSchema,
  stringsSchema,
  tokenIdListsSchema,
  tokenIdsSchema,
} from "./common.ts";

/** The request body; unknown fields are ignored. */
export const EmbeddingsRequestSchema = z.object({
  model: ModelIdSchema,
  input: z.union([z.string(), stringsSchema(), tokenIdsSchema(), tokenIdListsSchema()], {
    error: "input must be a string, an array of strings, an array of token ids, " +
      "or an array of token-id arrays",
  }),
  dimensions: z.number().int().nullish(),
  encoding_format: z.enum(["float", "base64"], {
    error: "encoding_format must be 'float' or 'base64'",
  }).nullish(),
  user: z.string().nullish(),
  /** Extension: cut each entry to the model's limit instead of rejecting it. */
  truncate: z.boolean().nullish(),
  /**
   * Extension: "query" formats each text entry with the model's query instruction (Qwen3-Embedding:
   * `Instruct: {task}\nQuery:{text}`); "document" (the default) embeds entries as sent.
   */
  input_type: z.enum(["query", "document"], { error: "input_type must be 'query' or 'document'" }).nullish(),
  /** Extension: the task description for queries, instead of the model's default. */
  instruction: z.string().min(1, "instruction is empty").max(4096, "instruction is over 4096 characters")
    .nullish(),
});
export type EmbeddingsRequest = z.infer<typeof EmbeddingsRequestSchema>;

/** One vector of the response. */
export const EmbeddingSchema = z.object({
  object: z.literal("embedding"),
  index: z.number().int().min(0),
  embedding: z.union([z.array(z.number()), z.string()]),
});

/** The response body. */
export const EmbeddingsResponseSchema = z.object({
  object: z.literal("list"),
  model: z.string(),
  data: z.array(EmbeddingSchema),
  usage: EmbeddingUsageSchema,
});
export type EmbeddingsResponse = z.infer<typeof EmbeddingsResponseSchema>;
