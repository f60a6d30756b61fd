/**
 * Renders chat templates on a thread of its own: a history of thousands of messages takes the
 * Jinja interpreter hundreds of milliseconds, which on the server's thread would hold every
 * route. Messages: see {@link RenderRequest} and {@link RenderReply}.
 */
import { type TemplateInput, TemplateRenderer, type TemplateSource } from "./template_render.ts";
import type { PromptPieces } from "../markup.ts";
import { EngineInputError } from "../types.ts";

/** What the render worker is asked and answers. */
export type RenderRequest = { type: "init"; init: TemplateSource } | {
  type: "render";
  id: number;
  input: TemplateInput;
};
export type RenderReply =
  | { id: number; ok: true; prompt: PromptPieces }
  | { id: number; ok: false; input: boolean; message: string; param: string | null; code: string | null };

const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<RenderRequest>) => void) | null;
  postMessage(reply: RenderReply): void;
};
let template: TemplateRenderer | undefined;

scope.onmessage = ({ data }) => {
  if (data.type === "init") {
    template = new TemplateRenderer(data.init);
    return;
  }
  try {
    scope.postMessage({ id: data.id, ok: true, prompt: template!.render(data.input) });
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
