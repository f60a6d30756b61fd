/**
 * The OpenAI semantics of `POST /v1/responses` (the Responses API of agent clients), stateless:
 * the request becomes a chat request and runs on the chat engine path (`runChat`), so grammars,
 * tools, thinking, limits and schema checks are those of `/v1/chat/completions`; its output is
 * read back into output items, or into the typed events of a response stream.
 */
import type { z } from "zod";
import { ApiError, badRequest, fromZodError } from "../http/errors.ts";
import type { ChatChunk, ChatCompletion, ChatMessage, ChatRequest } from "../protocol/chat.ts";
import type { CompletionUsage } from "../protocol/common.ts";
import {
  CustomToolCallItemSchema,
  CustomToolSchema,
  FunctionCallItemSchema,
  FunctionCallOutputItemSchema,
  FunctionToolSchema,
  InputMessageSchema,
  NamespaceToolSchema,
  type OutputItem,
  ReasoningItemSchema,
  type ResponseObject,
  type ResponsesRequest,
  type ResponseStreamEvent,
  type ResponseUsage,
  UNSERVED_TOOL_TYPES,
} from "../protocol/responses.ts";
import type { ChatEngine } from "../engines/types.ts";
import { type ChatContext, runChat } from "./chat.ts";
import type { ReasoningSealer } from "./reasoning_seal.ts";
import { BlankTextHold } from "./blank_text.ts";

/** How this server treats parts of the Responses API it cannot serve as asked (from configuration). */
export interface ResponsesOptions {
  /** Tools the server cannot run (web_search, file_search, mcp, …): left out of the prompt, or a 400. */
  hostedTools: "ignore" | "refuse";
  /** Seals the turn's thinking for `include: ["reasoning.encrypted_content"]`, and opens it again. */
  sealer: ReasoningSealer;
}

/**
 * A Responses request's outcome: the `response` object, or its typed events; with the tool types
 * left out of the prompt (`ignored`, hosted tools under the `ignore` policy).
 */
export type ResponsesRun =
  | { kind: "response"; response: ResponseObject; ignored: string[] }
  | { kind: "stream"; events: AsyncGenerator<ResponseStreamEvent>; ignored: string[] };

/**
 * Answers one Responses request: a `response` object, or (with `stream`) its typed events.
 *
 * @example
 * ```ts
 * import type { ResponsesRequest } from "../protocol/responses.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { ChatContext } from "./chat.ts";
 * import type { ReasoningSealer } from "./reasoning_seal.ts";
 * async function answer(body: ResponsesRequest, engine: ChatEngine, ctx: ChatContext, sealer: ReasoningSealer) {
 *   return await createResponse(body, engine, ctx, { hostedTools: "ignore", sealer });
 * }
 * ```
 */
export async function createResponse(
  req: ResponsesRequest,
  engine: ChatEngine,
  ctx: ChatContext,
  opts: ResponsesOptions,
): Promise<ResponsesRun> {
  const { chat, params, shape, ignored } = await toChatRequest(req, opts);
  if (ignored.length > 0) {
    ctx.log.warn("tools this server cannot run were left out of the prompt", {
      request_id: ctx.requestId,
      tools: ignored,
    });
  }
  const id = `resp_${crypto.randomUUID().replaceAll("-", "")}`;
  let run;
  try {
    run = await runChat(chat, engine, ctx);
  } catch (e) {
    throw renameParam(e, params);
  }
  const base = responseBase(req, id, ctx.created);
  if (run.kind === "completion") {
    return { kind: "response", response: await fromCompletion(base, run.completion, shape), ignored };
  }
  const events = streamEvents(base, run.chunks, (e) => renameParam(run.toError(e), params), shape);
  return { kind: "stream", events, ignored };
}

/** Where each chat message and tool came from, to name the Responses field in errors. */
interface ParamMap {
  /** messages[k] → its input field. */
  messages: string[];
  /** messages[k].tool_calls[j] → its input item. */
  calls: Map<string, string>;
  /** tools[k] → its request field, and whether it is a custom tool. */
  tools: { path: string; custom: boolean }[];
}

/** What a tool the model sees by `name` is in the request: a function (maybe of a namespace) or a custom tool. */
export interface ToolOrigin {
  name: string;
  namespace?: string;
  custom: boolean;
}

/** How chat output becomes output items: the tools' origins, and the sealing of reasoning when asked. */
export interface OutputShape {
  /** Model-facing tool name → what it is in the request (names not listed are plain functions). */
  tools?: ReadonlyMap<string, ToolOrigin>;
  /** Seals a reasoning item's text into its `encrypted_content`. */
  seal?: (text: string) => Promise<string>;
}

const TEXT_PARTS = new Set(["input_text", "output_text", "text"]);

/** Parses an item with its own schema, naming fields under `at`. */
function parseAt<S extends z.ZodType>(schema: S, value: unknown, at: string): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const inner = fromZodError(r.error);
  const param = `${at}${
    issue.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("")
  }`;
  return throwIt(badRequest(inner.message.replace(/'[^']*'/, `'${param}'`), param, inner.code));
}

function throwIt(e: ApiError): never {
  throw e;
}

/** The text of message content or of a function output; non-text parts are refused by name. */
function textOf(content: string | Record<string, unknown>[], at: string): string {
  if (typeof content === "string") return content;
  return content.map((p, j) => {
    if (!TEXT_PARTS.has(String(p.type)) || typeof p.text !== "string") {
      throw badRequest(
        `This server reads text only: content parts of type '${String(p.type)}' are not supported.`,
        `${at}[${j}].type`,
        "unsupported_value",
      );
    }
    return p.text;
  }).join("");
}

/**
 * The name the model sees for `name` of namespace `namespace`: Codex's flat form
 * (`multi_agent_v1__spawn_agent`), underscores at the seam trimmed.
 */
export function qualifiedName(namespace: string, name: string): string {
  return `${namespace.replace(/_+$/, "")}__${name.replace(/^_+/, "")}`;
}

const short = (text: string) => text.slice(0, 64);

/** The parameters of a custom tool as the model's function: one string, `input` (a regex format enforced). */
function customParameters(format: z.infer<typeof CustomToolSchema>["format"]): Record<string, unknown> {
  const input: Record<string, unknown> = { type: "string" };
  if (format?.type === "grammar" && format.syntax === "regex") input.pattern = `^(?:${format.definition})$`;
  return { type: "object", properties: { input }, required: ["input"], additionalProperties: false };
}

/** The tools a request offers the model, where each came from, and the types left out. */
function servedTools(req: ResponsesRequest, hostedTools: ResponsesOptions["hostedTools"]) {
  const tools: NonNullable<ChatRequest["tools"]> = [];
  const origins = new Map<string, ToolOrigin>();
  const paths: ParamMap["tools"] = [];
  const ignored: string[] = [];
  const add = (
    fn: {
      name: string;
      description?: string | null;
      parameters?: Record<string, unknown> | null;
      strict?: boolean | null;
    },
    origin: ToolOrigin,
    path: string,
  ) => {
    tools.push({ type: "function", function: fn });
    origins.set(fn.name, origin);
    paths.push({ path, custom: origin.custom });
  };
  const serve = (
    t: Record<string, unknown>,
    at: string,
    namespace?: { name: string; description?: string | null },
  ) => {
    const named = (name: string) => (namespace ? qualifiedName(namespace.name, name) : name);
    if (t.type === "function") {
      const f = parseAt(FunctionToolSchema, t, at);
      add(
        {
          name: named(f.name),
          description: f.description ?? namespace?.description,
          parameters: f.parameters,
          strict: f.strict,
        },
        { name: f.name, namespace: namespace?.name, custom: false },
        at,
      );
    } else if (t.type === "custom") {
      const c = parseAt(CustomToolSchema, t, at);
      add(
        {
          name: named(c.name),
          description: c.description ?? namespace?.description,
          parameters: customParameters(c.format),
        },
        { name: c.name, namespace: namespace?.name, custom: true },
        at,
      );
    } else return false;
    return true;
  };
  (req.tools ?? []).forEach((t, i) => {
    const at = `tools[${i}]`;
    if (serve(t, at)) return;
    if (t.type === "namespace") {
      const ns = parseAt(NamespaceToolSchema, t, at);
      ns.tools.forEach((inner, j) => {
        if (!serve(inner, `${at}.tools[${j}]`, ns)) {
          throw badRequest(
            `A namespace holds function and custom tools; '${short(String(inner.type))}' is not one.`,
            `${at}.tools[${j}].type`,
            "unsupported_value",
          );
        }
      });
    } else if (UNSERVED_TOOL_TYPES.has(t.type)) {
      if (hostedTools === "refuse") {
        throw badRequest(
          `'${t.type}' is a tool this server does not run, and it is configured to refuse such tools ` +
            "(--hosted-tools refuse): send function, custom and namespace tools only.",
          `${at}.type`,
          "unsupported_value",
        );
      }
      if (!ignored.includes(t.type)) ignored.push(t.type);
    } else {
      throw badRequest(
        `Unknown tool type '${short(t.type)}': send function, custom or namespace tools.`,
        `${at}.type`,
        "unsupported_value",
      );
    }
  });
  return { tools, origins, paths, ignored };
}

/** The model-facing name of the tool `choice` names (a namespace or a unique inner name finds it). */
function chosenTool(
  choice: Record<string, unknown>,
  origins: ReadonlyMap<string, ToolOrigin>,
  custom: boolean,
): string {
  const name = String(choice.name);
  if (typeof choice.namespace === "string") return qualifiedName(choice.namespace, name);
  if (origins.get(name)?.namespace === undefined && origins.has(name)) return name;
  const inner = [...origins].filter(([, o]) => o.name === name && o.custom === custom);
  return inner.length === 1 ? inner[0][0] : name;
}

/** `tool_choice` as a chat tool choice; `allowed_tools` also narrows the tools offered. */
function toolChoiceOf(
  tc: ResponsesRequest["tool_choice"],
  served: ReturnType<typeof servedTools>,
): ChatRequest["tool_choice"] {
  if (tc == null || typeof tc === "string") return tc ?? undefined;
  const named = (c: Record<string, unknown>, custom: boolean, param: string) => {
    if (typeof c.name !== "string") throw badRequest(`${param} is missing its name.`, `${param}.name`);
    return chosenTool(c, served.origins, custom);
  };
  if (tc.type === "function" || tc.type === "custom") {
    return { type: "function", function: { name: named(tc, tc.type === "custom", "tool_choice") } };
  }
  if (tc.type === "allowed_tools") {
    const mode = tc.mode ?? "auto";
    if (mode !== "auto" && mode !== "required" || !Array.isArray(tc.tools)) {
      throw badRequest(
        "tool_choice of type allowed_tools needs mode 'auto' or 'required' and a tools array.",
        "tool_choice",
        "invalid_value",
      );
    }
    const allowed = new Set(
      (tc.tools as Record<string, unknown>[])
        .filter((t) => t && (t.type === "function" || t.type === "custom"))
        .map((t, j) => named(t, t.type === "custom", `tool_choice.tools[${j}]`)),
    );
    const keep = served.tools.map((t) => allowed.has(t.function.name));
    served.tools = served.tools.filter((_, k) => keep[k]);
    served.paths = served.paths.filter((_, k) => keep[k]);
    return mode;
  }
  throw badRequest(
    `tool_choice forces '${short(String(tc.type))}', a tool this server does not run: use 'none', 'auto', ` +
      "'required', {type:'function', name}, {type:'custom', name} or allowed_tools.",
    "tool_choice",
    "unsupported_value",
  );
}

/**
 * The chat request a Responses request means, where its messages and tools came from, how its
 * output is shaped back into items, and the tool types left out of the prompt.
 */
export async function toChatRequest(
  req: ResponsesRequest,
  opts: ResponsesOptions,
): Promise<{ chat: ChatRequest; params: ParamMap; shape: OutputShape; ignored: string[] }> {
  const stateless = (param: string, what: string) =>
    badRequest(
      `This server is stateless: it keeps no responses or conversations, so ${what} is not supported. ` +
        "Send the whole conversation in input (and store: false, or leave store out).",
      param,
      "unsupported_value",
    );
  if (req.store === true) throw stateless("store", "store: true");
  if (req.previous_response_id != null) throw stateless("previous_response_id", "previous_response_id");
  if (req.conversation != null) throw stateless("conversation", "conversation");
  if (req.background === true) throw stateless("background", "background: true");

  const served = servedTools(req, opts.hostedTools);
  const toolChoice = toolChoiceOf(req.tool_choice, served);

  const messages: ChatMessage[] = [];
  const params: ParamMap = { messages: [], calls: new Map(), tools: served.paths };
  const push = (m: ChatMessage, from: string) => {
    messages.push(m);
    params.messages.push(from);
  };
  if (req.instructions) push({ role: "system", content: req.instructions }, "instructions");
  const calls = new Set<string>();
  /** The assistant message that consecutive assistant items (reasoning, text, calls) build. */
  let open: Extract<ChatMessage, { role: "assistant" }> | undefined;
  /** Where `open` is in `messages` (a search per call: 8,192 calls made ~67 million comparisons). */
  let openAt = -1;
  const assistant = (from: string, fresh = false) => {
    if (!open || fresh) {
      open = { role: "assistant", content: null, tool_calls: [] };
      openAt = messages.length;
      push(open, from);
    }
    return open;
  };
  const call = (at: string, callId: string, name: string, args: string) => {
    const a = assistant(at);
    params.calls.set(`messages[${openAt}].tool_calls[${a.tool_calls!.length}]`, at);
    a.tool_calls!.push({ id: callId, type: "function", function: { name, arguments: args } });
    calls.add(callId);
  };
  const items = typeof req.input === "string" ? [] : req.input;
  if (typeof req.input === "string") push({ role: "user", content: req.input }, "input");
  for (const [i, item] of items.entries()) {
    const at = `input[${i}]`;
    const type = item.type ?? ("role" in item ? "message" : undefined);
    switch (type) {
      case "message": {
        const m = parseAt(InputMessageSchema, item, at);
        const text = textOf(m.content as string | Record<string, unknown>[], `${at}.content`);
        if (m.role === "assistant") {
          const a = assistant(at);
          a.content = (a.content ?? "") + text;
        } else {
          open = undefined;
          push({ role: m.role, content: text }, at);
        }
        break;
      }
      case "reasoning": {
        const r = parseAt(ReasoningItemSchema, item, at);
        let text: string;
        if (r.encrypted_content != null) {
          const opened = await opts.sealer.open(r.encrypted_content);
          if (opened === null) {
            throw badRequest(
              "This reasoning item's encrypted_content cannot be opened: it was not issued by this server " +
                "under its current key (a key generated at start does not survive a restart; see " +
                "--reasoning-key), or it was altered.",
              `${at}.encrypted_content`,
              "invalid_encrypted_content",
            );
          }
          text = opened;
        } else text = (r.content?.length ? r.content : r.summary).map((p) => p.text).join("\n\n");
        // Reasoning begins a turn: after text or calls it opens a new assistant message.
        const a = assistant(at, !!open && (open.content != null || (open.tool_calls?.length ?? 0) > 0));
        a.reasoning_content = (a.reasoning_content ?? "") + text;
        break;
      }
      case "function_call": {
        const c = parseAt(FunctionCallItemSchema, item, at);
        call(at, c.call_id, c.namespace ? qualifiedName(c.namespace, c.name) : c.name, c.arguments);
        break;
      }
      case "custom_tool_call": {
        const c = parseAt(CustomToolCallItemSchema, item, at);
        const name = c.namespace ? qualifiedName(c.namespace, c.name) : c.name;
        call(at, c.call_id, name, JSON.stringify({ input: c.input }));
        break;
      }
      case "function_call_output":
      case "custom_tool_call_output": {
        const o = parseAt(FunctionCallOutputItemSchema, item, at);
        if (!calls.has(o.call_id)) {
          throw badRequest(
            `No call with call_id '${o.call_id.slice(0, 256)}' comes before this output in input.`,
            `${at}.call_id`,
            "invalid_value",
          );
        }
        open = undefined;
        push(
          {
            role: "tool",
            tool_call_id: o.call_id,
            content: textOf(o.output as string | Record<string, unknown>[], `${at}.output`),
          },
          at,
        );
        break;
      }
      case "item_reference":
        throw stateless(`${at}.type`, "item_reference");
      default:
        throw badRequest(
          `Input items of type '${
            String(type).slice(0, 64)
          }' are not supported: send message, function_call, ` +
            "function_call_output, custom_tool_call, custom_tool_call_output or reasoning items.",
          `${at}.type`,
          "unsupported_value",
        );
    }
  }
  if (messages.length === 0) throw badRequest("input holds no items.", "input", "invalid_value");

  const format = req.text?.format;
  let responseFormat: ChatRequest["response_format"];
  if (format?.type === "json_object") responseFormat = { type: "json_object" };
  if (format?.type === "json_schema") {
    responseFormat = {
      type: "json_schema",
      json_schema: {
        name: format.name,
        description: format.description,
        schema: format.schema,
        strict: format.strict,
      },
    };
  }

  // The thinking switch: an explicit chat_template_kwargs wins, then reasoning.effort.
  const effort = req.reasoning?.effort;
  const thinking = req.chat_template_kwargs?.enable_thinking ??
    (effort == null ? undefined : effort !== "none" && effort !== "minimal");
  const chat: ChatRequest = {
    model: req.model,
    messages,
    tools: served.tools.length ? served.tools : undefined,
    tool_choice: toolChoice,
    parallel_tool_calls: req.parallel_tool_calls,
    max_completion_tokens: req.max_output_tokens,
    temperature: req.temperature,
    top_p: req.top_p,
    top_k: req.top_k,
    min_p: req.min_p,
    seed: req.seed,
    logit_bias: req.logit_bias,
    response_format: responseFormat,
    chat_template_kwargs: thinking === undefined ? undefined : { enable_thinking: thinking },
    stream: req.stream,
    // A response stream ends with the usage (response.completed carries it).
    stream_options: req.stream ? { include_usage: true } : undefined,
  };
  const sealed = req.include?.includes("reasoning.encrypted_content") ?? false;
  const shape: OutputShape = {
    tools: served.origins,
    seal: sealed ? (text) => opts.sealer.seal(text) : undefined,
  };
  return { chat, params, shape, ignored: served.ignored };
}

/** The chat field names in an error, as the Responses request names them. */
function renameParam(e: unknown, params: ParamMap): unknown {
  if (!(e instanceof ApiError) || e.param == null) return e;
  const p = e.param;
  let renamed: string | undefined;
  const call = p.match(/^(messages\[\d+\]\.tool_calls\[\d+\])(?:\.function)?(.*)$/);
  const inMessage = p.match(/^messages\[(\d+)\]/);
  const tool = p.match(/^tools\[(\d+)\]\.function(.*)$/);
  if (call && params.calls.has(call[1])) renamed = params.calls.get(call[1])! + call[2];
  else if (inMessage) renamed = params.messages[Number(inMessage[1])] ?? "input";
  else if (p === "messages") renamed = "input";
  else if (tool && params.tools[Number(tool[1])]) {
    const { path, custom } = params.tools[Number(tool[1])];
    renamed = custom && tool[2].startsWith(".parameters") ? `${path}.format` : path + tool[2];
  } else if (p === "tool_choice.function.name") renamed = "tool_choice.name";
  else if (p.startsWith("response_format")) {
    renamed = p.replace(/^response_format(\.json_schema)?/, "text.format");
  } else if (p === "max_completion_tokens" || p === "max_tokens") renamed = "max_output_tokens";
  else if (p === "chat_template_kwargs.enable_thinking") renamed = "reasoning.effort";
  if (renamed === undefined) return e;
  const message = e.message.replaceAll(p, renamed).replaceAll("response_format", "text.format");
  return new ApiError(e.status, e.type, message, renamed, e.code, e.headers);
}

/** The response fields fixed by the request (the rest come from the output). */
export type Base = Omit<ResponseObject, "status" | "output" | "usage" | "error" | "incomplete_details">;

function responseBase(req: ResponsesRequest, id: string, created: number): Base {
  const format = req.text?.format ?? { type: "text" };
  return {
    id,
    object: "response",
    created_at: created,
    instructions: req.instructions ?? null,
    max_output_tokens: req.max_output_tokens ?? null,
    model: req.model,
    parallel_tool_calls: req.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: { effort: req.reasoning?.effort ?? null, summary: req.reasoning?.summary ?? null },
    store: false,
    temperature: req.temperature ?? null,
    text: { format: format as Record<string, unknown> },
    tool_choice: req.tool_choice ?? "auto",
    tools: req.tools ?? [],
    top_p: req.top_p ?? null,
    truncation: req.truncation ?? "disabled",
    metadata: req.metadata ?? {},
  };
}

function usageOf(u: CompletionUsage): ResponseUsage {
  return {
    input_tokens: u.prompt_tokens,
    input_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 },
    output_tokens: u.completion_tokens,
    output_tokens_details: { reasoning_tokens: u.completion_tokens_details?.reasoning_tokens ?? 0 },
    total_tokens: u.prompt_tokens + u.completion_tokens,
  };
}

const itemId = (prefix: string) => `${prefix}_${crypto.randomUUID().replaceAll("-", "")}`;

/** How a finished response ended: cut by the token limit, or complete. */
function ending(finish: string | null) {
  return finish === "length"
    ? { status: "incomplete" as const, incomplete_details: { reason: "max_output_tokens" } }
    : { status: "completed" as const, incomplete_details: null };
}

/** A call's output item: a function call (named as in its namespace), or a custom tool call. */
function callItem(
  callId: string,
  name: string,
  args: string,
  status: "in_progress" | "completed" | "incomplete",
  shape: OutputShape,
): OutputItem {
  const origin = shape.tools?.get(name);
  const namespace = origin?.namespace !== undefined ? { namespace: origin.namespace } : {};
  if (origin?.custom) {
    return {
      type: "custom_tool_call",
      id: itemId("ctc"),
      call_id: callId,
      name: origin.name,
      ...namespace,
      input: customInput(args),
      status,
    };
  }
  return {
    type: "function_call",
    id: itemId("fc"),
    call_id: callId,
    name: origin?.name ?? name,
    ...namespace,
    arguments: args,
    status,
  };
}

/** The text input of a custom tool call, from the arguments of the function the model saw. */
function customInput(args: string): string {
  try {
    const value = JSON.parse(args);
    if (typeof value?.input === "string") return value.input;
  } catch { /* cut short: give the text as it is */ }
  return args;
}

/** A whole chat completion as a response object. */
async function fromCompletion(
  base: Base,
  completion: ChatCompletion,
  shape: OutputShape = {},
): Promise<ResponseObject> {
  const choice = completion.choices[0];
  const m = choice.message;
  const end = ending(choice.finish_reason);
  const itemStatus = end.status === "incomplete" ? "incomplete" : "completed";
  const output: OutputItem[] = [];
  if (m.reasoning_content) {
    output.push({
      type: "reasoning",
      id: itemId("rs"),
      summary: [{ type: "summary_text", text: m.reasoning_content }],
      ...(shape.seal ? { encrypted_content: await shape.seal(m.reasoning_content) } : {}),
      status: m.content || m.tool_calls ? "completed" : itemStatus,
    });
  }
  // A finished answer without text or calls is still an (empty) message: agents read it as the answer.
  if (m.content || (!m.tool_calls && end.status === "completed")) {
    output.push({
      type: "message",
      id: itemId("msg"),
      status: m.tool_calls ? "completed" : itemStatus,
      role: "assistant",
      content: [{ type: "output_text", text: m.content ?? "", annotations: [], logprobs: [] }],
    });
  }
  const calls = m.tool_calls ?? [];
  calls.forEach((c, i) => {
    // Only the last call can have been cut by the token limit.
    const status = i === calls.length - 1 ? itemStatus : "completed";
    output.push(callItem(c.id, c.function.name, c.function.arguments, status, shape));
  });
  return { ...base, ...end, error: null, output, usage: usageOf(completion.usage) };
}

/**
 * The typed events of a response stream, read off the chat chunks: items are written one after
 * another (reasoning, message, function and custom tool calls), each closed before the next opens;
 * an error ends the stream with `response.failed` and `error`.
 *
 * @example
 * ```ts
 * import type { ChatChunk } from "../protocol/chat.ts";
 * async function relay(base: Base, chunks: AsyncGenerator<ChatChunk>, send: (event: unknown) => void) {
 *   for await (const e of streamEvents(base, chunks, (e) => e, {})) send(e);
 * }
 * ```
 */
export async function* streamEvents(
  base: Base,
  chunks: AsyncGenerator<ChatChunk>,
  toError: (e: unknown) => unknown,
  shape: OutputShape = {},
): AsyncGenerator<ResponseStreamEvent> {
  let sequence = 0;
  const event = (type: ResponseStreamEvent["type"], fields: Record<string, unknown>) =>
    ({ type, sequence_number: sequence++, ...fields }) as ResponseStreamEvent;
  const output: OutputItem[] = [];
  const snapshot = (
    status: ResponseObject["status"],
    extra: Partial<ResponseObject> = {},
  ): ResponseObject => ({
    ...base,
    status,
    error: null,
    incomplete_details: null,
    output: structuredClone(output),
    usage: null,
    ...extra,
  });
  yield event("response.created", { response: snapshot("in_progress") });
  yield event("response.in_progress", { response: snapshot("in_progress") });

  // The item being written; items are written one after another.
  let current: OutputItem | undefined;
  let index = -1;
  const blank = new BlankTextHold();
  let finish: string | null = null;
  let usage: CompletionUsage | undefined;
  // A custom tool call's input is read from the whole arguments text when the call ends.
  let customArgs = "";

  async function* open(item: OutputItem): AsyncGenerator<ResponseStreamEvent> {
    yield* close("completed");
    current = item;
    output.push(item);
    index = output.length - 1;
    const shell = structuredClone(item);
    if (shell.type === "message") shell.content = [];
    if (shell.type === "reasoning") shell.summary = [];
    yield event("response.output_item.added", { output_index: index, item: shell });
    if (item.type === "message") {
      yield event("response.content_part.added", {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        part: { type: "output_text", text: "", annotations: [] },
      });
    }
    if (item.type === "reasoning") {
      yield event("response.reasoning_summary_part.added", {
        item_id: item.id,
        output_index: index,
        summary_index: 0,
        part: { type: "summary_text", text: "" },
      });
    }
  }

  async function* close(status: "completed" | "incomplete"): AsyncGenerator<ResponseStreamEvent> {
    const item = current;
    if (!item) return;
    current = undefined;
    const at = { item_id: item.id, output_index: index };
    // The item the token limit cut is incomplete; every one closed before it is completed.
    item.status = status;
    if (item.type === "reasoning") {
      const text = item.summary[0].text;
      yield event("response.reasoning_summary_text.done", { ...at, summary_index: 0, text });
      yield event("response.reasoning_summary_part.done", {
        ...at,
        summary_index: 0,
        part: { type: "summary_text", text },
      });
      if (shape.seal) item.encrypted_content = await shape.seal(text);
    } else if (item.type === "message") {
      const part = item.content[0];
      yield event("response.output_text.done", { ...at, content_index: 0, text: part.text, logprobs: [] });
      yield event("response.content_part.done", { ...at, content_index: 0, part: structuredClone(part) });
    } else if (item.type === "custom_tool_call") {
      item.input = customInput(customArgs);
      if (item.input) yield event("response.custom_tool_call_input.delta", { ...at, delta: item.input });
      yield event("response.custom_tool_call_input.done", { ...at, input: item.input });
    } else {
      yield event("response.function_call_arguments.done", {
        ...at,
        name: item.name,
        arguments: item.arguments,
      });
    }
    yield event("response.output_item.done", { output_index: index, item: structuredClone(item) });
  }

  async function* text(delta: string): AsyncGenerator<ResponseStreamEvent> {
    if (current?.type !== "message") {
      yield* open({
        type: "message",
        id: itemId("msg"),
        status: "in_progress",
        role: "assistant",
        content: [{ type: "output_text", text: "", annotations: [], logprobs: [] }],
      });
    }
    const item = current as Extract<OutputItem, { type: "message" }>;
    item.content[0].text += delta;
    yield event("response.output_text.delta", {
      item_id: item.id,
      output_index: index,
      content_index: 0,
      delta,
      logprobs: [],
    });
  }

  try {
    for await (const chunk of chunks) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        const d = choice.delta;
        if (d.reasoning_content) {
          if (current?.type !== "reasoning") {
            yield* open({
              type: "reasoning",
              id: itemId("rs"),
              summary: [{ type: "summary_text", text: "" }],
            });
          }
          const item = current as Extract<OutputItem, { type: "reasoning" }>;
          item.summary[0].text += d.reasoning_content;
          yield event("response.reasoning_summary_text.delta", {
            item_id: item.id,
            output_index: index,
            summary_index: 0,
            delta: d.reasoning_content,
          });
        }
        const shown = d.content ? blank.take(d.content, current?.type === "message") : undefined;
        if (shown) yield* text(shown);
        for (const call of d.tool_calls ?? []) {
          if (call.id) {
            blank.drop();
            customArgs = "";
            yield* open(callItem(call.id, call.function.name ?? "", "", "in_progress", shape));
          }
          const args = call.function.arguments;
          if (args && current?.type === "custom_tool_call") customArgs += args;
          if (args && current?.type === "function_call") {
            current.arguments += args;
            yield event("response.function_call_arguments.delta", {
              item_id: current.id,
              output_index: index,
              delta: args,
            });
          }
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    const rest = blank.rest();
    if (rest && !output.some((o) => o.type === "function_call" || o.type === "custom_tool_call")) {
      yield* text(rest);
    }
    const end = ending(finish);
    const answered = output.some((o) => o.type !== "reasoning");
    if (!answered && end.status === "completed") {
      yield* open({
        type: "message",
        id: itemId("msg"),
        status: "in_progress",
        role: "assistant",
        content: [{ type: "output_text", text: "", annotations: [], logprobs: [] }],
      });
    }
    yield* close(end.status);
    yield event(end.status === "incomplete" ? "response.incomplete" : "response.completed", {
      response: snapshot(end.status, { ...end, usage: usage ? usageOf(usage) : null }),
    });
  } catch (e) {
    const error = toError(e);
    const { message, code, param } = error instanceof ApiError
      ? error
      : { message: "The model failed while generating.", code: "generation_failed", param: null };
    yield event("response.failed", {
      response: snapshot("failed", { error: { code: code ?? "server_error", message } }),
    });
    yield event("error", { code, message, param });
  }
}
