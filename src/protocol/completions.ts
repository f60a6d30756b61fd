/** `POST /v1/completions` (legacy text completions) and the token utilities, as the v1 family shapes them. */
import { z } from "zod";
import {
  CompletionUsageSchema,
  LogitBiasSchema,
  ModelIdSchema,
  stringsSchema,
  tokenIdListsSchema,
  tokenIdsSchema,
} from "./common.ts";
import { ChatMessageSchema, MAX_MESSAGES, ToolSchema } from "./chat.ts";

/** The request body; unknown fields are ignored, `null` means "not given". */
export const CompletionRequestSchema = z.object({
  model: ModelIdSchema,
  prompt: z.union([z.string(), stringsSchema(1), tokenIdsSchema(1), tokenIdListsSchema(1)], {
    error:
      "prompt must be a string, an array of strings, an array of token ids, or an array of token-id arrays",
  }),
  suffix: z.string().nullish(),
  /** OpenAI's default for this endpoint is 16. */
  max_tokens: z.number().int().min(0).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  top_k: z.number().int().min(0).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  n: z.number().int().min(1).max(128).nullish(),
  best_of: z.number().int().min(1).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  /** The number of most likely alternatives per token (OpenAI allows up to 5; 20 here). */
  logprobs: z.number().int().min(0).max(20).nullish(),
  echo: z.boolean().nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(4, "stop takes at most 4 sequences")], {
    error: "stop must be a string or an array of up to 4 strings",
  }).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  repeat_penalty: z.number().min(0).nullish(),
  logit_bias: LogitBiasSchema.nullish(),
  seed: z.number().int().nullish(),
  user: z.string().nullish(),
  cache_prompt: z.boolean().nullish(),
});
export type CompletionRequest = z.infer<typeof CompletionRequestSchema>;

/** The legacy `logprobs` object: parallel arrays, alternatives as token → logprob maps. */
export const CompletionLogprobsSchema = z.object({
  tokens: z.array(z.string()),
  token_logprobs: z.array(z.number().nullable()),
  top_logprobs: z.array(z.record(z.string(), z.number()).nullable()),
  text_offset: z.array(z.number().int()),
});
export type CompletionLogprobs = z.infer<typeof CompletionLogprobsSchema>;

const CompletionChoice = z.object({
  text: z.string(),
  index: z.number().int(),
  logprobs: CompletionLogprobsSchema.nullable(),
  finish_reason: z.enum(["stop", "length"]).nullable(),
});

/** The response, and (with `stream`) each chunk: both are `text_completion` objects. */
export const CompletionSchema = z.object({
  id: z.string().startsWith("cmpl-"),
  object: z.literal("text_completion"),
  created: z.number().int(),
  model: z.string(),
  system_fingerprint: z.string().optional(),
  choices: z.array(CompletionChoice),
  usage: CompletionUsageSchema.nullable().optional(),
});
export type Completion = z.infer<typeof CompletionSchema>;

/** `POST /tokenize` (llama-server's and vLLM's shapes): text, or messages through the chat template. */
export const TokenizeRequestSchema = z.object({
  model: ModelIdSchema,
  content: z.string().nullish(),
  prompt: z.string().nullish(),
  messages: z.array(ChatMessageSchema).min(1)
    .max(MAX_MESSAGES, `messages may hold at most ${MAX_MESSAGES} messages`).nullish(),
  /** With `messages`: the tools the template renders into the prompt, as on chat completions. */
  tools: z.array(ToolSchema).nullish(),
  /** Parse special-token text and add the model's BOS (default true, as vLLM). */
  add_special_tokens: z.boolean().nullish(),
  add_special: z.boolean().nullish(),
  /** Return each token's text beside its id (llama-server). */
  with_pieces: z.boolean().nullish(),
  add_generation_prompt: z.boolean().nullish(),
  chat_template_kwargs: z.looseObject({ enable_thinking: z.boolean().nullish() }).nullish(),
});
export type TokenizeRequest = z.infer<typeof TokenizeRequestSchema>;

/** `POST /detokenize`. */
export const DetokenizeRequestSchema = z.object({
  model: ModelIdSchema,
  tokens: tokenIdsSchema(),
});
export type DetokenizeRequest = z.infer<typeof DetokenizeRequestSchema>;

/** The answer of `/tokenize`: llama-server's `tokens` and vLLM's `count` and `max_model_len`. */
export const TokenizeResponseSchema = z.object({
  tokens: z.union([
    z.array(z.number().int()),
    z.array(z.object({ id: z.number().int(), piece: z.string() })),
  ]),
  count: z.number().int(),
  max_model_len: z.number().int().optional(),
  prompt: z.string().optional(),
});
export type TokenizeResponse = z.infer<typeof TokenizeResponseSchema>;

/** The answer of `/detokenize` (`content` as llama-server, `prompt` as vLLM). */
export const DetokenizeResponseSchema = z.object({ content: z.string(), prompt: z.string() });
