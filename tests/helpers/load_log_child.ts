/**
 * An engine's real load in a process of its own, for tests/plan_llama.test.ts: llama.cpp's log goes
 * to this process's stderr through llama.cpp's default logger (as in dry_run_child.ts). In the test
 * process, lines reach JavaScript through node-llama-cpp's callback, which is process-wide: a parallel
 * `deno test` runs the test modules in one process, and another module's runtime took the callback over
 * (a capture then missed the load's lines, or got another module's). Argument: JSON { kind, options };
 * prints nothing on stdout.
 */
import { silentLogger } from "../../src/log.ts";
import { llamaRuntime } from "../../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../../src/engines/llama/ffi.ts";
import { LlamaChatEngine } from "../../src/engines/llama/chat.ts";
import { LlamaEmbeddingEngine } from "../../src/engines/llama/embedding.ts";

const { kind, options } = JSON.parse(Deno.args[0]);
await llamaRuntime("cpu", silentLogger);
const lib = openLlamaLibrary();
const own = Deno.dlopen(lib.path, { llama_log_set: { parameters: ["pointer", "pointer"], result: "void" } });
own.symbols.llama_log_set(null, null); // llama.cpp's default logger: every level, to stderr, at once
const engine = kind === "chat"
  ? await LlamaChatEngine.load(lib, { ...options, log: silentLogger })
  : await LlamaEmbeddingEngine.load(lib, options);
await engine.dispose();
Deno.exit(0);
