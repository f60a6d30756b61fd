/**
 * The model's own chat template as the chat engine uses it: rendered on the event loop when the
 * input is small, and on a worker thread of its own (`template_worker.ts`) when it is large, so the
 * event loop goes on serving meanwhile. The rendering itself is `template_render.ts`.
 */
import type { PromptPieces } from "../markup.ts";
import { EngineInputError } from "../types.ts";
import {
  type TemplateInput,
  TemplateRenderer,
  type TemplateSource,
  unpackPrompt,
} from "./template_render.ts";
import type { RenderReply, RenderRequest, WireCall } from "./template_worker.ts";
import type { EngineMessage } from "../types.ts";
import { helperWork, Slicer, turnIfHeld } from "../../event_loop.ts";

export type { TemplateInput, TemplateSource } from "./template_render.ts";

/**
 * Inputs up to this size render on the event loop (the 17k-token agent prompt of 15 tools renders
 * in 1-2 ms); larger ones on the worker. Size: messages, 3 per tool, and thousands of characters.
 */
const INLINE_RENDER_SIZE = 256;

/** A parsed chat template whose large inputs render on a worker thread. */
export class ChatTemplate extends TemplateRenderer {
  readonly #init: TemplateSource;
  #worker?: RenderWorker;

  constructor(init: TemplateSource) {
    super(init);
    this.#init = init;
  }

  /**
   * {@link render}, on the worker thread when the input is large: a history of thousands of
   * messages takes the interpreter hundreds of milliseconds.
   */
  async renderAsync(input: TemplateInput, signal?: AbortSignal): Promise<PromptPieces> {
    const small = renderSize(input) <= INLINE_RENDER_SIZE;
    // The request's steps before (its conversion, the weighing here) are not one block with the render.
    await turnIfHeld(5, signal);
    if (small) return this.render(input);
    if (this.#worker?.failed) this.dispose();
    this.#worker ??= new RenderWorker(this.#init);
    return await this.#worker.render(input, signal);
  }

  /** Stops the worker thread, if one was started. */
  dispose(): void {
    this.#worker?.terminate();
    this.#worker = undefined;
  }
}

/**
 * Characters a value is taken for in {@link renderSize}: the template's interpreter converts and
 * prints every value and key of a call's arguments or a tool's schema (`tojson`), so each counts as
 * this many characters besides its own text.
 */
const VALUE_CHARS = 40;

/**
 * The cost of rendering `input`, in the units of {@link INLINE_RENDER_SIZE}: past the limit, only
 * that it is past. A call's arguments and a tool's schema count by what they hold: one call of a
 * 2,000,000-number array (4 MB of JSON) counted as 200 characters, and rendered here.
 */
function renderSize(input: TemplateInput): number {
  const limit = INLINE_RENDER_SIZE * 1000;
  let chars = 0;
  for (const m of input.messages) {
    chars += m.text.length;
    if (m.role === "assistant") {
      chars += m.reasoning?.length ?? 0;
      for (const c of m.toolCalls) {
        if (chars > limit) break;
        chars += 200 + valueChars(c.arguments, limit - chars);
      }
    }
  }
  for (const t of input.tools) {
    if (chars > limit) break;
    chars += (t.description?.length ?? 0) + Math.max(2000, valueChars(t.parameters, limit - chars));
  }
  return input.messages.length + input.tools.length + chars / 1000;
}

/**
 * {@link VALUE_CHARS} for each value and key in `value` plus their strings' lengths, looked at only
 * until the count passes `limit` (a wide value costs no more to weigh than one just over it).
 */
function valueChars(value: unknown, limit: number): number {
  let chars = 0;
  const visit = (v: unknown): void => {
    chars += VALUE_CHARS;
    if (typeof v === "string") chars += v.length;
    else if (Array.isArray(v)) {
      for (let i = 0; i < v.length && chars <= limit; i++) visit(v[i]);
    } else if (typeof v === "object" && v !== null) {
      for (const k in v) {
        if (chars > limit) break;
        chars += VALUE_CHARS + k.length;
        visit((v as Record<string, unknown>)[k]);
      }
    }
  };
  visit(value);
  return chars;
}

/**
 * Call arguments of more than this many characters (by {@link valueChars}) go to the worker as JSON
 * text: a structured clone copies each value on this thread, 2,000,000 numbers in 56-106 ms and
 * 25 calls of 99,990 empty arrays in 0.5 s in one message, while their text is 15-31 and 2.5 ms a
 * call to write (between turns) and is copied whole.
 */
const WIDE_ARGUMENTS = 100_000;

/** `messages` with their calls' wide arguments as JSON text ({@link WireCall}), turns between calls. */
async function withWideArgumentsAsText(messages: EngineMessage[], slices: Slicer): Promise<EngineMessage[]> {
  const out: EngineMessage[] = [];
  for (const m of messages) {
    if (m.role !== "assistant" || m.toolCalls.length === 0) {
      out.push(m);
      continue;
    }
    const toolCalls: WireCall[] = [];
    for (const c of m.toolCalls) {
      if (valueChars(c.arguments, WIDE_ARGUMENTS) <= WIDE_ARGUMENTS) toolCalls.push(c);
      else {
        if (slices.due) await slices.pause();
        toolCalls.push({ id: c.id, name: c.name, arguments: {}, argumentsJson: JSON.stringify(c.arguments) });
      }
    }
    out.push({ ...m, toolCalls });
  }
  return out;
}

/**
 * Messages or tools posted to the worker in one message: each message is copied (structured clone)
 * on this thread, and 10,000 tools' schemas (~100,000 objects) in one took it 10-16 ms.
 */
const PART_ITEMS = 256;

/** The worker thread that renders large inputs, one at a time in arrival order. */
class RenderWorker {
  readonly #worker: Worker;
  readonly #waiting = new Map<number, (reply: RenderReply) => void>();
  #next = 0;
  /** The thread died (its next user starts another). */
  failed = false;

  constructor(init: TemplateSource) {
    this.#worker = new Worker(new URL("./template_worker.ts", import.meta.url), { type: "module" });
    this.#worker.onmessage = (e: MessageEvent<RenderReply>) => {
      const waiter = this.#waiting.get(e.data.id);
      this.#waiting.delete(e.data.id);
      waiter?.(e.data);
    };
    this.#worker.onerror = (e) => {
      e.preventDefault();
      this.failed = true;
      const reply = { ok: false as const, input: false, message: e.message, param: null, code: null };
      for (const [id, waiter] of this.#waiting) waiter({ id, ...reply });
      this.#waiting.clear();
    };
    this.#worker.postMessage({ type: "init", init } satisfies RenderRequest);
  }

  /** The prompt of `input`, rendered on the worker (which is at work meanwhile: see helperWork). */
  async render(input: TemplateInput, signal?: AbortSignal): Promise<PromptPieces> {
    const done = helperWork();
    try {
      return await this.#render(input, signal);
    } finally {
      done();
    }
  }

  async #render(input: TemplateInput, signal?: AbortSignal): Promise<PromptPieces> {
    signal?.throwIfAborted();
    const id = this.#next++;
    // The messages and tools go a part at a time, with turns of the event loop between parts once
    // a slice of this thread's time is used; the worker puts them together (in the order sent).
    const slices = new Slicer(5, signal);
    try {
      for (const key of ["messages", "tools"] as const) {
        const list = input[key];
        for (let at = 0; at < list.length; at += PART_ITEMS) {
          if (slices.due) await slices.pause();
          let items = list.slice(at, at + PART_ITEMS);
          if (key === "messages") items = await withWideArgumentsAsText(items as EngineMessage[], slices);
          this.#worker.postMessage({ type: "part", id, key, items } satisfies RenderRequest);
        }
      }
      if (slices.due) await slices.pause();
    } catch (e) {
      // Aborted: the worker lets go of the parts it holds for this render.
      this.#worker.postMessage({ type: "drop", id } satisfies RenderRequest);
      throw e;
    }
    const rest = { ...input, messages: [], tools: [] };
    const reply = await new Promise<RenderReply>((resolve, reject) => {
      const onAbort = () => {
        this.#waiting.delete(id);
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiting.set(id, (r) => {
        signal?.removeEventListener("abort", onAbort);
        resolve(r);
      });
      this.#worker.postMessage({ type: "render", id, input: rest } satisfies RenderRequest);
    });
    if (reply.ok) return await unpackPrompt(reply.prompt, new Slicer(10, signal));
    if (reply.input) throw new EngineInputError(reply.message, reply.param, reply.code);
    throw new Error(`the template worker failed: ${reply.message}`);
  }

  terminate(): void {
    this.#worker.terminate();
  }
}
