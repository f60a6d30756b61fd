/**
 * The OpenAI semantics of `/v1/chat/completions`: request → engine job, engine events →
 * a `chat.completion` or a stream of `chat.completion.chunk`s.
 */
import { abortedError, ApiError, badRequest, fromUpstreamError } from "../http/errors.ts";
import type {
  ChatChunk,
  ChatCompletion,
  ChatMessage,
  ChatRequest,
  FinishReason,
  TokenLogprob,
  ToolCall,
} from "../protocol/chat.ts";
import type { CompletionUsage } from "../protocol/common.ts";
import type {
  ChatEngine,
  ChatEvent,
  ChatJob,
  EngineMessage,
  OutputConstraint,
  TokenLogprobInfo,
} from "../engines/types.ts";
import { EngineInputError, EngineUpstreamError } from "../engines/types.ts";
import type { Logger } from "../log.ts";
import { samplingOptions } from "./sampling.ts";
import { checkAgainstSchema, type CheckResult, checkSchemaLimits, warmSchemaCheck } from "./schema_check.ts";
import { Budget } from "../grammar/mod.ts";
import { Slicer, turnIfHeld } from "../event_loop.ts";
import {
  JsonBodyError,
  MAX_JSON_CONTAINERS,
  MAX_JSON_DEPTH,
  MAX_OBJECT_MEMBERS,
  parseJsonInSlices,
} from "../http/json_slices.ts";

/** Per-request context from the server. */
export interface ChatContext {
  /** The registry's default of `enable_thinking` (undefined: the model's template decides). */
  defaultThinking?: boolean;
  created: number;
  signal: AbortSignal;
  log: Logger;
  requestId: string;
  /** `system_fingerprint`: the engine build and the model file's digest. */
  systemFingerprint?: string;
  /** The engine started the job at `startedAt`: it got its sequences (a remote engine: it sent the request). */
  onStarted?: (startedAt?: number) => void;
  /** The first token arrived. */
  onFirstToken?: () => void;
  onUsage?: (usage: CompletionUsage) => void;
}

/** A chat request's outcome: the whole completion, or its chunks (errors mid-stream are thrown by them). */
export type ChatRun =
  | { kind: "completion"; completion: ChatCompletion }
  | { kind: "stream"; chunks: AsyncGenerator<ChatChunk>; toError: (e: unknown) => ApiError };

/**
 * Runs one chat request to its OpenAI objects; the engine path that `/v1/chat/completions` and
 * `/v1/responses` share. Errors found before the first token are thrown as `ApiError`s; a
 * stream's later errors are thrown by its iterator (logged here) and `toError` shapes them.
 */
export async function runChat(req: ChatRequest, engine: ChatEngine, ctx: ChatContext): Promise<ChatRun> {
  await parseHistoryArguments(req.messages, ctx.signal);
  const job = await toJob(req, ctx.defaultThinking, ctx.signal);
  job.streamed = req.stream === true;
  job.requestId = ctx.requestId;
  const check = outputCheck(req, job, ctx.signal);
  const id = `chatcmpl-${crypto.randomUUID().replaceAll("-", "")}`;
  // The stream's own controller also stops generation when the consumer goes away.
  const abort = new AbortController();
  const signal = AbortSignal.any([ctx.signal, abort.signal]);
  const toError = (e: unknown) => toApiError(e, signal);
  const start = async () => {
    const iterator = withFirstToken(engine.generate(job, signal)[Symbol.asyncIterator](), ctx);
    let first: IteratorResult<ChatEvent>;
    try {
      first = await iterator.next();
    } catch (e) {
      throw toError(e);
    }
    const prompt: { promptTokens: number; cachedTokens: number; startedAt?: number } =
      first.done || first.value.type !== "prompt" ? { promptTokens: 0, cachedTokens: 0 } : first.value;
    // A remote engine's own fingerprint (the build that really answers) wins over ours.
    if (!first.done && first.value.type === "prompt" && first.value.systemFingerprint) {
      ctx = { ...ctx, systemFingerprint: first.value.systemFingerprint };
    }
    return { iterator, prompt };
  };
  if (!req.stream) {
    // Output that fails its schema (possible only for keywords the grammar leaves to this check)
    // is generated again, up to three times in all; it is never returned.
    for (let attempt = 1;; attempt++) {
      const { iterator, prompt } = await start();
      if (attempt === 1) ctx.onStarted?.(prompt.startedAt);
      const body = await collect(req, job, id, ctx, prompt, iterator, toError);
      const fault = check
        ? (await Promise.all(body.choices.map((c) => check(c.index, c.message, c.finish_reason)))).find(
          Boolean,
        )
        : undefined;
      if (!fault) return { kind: "completion", completion: body };
      if (attempt === MAX_ATTEMPTS) throw invalidOutput(fault);
      ctx.log.warn("the output failed its schema; generating it again", {
        request_id: ctx.requestId,
        attempt,
        fault: fault.text,
      });
      job.sampling.seed = (job.sampling.seed ?? Math.floor(Math.random() * 2 ** 31)) + 7919;
    }
  }
  const { iterator, prompt } = await start();
  ctx.onStarted?.(prompt.startedAt);
  const chunks = streamChunks(req, job, id, ctx, prompt, iterator, abort, check);
  return { kind: "stream", chunks: logErrors(chunks, toError, ctx), toError };
}

/** Logs the error that ends a stream (once, as it passes) and rethrows it. */
async function* logErrors(
  chunks: AsyncGenerator<ChatChunk>,
  toError: (e: unknown) => ApiError,
  ctx: ChatContext,
): AsyncGenerator<ChatChunk> {
  try {
    yield* chunks;
  } catch (e) {
    const error = toError(e);
    const log = error.status >= 500 && error.status !== 503 && error.status !== 504
      ? ctx.log.error
      : ctx.log.warn;
    log("stream ended with an error", { request_id: ctx.requestId, status: error.status, code: error.code });
    throw error;
  }
}

/** Attempts at output that passes its schema check. */
const MAX_ATTEMPTS = 3;

/** A schema whose check of the output was cut off: the schema is at fault, so no attempt again. */
function uncheckable(reason: string, param: string): ApiError {
  return badRequest(
    `The output could not be checked against the schema: ${reason}. Simplify the schema (its patterns, ` +
      "anyOf/oneOf alternatives or size).",
    param,
    "schema_too_large",
  );
}

/**
 * Why output failed the schema at `param`; `overlap`: it matched several `oneOf` alternatives (the
 * schema's fault).
 */
type Fault = { text: string; param: string; overlap?: { param: string; at: string } };

function invalidOutput(fault: Fault): ApiError {
  if (fault.overlap) {
    const { param, at } = fault.overlap;
    return badRequest(
      `The output matched more than one of the oneOf alternatives at ${
        at ? `'${at}'` : "the top"
      } of ${param}: ` +
        "constrained decoding enforces at least one alternative, not exactly one, so oneOf alternatives that " +
        "overlap cannot be met. Use anyOf, or make the alternatives exclude each other (e.g. a property with a " +
        "different const in each).",
      param,
      "unsupported_schema",
    );
  }
  // Only keywords the grammar leaves to the check can fail (docs/structured-output.md): a schema no
  // value meets (`contains` beside `maxItems: 0`, `uniqueItems` on items that must be equal), or a
  // value the model rarely writes. Not a server fault: the request cannot be met as it stands (422).
  return new ApiError(
    422,
    "invalid_request_error",
    `The model's output did not satisfy the requested schema (${fault.text}), each time it was generated; ` +
      "no answer is returned rather than an invalid one. The keyword at fault is one the grammar cannot enforce " +
      "while generating, only check after: the schema may admit no value, or one the model seldom writes.",
    fault.param,
    "invalid_output",
  );
}

/**
 * Checks a finished choice: undefined when it is valid (or needs no check), else the reason; throws
 * a 400 when the schema is too costly to check.
 */
type OutputCheck = (
  index: number,
  message: { content?: string | null; tool_calls?: ToolCall[] },
  finish: FinishReason,
) => Promise<Fault | undefined>;

/** The fault of a failed check of the schema at `param` (undefined: passed); a 400 when it was cut off. */
function failed(r: CheckResult, param: string): Fault | undefined {
  if (r.ok) return undefined;
  if (r.timedOut) throw uncheckable(r.reason, param);
  return { text: r.reason, param, overlap: r.overlap === undefined ? undefined : { param, at: r.overlap } };
}

/**
 * The check of finished output against the schemas the request promises: the `json_schema`
 * response format, and the parameters of calls that must follow their schema (forced calls and
 * `strict` tools). Output cut by max_tokens is not checked (it cannot be complete).
 */
function outputCheck(req: ChatRequest, job: ChatJob, signal: AbortSignal): OutputCheck | undefined {
  const schema = job.output.type === "json_schema" ? job.output.schema : undefined;
  const forced = job.toolChoice === "required" || typeof job.toolChoice === "object";
  const toolSchemas = new Map(
    (req.tools ?? []).filter((t) => forced || t.function.strict).map((
      t,
    ) => [t.function.name, t.function.parameters ?? {}]),
  );
  if (!schema && toolSchemas.size === 0) return undefined;
  warmSchemaCheck();
  const toolIndex = (name: string) => (req.tools ?? []).findIndex((t) => t.function.name === name);
  return async (_index, message, finish) => {
    if (finish === "length") return undefined;
    if (schema && !(message.tool_calls?.length)) {
      let value: unknown;
      try {
        value = JSON.parse(message.content ?? "");
      } catch {
        return { text: "the content is not JSON", param: "response_format.json_schema.schema" };
      }
      const fault = failed(
        await checkAgainstSchema(schema, value, signal),
        "response_format.json_schema.schema",
      );
      if (fault) return { ...fault, text: `response_format: ${fault.text}` };
    }
    for (const call of message.tool_calls ?? []) {
      const params = toolSchemas.get(call.function.name);
      if (!params) continue;
      const param = `tools[${toolIndex(call.function.name)}].function.parameters`;
      let value: unknown;
      try {
        value = JSON.parse(call.function.arguments);
      } catch {
        return { text: `the arguments of ${call.function.name} are not JSON`, param };
      }
      const fault = failed(await checkAgainstSchema(params, value, signal), param);
      if (fault) return { ...fault, text: `${call.function.name}: ${fault.text}` };
    }
    return undefined;
  };
}

function toApiError(e: unknown, signal: AbortSignal): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof EngineInputError) return badRequest(e.message, e.param, e.code);
  if (e instanceof EngineUpstreamError) return fromUpstreamError(e);
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

/**
 * The engine job for a validated request; rejects combinations the contract forbids. The tools'
 * schemas are measured with turns of the event loop between them (10,000 tools took 60-100 ms).
 */
export async function toJob(
  req: ChatRequest,
  defaultThinking?: boolean,
  signal?: AbortSignal,
): Promise<ChatJob> {
  const tools = (req.tools ?? []).map((t) => ({
    name: t.function.name,
    description: t.function.description ?? undefined,
    parameters: t.function.parameters ?? undefined,
    strict: t.function.strict ?? undefined,
  }));
  // One schema budget for every schema of the request.
  const budget = new Budget();
  const slices = new Slicer(10, signal);
  for (let i = 0; i < tools.length; i++) {
    if (slices.due) await slices.pause();
    checkSchemaLimits(tools[i].parameters, `tools[${i}].function.parameters`, budget);
  }
  if (req.response_format?.type === "json_schema") {
    checkSchemaLimits(req.response_format.json_schema.schema, "response_format.json_schema.schema", budget);
  }
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
  if (req.audio != null || (req.modalities ?? []).some((m) => m !== "text")) {
    throw badRequest(
      "This server generates text only: audio output (modalities ['audio'], audio) is not available.",
      req.audio != null ? "audio" : "modalities",
      "unsupported_value",
    );
  }
  if (req.top_logprobs != null && !req.logprobs) {
    throw badRequest("top_logprobs needs logprobs: true.", "top_logprobs", "invalid_value");
  }
  const stop = req.stop == null ? [] : typeof req.stop === "string" ? [req.stop] : req.stop;
  const job: ChatJob = {
    messages: toEngineMessages(req.messages),
    tools,
    toolChoice,
    parallelToolCalls: req.parallel_tool_calls ?? true,
    output,
    sampling: samplingOptions(req),
    maxTokens: req.max_completion_tokens ?? req.max_tokens ?? undefined,
    stop: stop.filter((s) => s !== ""),
    enableThinking: req.chat_template_kwargs?.enable_thinking ?? defaultThinking,
    n: req.n ?? 1,
    logprobs: req.logprobs ? req.top_logprobs ?? 0 : undefined,
    cachePrompt: req.cache_prompt ?? undefined,
  };
  // A long history's conversion (10,000 calls: 5-15 ms) is not one block with the steps after it.
  await turnIfHeld(5, signal);
  return job;
}

function textOf(content: ChatMessage["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((p) => p.text).join("");
}

/**
 * A system or developer message inside the conversation, as the user-side turn chat templates allow
 * there: its text in `<system-reminder>` tags (the convention of Claude Code and Qwen Code for an
 * application's mid-session instructions), unless it already is one. Every API uses this one rule.
 *
 * @example
 * ```ts
 * systemReminder("Be brief."); // "<system-reminder>\nBe brief.\n</system-reminder>"
 * ```
 */
export function systemReminder(text: string): string {
  const t = text.trim();
  return /^<system-reminder>[\s\S]*<\/system-reminder>$/.test(t)
    ? t
    : `<system-reminder>\n${t}\n</system-reminder>`;
}

/**
 * The conversation as engine messages. Chat templates take one system message, first: the leading
 * run of system / developer messages is joined into it (blank line between), and a later one (an
 * application's mid-conversation instruction) becomes a user turn of its own in its place, wrapped
 * by {@link systemReminder} (one without text is left out). Nothing before it changes, so a
 * session's cached prompt prefix survives.
 */
export function toEngineMessages(messages: ChatMessage[]): EngineMessage[] {
  const callNames = new Map<string, string>();
  const lead = messages.findIndex((m) => m.role !== "system" && m.role !== "developer");
  const leading = lead === -1 ? messages.length : lead;
  const out: EngineMessage[] = leading > 0
    ? [{ role: "system", text: messages.slice(0, leading).map((m) => textOf(m.content)).join("\n\n") }]
    : [];
  return out.concat(
    messages.slice(leading).flatMap((m, k): EngineMessage[] => {
      const i = k + leading;
      switch (m.role) {
        case "system":
        case "developer": {
          const text = textOf(m.content);
          return text.trim() ? [{ role: "user", text: systemReminder(text) }] : [];
        }
        case "user":
          return [{ role: "user", text: textOf(m.content) }];
        case "assistant": {
          const toolCalls = (m.tool_calls ?? []).map((c, j) => {
            callNames.set(c.id, c.function.name);
            return {
              id: c.id,
              name: c.function.name,
              arguments: argumentsObject(c, i, j),
            };
          });
          const reasoning = m.reasoning_content ?? m.reasoning ?? undefined;
          return [{
            role: "assistant",
            text: textOf(m.content),
            toolCalls,
            ...(reasoning ? { reasoning } : {}),
          }];
        }
        case "tool":
          return [{
            role: "tool",
            text: textOf(m.content),
            toolCallId: m.tool_call_id,
            toolName: callNames.get(m.tool_call_id),
          }];
      }
    }),
  );
}

/** History calls' `arguments` parsed ahead by {@link parseHistoryArguments} (undefined: not JSON), by call. */
const parsedArguments = new WeakMap<object, unknown>();

/**
 * Parses the `arguments` of the history's tool calls ahead of {@link toEngineMessages}, a slice at a
 * time and with the body's limits (nesting, arrays and objects: http/json_slices.ts): a JSON text
 * inside a string escapes the checks of the body around it. One call's arguments of 1,000,000
 * nested objects (6 MB) held the event loop 300 ms in `JSON.parse` and the template's recursion,
 * which ended in a stack overflow. Throws a 400 naming the call past a limit.
 */
export async function parseHistoryArguments(messages: ChatMessage[], signal?: AbortSignal): Promise<void> {
  // What came before (a validation, an Anthropic or Responses request's conversion) and the slices
  // here are not one block.
  await turnIfHeld(5, signal);
  const slices = new Slicer(10, signal);
  for (const [i, m] of messages.entries()) {
    if (m.role !== "assistant" || !m.tool_calls) continue;
    for (const [j, call] of m.tool_calls.entries()) {
      const text = call.function.arguments;
      // Per call too: a short text is parsed without a look at the clock (10,000 calls in one block).
      if (slices.due) await slices.pause();
      let value: unknown;
      try {
        value = await parseJsonInSlices(text === "" ? "{}" : text, slices);
      } catch (e) {
        if (!(e instanceof JsonBodyError)) throw abortedError(e);
        if (e.limit) {
          throw badRequest(
            `function.arguments ${
              e.limit === "depth"
                ? `nests arrays and objects more than ${MAX_JSON_DEPTH} levels deep`
                : e.limit === "members"
                ? `holds an object of more than ${MAX_OBJECT_MEMBERS} members`
                : `holds more than ${MAX_JSON_CONTAINERS} arrays and objects`
            }.`,
            `messages[${i}].tool_calls[${j}].function.arguments`,
            "invalid_value",
          );
        }
        value = undefined;
      }
      parsedArguments.set(call, value);
    }
  }
  await turnIfHeld(5, signal);
}

/** A history call's `arguments` (JSON text, as the SDKs send it) as the object templates iterate. */
function argumentsObject(
  call: { function: { arguments: string } },
  i: number,
  j: number,
): Record<string, unknown> {
  const text = call.function.arguments;
  let value: unknown;
  if (parsedArguments.has(call)) value = parsedArguments.get(call);
  else {
    try {
      value = JSON.parse(text === "" ? "{}" : text);
    } catch {
      value = undefined;
    }
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw badRequest(
      'function.arguments must be a JSON object encoded as a string (e.g. \'{"city":"Paris"}\').',
      `messages[${i}].tool_calls[${j}].function.arguments`,
      "invalid_value",
    );
  }
  return value as Record<string, unknown>;
}

type Events = AsyncIterator<ChatEvent>;

/** Everything one choice produced. */
interface ChoiceResult {
  content: string;
  reasoning: string;
  calls: ToolCall[];
  finish: FinishReason;
  tokens: number;
  reasoningTokens: number;
  logprobs: TokenLogprob[];
}

function wireLogprob(e: TokenLogprobInfo): TokenLogprob {
  return {
    token: e.token,
    logprob: e.logprob,
    bytes: e.bytes,
    top_logprobs: e.top.map((t) => ({ token: t.token, logprob: t.logprob, bytes: t.bytes })),
  };
}

function usageOf(
  prompt: { promptTokens: number; cachedTokens: number },
  completion: number,
  reasoning: number,
  final?: Extract<ChatEvent, { type: "usage" }>,
) {
  if (final) return usageOf(final, final.completionTokens, final.reasoningTokens);
  return {
    prompt_tokens: prompt.promptTokens,
    completion_tokens: completion,
    total_tokens: prompt.promptTokens + completion,
    prompt_tokens_details: { cached_tokens: prompt.cachedTokens },
    completion_tokens_details: { reasoning_tokens: reasoning },
  };
}

async function collect(
  req: ChatRequest,
  job: ChatJob,
  id: string,
  ctx: ChatContext,
  prompt: { promptTokens: number; cachedTokens: number },
  events: Events,
  toError: (e: unknown) => ApiError,
): Promise<ChatCompletion> {
  const results: ChoiceResult[] = Array.from({ length: job.n }, () => ({
    content: "",
    reasoning: "",
    calls: [],
    finish: "stop",
    tokens: 0,
    reasoningTokens: 0,
    logprobs: [],
  }));
  let final: Extract<ChatEvent, { type: "usage" }> | undefined;
  try {
    for (let e = await events.next(); !e.done; e = await events.next()) {
      const ev = e.value;
      if (ev.type === "usage") final = ev;
      if (
        ev.type === "prompt" || ev.type === "first_token" || ev.type === "prompt_logprobs" ||
        ev.type === "usage"
      ) continue;
      const r = results[ev.choice];
      switch (ev.type) {
        case "content":
          r.content += ev.text;
          break;
        case "reasoning":
          r.reasoning += ev.text;
          break;
        case "logprobs":
          if (ev.channel === "content") r.logprobs.push(...ev.entries.map(wireLogprob));
          break;
        case "tool_call_start":
          r.calls[ev.index] = { id: ev.id, type: "function", function: { name: ev.name, arguments: "" } };
          break;
        case "tool_call_arguments":
          r.calls[ev.index].function.arguments += ev.text;
          break;
        case "end":
          r.finish = ev.finishReason;
          r.tokens = ev.completionTokens;
          r.reasoningTokens = ev.reasoningTokens;
          break;
      }
    }
  } catch (e) {
    throw toError(e);
  }
  const usage = usageOf(
    prompt,
    results.reduce((n, r) => n + r.tokens, 0),
    results.reduce((n, r) => n + r.reasoningTokens, 0),
    final,
  );
  ctx.onUsage?.(usage);
  return {
    id,
    object: "chat.completion",
    created: ctx.created,
    model: req.model,
    ...(ctx.systemFingerprint ? { system_fingerprint: ctx.systemFingerprint } : {}),
    choices: results.map((r, index) => ({
      index,
      message: {
        role: "assistant",
        content: r.calls.length > 0 && r.content.trim() === "" ? null : r.content,
        ...(r.calls.length > 0 ? { tool_calls: r.calls } : {}),
        ...(r.reasoning ? { reasoning_content: r.reasoning, reasoning: r.reasoning } : {}),
      },
      logprobs: job.logprobs !== undefined ? { content: r.logprobs, refusal: null } : null,
      finish_reason: r.finish,
    })),
    usage,
  };
}

async function* streamChunks(
  req: ChatRequest,
  job: ChatJob,
  id: string,
  ctx: ChatContext,
  prompt: { promptTokens: number; cachedTokens: number },
  events: Events,
  abort: AbortController,
  check?: OutputCheck,
): AsyncGenerator<ChatChunk> {
  // What each choice wrote, for the schema check at its end.
  const written = Array.from({ length: job.n }, () => ({ content: "", calls: [] as ToolCall[] }));
  const chunk = (
    index: number,
    delta: ChatChunk["choices"][0]["delta"],
    finish: FinishReason | null = null,
    logprobs?: TokenLogprob[],
  ): ChatChunk => ({
    id,
    object: "chat.completion.chunk",
    created: ctx.created,
    model: req.model,
    ...(ctx.systemFingerprint ? { system_fingerprint: ctx.systemFingerprint } : {}),
    choices: [{
      index,
      delta,
      logprobs: logprobs ? { content: logprobs, refusal: null } : null,
      finish_reason: finish,
    }],
  });
  let completed = false;
  let tokens = 0;
  let reasoningTokens = 0;
  let final: Extract<ChatEvent, { type: "usage" }> | undefined;
  try {
    for (let i = 0; i < job.n; i++) yield chunk(i, { role: "assistant", content: "" });
    for (let e = await events.next(); !e.done; e = await events.next()) {
      const ev = e.value;
      switch (ev.type) {
        case "usage":
          final = ev;
          break;
        case "content":
          written[ev.choice].content += ev.text;
          yield chunk(ev.choice, { content: ev.text });
          break;
        case "reasoning":
          yield chunk(ev.choice, { reasoning_content: ev.text, reasoning: ev.text });
          break;
        case "logprobs":
          if (ev.channel === "content") yield chunk(ev.choice, {}, null, ev.entries.map(wireLogprob));
          break;
        case "tool_call_start":
          written[ev.choice].calls[ev.index] = {
            id: ev.id,
            type: "function",
            function: { name: ev.name, arguments: "" },
          };
          yield chunk(ev.choice, {
            tool_calls: [{
              index: ev.index,
              id: ev.id,
              type: "function",
              function: { name: ev.name, arguments: "" },
            }],
          });
          break;
        case "tool_call_arguments":
          written[ev.choice].calls[ev.index].function.arguments += ev.text;
          yield chunk(ev.choice, { tool_calls: [{ index: ev.index, function: { arguments: ev.text } }] });
          break;
        case "end": {
          // A stream cannot take back what it sent: output failing its schema ends in an error event.
          const w = written[ev.choice];
          const fault = await check?.(ev.choice, {
            content: w.content,
            tool_calls: w.calls.length ? w.calls : undefined,
          }, ev.finishReason);
          if (fault) throw invalidOutput(fault);
          tokens += ev.completionTokens;
          reasoningTokens += ev.reasoningTokens;
          yield chunk(ev.choice, {}, ev.finishReason);
          break;
        }
      }
    }
    const usage = usageOf(prompt, tokens, reasoningTokens, final);
    ctx.onUsage?.(usage);
    if (req.stream_options?.include_usage) {
      yield {
        id,
        object: "chat.completion.chunk",
        created: ctx.created,
        model: req.model,
        choices: [],
        usage,
      };
    }
    completed = true;
  } finally {
    if (!completed) {
      // The client went away (or the consumer stopped): stop generation and free the sequences now.
      abort.abort(new DOMException("stream cancelled", "AbortError"));
      await events.return?.();
      ctx.log.info("stream cancelled", { request_id: ctx.requestId });
    }
  }
}
