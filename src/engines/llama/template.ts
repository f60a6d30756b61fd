/**
 * The model's own Jinja chat template (from the GGUF), rendered with `@huggingface/jinja`, and the
 * facts read from it: whether it has a thinking switch and its default.
 */
import { Template } from "@huggingface/jinja";
import type { EngineMessage, EngineTool } from "../types.ts";
import { EngineInputError } from "../types.ts";

/** What a template does with thinking. */
export interface ThinkingFacts {
  /** `enable_thinking` changes the prompt. */
  switchable: boolean;
  /** Thinking when the request does not say. */
  defaultOn: boolean;
}

/** A parsed chat template. */
export class ChatTemplate {
  readonly #template: Template;
  readonly #specials: { bos_token: string; eos_token: string };
  readonly source: string;

  constructor(source: string, specials: { bos: string; eos: string }) {
    this.source = source;
    this.#template = new Template(source);
    this.#specials = { bos_token: specials.bos, eos_token: specials.eos };
  }

  /**
   * The prompt for `messages`; a template error (its `raise_exception`, or a history it cannot
   * render) is an {@link EngineInputError} carrying the template's message.
   *
   * @example
   * ```ts
   * const template = new ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", {
   *   bos: "",
   *   eos: "<|im_end|>",
   * });
   * template.render([{ role: "user", text: "Hi" }], [], true); // "user: Hi\n"
   * ```
   */
  render(
    messages: readonly EngineMessage[],
    tools: readonly EngineTool[],
    thinking: boolean | undefined,
  ): string {
    try {
      return this.#template.render({
        messages: toTemplateMessages(messages),
        tools: tools.length > 0
          ? tools.map((t) => ({
            type: "function",
            function: { name: t.name, description: t.description ?? "", parameters: t.parameters ?? {} },
          }))
          : undefined,
        add_generation_prompt: true,
        ...(thinking === undefined ? {} : { enable_thinking: thinking }),
        ...this.#specials,
      });
    } catch (e) {
      const reason = (e as Error).message?.replace(/^Error:\s*/, "") || String(e);
      throw new EngineInputError(
        `The model's chat template cannot render these messages: ${reason}`,
        "messages",
        "invalid_messages",
      );
    }
  }

  /** Whether the template switches thinking, and its default (from three probe renders). */
  thinkingFacts(): ThinkingFacts {
    const probe = [{ role: "user" as const, text: "ping" }];
    try {
      const on = this.render(probe, [], true);
      const off = this.render(probe, [], false);
      const unset = this.render(probe, [], undefined);
      return { switchable: on !== off, defaultOn: on !== off && unset === on };
    } catch {
      return { switchable: false, defaultOn: false };
    }
  }
}

/** The history in the shape chat templates expect (OpenAI-like; call arguments as objects). */
function toTemplateMessages(messages: readonly EngineMessage[]) {
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
