/**
 * The model's own Jinja chat template (from the GGUF), rendered with `@huggingface/jinja` (the
 * facts the engine reads from it are `template_facts.ts`). The rendering itself, on
 * whichever thread calls it: the server's (`template.ts`) and the render worker's
 * (`template_worker.ts`) alike.
 *
 * Client strings never become markup: they are rendered with their special-token strings hidden
 * and come back as plain-text pieces ({@link Markup}).
 */
import { Template } from "@huggingface/jinja";
import type { EngineMessage, EngineTool } from "../types.ts";
import { EngineInputError } from "../types.ts";
import { Markup, type MarkupToken, type PromptPieces, TooManyMarkupStrings } from "../markup.ts";
import type { Slicer } from "../../event_loop.ts";

/** What a prompt is rendered from. */
export interface TemplateInput {
  messages: readonly EngineMessage[];
  tools: readonly EngineTool[];
  thinking: boolean | undefined;
  /** False: without the generation prompt (`add_generation_prompt`; default true). */
  generationPrompt?: boolean;
}

/** How a template is built (also what its worker receives). */
export interface TemplateSource {
  source: string;
  specials: { bos: string; eos: string };
  markup: readonly MarkupToken[];
}

/** A parsed chat template. */
export class TemplateRenderer {
  readonly #template: Template;
  readonly #specials: { bos_token: string; eos_token: string };
  readonly #markup: Markup;
  /** The template splits `<think>…</think>` out of assistant content (Qwen's templates do). */
  readonly #splitsThink: boolean;
  readonly source: string;

  constructor(init: TemplateSource) {
    this.source = init.source;
    this.#template = new Template(init.source);
    this.#specials = { bos_token: init.specials.bos, eos_token: init.specials.eos };
    this.#markup = new Markup(init.markup);
    this.#splitsThink = init.source.includes("</think>");
  }

  /** The vocabulary's markup strings. */
  get markup(): Markup {
    return this.#markup;
  }

  /**
   * The prompt for `messages`, split at the template's markup ({@link Markup.split}); a template
   * error (its `raise_exception`, or a history it cannot render) is an {@link EngineInputError}
   * carrying the template's message.
   *
   * @example
   * ```ts
   * const template = new TemplateRenderer({
   *   source: "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}",
   *   specials: { bos: "", eos: "<|im_end|>" },
   *   markup: [{ text: "<|im_end|>", id: 2, matchedInText: false }],
   * });
   * template.render({ messages: [{ role: "user", text: "Hi" }], tools: [], thinking: true });
   * // { text: "user: Hi<|im_end|>\n", pieces: ["user: Hi", 2, "\n"] }
   * ```
   */
  render(input: TemplateInput): PromptPieces {
    const hider = this.#markup.hider();
    let rendered: string;
    try {
      const context = {
        messages: hider.hideDeep(toTemplateMessages(input.messages, this.#splitsThink)),
        tools: input.tools.length > 0
          ? hider.hideDeep(input.tools.map((t) => ({
            type: "function",
            function: { name: t.name, description: t.description ?? "", parameters: t.parameters ?? {} },
          })))
          : undefined,
        add_generation_prompt: input.generationPrompt ?? true,
        ...(input.thinking === undefined ? {} : { enable_thinking: input.thinking }),
        ...this.#specials,
      };
      rendered = this.#template.render(context);
    } catch (e) {
      if (e instanceof TooManyMarkupStrings) {
        throw new EngineInputError(e.message, "messages", "invalid_value");
      }
      const reason = (e as Error).message?.replace(/^Error:\s*/, "") || String(e);
      throw new EngineInputError(
        `The model's chat template cannot render these messages: ${reason}`,
        "messages",
        "invalid_messages",
      );
    }
    return this.#markup.split(rendered, hider);
  }

  /**
   * A lower bound of the prompt tokens of `messages`, found without rendering them: per message,
   * the markup tokens and plain-text runs one more message of its role adds (probed once: runs
   * between markup tokens hold at least one token each), with more for the run of a text longer
   * than one of the vocabulary's longest tokens. Lets a history far past the context be refused at
   * once (`longestToken`: in characters; UTF-8 bytes are never fewer than UTF-16 units).
   */
  promptFloor(messages: readonly EngineMessage[], longestToken: number): number {
    this.#costs ??= this.#messageCosts();
    let floor = 0;
    for (const m of messages) {
      const cost = this.#costs[m.role];
      // Its text lies in one of its runs, whose tokens hold at most `longestToken` characters each.
      floor += cost.markup +
        (cost.runs === 0 ? 0 : cost.runs - 1 + Math.max(1, Math.ceil(m.text.length / longestToken)));
    }
    return floor;
  }

  #costs?: Record<EngineMessage["role"], { markup: number; runs: number }>;

  /**
   * What one more message of each role adds to a prompt at least: markup tokens and plain-text
   * runs, the fewest over the places a message can take (after a user query, after one of its own
   * role, before a user query: templates render the last message, runs of a role and turns before
   * the last query differently). Places the template refuses are skipped; a role it refuses
   * everywhere adds 0.
   */
  #messageCosts(): Record<EngineMessage["role"], { markup: number; runs: number }> {
    const count = (messages: EngineMessage[]) => {
      const { pieces } = this.render({ messages, tools: [], thinking: undefined });
      let markup = 0;
      let runs = 0;
      for (let i = 0; i < pieces.length; i++) {
        if (typeof pieces[i] === "number") markup++;
        else if (i === 0 || typeof pieces[i - 1] === "number") runs++;
      }
      return { markup, runs };
    };
    const q: EngineMessage = { role: "user", text: "" };
    const samples: Record<EngineMessage["role"], EngineMessage> = {
      user: { role: "user", text: "" },
      system: { role: "system", text: "" },
      assistant: { role: "assistant", text: "", toolCalls: [] },
      tool: { role: "tool", text: "", toolCallId: "call_0" },
    };
    const costs = {} as Record<EngineMessage["role"], { markup: number; runs: number }>;
    for (const [role, r] of Object.entries(samples) as [EngineMessage["role"], EngineMessage][]) {
      let markup = Infinity;
      let runs = Infinity;
      for (const [without, withIt] of [[[q], [q, r]], [[q, r], [q, r, r]], [[q, q], [q, r, q]]]) {
        try {
          const a = count(without);
          const b = count(withIt);
          markup = Math.min(markup, b.markup - a.markup);
          runs = Math.min(runs, b.runs - a.runs);
        } catch {
          // a place this template refuses
        }
      }
      costs[role] = {
        markup: Number.isFinite(markup) ? Math.max(0, markup) : 0,
        runs: Number.isFinite(runs) ? Math.max(0, runs) : 0,
      };
    }
    return costs;
  }
}

/** The history in the shape chat templates expect (OpenAI-like; call arguments as objects). */
function toTemplateMessages(messages: readonly EngineMessage[], splitsThink: boolean) {
  return messages.map((m) => {
    switch (m.role) {
      case "assistant": {
        // A reasoning block in the content, as some clients send the model's output back: the
        // template would split it out at `</think>`; it is the message's reasoning (as text).
        let text = m.text;
        let reasoning = m.reasoning;
        if (splitsThink && !reasoning && text.includes("</think>")) {
          const [before] = text.split("</think>", 1);
          reasoning = before.replace(/\n+$/, "").split("<think>").at(-1)!.replace(/^\n+/, "");
          text = text.slice(text.lastIndexOf("</think>") + "</think>".length).replace(/^\n+/, "");
        }
        return {
          role: "assistant",
          content: text,
          ...(reasoning ? { reasoning_content: reasoning } : {}),
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
      }
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

/**
 * A rendered prompt as the render worker sends it: its text pieces one after another in `joined`,
 * and per piece in `marks` a text piece's length (from 0) or a token id `t` as `-t - 1`. A
 * markup-dense message is 400,000 pieces, which as an array of strings took this thread 30-70 ms
 * to receive in one block; this is two strings and a buffer handed over.
 */
export interface PackedPrompt {
  text: string;
  joined: string;
  marks: Int32Array<ArrayBuffer>;
}

/** `prompt` packed for the way back from the worker (see {@link PackedPrompt}). */
export function packPrompt(prompt: PromptPieces): PackedPrompt {
  const marks = new Int32Array(prompt.pieces.length);
  const texts: string[] = [];
  prompt.pieces.forEach((piece, i) => {
    if (typeof piece === "number") marks[i] = -piece - 1;
    else {
      marks[i] = piece.length;
      texts.push(piece);
    }
  });
  return { text: prompt.text, joined: texts.join(""), marks };
}

/** Pieces unpacked between turns of the event loop. */
const UNPACK_RUN = 4096;

/**
 * The prompt of a {@link PackedPrompt}, its pieces unpacked a run at a time with turns of the event
 * loop between `slices`.
 *
 * @example
 * ```ts
 * import { Slicer } from "../../event_loop.ts";
 * const packed = packPrompt({ text: "<s>hi", pieces: [1, "hi"] });
 * await unpackPrompt(packed, new Slicer(10)); // { text: "<s>hi", pieces: [1, "hi"] }
 * ```
 */
export async function unpackPrompt(packed: PackedPrompt, slices: Slicer): Promise<PromptPieces> {
  const pieces: (number | string)[] = [];
  const { joined, marks } = packed;
  let at = 0;
  for (let i = 0; i < marks.length; i++) {
    if (i % UNPACK_RUN === 0 && slices.due) await slices.pause();
    const mark = marks[i];
    if (mark < 0) pieces.push(-mark - 1);
    else {
      pieces.push(joined.slice(at, at + mark));
      at += mark;
    }
  }
  return { text: packed.text, pieces };
}
