/**
 * The OpenAI semantics of `/v1/chat/completions`: request → engine job, engine events →
 * a `chat.completion` or a stream of `chat.completion.chunk`s.
 */
import { abortedError, ApiError, badRequest, jsonResponse } from "../http/errors.ts";
import { SSE_HEADERS, sseStream } from "../http/sse.ts";
import type {
  ChatChunk,
  ChatCompletion,
  ChatMessage,
  ChatRequest,
  FinishReason,
  ToolCall,
} from "../protocol/chat.ts";
import type { CompletionUsage } from "../protocol/common.ts";
import type { ChatEngine, ChatEvent, ChatJob, EngineMessage, OutputConstraint } from "../engines/types.ts";
import { EngineInputError } from "../engines/types.ts";
import type { Logger } from "../log.ts";

/** Per-request context from the server. */
export interface ChatContext {
  defaultThinking: boolean;
  created: number;
  signal: AbortSignal;
  log: Logger;
  requestId: string;
  /** The engine started the job (a sequence was free). */
  onStarted?: () => void;
  /** The first token arrived. */
  onFirstToken?: () => void;
  onUsage?: (usage: CompletionUsage) => void;
}

/**
 * Answers one chat request: JSON, or an SSE stream when `stream` is true. Errors found before
 * the first token are thrown (a normal HTTP error); later ones become an error event.
 *
 * @example
 * ```ts
 * const res = await createChatCompletion(body, engine, ctx);
 * ```
 */
export async function createChatCompletion(
  req: ChatRequest,
  engine: ChatEngine,
  ctx: ChatContext,
): Promise<Response> {
  const job = toJob(req, ctx.defaultThinking);
  const id = `chatcmpl-${crypto.randomUUID().replaceAll("-", "")}`;
  // The stream's own controller also stops generation when the consumer goes away.
  const abort = new AbortController();
  const signal = AbortSignal.any([ctx.signal, abort.signal]);
  const toError = (e: unknown) => toApiError(e, signal);
  const iterator = withFirstToken(engine.generate(job, signal)[Symbol.asyncIterator](), ctx);
  let first: IteratorResult<ChatEvent>;
  try {
    first = await iterator.next();
  } catch (e) {
    throw toError(e);
  }
  ctx.onStarted?.();
  const promptTokens = first.done || first.value.type !== "prompt" ? 0 : first.value.promptTokens;
  if (!req.stream) return jsonResponse(await collect(req, id, ctx, promptTokens, iterator, toError));
  const chunks = streamChunks(req, id, ctx, promptTokens, iterator, abort);
  const body = sseStream(chunks, {
    pingMs: 15_000,
    onError: (e) => {
      const error = toError(e);
      const log = error.status >= 500 && error.status !== 503 && error.status !== 504
        ? ctx.log.error
        : ctx.log.warn;
      log("stream ended with an error", {
        request_id: ctx.requestId,
        status: error.status,
        code: error.code,
      });
      return error.toBody();
    },
  });
  return new Response(body, { headers: SSE_HEADERS });
}

function toApiError(e: unknown, signal: AbortSignal): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof EngineInputError) return badRequest(e.message, e.param, e.code);
  if (signal.aborted) return abortedError(signal.reason);
  return new ApiError(500, "server_error", "The model failed while generating.", null, "generation_failed");
}

/** Calls `ctx.onFirstToken` when the engine reports the first generated token. */
function withFirstToken(events: AsyncIterator<ChatEvent>, ctx: ChatContext): AsyncIterator<ChatEvent> {
  let seen = false;
  return {
    async next() {
      const r = await events.next();
      if (!seen && !r.done && r.value.type === "first_token") {
        seen = true;
        ctx.onFirstToken?.();
      }
      return r;
    },
    return: (v?: unknown) => events.return?.(v) ?? Promise.resolve({ done: true, value: undefined }),
  };
}

/** The engine job for a validated request; rejects combinations the contract forbids. */
export function toJob(req: ChatRequest, defaultThinking: boolean): ChatJob {
  if ((req.n ?? 1) > 1) {
    throw badRequest(
      "n > 1 is not supported by this server; send n requests instead.",
      "n",
      "unsupported_value",
    );
  }
  const tools = (req.tools ?? []).map((t) => ({
    name: t.function.name,
    description: t.function.description ?? undefined,
    parameters: t.function.parameters ?? undefined,
  }));
  const names = new Set<string>();
  tools.forEach((t, i) => {
    if (names.has(t.name)) throw badRequest(`Duplicate tool name '${t.name}'.`, `tools[${i}].function.name`);
    names.add(t.name);
  });
  const choice = req.tool_choice ?? (tools.length > 0 ? "auto" : "none");
  let toolChoice: ChatJob["toolChoice"];
  if (typeof choice === "string") {
    if (choice === "required" && tools.length === 0) {
      throw badRequest("tool_choice 'required' needs at least one entry in tools.", "tool_choice");
    }
    toolChoice = choice;
  } else {
    if (!names.has(choice.function.name)) {
      throw badRequest(
        `tool_choice names the function '${choice.function.name}', which is not in tools.`,
        "tool_choice.function.name",
      );
    }
    toolChoice = { name: choice.function.name };
  }
  const rf = req.response_format;
  let output: OutputConstraint = { type: "text" };
  if (rf?.type === "json_object") output = { type: "json_object" };
  if (rf?.type === "json_schema") {
    output = rf.json_schema.schema
      ? { type: "json_schema", schema: rf.json_schema.schema }
      : { type: "json_object" };
  }
  if (output.type !== "text" && toolChoice !== "none" && tools.length > 0 && toolChoice !== "auto") {
    throw badRequest("response_format cannot be combined with a forced tool_choice.", "response_format");
  }
  const stop = req.stop == null ? [] : typeof req.stop === "string" ? [req.stop] : req.stop;
  return {
    messages: toEngineMessages(req.messages),
    tools,
    toolChoice,
    parallelToolCalls: req.parallel_tool_calls ?? true,
    output,
    sampling: {
      temperature: req.temperature ?? undefined,
      topP: req.top_p ?? undefined,
      topK: req.top_k ?? undefined,
      minP: req.min_p ?? undefined,
      seed: req.seed ?? undefined,
      presencePenalty: req.presence_penalty ?? undefined,
      frequencyPenalty: req.frequency_penalty ?? undefined,
      repeatPenalty: req.repeat_penalty ?? undefined,
      logitBias: req.logit_bias
        ? Object.fromEntries(Object.entries(req.logit_bias).map(([k, v]) => [Number(k), v]))
        : undefined,
    },
    maxTokens: req.max_completion_tokens ?? req.max_tokens ?? undefined,
    stop: stop.filter((s) => s !== ""),
    enableThinking: req.chat_template_kwargs?.enable_thinking ?? defaultThinking,
  };
}

function textOf(content: ChatMessage["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((p) => p.text).join("");
}

function toEngineMessages(messages: ChatMessage[]): EngineMessage[] {
  const callNames = new Map<string, string>();
  return messages.map((m, i): EngineMessage => {
    switch (m.role) {
      case "system":
      case "user":
        return { role: m.role, text: textOf(m.content) };
      case "assistant": {
        const toolCalls = (m.tool_calls ?? []).map((c, j) => {
          callNames.set(c.id, c.function.name);
          try {
            JSON.parse(c.function.arguments);
          } catch {
            throw badRequest(
              "function.arguments must be a JSON string.",
              `messages[${i}].tool_calls[${j}].function.arguments`,
            );
          }
          return { id: c.id, name: c.function.name, arguments: c.function.arguments };
        });
        const reasoning = m.reasoning_content ?? m.reasoning ?? undefined;
        return { role: "assistant", text: textOf(m.content), toolCalls, ...(reasoning ? { reasoning } : {}) };
      }
      case "tool":
        return {
          role: "tool",
          text: textOf(m.content),
          toolCallId: m.tool_call_id,
          toolName: callNames.get(m.tool_call_id),
        };
    }
  });
}

type Events = AsyncIterator<ChatEvent>;

async function collect(
  req: ChatRequest,
  id: string,
  ctx: ChatContext,
  promptTokens: number,
  events: Events,
  toError: (e: unknown) => ApiError,
): Promise<ChatCompletion> {
  let content = "";
  let reasoning = "";
  const calls: ToolCall[] = [];
  let finish: FinishReason = "stop";
  let completionTokens = 0;
  try {
    for (let e = await events.next(); !e.done; e = await events.next()) {
      const ev = e.value;
      if (ev.type === "content") content += ev.text;
      else if (ev.type === "reasoning") reasoning += ev.text;
      else if (ev.type === "tool_call") {
        calls.push({
          id: ev.call.id,
          type: "function",
          function: { name: ev.call.name, arguments: ev.call.arguments },
        });
      } else if (ev.type === "end") {
        finish = ev.finishReason;
        completionTokens = ev.completionTokens;
      }
    }
  } catch (e) {
    throw toError(e);
  }
  const usage = {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
  };
  ctx.onUsage?.(usage);
  return {
    id,
    object: "chat.completion",
    created: ctx.created,
    model: req.model,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: calls.length > 0 && content.trim() === "" ? null : content,
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
        ...(reasoning ? { reasoning_content: reasoning, reasoning } : {}),
      },
      logprobs: null,
      finish_reason: finish,
    }],
    usage,
  };
}

async function* streamChunks(
  req: ChatRequest,
  id: string,
  ctx: ChatContext,
  promptTokens: number,
  events: Events,
  abort: AbortController,
): AsyncGenerator<ChatChunk> {
  const chunk = (delta: ChatChunk["choices"][0]["delta"], finish: FinishReason | null = null): ChatChunk => ({
    id,
    object: "chat.completion.chunk",
    created: ctx.created,
    model: req.model,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  });
  let completed = false;
  try {
    yield chunk({ role: "assistant", content: "" });
    let callIndex = 0;
    for (let e = await events.next(); !e.done; e = await events.next()) {
      const ev = e.value;
      if (ev.type === "content") yield chunk({ content: ev.text });
      else if (ev.type === "reasoning") yield chunk({ reasoning_content: ev.text, reasoning: ev.text });
      else if (ev.type === "tool_call") {
        const index = callIndex++;
        yield chunk({
          tool_calls: [{
            index,
            id: ev.call.id,
            type: "function",
            function: { name: ev.call.name, arguments: "" },
          }],
        });
        for (const piece of fragments(ev.call.arguments)) {
          yield chunk({ tool_calls: [{ index, function: { arguments: piece } }] });
        }
      } else if (ev.type === "end") {
        yield chunk({}, ev.finishReason);
        const usage = {
          prompt_tokens: promptTokens,
          completion_tokens: ev.completionTokens,
          total_tokens: promptTokens + ev.completionTokens,
        };
        ctx.onUsage?.(usage);
        if (req.stream_options?.include_usage) {
          yield { ...chunk({}), choices: [], usage };
        }
      }
    }
    completed = true;
  } finally {
    if (!completed) {
      // The client went away (or the consumer stopped): stop generation and free the sequence now.
      abort.abort(new DOMException("stream cancelled", "AbortError"));
      await events.return?.();
      ctx.log.info("stream cancelled", { request_id: ctx.requestId });
    }
  }
}

/** Splits argument JSON into a few pieces, as OpenAI streams it, without splitting code points. */
function fragments(text: string): string[] {
  const points = Array.from(text);
  const size = Math.max(8, Math.ceil(points.length / 4));
  const out: string[] = [];
  for (let i = 0; i < points.length; i += size) out.push(points.slice(i, i + size).join(""));
  return out.length > 0 ? out : [""];
}
