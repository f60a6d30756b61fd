/**
 * `POST /v1/responses` (the Responses API of agent clients), the stateless subset: request,
 * response object and the typed stream events, as the v1 family shapes them.
 */
import { z } from "zod";
import { LogitBiasSchema, MAX_MESSAGES, ModelIdSchema } from "./common.ts";

const FUNCTION_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const NAME_RULE = "function names are 1-64 characters of a-z, A-Z, 0-9, _ and -";

/** A text part of an input message (`input_text`; `output_text` in assistant history). */
const InputTextPart = z.object({
  type: z.enum(["input_text", "output_text", "text"]),
  text: z.string(),
});
/** Any other part type (images, files, audio) is read so that the error can name it. */
const OtherPart = z.looseObject({ type: z.string() });
const MessageContent = z.union([z.string(), z.array(z.union([InputTextPart, OtherPart]))], {
  error: "content must be a string or an array of {type:'input_text', text} parts",
});

/** A message item; `type` may be left out (the SDKs' "easy" input message). */
export const InputMessageSchema = z.object({
  type: z.literal("message").optional(),
  role: z.enum(["user", "system", "developer", "assistant"]),
  content: MessageContent,
  id: z.string().nullish(),
  status: z.string().nullish(),
});

/** A function call the model made earlier, sent back as history (`namespace`: its namespace tool). */
export const FunctionCallItemSchema = z.object({
  type: z.literal("function_call"),
  call_id: z.string().min(1, "call_id is empty"),
  name: z.string(),
  namespace: z.string().nullish(),
  arguments: z.string(),
  id: z.string().nullish(),
  status: z.string().nullish(),
});

/** A call of a custom (freeform) tool the model made earlier, sent back as history. */
export const CustomToolCallItemSchema = z.object({
  type: z.literal("custom_tool_call"),
  call_id: z.string().min(1, "call_id is empty"),
  name: z.string(),
  namespace: z.string().nullish(),
  input: z.string(),
  id: z.string().nullish(),
  status: z.string().nullish(),
});

/** The result of a function call (or of a custom tool call), answering `call_id`. */
export const FunctionCallOutputItemSchema = z.object({
  type: z.enum(["function_call_output", "custom_tool_call_output"]),
  call_id: z.string().min(1, "call_id is empty"),
  output: z.union([z.string(), z.array(z.union([InputTextPart, OtherPart]))]),
  id: z.string().nullish(),
  status: z.string().nullish(),
});

const SummaryText = z.object({ type: z.literal("summary_text"), text: z.string() });
const ReasoningText = z.object({ type: z.literal("reasoning_text"), text: z.string() });

/** Earlier reasoning, sent back as history. */
export const ReasoningItemSchema = z.object({
  type: z.literal("reasoning"),
  id: z.string().nullish(),
  summary: z.array(SummaryText).default([]),
  content: z.array(ReasoningText).nullish(),
  encrypted_content: z.string().nullish(),
  status: z.string().nullish(),
});

/** An input item as the request schema reads it; its own schema (by `type`) is applied per item. */
export const InputItemSchema = z.looseObject({ type: z.string().optional() }, {
  error:
    "each input item is an object: a message {role, content}, function_call, function_call_output or reasoning",
});
export type InputItem = z.infer<typeof InputItemSchema>;

/** A function tool in the Responses API's flat shape. */
export const FunctionToolSchema = z.object({
  type: z.literal("function"),
  name: z.string().regex(FUNCTION_NAME, NAME_RULE),
  description: z.string().nullish(),
  parameters: z.record(z.string(), z.unknown()).nullish(),
  strict: z.boolean().nullish(),
});
/** A custom (freeform) tool: its input is text, optionally of a grammar (`regex` is enforced, `lark` not). */
export const CustomToolSchema = z.object({
  type: z.literal("custom"),
  name: z.string().regex(FUNCTION_NAME, NAME_RULE),
  description: z.string().nullish(),
  format: z.discriminatedUnion("type", [
    z.object({ type: z.literal("text") }),
    z.object({ type: z.literal("grammar"), syntax: z.enum(["lark", "regex"]), definition: z.string() }),
  ]).nullish(),
});

/** Function and custom tools grouped under a namespace; the model calls them as `namespace__name`. */
export const NamespaceToolSchema = z.object({
  type: z.literal("namespace"),
  name: z.string().regex(FUNCTION_NAME, "namespace names are 1-64 characters of a-z, A-Z, 0-9, _ and -"),
  description: z.string().nullish(),
  tools: z.array(z.looseObject({ type: z.string() }, { error: "each tool is an object with a type" })),
});

/** A tool as the request schema reads it; its own schema (by `type`) is applied per tool. */
export const ResponsesToolSchema = z.looseObject({ type: z.string() });

/**
 * Tools of the Responses API that the provider runs or that need a model trained for their own
 * output items: this server runs none of them. They are left out of the prompt (named in the
 * `x-vserve-ignored-tools` header), or refused with `--hosted-tools refuse`.
 */
export const UNSERVED_TOOL_TYPES: ReadonlySet<string> = new Set([
  "web_search",
  "web_search_2025_08_26",
  "web_search_preview",
  "web_search_preview_2025_03_11",
  "file_search",
  "code_interpreter",
  "computer",
  "computer_use",
  "computer_use_preview",
  "image_generation",
  "mcp",
  "local_shell",
  "shell",
  "apply_patch",
  "tool_search",
  "programmatic_tool_calling",
]);

/** `tool_choice`: a mode or one named function. */
export const ResponsesToolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.object({ type: z.literal("function"), name: z.string() }),
  z.looseObject({ type: z.string() }),
], { error: "tool_choice must be 'none', 'auto', 'required' or {type:'function', name}" });

/** `text.format`. */
export const TextFormatSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("text") }),
  z.object({ type: z.literal("json_object") }),
  z.object({
    type: z.literal("json_schema"),
    name: z.string().regex(/^[a-zA-Z0-9_-]{1,64}$/, "name is 1-64 characters of a-z, A-Z, 0-9, _ and -"),
    description: z.string().nullish(),
    schema: z.record(z.string(), z.unknown()),
    strict: z.boolean().nullish(),
  }),
]);
export type TextFormat = z.infer<typeof TextFormatSchema>;

/** The request body; unknown fields are ignored, `null` means "not given". */
export const ResponsesRequestSchema = z.object({
  model: ModelIdSchema,
  // The count first: a union's one message would hide the cap, and 100,000 items take long to check.
  input: z.preprocess(
    (v, ctx) => {
      if (Array.isArray(v) && v.length > MAX_MESSAGES) {
        ctx.addIssue({ code: "custom", message: `input may hold at most ${MAX_MESSAGES} items`, input: v });
        return z.NEVER;
      }
      return v;
    },
    z.union([z.string(), z.array(InputItemSchema)], {
      error: "input must be a string or an array of input items",
    }),
  ),
  instructions: z.string().nullish(),
  tools: z.array(ResponsesToolSchema).nullish(),
  tool_choice: ResponsesToolChoiceSchema.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  max_output_tokens: z.number().int().min(1).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  text: z.object({ format: TextFormatSchema.nullish(), verbosity: z.string().nullish() }).nullish(),
  /** `effort` switches thinking for models that have the switch: "none" / "minimal" off, others on. */
  reasoning: z.object({
    effort: z.enum(["none", "minimal", "low", "medium", "high", "xhigh", "max"]).nullish(),
    summary: z.string().nullish(),
    generate_summary: z.string().nullish(),
  }).nullish(),
  stream: z.boolean().nullish(),
  /** Stateless server: `true` is refused; false and absent are the same. */
  store: z.boolean().nullish(),
  previous_response_id: z.string().nullish(),
  conversation: z.unknown().optional(),
  background: z.boolean().nullish(),
  /** `reasoning.encrypted_content` seals the turn's thinking into its reasoning item; others are accepted. */
  include: z.array(z.string()).nullish(),
  /** Accepted; the server never drops input to fit (too long an input is a 400). */
  truncation: z.enum(["auto", "disabled"]).nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  user: z.string().nullish(),
  // Extensions shared with /v1/chat/completions.
  seed: z.number().int().nullish(),
  top_k: z.number().int().min(0).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  logit_bias: LogitBiasSchema.nullish(),
  chat_template_kwargs: z.looseObject({ enable_thinking: z.boolean().nullish() }).nullish(),
});
export type ResponsesRequest = z.infer<typeof ResponsesRequestSchema>;

const OutputText = z.object({
  type: z.literal("output_text"),
  text: z.string(),
  annotations: z.array(z.unknown()),
  logprobs: z.array(z.unknown()).optional(),
});

/** An output item: a message, a function call or reasoning. */
export const OutputItemSchema = z.discriminatedUnion("type", [
  z.object({
    type: z.literal("message"),
    id: z.string(),
    status: z.enum(["in_progress", "completed", "incomplete"]),
    role: z.literal("assistant"),
    content: z.array(OutputText),
  }),
  z.object({
    type: z.literal("function_call"),
    id: z.string(),
    call_id: z.string(),
    name: z.string(),
    /** Set for a function of a namespace tool (`name` is then its name inside the namespace). */
    namespace: z.string().optional(),
    arguments: z.string(),
    status: z.enum(["in_progress", "completed", "incomplete"]),
  }),
  z.object({
    type: z.literal("custom_tool_call"),
    id: z.string(),
    call_id: z.string(),
    name: z.string(),
    namespace: z.string().optional(),
    input: z.string(),
    status: z.enum(["in_progress", "completed", "incomplete"]),
  }),
  z.object({
    type: z.literal("reasoning"),
    id: z.string(),
    summary: z.array(SummaryText),
    /** The thinking, sealed (with `include: ["reasoning.encrypted_content"]`). */
    encrypted_content: z.string().optional(),
    status: z.enum(["in_progress", "completed", "incomplete"]).optional(),
  }),
]);
export type OutputItem = z.infer<typeof OutputItemSchema>;

/** `usage` of a response. */
export const ResponseUsageSchema = z.object({
  input_tokens: z.number().int(),
  input_tokens_details: z.object({ cached_tokens: z.number().int() }),
  output_tokens: z.number().int(),
  output_tokens_details: z.object({ reasoning_tokens: z.number().int() }),
  total_tokens: z.number().int(),
});
export type ResponseUsage = z.infer<typeof ResponseUsageSchema>;

/** The response object (the non-streamed answer, and the snapshot in lifecycle events). */
export const ResponseObjectSchema = z.object({
  id: z.string().startsWith("resp_"),
  object: z.literal("response"),
  created_at: z.number().int(),
  status: z.enum(["in_progress", "completed", "incomplete", "failed"]),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
  incomplete_details: z.object({ reason: z.string() }).nullable(),
  instructions: z.string().nullable(),
  max_output_tokens: z.number().int().nullable(),
  model: z.string(),
  output: z.array(OutputItemSchema),
  parallel_tool_calls: z.boolean(),
  previous_response_id: z.null(),
  reasoning: z.object({ effort: z.string().nullable(), summary: z.string().nullable() }),
  store: z.literal(false),
  temperature: z.number().nullable(),
  text: z.object({ format: z.record(z.string(), z.unknown()) }),
  tool_choice: z.unknown(),
  tools: z.array(z.unknown()),
  top_p: z.number().nullable(),
  truncation: z.string(),
  metadata: z.record(z.string(), z.string()),
  usage: ResponseUsageSchema.nullable(),
});
export type ResponseObject = z.infer<typeof ResponseObjectSchema>;

/** One event of a response stream (each carries `type` and `sequence_number`). */
export const ResponseStreamEventSchema = z.looseObject({
  type: z.enum([
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
  ]),
  sequence_number: z.number().int().min(0),
});
export type ResponseStreamEvent = z.infer<typeof ResponseStreamEventSchema>;
