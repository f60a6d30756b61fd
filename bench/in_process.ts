/**
 * The benchmark's in-process side: the engines vserve serves with, called directly in the benchmark
 * process (no HTTP, no JSON, no SSE): the ceiling for the server. `bench/main.ts` imports this module
 * dynamically and only when the in-process column is wanted, so the rest of the benchmark (the server,
 * the llama-server baseline) does not depend on the engines' API.
 */
import { silentLogger } from "../src/log.ts";
import { loadConfig } from "../src/config.ts";
import { resolveModelSpecs } from "../src/model_specs.ts";
import { loadEngine } from "../src/engines/load.ts";
import { ComputeShare } from "../src/engines/compute_share.ts";
import type { ChatEngine, EmbeddingEngine } from "../src/engines/types.ts";
import { toJob } from "../src/services/chat.ts";
import type { ChatRequest } from "../src/protocol/chat.ts";
import type { StreamTiming } from "./workload.ts";

/** The engines, behind the calls the benchmark makes. */
export interface InProcessSide {
  /** One chat generation of model `chatId` from a request body (the same body the HTTP clients send). */
  chatStream(chatId: string, body: Record<string, unknown>): Promise<StreamTiming>;
  /** Tokenizes and embeds `texts` as one call (the server tokenizes too, inside its timed region). */
  embedTexts(texts: readonly string[]): Promise<unknown>;
  dispose(): Promise<void>;
}

/**
 * Loads the chat models `chatIds` and the embedding model `embedId` exactly as the server started with
 * `serverArgs` does (its configuration, its registry, its engine loader), but in this process.
 */
export async function loadInProcess(
  serverArgs: string[],
  chatIds: readonly string[],
  embedId: string,
): Promise<InProcessSide> {
  const { config } = await loadConfig(serverArgs, {});
  const specs = await resolveModelSpecs(config);
  const share = new ComputeShare();
  const load = async (id: string) => {
    const spec = specs.find((s) => s.id === id);
    if (!spec) throw new Error(`no model '${id}' in the benchmark's registry`);
    return await loadEngine(spec, config, silentLogger, () => {}, undefined, share);
  };
  const chatEngines = new Map<string, ChatEngine>();
  for (const id of chatIds) chatEngines.set(id, await load(id) as ChatEngine);
  const embedEngine = await load(embedId) as EmbeddingEngine;

  return {
    async chatStream(chatId, body) {
      const chatEngine = chatEngines.get(chatId)!;
      const start = performance.now();
      let first = NaN;
      let promptTokens = 0;
      let completionTokens = 0;
      const job = await toJob(body as ChatRequest);
      for await (const ev of chatEngine.generate(job, new AbortController().signal)) {
        if (ev.type === "prompt") promptTokens = ev.promptTokens;
        else if (ev.type === "end") completionTokens += ev.completionTokens;
        else if ((ev.type === "content" || ev.type === "reasoning") && Number.isNaN(first)) {
          first = performance.now();
        }
      }
      return { start, first, end: performance.now(), promptTokens, completionTokens };
    },
    async embedTexts(texts) {
      return await embedEngine.embed(await Promise.all(texts.map((s) => embedEngine.tokenize(s))));
    },
    async dispose() {
      for (const e of chatEngines.values()) await e.dispose();
      await embedEngine.dispose();
    },
  };
}
