/** One shared node-llama-cpp runtime per GPU setting (loading the native backend is costly). */
import { getLlama, GgufInsights, type Llama, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";
import type { Logger } from "../../log.ts";
import { openLlamaLibrary, writeLogMark } from "./ffi.ts";

/** GPU choice as configured. */
export type GpuSetting = "auto" | "cuda" | "vulkan" | "cpu";

const runtimes = new Map<GpuSetting, Promise<Llama>>();
/** Listeners that receive every llama.cpp log line while they are registered (see {@link captureLlamaLog}). */
/** The text of the marks {@link captureLlamaLog} writes to find the end of llama.cpp's queued lines. */
const LOG_MARK = "vserve-log-mark";
/** How long a capture waits for its mark (a bound against a hang, not a pace). */
const MARK_WAIT_MS = 10_000;
let marks = 0;
const taps = new Set<(line: string) => void>();

/**
 * The runtime for `gpu`; prebuilt binaries only (`build: "never"`), never a compile at run time.
 *
 * @example
 * ```ts
 * import type { Logger } from "../../log.ts";
 * async function cpuRuntime(log: Logger) {
 *   return await llamaRuntime("cpu", log);
 * }
 * ```
 */
export function llamaRuntime(gpu: GpuSetting, log: Logger): Promise<Llama> {
  let runtime = runtimes.get(gpu);
  if (!runtime) {
    runtime = getLlama({
      build: "never",
      gpu: gpu === "cpu" ? false : gpu,
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const text = message.trim();
        for (const tap of taps) tap(text);
        if (text.startsWith(LOG_MARK)) return;
        // The Qwen vocabulary trips this llama.cpp warning for every real Qwen GGUF too.
        if (!text || text.includes("control-looking token")) return;
        // Embedding contexts ask for no pooling on purpose: the engine pools the token states itself.
        if (/pooling_type is \[\d+\], but \[0\] was specified/.test(text)) {
          log.debug(`llama.cpp: ${text} (expected: vserve pools the token states itself)`);
          return;
        }
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) log.error(`llama.cpp: ${text}`);
        else if (level === LlamaLogLevel.warn) log.warn(`llama.cpp: ${text}`);
        else log.debug(`llama.cpp: ${text}`);
      },
    });
    runtimes.set(gpu, runtime);
  }
  return runtime;
}

/**
 * Collects llama.cpp's log lines, down to debug level, until `stop()` (or the end of an
 * `await using` scope), then hands them to `onStop`: the load log that says where each tensor went
 * and how large each buffer is. Lines below warning level still go to the server log at debug
 * level only.
 *
 * @example
 * ```ts
 * import type { Llama } from "node-llama-cpp";
 * import { parseLlamaLog } from "../../plan/llama_log.ts";
 * async function loadLogged<T>(llama: Llama, load: () => Promise<T>): Promise<T> {
 *   await using _log = captureLlamaLog(llama, (lines) => console.log(parseLlamaLog(lines)));
 *   return await load(); // e.g. NativeModel.load(lib, path, layers)
 * }
 * ```
 */
export function captureLlamaLog(
  llama: Llama,
  onStop: (lines: string[]) => void = () => {},
): { lines: string[]; stop(): Promise<string[]>; [Symbol.asyncDispose](): Promise<void> } {
  const lines: string[] = [];
  const mark = `${LOG_MARK} ${++marks}`;
  let marked: (() => void) | undefined;
  const tap = (line: string) => {
    if (line === mark) marked?.();
    else if (!line.startsWith(LOG_MARK)) lines.push(line);
  };
  taps.add(tap);
  llama.logLevel = LlamaLogLevel.debug;
  let stopped: Promise<string[]> | undefined;
  const stop = () =>
    stopped ??= (async () => {
      // llama.cpp's lines reach JS through the addon's queue, in order, after the call that logged
      // them may have returned (a load logs from a worker thread): a mark queued now arrives after
      // all of them. The bound only guards against a mark that never comes.
      const arrived = new Promise<void>((resolve) => marked = resolve);
      let guard: ReturnType<typeof setTimeout> | undefined;
      if (writeLogMark(openLlamaLibrary(), mark)) {
        await Promise.race([arrived, new Promise((r) => guard = setTimeout(r, MARK_WAIT_MS))]);
        clearTimeout(guard);
      } else {
        await new Promise((r) => setTimeout(r, 0));
      }
      taps.delete(tap);
      if (taps.size === 0) llama.logLevel = LlamaLogLevel.warn;
      onStop(lines);
      return lines;
    })();
  return { lines, stop, [Symbol.asyncDispose]: async () => void await stop() };
}

/** Threads for one engine: the configured count, never more than the cores. */
export function engineThreads(configured: number): number {
  return Math.max(1, Math.min(configured, navigator.hardwareConcurrency || 1));
}

/**
 * Layers to offload as llama.cpp counts them (-1 = all): `max` offloads everything, `auto` asks
 * node-llama-cpp's estimator what fits in free VRAM, a number is taken as is; CPU builds get 0.
 *
 * @example
 * ```ts
 * import type { Llama } from "node-llama-cpp";
 * async function layers(llama: Llama) {
 *   return await resolveGpuLayers(llama, "model.gguf", "auto");
 * }
 * ```
 */
export async function resolveGpuLayers(
  llama: Llama,
  modelPath: string,
  setting: number | "auto" | "max" | undefined,
): Promise<number> {
  if (!llama.gpu) return 0;
  if (setting === "max") return -1;
  if (typeof setting === "number") return setting;
  const insights = await GgufInsights.from(await readGgufFileInfo(modelPath), llama);
  return (await insights.configurationResolver.resolveModelGpuLayersV2("auto")).gpuLayers;
}
