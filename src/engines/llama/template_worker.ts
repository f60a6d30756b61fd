/**
 * Renders chat templates on a thread of its own: a history of thousands of messages takes the
 * Jinja interpreter hundreds of milliseconds, which on the server's thread would hold every
 * route. Messages: see {@link RenderRequest} and {@link RenderReply}.
 */
import { ChatTemplate, type RenderReply, type RenderRequest } from "./template.ts";
import { EngineInputError } from "../types.ts";

const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<RenderRequest>) => void) | null;
  postMessage(reply: RenderReply): void;
};
let template: ChatTemplate | undefined;

scope.onmessage = ({ data }) => {
  if (data.type === "init") {
    template = new ChatTemplate(data.init);
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
