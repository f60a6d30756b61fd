/**
 * The Anthropic semantics of `POST /v1/messages` and `/v1/messages/count_tokens`: the request
 * becomes a chat request and runs on the chat engine path (`runChat`), so tools, grammars,
 * thinking, limits, schema checks and cancellation are those of `/v1/chat/completions`; its output
 * is read back into a message, or into Anthropic's stream events.
 */
import type { z } from "zod";
import { ApiError, badRequest, formatPath } from "../http/errors.ts";
import type { ChatChunk, ChatCompletion, ChatMessage, ChatRequest } from "../protocol/chat.ts";
import type { CompletionUsage } from "../protocol/common.ts";
import {
  type AnthropicErrorType,
  type ContentBlock,
  type CountTokensRequest,
  type CustomTool,
  CustomToolSchema,
  type Message,
  type MessageParam,
  type MessagesRequest,
  type MessageStreamEvent,
  type MessageTokensCount,
  SERVER_BLOCK_TYPES,
  type StopReason,
  type Usage,
} from "../protocol/anthropic.ts";
import type { ChatEngine, ChatEvent } from "../engines/types.ts";
import { type ChatContext, parseHistoryArguments, runChat, toJob } from "./chat.ts";
import type { ReasoningSealer } from "./reasoning_seal.ts";
import { BlankTextHold } from "./blank_text.ts";

/** A messages request's outcome: the whole message, or its stream events (errors become an `error` event). */
export type MessagesRun =
  & ({ kind: "message"; message: Message } | { kind: "stream"; events: AsyncGenerator<MessageStreamEvent> })
  & {
    /** The types of tools left out of the prompt (Anthropic-defined tools, under `hostedTools: "ignore"`). */
    ignored: string[];
  };

/** How this server treats what it cannot serve as asked, and its seal (from configuration, as for Responses). */
export interface MessagesOptions {
  /** Anthropic-defined tools (web_search_…, bash_…, text_editor_…, …): left out of the prompt, or a 400. */
  hostedTools: "ignore" | "refuse";
  /** Seals thinking into signatures, and opens them again. */
  sealer: ReasoningSealer;
}

/**
 * Runs one messages request. Errors found before the first token are thrown as `ApiError`s
 * naming the Anthropic field; a stream's later errors end it with an `error` event.
 *
 * @example
 * ```ts
 * import type { MessagesRequest } from "../protocol/anthropic.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { ChatContext } from "./chat.ts";
 * import type { ReasoningSealer } from "./reasoning_seal.ts";
 * async function answer(body: MessagesRequest, engine: ChatEngine, ctx: ChatContext, sealer: ReasoningSealer) {
 *   const run = await createMessage(body, engine, ctx, { hostedTools: "ignore", sealer });
 *   if (run.kind === "message") console.log(run.message.content);
 * }
 * ```
 */
export async function createMessage(
  req: MessagesRequest,
  engine: ChatEngine,
  ctx: ChatContext,
  opts: MessagesOptions,
): Promise<MessagesRun> {
  const { sealer } = opts;
  const { chat, params, omitThinking, ignored } = await toChatRequest(req, opts);
  // What the chat objects do not carry: the prompt's counts at the start, and which stop sequence ended it.
  const seen: { prompt?: Extract<ChatEvent, { type: "prompt" }>; stopSequence?: string } = {};
  const observed = observe(engine, (e) => {
    if (e.type === "prompt") Object.assign(seen, { prompt: e, stopSequence: undefined });
    if (e.type === "end" && e.stopSequence !== undefined) seen.stopSequence = e.stopSequence;
  });
  let run;
  try {
    run = await runChat(chat, observed, ctx);
  } catch (e) {
    throw renameParam(e, params);
  }
  const base = {
    id: `msg_${crypto.randomUUID().replaceAll("-", "")}`,
    model: req.model,
    maxTokens: req.max_tokens,
    omitThinking,
    contextManagement: req.context_management != null,
    seal: (text: string) => sealer.seal(text),
  };
  if (run.kind === "completion") {
    return {
      kind: "message",
      message: await fromCompletion(base, run.completion, seen.stopSequence),
      ignored,
    };
  }
  const toError = (e: unknown) => renameParam(run.toError(e), params);
  return {
    kind: "stream",
    events: streamEvents(base, run.chunks, toError, {
      prompt: () => seen.prompt,
      stopSequence: () => seen.stopSequence,
    }),
    ignored,
  };
}

/**
 * The prompt tokens of a request, counted as `/v1/messages` would count them (the same prompt).
 *
 * @example
 * ```ts
 * import type { CountTokensRequest } from "../protocol/anthropic.ts";
 * import type { ChatEngine } from "../engines/types.ts";
 * import type { ReasoningSealer } from "./reasoning_seal.ts";
 * async function count(body: CountTokensRequest, engine: ChatEngine, sealer: ReasoningSealer, signal: AbortSignal) {
 *   return await countTokens(body, engine, undefined, { hostedTools: "ignore", sealer }, signal); // { input_tokens: 1234 }
 * }
 * ```
 */
export async function countTokens(
  req: CountTokensRequest,
  engine: ChatEngine,
  defaultThinking: boolean | undefined,
  opts: MessagesOptions,
  signal?: AbortSignal,
): Promise<MessageTokensCount> {
  const { chat, params } = await toChatRequest({ ...req, max_tokens: 1 }, opts);
  if (engine.upstreams) {
    throw badRequest(
      `The model '${req.model.slice(0, 256)}' is served by upstream servers, whose tokenizer is theirs: ` +
        "count_tokens is not available for it.",
      "model",
      "unsupported_for_upstream_model",
    );
  }
  try {
    await parseHistoryArguments(chat.messages, signal);
    const job = await toJob(chat, defaultThinking, signal);
    return { input_tokens: (await engine.prompt(job, signal)).tokens.length };
  } catch (e) {
    throw renameParam(e, params);
  }
}

// ---- request → chat request ----

/** Where each chat message and tool came from, to name the Anthropic field in errors. */
interface ParamMap {
  /** messages[k] → its Anthropic field (`system`, `messages[i]`). */
  messages: string[];
  /** messages[k].tool_calls[j] → its tool_use block. */
  calls: Map<string, string>;
  /** tools[k] → the Anthropic tools index (deferred tools are left out). */
  tools: number[];
  /** Where the output format came from: `output_config.format` or the beta's `output_format`. */
  format: string;
}

/** Claude Code's first system block: per-request billing data that would defeat prompt reuse. */
const BILLING_HEADER = /^x-anthropic-billing-header:[^\n]*\n?/;

/**
 * The chat request an Anthropic request means, where its parts came from, the thinking display, and
 * the tool types left out. Thinking signatures are opened with the sealer (one that does not open is a 400).
 */
export async function toChatRequest(req: MessagesRequest, opts: MessagesOptions): Promise<{
  chat: ChatRequest;
  params: ParamMap;
  omitThinking: boolean;
  ignored: string[];
}> {
  if (req.mcp_servers?.length) {
    throw badRequest(
      "mcp_servers are connected by Anthropic's servers; this server connects to none. " +
        "Give MCP tools to the client instead (they arrive here as ordinary tools).",
      "mcp_servers",
      "unsupported_value",
    );
  }
  const messages: ChatMessage[] = [];
  if (req.output_format && req.output_config?.format) {
    throw badRequest(
      "output_format is the structured-outputs beta's name for output_config.format: give one of them, not both.",
      "output_format",
      "invalid_value",
    );
  }
  const params: ParamMap = {
    messages: [],
    calls: new Map(),
    tools: [],
    format: req.output_format ? "output_format" : "output_config.format",
  };
  const push = (m: ChatMessage, from: string) => {
    messages.push(m);
    params.messages.push(from);
  };
  const system = systemText(req.system);
  if (system) push({ role: "system", content: system }, "system");

  const signatures = await openSignatures(req.messages, opts.sealer);
  const referenced = new Set<string>();
  const callNames = new Map<string, string>();
  const last = () => messages.at(-1);
  // The texts of a message that more blocks or turns may add to, joined once at the end: joined at
  // each block, 50,000 text blocks held the event loop 7 s (each join read the whole text so far).
  const parts = new Map<ChatMessage, { content: string[]; separator: string; reasoning: string[] }>();
  const partsOf = (m: ChatMessage, separator: string) => {
    let p = parts.get(m);
    if (!p) parts.set(m, p = { content: [], separator, reasoning: [] });
    return p;
  };
  /** User text joins the user message before it (consecutive turns are one turn, as Anthropic merges them). */
  const userText = (text: string, from: string) => {
    const prev = last();
    if (prev?.role === "user") partsOf(prev, "\n\n").content.push(text);
    else {
      const m: ChatMessage = { role: "user", content: text };
      push(m, from);
      partsOf(m, "\n\n").content.push(text);
    }
  };
  req.messages.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (m.role === "system") {
      // As on every API (toEngineMessages): leading ones join the system prompt, later ones are reminders.
      push({ role: "system", content: textOf(m.content) }, at);
      return;
    }
    const blocks = typeof m.content === "string" ? [{ type: "text" as const, text: m.content }] : m.content;
    if (m.role === "user") {
      const texts: string[] = [];
      blocks.forEach((b, j) => {
        const bat = `${at}.content[${j}]`;
        if (b.type === "text") texts.push(b.text);
        else if (b.type === "tool_result") {
          const name = callNames.get(b.tool_use_id);
          if (name === undefined) {
            throw badRequest(
              `tool_result answers tool_use_id '${
                b.tool_use_id.slice(0, 128)
              }', but no earlier tool_use block ` +
                "has that id.",
              `${bat}.tool_use_id`,
              "invalid_value",
            );
          }
          const content = toolResultText(b.content, `${bat}.content`, referenced);
          push({
            role: "tool",
            tool_call_id: b.tool_use_id,
            content: b.is_error ? `Error: ${content}` : content,
          }, bat);
        } else throw refused(b.type, bat, "user");
      });
      if (texts.length) userText(joinText(texts), at);
      return;
    }
    // assistant
    const prev = last();
    const a: Extract<ChatMessage, { role: "assistant" }> = prev?.role === "assistant"
      ? prev
      : { role: "assistant", content: null, tool_calls: [] };
    if (a !== prev) push(a, at);
    const k = messages.length - 1;
    const texts = partsOf(a, "\n");
    blocks.forEach((b, j) => {
      const bat = `${at}.content[${j}]`;
      switch (b.type) {
        case "text":
          texts.content.push(b.text);
          break;
        case "thinking": {
          const text = thinkingOf(b, signatures, bat);
          if (text) texts.reasoning.push(text);
          break;
        }
        case "redacted_thinking":
          break; // opaque to this server: another provider's encrypted thinking
        case "tool_use":
          params.calls.set(`messages[${k}].tool_calls[${a.tool_calls!.length}]`, bat);
          callNames.set(b.id, b.name);
          a.tool_calls!.push({
            id: b.id,
            type: "function",
            function: { name: b.name, arguments: JSON.stringify(b.input) },
          });
          break;
        default:
          throw refused(b.type, bat, "assistant");
      }
    });
  });
  for (const [m, p] of parts) {
    if (p.content.length > 0) m.content = joinText(p.content, p.separator);
    if (p.reasoning.length > 0 && m.role === "assistant") m.reasoning_content = joinText(p.reasoning, "\n\n");
  }
  const final = last();
  if (final?.role === "assistant" || !messages.some((m) => m.role === "user" || m.role === "tool")) {
    const i = req.messages.length - 1;
    throw badRequest(
      final?.role === "assistant"
        ? "The last message is an assistant turn: this server does not continue a prefilled answer. End " +
          "with a user message (or tool_result blocks)."
        : "messages hold no user turn to answer.",
      `messages[${i}].role`,
      "invalid_value",
    );
  }

  const tools: NonNullable<ChatRequest["tools"]> = [];
  const ignored: string[] = [];
  (req.tools ?? []).forEach((t, i) => {
    if (t.type != null && t.type !== "custom") {
      // As the Responses API's hosted tools (--hosted-tools): left out and named, or refused.
      const type = String(t.type).slice(0, 64);
      if (opts.hostedTools === "refuse") {
        throw badRequest(
          `tools[${i}] is a '${type}' tool, which Anthropic's servers run or only Claude knows, and this ` +
            "server is configured to refuse such tools (--hosted-tools refuse): send custom tools " +
            "{name, description, input_schema}.",
          `tools[${i}].type`,
          "unsupported_value",
        );
      }
      if (!ignored.includes(type)) ignored.push(type);
      return;
    }
    const tool: CustomTool = parseAt(CustomToolSchema, t, `tools[${i}]`);
    if (tool.defer_loading && !referenced.has(tool.name)) return;
    params.tools.push(i);
    tools.push({
      type: "function",
      function: {
        name: tool.name,
        description: tool.description ?? undefined,
        parameters: tool.input_schema,
        strict: tool.strict ?? undefined,
      },
    });
  });

  const tc = req.tool_choice;
  let toolChoice: ChatRequest["tool_choice"];
  if (tc?.type === "auto" || tc?.type === "none") toolChoice = tc.type;
  else if (tc?.type === "any") toolChoice = "required";
  else if (tc?.type === "tool") toolChoice = { type: "function", function: { name: tc.name } };
  const disableParallel = tc && tc.type !== "none" ? tc.disable_parallel_tool_use : undefined;

  const format = req.output_config?.format ?? req.output_format;
  const thinking = req.thinking;
  const chat: ChatRequest = {
    model: req.model,
    messages,
    tools: tools.length ? tools : undefined,
    tool_choice: toolChoice,
    parallel_tool_calls: disableParallel == null ? undefined : !disableParallel,
    max_tokens: req.max_tokens,
    stop: req.stop_sequences ?? undefined,
    temperature: req.temperature,
    top_p: req.top_p,
    top_k: req.top_k,
    seed: req.seed,
    logit_bias: req.logit_bias,
    response_format: format
      ? { type: "json_schema", json_schema: { name: "output", schema: format.schema, strict: true } }
      : undefined,
    // adaptive (and no thinking field): the model's default.
    chat_template_kwargs: thinking?.type === "enabled" || thinking?.type === "disabled"
      ? { enable_thinking: thinking.type === "enabled" }
      : undefined,
    stream: req.stream,
    stream_options: req.stream ? { include_usage: true } : undefined,
  };
  const omitThinking = (thinking?.type === "enabled" || thinking?.type === "adaptive") &&
    thinking.display === "omitted";
  return { chat, params, omitThinking, ignored };
}

/** Text blocks joined; a line break between two blocks unless one is already there. */
function joinText(parts: string[], separator = "\n"): string {
  const out: string[] = [];
  let open = false; // the text so far ends without a line break
  for (const p of parts) {
    if (p === "") continue;
    if (open && !p.startsWith("\n")) out.push(separator);
    out.push(p);
    open = !p.endsWith("\n");
  }
  return out.join("");
}

function systemText(system: MessagesRequest["system"]): string {
  if (system === undefined) return "";
  if (typeof system === "string") return system.replace(BILLING_HEADER, "");
  return joinText(system.filter((b) => !BILLING_HEADER.test(b.text)).map((b) => b.text));
}

function textOf(content: string | { text: string }[]): string {
  return typeof content === "string" ? content : joinText(content.map((b) => b.text));
}

function toolResultText(
  content: ContentBlockParamOf<"tool_result">["content"],
  at: string,
  referenced: Set<string>,
): string {
  if (content === undefined) return "";
  if (typeof content === "string") return content;
  return joinText(content.map((b, j) => {
    if (b.type === "text") return b.text;
    if (b.type === "tool_reference") {
      referenced.add(b.tool_name);
      return `Tool loaded: ${b.tool_name}`;
    }
    throw refused(b.type, `${at}[${j}]`, "tool_result");
  }));
}
type ContentBlockParamOf<T extends string> = Extract<
  Exclude<MessageParam["content"], string>[number],
  { type: T }
>;

function refused(type: string, at: string, where: string): ApiError {
  const server = (SERVER_BLOCK_TYPES as readonly string[]).includes(type);
  return badRequest(
    server
      ? `Content blocks of type '${type}' belong to tools that Anthropic's servers run; this server runs none.`
      : type === "image" || type === "document" || type === "search_result"
      ? `This server reads text only: content blocks of type '${type}' are not supported.`
      : `Content blocks of type '${type}' cannot appear in a ${where} ${
        where === "tool_result" ? "" : "message "
      }(text${
        where === "assistant" ? ", thinking, tool_use" : where === "user" ? ", tool_result" : ""
      } only).`,
    `${at}.type`,
    "unsupported_value",
  );
}

/** Parses a value with its own schema, naming fields under `at`. */
function parseAt<S extends z.ZodType>(schema: S, value: unknown, at: string): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const param = `${at}${formatPath(issue.path)?.replace(/^(?!\[)/, ".") ?? ""}`;
  const reason = issue.message.replace(/^Invalid input: /, "");
  throw badRequest(`Invalid value for '${param}': ${reason}`, param, "invalid_value");
}

/** The chat field names in an error, as the Anthropic request names them. */
function renameParam(e: unknown, params: ParamMap): unknown {
  if (!(e instanceof ApiError) || e.param == null) return e;
  const p = e.param;
  let renamed: string | undefined;
  const call = p.match(/^(messages\[\d+\]\.tool_calls\[\d+\])(?:\.function)?(.*)$/);
  const inMessage = p.match(/^messages\[(\d+)\]/);
  const tool = p.match(/^tools\[(\d+)\]\.function\.(\w+)(.*)$/);
  if (call && params.calls.has(call[1])) {
    renamed = params.calls.get(call[1])! + call[2].replace(/^\.arguments/, ".input");
  } else if (inMessage) renamed = params.messages[Number(inMessage[1])] ?? "messages";
  else if (tool) {
    const field = tool[2] === "parameters" ? "input_schema" : tool[2];
    renamed = `tools[${params.tools[Number(tool[1])] ?? tool[1]}].${field}${tool[3]}`;
  } else if (p === "tool_choice.function.name") renamed = "tool_choice.name";
  else if (p.startsWith("response_format")) {
    renamed = p.replace(/^response_format(\.json_schema)?/, params.format);
  } else if (p === "max_completion_tokens") renamed = "max_tokens";
  else if (p === "stop") renamed = "stop_sequences";
  else if (p === "chat_template_kwargs.enable_thinking") renamed = "thinking";
  renamed ??= p;
  const message = e.message.replaceAll(p, renamed)
    .replaceAll("tool_choice 'required'", "tool_choice {type:'any'}")
    .replaceAll("response_format", params.format);
  return new ApiError(e.status, e.type, message, renamed, e.code, e.headers);
}

// ---- engine events → message ----

/** The engine with every event of its jobs shown to `see` as it passes. */
function observe(engine: ChatEngine, see: (e: ChatEvent) => void): ChatEngine {
  return new Proxy(engine, {
    get(target, prop) {
      if (prop === "generate") {
        return async function* (job: Parameters<ChatEngine["generate"]>[0], signal: AbortSignal) {
          for await (const e of target.generate(job, signal)) {
            see(e);
            yield e;
          }
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** What the message fixes from the request. */
interface Base {
  id: string;
  model: string;
  maxTokens: number;
  omitThinking: boolean;
  contextManagement: boolean;
  /** A thinking block's signature: its thinking, sealed (so that the block sent back restores it). */
  seal: (thinking: string) => Promise<string>;
}

/** The thinking each distinct signature in the conversation seals (null: it does not open). */
async function openSignatures(
  messages: MessagesRequest["messages"],
  sealer: ReasoningSealer,
): Promise<Map<string, string | null>> {
  const signatures = new Set<string>();
  for (const m of messages) {
    if (m.role !== "assistant" || typeof m.content === "string") continue;
    for (const b of m.content) if (b.type === "thinking" && b.signature) signatures.add(b.signature);
  }
  const opened = await Promise.all([...signatures].map(async (s) => [s, await sealer.open(s)] as const));
  return new Map(opened);
}

/**
 * The thinking a block gives the prompt. Its signature is the thinking sealed by this server (see
 * reasoning_seal.ts, as the Responses API's `encrypted_content`): it restores the text when the
 * block's is empty (`display: "omitted"`). A signature that does not open, or a text that differs
 * from the sealed one, is Anthropic's 400; a block without a signature gives its text as it is.
 */
function thinkingOf(
  b: { thinking: string; signature?: string | null },
  signatures: ReadonlyMap<string, string | null>,
  at: string,
): string {
  if (!b.signature) return b.thinking;
  const sealed = signatures.get(b.signature);
  if (sealed == null || (b.thinking !== "" && b.thinking !== sealed)) {
    throw badRequest(
      "Invalid `signature` in `thinking` block: " +
        (sealed == null
          ? "it was not issued by this server under its current key (a key generated at start does not " +
            "survive a restart; see --reasoning-key), or it was altered."
          : "the thinking text is not the one the signature was issued for; send thinking blocks back unchanged."),
      at,
      "invalid_signature",
    );
  }
  return sealed;
}

const toolUseId = (id: string) => id.startsWith("toolu_") ? id : `toolu_${id.replace(/^call_/, "")}`;

function stopReason(
  finish: string | null | undefined,
  stopSequence: string | undefined,
  outputTokens: number,
  maxTokens: number,
): StopReason {
  if (finish === "tool_calls") return "tool_use";
  if (finish === "length") return outputTokens < maxTokens ? "model_context_window_exceeded" : "max_tokens";
  return stopSequence !== undefined ? "stop_sequence" : "end_turn";
}

function usageOf(u: { prompt: number; cached: number; output: number; thinking: number }): Usage {
  return {
    input_tokens: u.prompt - u.cached,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: u.cached,
    cache_creation: { ephemeral_5m_input_tokens: 0, ephemeral_1h_input_tokens: 0 },
    output_tokens: u.output,
    output_tokens_details: { thinking_tokens: u.thinking },
    service_tier: "standard",
  };
}

const fromChatUsage = (u: CompletionUsage) =>
  usageOf({
    prompt: u.prompt_tokens,
    cached: u.prompt_tokens_details?.cached_tokens ?? 0,
    output: u.completion_tokens,
    thinking: u.completion_tokens_details?.reasoning_tokens ?? 0,
  });

/** A tool call's arguments as the `input` object (a cut call's partial JSON gives `{}`). */
function inputObject(args: string): Record<string, unknown> {
  try {
    const v = JSON.parse(args);
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

async function fromCompletion(
  base: Base,
  completion: ChatCompletion,
  stopSequence?: string,
): Promise<Message> {
  const m = completion.choices[0].message;
  const content: ContentBlock[] = [];
  if (m.reasoning_content) {
    content.push({
      type: "thinking",
      thinking: base.omitThinking ? "" : m.reasoning_content,
      signature: await base.seal(m.reasoning_content),
    });
  }
  if (m.content) content.push({ type: "text", text: m.content });
  for (const c of m.tool_calls ?? []) {
    content.push({
      type: "tool_use",
      id: toolUseId(c.id),
      name: c.function.name,
      input: inputObject(c.function.arguments),
    });
  }
  const usage = fromChatUsage(completion.usage);
  return {
    id: base.id,
    type: "message",
    role: "assistant",
    model: base.model,
    content,
    stop_reason: stopReason(
      completion.choices[0].finish_reason,
      stopSequence,
      usage.output_tokens,
      base.maxTokens,
    ),
    stop_sequence: stopSequence ?? null,
    usage,
    ...(base.contextManagement ? { context_management: { applied_edits: [] } } : {}),
  };
}

/**
 * Anthropic's stream events, read off the chat chunks: `message_start`, `ping`, then blocks one
 * after another (thinking, text, tool_use), each opened by `content_block_start` and closed by
 * `content_block_stop` before the next opens, then `message_delta` and `message_stop`. An error
 * ends the stream with an `error` event.
 *
 * @example
 * ```ts
 * import type { ChatChunk } from "../protocol/chat.ts";
 * async function relay(
 *   base: Parameters<typeof streamEvents>[0],
 *   chunks: AsyncIterable<ChatChunk>,
 *   seen: Parameters<typeof streamEvents>[3],
 *   send: (type: string, event: unknown) => void,
 * ) {
 *   for await (const e of streamEvents(base, chunks, (e) => e, seen)) send(e.type, e);
 * }
 * ```
 */
export async function* streamEvents(
  base: Base,
  chunks: AsyncIterable<ChatChunk>,
  toError: (e: unknown) => unknown,
  seen: {
    prompt: () => { promptTokens: number; cachedTokens: number } | undefined;
    stopSequence: () => string | undefined;
  },
): AsyncGenerator<MessageStreamEvent> {
  const prompt = seen.prompt() ?? { promptTokens: 0, cachedTokens: 0 };
  yield {
    type: "message_start",
    message: {
      id: base.id,
      type: "message",
      role: "assistant",
      model: base.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: usageOf({ prompt: prompt.promptTokens, cached: prompt.cachedTokens, output: 0, thinking: 0 }),
      ...(base.contextManagement ? { context_management: { applied_edits: [] } } : {}),
    },
  };
  yield { type: "ping" };
  let index = -1;
  let open: "thinking" | "text" | "tool_use" | undefined;
  let thinking = "";
  const blank = new BlankTextHold();
  let calls = 0;
  let finish: string | null = null;
  let usage: CompletionUsage | undefined;

  async function* close(): AsyncGenerator<MessageStreamEvent> {
    if (open === "thinking") {
      yield {
        type: "content_block_delta",
        index,
        delta: { type: "signature_delta", signature: await base.seal(thinking) },
      };
    }
    if (open) yield { type: "content_block_stop", index };
    open = undefined;
  }
  async function* start(block: ContentBlock): AsyncGenerator<MessageStreamEvent> {
    yield* close();
    index++;
    open = block.type;
    yield { type: "content_block_start", index, content_block: block };
  }
  async function* text(delta: string): AsyncGenerator<MessageStreamEvent> {
    if (open !== "text") yield* start({ type: "text", text: "" });
    yield { type: "content_block_delta", index, delta: { type: "text_delta", text: delta } };
  }

  try {
    for await (const chunk of chunks) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        const d = choice.delta;
        if (d.reasoning_content) {
          if (open !== "thinking") {
            thinking = "";
            yield* start({ type: "thinking", thinking: "", signature: "" });
          }
          thinking += d.reasoning_content;
          if (!base.omitThinking) {
            yield {
              type: "content_block_delta",
              index,
              delta: { type: "thinking_delta", thinking: d.reasoning_content },
            };
          }
        }
        const shown = d.content ? blank.take(d.content, open === "text") : undefined;
        if (shown) yield* text(shown);
        for (const call of d.tool_calls ?? []) {
          if (call.id) {
            blank.drop();
            calls++;
            yield* start({
              type: "tool_use",
              id: toolUseId(call.id),
              name: call.function.name ?? "",
              input: {},
            });
          }
          const args = call.function.arguments;
          if (args && open === "tool_use") {
            yield {
              type: "content_block_delta",
              index,
              delta: { type: "input_json_delta", partial_json: args },
            };
          }
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    const rest = blank.rest();
    if (rest && calls === 0) yield* text(rest);
    yield* close();
    const final = usage
      ? fromChatUsage(usage)
      : usageOf({ prompt: prompt.promptTokens, cached: prompt.cachedTokens, output: 0, thinking: 0 });
    const stopSequence = seen.stopSequence();
    yield {
      type: "message_delta",
      delta: {
        stop_reason: stopReason(finish, stopSequence, final.output_tokens, base.maxTokens),
        stop_sequence: stopSequence ?? null,
      },
      usage: {
        input_tokens: final.input_tokens,
        cache_creation_input_tokens: final.cache_creation_input_tokens,
        cache_read_input_tokens: final.cache_read_input_tokens,
        output_tokens: final.output_tokens,
      },
    };
    yield { type: "message_stop" };
  } catch (e) {
    const error = toError(e);
    yield {
      type: "error",
      error: error instanceof ApiError
        ? anthropicError(error).error
        : { type: "api_error", message: "The model failed while generating." },
    };
  }
}

// ---- errors ----

/**
 * An error as Anthropic shapes it: its status (a server that sheds load answers 529) and body.
 *
 * @example
 * ```ts
 * import { badRequest } from "../http/errors.ts";
 * anthropicError(badRequest("max_tokens is required", "max_tokens")); // 400 invalid_request_error
 * ```
 */
export function anthropicError(e: ApiError): {
  status: number;
  error: { type: AnthropicErrorType; message: string };
} {
  const s = e.status;
  const shed = e.code === "queue_full" || e.code === "token_budget_exceeded" || s === 503;
  const [status, type] = shed
    ? [529, "overloaded_error" as const]
    : s === 401
    ? [s, "authentication_error" as const]
    : s === 403
    ? [s, "permission_error" as const]
    : s === 404
    ? [s, "not_found_error" as const]
    : s === 413
    ? [s, "request_too_large" as const]
    : s === 429
    ? [s, "rate_limit_error" as const]
    : s === 504
    ? [s, "timeout_error" as const]
    : s >= 500
    ? [s, "api_error" as const]
    : [s, "invalid_request_error" as const];
  // These bodies have no `param`: the message names the field.
  const message = e.param && !e.message.includes(e.param) ? `${e.param}: ${e.message}` : e.message;
  return { status, error: { type, message } };
}
