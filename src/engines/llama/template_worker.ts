/**
 * Renders chat templates on a thread of its own: a history of thousands of messages takes the
 * Jinja interpreter hundreds of milliseconds, which on the server's thread would hold every
 * route. Messages: see {@link RenderRequest} and {@link RenderReply}.
 */
import {
  type PackedPrompt,
  packPrompt,
  type TemplateInput,
  TemplateRenderer,
  type TemplateSource,
} from "./template_render.ts";
import { type EngineHistoryCall, EngineInputError } from "../types.ts";

/** A history call as posted here: wide arguments come as their JSON text (see template.ts). */
export type WireCall = EngineHistoryCall & { argumentsJson?: string };

/**
 * What the render worker is asked and answers: a render's messages and tools come first in parts
 * (appended in order), then the render with the rest of its input; `drop`: the parts of a render
 * that will not come.
 */
export type RenderRequest =
  | { type: "init"; init: TemplateSource }
  | { type: "part"; id: number; key: "messages" | "tools"; items: TemplateInput["messages" | "tools"] }
  | { type: "drop"; id: number }
  | { type: "render"; id: number; input: TemplateInput };
export type RenderReply =
  | { id: number; ok: true; prompt: PackedPrompt }
  | { id: number; ok: false; input: boolean; message: string; param: string | null; code: string | null };

const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<RenderRequest>) => void) | null;
  postMessage(reply: RenderReply, transfer?: Transferable[]): void;
};
let template: TemplateRenderer | undefined;
/** The parts received of each render still to come. */
const parts = new Map<number, { messages: unknown[]; tools: unknown[] }>();

scope.onmessage = ({ data }) => {
  if (data.type === "init") {
    template = new TemplateRenderer(data.init);
    return;
  }
  if (data.type === "part") {
    let got = parts.get(data.id);
    if (!got) parts.set(data.id, got = { messages: [], tools: [] });
    for (const item of data.items) {
      if (data.key === "messages" && item && (item as { role?: string }).role === "assistant") {
        for (const c of (item as { toolCalls: WireCall[] }).toolCalls) {
          if (c.argumentsJson === undefined) continue;
          c.arguments = JSON.parse(c.argumentsJson);
          delete c.argumentsJson;
        }
      }
      got[data.key].push(item);
    }
    return;
  }
  if (data.type === "drop") {
    parts.delete(data.id);
    return;
  }
  const got = parts.get(data.id);
  parts.delete(data.id);
  const input = got
    ? {
      ...data.input,
      messages: [...data.input.messages, ...got.messages],
      tools: [...data.input.tools, ...got.tools],
    } as TemplateInput
    : data.input;
  try {
    const prompt = packPrompt(template!.render(input));
    scope.postMessage({ id: data.id, ok: true, prompt }, [prompt.marks.buffer]);
  } catch (e) {
    const input = e instanceof EngineInputError;
    scope.postMessage({
      id: data.id,
      ok: false,
      input,
      message: (e as Error).message ?? String(e),
      param: input ? e.param : null,
      code: input ? e.code : null,
    });
  }
};
