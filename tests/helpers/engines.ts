/** In-process engines on the built-in stand-ins, for tests that call an engine directly. */
import { resolveSource } from "../../src/models/sources.ts";
import { silentLogger } from "../../src/log.ts";
import { llamaRuntime } from "../../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../../src/engines/llama/ffi.ts";
import { LlamaChatEngine } from "../../src/engines/llama/chat.ts";

const CACHE = new URL("../../models/cache", import.meta.url).pathname;

/** A built-in chat model (`tiny-chat`, `tiny-moe`, …) on the CPU, one thread, one sequence of `contextSize`. */
export async function builtinChatEngine(name: string, contextSize: number): Promise<LlamaChatEngine> {
  await llamaRuntime("cpu", silentLogger);
  const modelPath = await resolveSource(`builtin:${name}`, {
    cacheDir: CACHE,
    hubUrl: "",
    log: silentLogger,
  });
  return await LlamaChatEngine.load(openLlamaLibrary(), {
    modelPath,
    gpuLayers: 0,
    threads: 1,
    parallel: 1,
    contextSize,
    log: silentLogger,
  });
}
