/**
 * The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): request,
 * message, stream events, token count and error body, as Anthropic shapes them. Unknown fields
 * are ignored; what this server accepts but does not act on is said field by field.
 */
import { z } from "zod";
import { LogitBiasSchema, MAX_MESSAGES, ModelIdSchema } from "./common.ts";

/** `cache_control` on a block or tool: accepted and ignored (prompt reuse here is automatic). */
const CacheControl = z.looseObject({ type: z.string() }).nullish();

const TextBlock = z.object({
  type: z.literal("text"),
  text: z.string(),
  cache_control: CacheControl,
  citations: z.array(z.unknown()).nullish(),
});
/** Block types read only so that the error can name them (this server reads text). */
const Refused = <T extends string>(type: T) => z.looseObject({ type: z.literal(type) });
const ImageBlock = Refused("image");
const DocumentBlock = Refused("document");
const SearchResultBlock = Refused("search_result");
/** A deferred tool (`defer_loading`) loaded by a tool search. */
const ToolReferenceBlock = z.object({
  type: z.literal("tool_reference"),
  tool_name: z.string(),
  cache_control: CacheControl,
});

/** `tool_result.content`: a string or blocks. */
const ToolResultContent = z.union([
  z.string(),
  z.array(z.discriminatedUnion("type", [
    TextBlock,
    ImageBlock,
    DocumentBlock,
    SearchResultBlock,
    ToolReferenceBlock,
  ])),
], { error: "content must be a string or an array of {type:'text', text} blocks" });

const ToolUseBlock = z.object({
  type: z.literal("tool_use"),
  id: z.string().min(1, "id is empty"),
  name: z.string(),
  input: z.record(z.string(), z.unknown(), { error: "input must be an object (the tool's arguments)" }),
  cache_control: CacheControl,
});
const ToolResultBlock = z.object({
  type: z.literal("tool_result"),
  tool_use_id: z.string().min(1, "tool_use_id is empty"),
  content: ToolResultContent.optional(),
  is_error: z.boolean().nullish(),
  cache_control: CacheControl,
});
const ThinkingBlock = z.object({
  type: z.literal("thinking"),
  thinking: z.string(),
  signature: z.string().nullish(),
  cache_control: CacheControl,
});
const RedactedThinkingBlock = z.object({ type: z.literal("redacted_thinking"), data: z.string() });
/** Blocks of tools that Anthropic's servers run: refused by name. */
export const SERVER_BLOCK_TYPES = [
  "server_tool_use",
  "web_search_tool_result",
  "web_fetch_tool_result",
  "code_execution_tool_result",
  "bash_code_execution_tool_result",
  "text_editor_code_execution_tool_result",
  "tool_search_tool_result",
  "mcp_tool_use",
  "mcp_tool_result",
  "container_upload",
] as const;

/** A content block of a user or assistant message. */
export const ContentBlockParamSchema = z.discriminatedUnion("type", [
  TextBlock,
  ImageBlock,
  DocumentBlock,
  SearchResultBlock,
  ToolUseBlock,
  ToolResultBlock,
  ThinkingBlock,
  RedactedThinkingBlock,
  ...SERVER_BLOCK_TYPES.map((t) => Refused(t)),
]);
export type ContentBlockParam = z.infer<typeof ContentBlockParamSchema>;

const MessageContent = z.union([z.string(), z.array(ContentBlockParamSchema)], {
  error: "content must be a string or an array of content blocks",
});

/** One message; `system` in the middle of a conversation is what Claude Code sends for reminders. */
export const MessageParamSchema = z.discriminatedUnion("role", [
  z.object({ role: z.literal("user"), content: MessageContent }),
  z.object({ role: z.literal("assistant"), content: MessageContent }),
  z.object({
    role: z.literal("system"),
    content: z.union([z.string(), z.array(TextBlock)], {
      error: "a system message's content is a string or an array of {type:'text', text} blocks",
    }),
  }),
], { error: "role must be 'user', 'assistant' or 'system'" });
export type MessageParam = z.infer<typeof MessageParamSchema>;

/** A custom (client) tool. */
export const CustomToolSchema = z.object({
  type: z.literal("custom").nullish(),
  name: z.string().regex(
    /^[a-zA-Z0-9_-]{1,128}$/,
    "tool names are 1-128 characters of a-z, A-Z, 0-9, _ and -",
  ),
  description: z.string().nullish(),
  input_schema: z.looseObject({
    type: z.literal("object", { error: "input_schema.type must be 'object'" }),
  }, { error: "input_schema must be a JSON schema object with type 'object'" }),
  /** Left out of the prompt until a `tool_reference` block loads it. */
  defer_loading: z.boolean().nullish(),
  strict: z.boolean().nullish(),
  cache_control: CacheControl,
});
export type CustomTool = z.infer<typeof CustomToolSchema>;
/** A tool as the request reads it: custom tools are parsed with their own schema, others refused by type. */
const ToolParam = z.looseObject({ type: z.string().nullish() }, {
  error: "each tool is an object {name, description, input_schema}",
});

export const ToolChoiceSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("auto"), disable_parallel_tool_use: z.boolean().nullish() }),
  z.object({ type: z.literal("any"), disable_parallel_tool_use: z.boolean().nullish() }),
  z.object({
    type: z.literal("tool"),
    name: z.string(),
    disable_parallel_tool_use: z.boolean().nullish(),
  }),
  z.object({ type: z.literal("none") }),
], { error: "tool_choice must be {type:'auto'}, {type:'any'}, {type:'tool', name} or {type:'none'}" });
export type ToolChoiceParam = z.infer<typeof ToolChoiceSchema>;

/**
 * `omitted` leaves the thinking text out (its signature still restores it); any other value shows it.
 * The set grows (`summarized`, `display`, and `updates`, which Claude Code 2.1.332 sends), so it is open.
 */
const ThinkingDisplay = z.string().nullish();
/** The thinking switch: `enabled` on, `disabled` off, `adaptive` the model's default. */
export const ThinkingConfigSchema = z.discriminatedUnion("type", [
  z.object({
    type: z.literal("enabled"),
    /** Accepted, not enforced: thinking counts toward max_tokens. */
    budget_tokens: z.number().int().min(0).nullish(),
    display: ThinkingDisplay,
  }),
  z.object({ type: z.literal("disabled") }),
  z.object({ type: z.literal("adaptive"), display: ThinkingDisplay }),
  z.object({ type: z.literal("between_tools") }),
], { error: "thinking must be {type:'enabled', budget_tokens}, {type:'disabled'} or {type:'adaptive'}" });

const SystemParam = z.union([z.string(), z.array(TextBlock)], {
  error: "system must be a string or an array of {type:'text', text} blocks",
});

/** Structured output: the text answer is JSON valid against `schema`. */
const JsonOutputFormat = z.object({
  type: z.literal("json_schema"),
  schema: z.record(z.string(), z.unknown()),
});

/** Fields shared by `/v1/messages` and `/v1/messages/count_tokens`. */
const PromptFields = {
  model: ModelIdSchema,
  messages: z.array(MessageParamSchema).min(1, "messages must hold at least one message")
    .max(MAX_MESSAGES, `messages may hold at most ${MAX_MESSAGES} messages`),
  system: SystemParam.optional(),
  tools: z.array(ToolParam).nullish(),
  tool_choice: ToolChoiceSchema.nullish(),
  thinking: ThinkingConfigSchema.nullish(),
  /** `effort` is accepted and not translated (the model has no effort levels); `format` is structured output. */
  output_config: z.object({
    effort: z.string().nullish(),
    format: JsonOutputFormat.nullish(),
  }).nullish(),
  /**
   * The structured-outputs beta's name for `output_config.format` (the SDKs' `beta.messages.parse`
   * still send it): the same, and a 400 when both are given.
   */
  output_format: JsonOutputFormat.nullish(),
  /** Accepted; edits are not applied (this server never clears history on its own). */
  context_management: z.looseObject({ edits: z.array(z.looseObject({ type: z.string() })).nullish() })
    .nullish(),
  /** Remote MCP servers that Anthropic would connect to: refused when given. */
  mcp_servers: z.array(z.unknown()).nullish(),
  cache_control: CacheControl,
};

/** The `POST /v1/messages` body. */
export const MessagesRequestSchema = z.object({
  ...PromptFields,
  max_tokens: z.number({ error: "max_tokens is required: the most tokens to generate" }).int().min(1),
  stop_sequences: z.array(z.string()).nullish(),
  stream: z.boolean().nullish(),
  temperature: z.number().min(0).max(1).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  top_k: z.number().int().min(0).nullish(),
  /** `user_id` is accepted and not used. */
  metadata: z.looseObject({ user_id: z.string().nullish() }).nullish(),
  /** Extension (llama-server): a fixed seed. */
  seed: z.number().int().nullish(),
  /** Extension, as on chat completions: token id → bias from -100 (never) to 100. */
  logit_bias: LogitBiasSchema.nullish(),
});
export type MessagesRequest = z.infer<typeof MessagesRequestSchema>;

/** The `POST /v1/messages/count_tokens` body. */
export const CountTokensRequestSchema = z.object(PromptFields);
export type CountTokensRequest = z.infer<typeof CountTokensRequestSchema>;

/** `POST /v1/messages/count_tokens`'s answer: every token of the prompt. */
export const MessageTokensCountSchema = z.object({ input_tokens: z.number().int().min(0) });
export type MessageTokensCount = z.infer<typeof MessageTokensCountSchema>;

// ---- the answer ----

export const TextBlockSchema = z.object({ type: z.literal("text"), text: z.string() });
export const ThinkingBlockSchema = z.object({
  type: z.literal("thinking"),
  thinking: z.string(),
  signature: z.string(),
});
export const ToolUseBlockSchema = z.object({
  type: z.literal("tool_use"),
  id: z.string(),
  name: z.string(),
  input: z.record(z.string(), z.unknown()),
});
export const ContentBlockSchema = z.discriminatedUnion("type", [
  TextBlockSchema,
  ThinkingBlockSchema,
  ToolUseBlockSchema,
]);
export type ContentBlock = z.infer<typeof ContentBlockSchema>;

export const StopReasonSchema = z.enum([
  "end_turn",
  "max_tokens",
  "stop_sequence",
  "tool_use",
  "model_context_window_exceeded",
]);
export type StopReason = z.infer<typeof StopReasonSchema>;

/** Token counts: the prompt is `input_tokens` + `cache_read_input_tokens` (+ creation, always 0 here). */
export const UsageSchema = z.object({
  /** Prompt tokens computed for this request (not read from the prompt cache). */
  input_tokens: z.number().int().min(0),
  cache_creation_input_tokens: z.number().int().min(0),
  /** Prompt tokens reused from an earlier request's state. */
  cache_read_input_tokens: z.number().int().min(0),
  cache_creation: z.object({
    ephemeral_5m_input_tokens: z.number().int().min(0),
    ephemeral_1h_input_tokens: z.number().int().min(0),
  }),
  output_tokens: z.number().int().min(0),
  output_tokens_details: z.object({ thinking_tokens: z.number().int().min(0) }),
  service_tier: z.literal("standard"),
});
export type Usage = z.infer<typeof UsageSchema>;

/** The message object (the non-streamed answer; `message_start` carries it empty). */
export const MessageSchema = z.object({
  id: z.string().startsWith("msg_"),
  type: z.literal("message"),
  role: z.literal("assistant"),
  model: z.string(),
  content: z.array(ContentBlockSchema),
  stop_reason: StopReasonSchema.nullable(),
  stop_sequence: z.string().nullable(),
  usage: UsageSchema,
  /** With `context_management` in the request: the edits applied (none). */
  context_management: z.object({ applied_edits: z.array(z.unknown()) }).optional(),
});
export type Message = z.infer<typeof MessageSchema>;

/** The error body on these routes, with the HTTP status each type comes with. */
export const ANTHROPIC_ERROR_TYPES = [
  "invalid_request_error", // 400 (and other 4xx)
  "authentication_error", // 401
  "permission_error", // 403
  "not_found_error", // 404
  "request_too_large", // 413
  "rate_limit_error", // 429
  "api_error", // 500, 502
  "timeout_error", // 504
  "overloaded_error", // 529
] as const;
export type AnthropicErrorType = (typeof ANTHROPIC_ERROR_TYPES)[number];

export const AnthropicErrorSchema = z.object({
  type: z.literal("error"),
  error: z.object({ type: z.enum(ANTHROPIC_ERROR_TYPES), message: z.string() }),
  request_id: z.string(),
});
export type AnthropicError = z.infer<typeof AnthropicErrorSchema>;

const StreamUsage = z.object({
  input_tokens: z.number().int().min(0),
  cache_creation_input_tokens: z.number().int().min(0),
  cache_read_input_tokens: z.number().int().min(0),
  output_tokens: z.number().int().min(0),
});

/** One event of a message stream (`event: <type>` + `data: <json>`), in Anthropic's order. */
export const MessageStreamEventSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("message_start"), message: MessageSchema }),
  z.object({ type: z.literal("ping") }),
  z.object({
    type: z.literal("content_block_start"),
    index: z.number().int(),
    content_block: ContentBlockSchema,
  }),
  z.object({
    type: z.literal("content_block_delta"),
    index: z.number().int(),
    delta: z.discriminatedUnion("type", [
      z.object({ type: z.literal("text_delta"), text: z.string() }),
      z.object({ type: z.literal("thinking_delta"), thinking: z.string() }),
      z.object({ type: z.literal("signature_delta"), signature: z.string() }),
      z.object({ type: z.literal("input_json_delta"), partial_json: z.string() }),
    ]),
  }),
  z.object({ type: z.literal("content_block_stop"), index: z.number().int() }),
  z.object({
    type: z.literal("message_delta"),
    delta: z.object({ stop_reason: StopReasonSchema, stop_sequence: z.string().nullable() }),
    usage: StreamUsage,
  }),
  z.object({ type: z.literal("message_stop") }),
  AnthropicErrorSchema.omit({ request_id: true }),
]);
export type MessageStreamEvent = z.infer<typeof MessageStreamEventSchema>;
