/**
 * A llama.cpp dry run (`no_alloc`) in a process of its own, for tests/plan_llama.test.ts: llama.cpp's
 * log goes to this process's stderr through llama.cpp's own default logger, written synchronously by
 * whichever thread logs, so the parent reads every line, in order, once the process has ended (in
 * process, lines reach JavaScript through node-llama-cpp's queue, which a loaded machine was seen to
 * lose). Argument: JSON { path, patterns, context }; prints JSON { weights } on stdout.
 */
import { silentLogger } from "../../src/log.ts";
import { llamaRuntime } from "../../src/engines/llama/runtime.ts";
import { backendDevices, openLlamaLibrary } from "../../src/engines/llama/ffi.ts";
import { type ContextOptions, NativeContext, NativeModel } from "../../src/engines/llama/native.ts";

const { path, patterns, context } = JSON.parse(Deno.args[0]) as {
  path: string;
  patterns: string[];
  context: ContextOptions;
};
await llamaRuntime("cpu", silentLogger);
const lib = openLlamaLibrary();
const own = Deno.dlopen(lib.path, { llama_log_set: { parameters: ["pointer", "pointer"], result: "void" } });
own.symbols.llama_log_set(null, null); // llama.cpp's default logger: every level, to stderr, at once
const cpu = backendDevices(lib).find((d) => d.type === "CPU")!;
const overrides = patterns.map((pattern) => ({ pattern, bufferType: cpu.bufferType }));
const model = await NativeModel.load(lib, path, 0, { noAlloc: true, overrides });
const ctx = await NativeContext.create(model, context);
ctx.free();
console.log(JSON.stringify({ weights: model.sizeBytes }));
model.free();
