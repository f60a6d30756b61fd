/** `POST /v1/chat/completions`: request, response and stream chunk, as the OpenAI v1 family shapes them. */
import { z } from "zod";
import { CompletionUsageSchema, LogitBiasSchema, MAX_MESSAGES, ModelIdSchema } from "./common.ts";

export { MAX_MESSAGES };

const TextPart = z.object({ type: z.literal("text"), text: z.string() });
/** Message content: a string or an array of text parts. */
const Content = z.union([z.string(), z.array(z.discriminatedUnion("type", [TextPart]))], {
  error: "content must be a string or an array of {type:'text', text} parts",
});

/** A tool call as it appears in an assistant message (request history and response). */
export const ToolCallSchema = z.object({
  id: z.string(),
  type: z.literal("function"),
  function: z.object({ name: z.string(), arguments: z.string() }),
});
export type ToolCall = z.infer<typeof ToolCallSchema>;

const SystemMessage = z.object({ role: z.literal("system"), content: Content, name: z.string().nullish() });
/** `developer` (newer OpenAI clients and agent SDKs) is a system message. */
const DeveloperMessage = z.object({
  role: z.literal("developer"),
  content: Content,
  name: z.string().nullish(),
});
const UserMessage = z.object({ role: z.literal("user"), content: Content, name: z.string().nullish() });
const AssistantMessage = z.object({
  role: z.literal("assistant"),
  content: Content.nullish(),
  name: z.string().nullish(),
  tool_calls: z.array(ToolCallSchema).nullish(),
  reasoning_content: z.string().nullish(),
  reasoning: z.string().nullish(),
});
const ToolMessage = z.object({
  role: z.literal("tool"),
  content: Content,
  tool_call_id: z.string({ error: "tool messages need the tool_call_id they answer" }),
});

/** One message of the conversation; the role decides the fields. */
export const ChatMessageSchema = z.discriminatedUnion("role", [
  SystemMessage,
  DeveloperMessage,
  UserMessage,
  AssistantMessage,
  ToolMessage,
]);
export type ChatMessage = z.infer<typeof ChatMessageSchema>;

/** A function tool offered to the model. */
export const ToolSchema = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string().regex(
      /^[a-zA-Z0-9_-]{1,64}$/,
      "function names are 1-64 characters of a-z, A-Z, 0-9, _ and -",
    ),
    description: z.string().nullish(),
    parameters: z.record(z.string(), z.unknown()).nullish(),
    strict: z.boolean().nullish(),
  }),
});
export type Tool = z.infer<typeof ToolSchema>;

/** `tool_choice`: a mode or one named function. */
export const ToolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) }),
], { error: "tool_choice must be 'none', 'auto', 'required' or {type:'function', function:{name}}" });
export type ToolChoice = z.infer<typeof ToolChoiceSchema>;

/** `response_format`. */
export const ResponseFormatSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("text") }),
  z.object({ type: z.literal("json_object") }),
  z.object({
    type: z.literal("json_schema"),
    json_schema: z.object({
      name: z.string().regex(/^[a-zA-Z0-9_-]{1,64}$/, "name is 1-64 characters of a-z, A-Z, 0-9, _ and -"),
      description: z.string().nullish(),
      schema: z.record(z.string(), z.unknown()).nullish(),
      strict: z.boolean().nullish(),
    }),
  }),
]);
export type ResponseFormat = z.infer<typeof ResponseFormatSchema>;

const MessagesSchema = z.array(ChatMessageSchema)
  .max(MAX_MESSAGES, `messages may hold at most ${MAX_MESSAGES} messages`);

/** The request body; unknown fields are ignored, `null` means "not given" as with OpenAI. */
export const ChatRequestSchema = z.object({
  model: ModelIdSchema,
  messages: MessagesSchema.min(1, "messages must hold at least one message"),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  top_k: z.number().int().min(0).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  repeat_penalty: z.number().min(0).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  max_tokens: z.number().int().min(1).nullish(),
  max_completion_tokens: z.number().int().min(1).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(4, "stop takes at most 4 sequences")], {
    error: "stop must be a string or an array of up to 4 strings",
  }).nullish(),
  seed: z.number().int().nullish(),
  /** Token id (as a string key) → bias from -100 (never) to 100 (almost always), as OpenAI defines it. */
  logit_bias: LogitBiasSchema.nullish(),
  n: z.number().int().min(1).max(128).nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  tools: z.array(ToolSchema).nullish(),
  tool_choice: ToolChoiceSchema.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  response_format: ResponseFormatSchema.nullish(),
  chat_template_kwargs: z.looseObject({ enable_thinking: z.boolean().nullish() }).nullish(),
  /** Accepted and not translated: the thinking switch is `chat_template_kwargs.enable_thinking`. */
  reasoning_effort: z.string().nullish(),
  user: z.string().nullish(),
  /** Output modalities: only text is served (audio is refused, never silently dropped). */
  modalities: z.array(z.string()).nullish(),
  audio: z.record(z.string(), z.unknown()).nullish(),
  /** Extension (llama-server): false recomputes the whole prompt instead of reusing a cached prefix. */
  cache_prompt: z.boolean().nullish(),
});
export type ChatRequest = z.infer<typeof ChatRequestSchema>;

/** Why generation ended. */
export const FinishReasonSchema = z.enum(["stop", "length", "tool_calls"]);
export type FinishReason = z.infer<typeof FinishReasonSchema>;

/** One token's log-probability, with its most likely alternatives. */
export const TokenLogprobSchema = z.object({
  token: z.string(),
  logprob: z.number(),
  bytes: z.array(z.number().int()).nullable(),
  top_logprobs: z.array(z.object({
    token: z.string(),
    logprob: z.number(),
    bytes: z.array(z.number().int()).nullable(),
  })),
});
export type TokenLogprob = z.infer<typeof TokenLogprobSchema>;

/** `choices[].logprobs`. */
export const ChoiceLogprobsSchema = z.object({
  content: z.array(TokenLogprobSchema).nullable(),
  refusal: z.array(TokenLogprobSchema).nullable().optional(),
});
export type ChoiceLogprobs = z.infer<typeof ChoiceLogprobsSchema>;

/** The non-streamed response. */
export const ChatCompletionSchema = z.object({
  id: z.string().startsWith("chatcmpl-"),
  object: z.literal("chat.completion"),
  created: z.number().int(),
  model: z.string(),
  system_fingerprint: z.string().optional(),
  choices: z.array(z.object({
    index: z.number().int(),
    message: z.object({
      role: z.literal("assistant"),
      content: z.string().nullable(),
      tool_calls: z.array(ToolCallSchema).optional(),
      reasoning_content: z.string().optional(),
      reasoning: z.string().optional(),
    }),
    logprobs: ChoiceLogprobsSchema.nullable(),
    finish_reason: FinishReasonSchema,
  })),
  usage: CompletionUsageSchema,
});
export type ChatCompletion = z.infer<typeof ChatCompletionSchema>;

/** A tool-call fragment inside a stream delta. */
export const ToolCallDeltaSchema = z.object({
  index: z.number().int(),
  id: z.string().optional(),
  type: z.literal("function").optional(),
  function: z.object({ name: z.string().optional(), arguments: z.string().optional() }),
});

/** One `chat.completion.chunk` of a stream. */
export const ChatChunkSchema = z.object({
  id: z.string().startsWith("chatcmpl-"),
  object: z.literal("chat.completion.chunk"),
  created: z.number().int(),
  model: z.string(),
  system_fingerprint: z.string().optional(),
  choices: z.array(z.object({
    index: z.number().int(),
    delta: z.object({
      role: z.literal("assistant").optional(),
      content: z.string().nullable().optional(),
      reasoning_content: z.string().optional(),
      reasoning: z.string().optional(),
      tool_calls: z.array(ToolCallDeltaSchema).optional(),
    }),
    logprobs: ChoiceLogprobsSchema.nullable().optional(),
    finish_reason: FinishReasonSchema.nullable(),
  })),
  usage: CompletionUsageSchema.nullable().optional(),
});
export type ChatChunk = z.infer<typeof ChatChunkSchema>;
