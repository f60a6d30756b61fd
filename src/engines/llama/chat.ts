/**
 * GGUF chat models through node-llama-cpp. The prompt is the GGUF's own Jinja chat template
 * rendered with the OpenAI-shaped history; generation runs on one of N sequences of a shared
 * context (concurrent requests decode in shared batches); grammars enforce JSON output and
 * forced tool calls; tool calls are parsed and returned, never executed.
 */
import {
  type Llama,
  LlamaCompletion,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaGrammar,
  type LlamaModel,
  type Token,
  TokenBias,
} from "node-llama-cpp";
import { Template } from "@huggingface/jinja";
import type { ChatEngine, ChatEvent, ChatJob, EngineMessage } from "../types.ts";
import { EngineInputError } from "../types.ts";
import type { Logger } from "../../log.ts";
import { QwenOutputParser } from "./output_parser.ts";
import { toGrammarSchema } from "./json_schema.ts";

/** How to load a GGUF chat model. */
export interface LlamaChatOptions {
  modelPath: string;
  gpuLayers?: number | "auto" | "max";
  threads: number;
  parallel: number;
  contextSize: number;
  log: Logger;
}

/** The tag that opens a tool call in Qwen's format. */
const TOOL_OPEN = "<tool_call>";

/** Most tool calls one turn may hold (bounds the grammar's repetition). */
const MAX_PARALLEL_CALLS = 8;

/** A chat model with a pool of sequences. */
export class LlamaChatEngine implements ChatEngine {
  readonly contextSize: number;
  readonly #llama: Llama;
  readonly #model: LlamaModel;
  readonly #context: LlamaContext;
  readonly #template: Template;
  readonly #idle: LlamaContextSequence[];
  readonly #waiting: ((s: LlamaContextSequence) => void)[] = [];
  readonly #log: Logger;
  readonly #specials: { bos: string; eos: string };

  private constructor(llama: Llama, model: LlamaModel, context: LlamaContext, template: string, log: Logger) {
    this.#llama = llama;
    this.#model = model;
    this.#context = context;
    this.#template = new Template(template);
    this.#log = log;
    this.contextSize = context.contextSize;
    this.#idle = Array.from({ length: context.totalSequences }, () => context.getSequence());
    this.#specials = {
      bos: model.tokens.bosString ?? "",
      eos: model.tokens.eosString ?? "",
    };
  }

  /** Loads the model and one context with `parallel` sequences of `contextSize` tokens each. */
  static async load(llama: Llama, opts: LlamaChatOptions): Promise<LlamaChatEngine> {
    const model = await llama.loadModel({ modelPath: opts.modelPath, gpuLayers: opts.gpuLayers });
    const template = model.fileInfo.metadata.tokenizer?.chat_template;
    if (typeof template !== "string" || template === "") {
      await model.dispose();
      throw new Error(`'${opts.modelPath}' has no chat template (tokenizer.chat_template)`);
    }
    const context = await model.createContext({
      contextSize: opts.contextSize,
      sequences: opts.parallel,
      threads: opts.threads,
      batchSize: Math.min(opts.contextSize, 2048),
    });
    return new LlamaChatEngine(llama, model, context, template, opts.log);
  }

  /** The prompt text for a job, rendered with the model's chat template. */
  renderPrompt(job: ChatJob): string {
    return this.#template.render({
      messages: toTemplateMessages(job.messages),
      tools: job.tools.length > 0 && job.toolChoice !== "none"
        ? job.tools.map((t) => ({
          type: "function",
          function: { name: t.name, description: t.description ?? "", parameters: t.parameters ?? {} },
        }))
        : undefined,
      add_generation_prompt: true,
      enable_thinking: job.enableThinking,
      bos_token: this.#specials.bos,
      eos_token: this.#specials.eos,
    });
  }

  async *generate(job: ChatJob, signal: AbortSignal): AsyncGenerator<ChatEvent> {
    const prompt = this.renderPrompt(job);
    const tokens = this.#model.tokenize(prompt, true);
    const limit = this.contextSize;
    if (tokens.length + (job.maxTokens ?? 1) > limit) {
      throw new EngineInputError(
        `This model's context window is ${limit} tokens; the messages take ${tokens.length} tokens` +
          (job.maxTokens ? ` and max_tokens asks for ${job.maxTokens} more` : "") +
          ". Shorten the messages or lower max_tokens.",
        "messages",
        "context_length_exceeded",
      );
    }
    const grammar = await this.#grammarFor(job);
    const callGrammar = grammar === undefined && job.toolChoice === "auto" && job.tools.length > 0
      ? await this.#lazyCallGrammar(job)
      : undefined;
    signal.throwIfAborted();
    const sequence = await this.#acquire(signal);
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    const queue = new EventQueue<ChatEvent>();
    let completionTokens = 0;
    const parser = new QwenOutputParser(/<think>\s*$/.test(prompt));
    let calls = 0;
    const forward = (pieces: ReturnType<QwenOutputParser["push"]>) => {
      for (const p of pieces) {
        if (p.type === "tool_call") {
          calls++;
          queue.push({
            type: "tool_call",
            call: {
              id: `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
              name: p.name,
              arguments: p.arguments,
            },
          });
        } else if (p.type === "invalid_tool_call") queue.push({ type: "content", text: p.raw });
        else queue.push(p);
      }
    };
    const s = job.sampling;
    const penalize = s.presencePenalty || s.frequencyPenalty || (s.repeatPenalty && s.repeatPenalty !== 1);
    const completion = new LlamaCompletion({ contextSequence: sequence });
    const budget = job.maxTokens ?? limit - tokens.length;
    const options = (phaseGrammar: LlamaGrammar | undefined, triggers: string[], maxTokens: number) => ({
      maxTokens,
      temperature: s.temperature ?? 1,
      topP: s.topP,
      topK: s.topK,
      minP: s.minP,
      seed: s.seed,
      repeatPenalty: penalize
        ? {
          penalty: s.repeatPenalty ?? 1,
          presencePenalty: s.presencePenalty ?? 0,
          frequencyPenalty: s.frequencyPenalty ?? 0,
          lastTokens: 64,
        }
        : false as const,
      tokenBias: this.#tokenBias(s.logitBias),
      grammar: phaseGrammar,
      customStopTriggers: triggers.length > 0 ? triggers : undefined,
      signal: stop.signal,
      onToken: (t: readonly unknown[]) => {
        if (completionTokens === 0 && t.length > 0) queue.push({ type: "first_token" });
        completionTokens += t.length;
      },
    });
    // With tool_choice auto, text is free until the model opens a tool call; the call itself is then
    // generated under the tool-call grammar (a lazy grammar, as llama-server does it).
    const lazyCalls = callGrammar !== undefined;
    const run = (async () => {
      let text = "";
      let res = await completion.generateCompletionWithMeta(tokens, {
        ...options(grammar, lazyCalls ? [...job.stop, TOOL_OPEN] : job.stop, budget),
        onTextChunk: (chunk) => {
          text += chunk;
          forward(parser.push(chunk));
        },
      });
      const opened = res.metadata.stopReason === "customStopTrigger" &&
        res.metadata.customStopTrigger.join("") === TOOL_OPEN;
      if (lazyCalls && opened && budget - completionTokens > 0) {
        forward(parser.push(TOOL_OPEN));
        res = await completion.generateCompletionWithMeta(
          this.#model.tokenize(prompt + text + TOOL_OPEN, true),
          {
            ...options(callGrammar, job.stop, budget - completionTokens),
            onTextChunk: (chunk) => forward(parser.push(chunk)),
          },
        );
      }
      forward(parser.end());
      const finishReason = res.metadata.stopReason === "maxTokens"
        ? "length"
        : calls > 0
        ? "tool_calls"
        : "stop";
      queue.push({ type: "end", finishReason, completionTokens });
      queue.close();
    })().catch((e) => queue.fail(e));
    try {
      yield { type: "prompt", promptTokens: tokens.length };
      yield* queue;
    } finally {
      if (!stop.signal.aborted) stop.abort(new DOMException("generation stopped", "AbortError"));
      await run.catch(() => {});
      signal.removeEventListener("abort", onAbort);
      completion.dispose({ disposeSequence: false });
      this.#release(sequence);
    }
  }

  async #grammarFor(job: ChatJob): Promise<LlamaGrammar | undefined> {
    if (job.toolChoice === "required") return await this.#toolCallGrammar(job, job.tools, false);
    if (typeof job.toolChoice === "object") {
      const name = job.toolChoice.name;
      return await this.#toolCallGrammar(job, job.tools.filter((t) => t.name === name), false);
    }
    if (job.output.type === "text") return undefined;
    const schema = job.output.type === "json_schema"
      ? toGrammarSchema(job.output.schema, "response_format.json_schema.schema")
      : { type: "object", additionalProperties: true };
    const json = await this.#jsonGrammarText(schema);
    if (!job.enableThinking) {
      return await this.#llama.createGrammar({ grammar: json });
    }
    return await this.#llama.createGrammar({
      grammar: `root ::= ${this.#thinkPrefix(job)}payload\n${json.replace(/^root ::=/m, "payload ::=")}`,
    });
  }

  /**
   * Tool calls in the model's format: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`,
   * one or (with parallel calls) up to MAX_PARALLEL_CALLS, each matching one tool's schema.
   * `opened`: the first `<tool_call>` is already written (lazy grammar after the trigger).
   */
  async #toolCallGrammar(job: ChatJob, tools: ChatJob["tools"], opened: boolean): Promise<LlamaGrammar> {
    const callSchema = {
      oneOf: tools.map((t) => ({
        type: "object",
        properties: {
          name: { const: t.name },
          arguments: toGrammarSchema(
            t.parameters ?? { type: "object" },
            `tools[${job.tools.indexOf(t)}].function.parameters`,
          ),
        },
        required: ["name", "arguments"],
        additionalProperties: false,
      })),
    };
    const json = await this.#jsonGrammarText(callSchema);
    const body = `"\\n" call-json "\\n</tool_call>"`;
    const call = `"${TOOL_OPEN}" ${body}`;
    const more = job.parallelToolCalls ? ` ("\\n" ${call}){0,${MAX_PARALLEL_CALLS - 1}}` : "";
    const first = opened ? body : `${this.#thinkPrefix(job)}${call}`;
    return await this.#llama.createGrammar({
      grammar: `root ::= ${first}${more}\n${json.replace(/^root ::=/m, "call-json ::=")}`,
    });
  }

  /**
   * The grammar for calls the model opens under `auto`, or none when a tool's schema cannot be
   * enforced: `auto` promises no grammar, so such calls are parsed from free text instead of failing.
   */
  async #lazyCallGrammar(job: ChatJob): Promise<LlamaGrammar | undefined> {
    try {
      return await this.#toolCallGrammar(job, job.tools, true);
    } catch (e) {
      if (!(e instanceof EngineInputError)) throw e;
      this.#log.debug("tool calls under auto are not grammar-constrained", { reason: e.message });
      return undefined;
    }
  }

  /** OpenAI `logit_bias` as node-llama-cpp token biases (-100 = never). */
  #tokenBias(bias: Record<number, number> | undefined): TokenBias | undefined {
    if (!bias) return undefined;
    const out = new TokenBias(this.#model.tokenizer);
    for (const [token, value] of Object.entries(bias)) {
      out.set(Number(token) as Token, value <= -100 ? "never" : { logit: value });
    }
    return out;
  }

  /** With thinking on, a constrained answer may start with a reasoning block. */
  #thinkPrefix(job: ChatJob): string {
    return job.enableThinking ? `("<think>" [^<]* "</think>" "\\n"{0,2})? ` : "";
  }

  async #jsonGrammarText(schema: unknown): Promise<string> {
    try {
      // deno-lint-ignore no-explicit-any
      const g = await this.#llama.createGrammarForJsonSchema(schema as any);
      // node-llama-cpp ends JSON with forced newlines plus a stop trigger; ending the grammar at
      // the closing brace instead lets only end-of-generation follow the JSON.
      return tightenJsonGrammar(g.grammar);
    } catch (e) {
      throw new EngineInputError(
        `The JSON schema cannot be turned into a grammar: ${(e as Error).message}`,
        "response_format",
        "unsupported_schema",
      );
    }
  }

  #acquire(signal: AbortSignal): Promise<LlamaContextSequence> {
    const idle = this.#idle.pop();
    if (idle) return Promise.resolve(idle);
    return new Promise((resolve, reject) => {
      const waiter = (s: LlamaContextSequence) => {
        signal.removeEventListener("abort", onAbort);
        resolve(s);
      };
      const onAbort = () => {
        const i = this.#waiting.indexOf(waiter);
        if (i >= 0) this.#waiting.splice(i, 1);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.#waiting.push(waiter);
    });
  }

  #release(sequence: LlamaContextSequence) {
    const next = this.#waiting.shift();
    if (next) next(sequence);
    else this.#idle.push(sequence);
  }

  /** Sequences not in use (for health and tests). */
  get idleSequences(): number {
    return this.#idle.length;
  }

  async dispose(): Promise<void> {
    await this.#context.dispose();
    await this.#model.dispose();
  }
}

/**
 * Adjusts node-llama-cpp's JSON grammar: it ends JSON with forced newlines plus a stop trigger,
 * so the root ends at the closing brace instead (only end-of-generation may follow); and its
 * numbers allow 16-digit exponents (`1e999999` parses to Infinity, `1e-5` is no integer), so
 * integers get none and other numbers at most two exponent digits.
 */
export function tightenJsonGrammar(grammar: string): string {
  const exponent = '([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?';
  return grammar
    .replace(/^(root ::= .*?)\s*"(?:\\n)+"\s*\[\\n\]\*\s*$/m, "$1")
    .replace(
      /^(integer-number-rule ::= .*?) ?(\(\[eE\] .*\)\?)$/m,
      (_m, head: string, exp: string) => exp === exponent ? head : _m,
    )
    .replace(
      /^(fractional-number-rule ::= .*?)(\(\[eE\] .*\)\?)$/m,
      (_m, head: string, exp: string) => exp === exponent ? `${head}([eE] [-+]? [0-9]{1,2})?` : _m,
    );
}

/** The history in the shape chat templates expect (OpenAI-like, content always a string). */
function toTemplateMessages(messages: EngineMessage[]) {
  return messages.map((m) => {
    switch (m.role) {
      case "assistant":
        return {
          role: "assistant",
          content: m.text,
          ...(m.reasoning ? { reasoning_content: m.reasoning } : {}),
          ...(m.toolCalls.length > 0
            ? {
              tool_calls: m.toolCalls.map((c) => ({
                id: c.id,
                type: "function",
                function: { name: c.name, arguments: c.arguments },
              })),
            }
            : {}),
        };
      case "tool":
        return {
          role: "tool",
          content: m.text,
          tool_call_id: m.toolCallId,
          ...(m.toolName ? { name: m.toolName } : {}),
        };
      default:
        return { role: m.role, content: m.text };
    }
  });
}

/** A push-to-pull bridge from callbacks to an async iterator. */
class EventQueue<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #closed = false;
  #error: unknown;
  #failed = false;
  #wake: (() => void) | undefined;

  push(item: T) {
    this.#items.push(item);
    this.#wake?.();
  }
  close() {
    this.#closed = true;
    this.#wake?.();
  }
  fail(e: unknown) {
    this.#failed = true;
    this.#error = e;
    this.#wake?.();
  }
  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    while (true) {
      if (this.#items.length > 0) {
        yield this.#items.shift()!;
        continue;
      }
      if (this.#failed) throw this.#error;
      if (this.#closed) return;
      await new Promise<void>((r) => (this.#wake = r));
      this.#wake = undefined;
    }
  }
}
