/**
 * What the chat engine reads from a model's chat template, in one place and once, at load: the
 * markup token that opens a turn (where recurrent-state checkpoints go), whether `enable_thinking`
 * switches thinking and its default, the thinking markers, and the tool-call dialect.
 */
import type { TemplateInput, TemplateRenderer } from "./template_render.ts";
import { dialectOfTemplate, type ToolDialect } from "./dialects/index.ts";

/** What a template does with thinking. */
export interface ThinkingFacts {
  /** `enable_thinking` changes the prompt. */
  switchable: boolean;
  /** Thinking when the request does not say. */
  defaultOn: boolean;
}

/** The tags around a reasoning block. */
export interface ThinkMarkers {
  open: string;
  close: string;
}

/** The thinking markers of the families served (Qwen3, Qwen3.5/3.6, and the templates written like them). */
export const THINK_MARKERS: ThinkMarkers = { open: "<think>", close: "</think>" };

/** The facts of one chat template. */
export interface TemplateFacts {
  /**
   * The markup token that opens a turn (`<|im_start|>` in ChatML): the first one of the generation
   * prompt. Null when the generation prompt holds none (then turns get no checkpoints).
   */
  turnStart: { id: number; text: string } | null;
  thinking: ThinkingFacts;
  think: ThinkMarkers;
  /** The dialect the template renders tool calls in. */
  dialect: ToolDialect;
}

/**
 * The facts of `template`, from its source and probe renders of one user message.
 *
 * @example
 * ```ts
 * import { TemplateRenderer } from "./template_render.ts";
 * const template = new TemplateRenderer({
 *   source: "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
 *     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
 *   specials: { bos: "", eos: "<|im_end|>" },
 *   markup: [
 *     { text: "<|im_start|>", id: 1, matchedInText: false },
 *     { text: "<|im_end|>", id: 2, matchedInText: false },
 *   ],
 * });
 * const facts = readTemplateFacts(template);
 * facts.turnStart; // { id: 1, text: "<|im_start|>" }
 * facts.thinking; // { switchable: false, defaultOn: false }
 * facts.dialect.name; // "json"
 * ```
 */
export function readTemplateFacts(template: TemplateRenderer): TemplateFacts {
  return {
    turnStart: turnStartOf(template),
    thinking: thinkingOf(template),
    think: THINK_MARKERS,
    dialect: dialectOfTemplate(template.source),
  };
}

const PROBE: TemplateInput = { messages: [{ role: "user", text: "ping" }], tools: [], thinking: undefined };

/**
 * The first markup token of the generation prompt (what the template adds for
 * `add_generation_prompt`): the token each turn opens with.
 */
function turnStartOf(template: TemplateRenderer): { id: number; text: string } | null {
  try {
    const before = template.render({ ...PROBE, generationPrompt: false }).text;
    const rendered = template.render(PROBE);
    if (!rendered.text.startsWith(before)) return null;
    const texts = new Map(template.markup.tokens.map((t) => [t.id, t.text]));
    let at = 0;
    for (const piece of rendered.pieces) {
      const text = typeof piece === "number" ? texts.get(piece) ?? "" : piece;
      if (typeof piece === "number" && at >= before.length) return { id: piece, text };
      at += text.length;
    }
    return null;
  } catch {
    return null;
  }
}

/** Whether the template switches thinking, and its default (from three probe renders). */
function thinkingOf(template: TemplateRenderer): ThinkingFacts {
  try {
    const on = template.render({ ...PROBE, thinking: true }).text;
    const off = template.render({ ...PROBE, thinking: false }).text;
    const unset = template.render({ ...PROBE, thinking: undefined }).text;
    return { switchable: on !== off, defaultOn: on !== off && unset === on };
  } catch {
    return { switchable: false, defaultOn: false };
  }
}
