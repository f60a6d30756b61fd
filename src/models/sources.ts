/** Turns a registry `source` (file path, `hf:` reference, `builtin:` preset) into a local file. */
import type { Logger } from "../log.ts";
import { fetchFromHub } from "./hub.ts";
import { GENERATOR_VERSION, PRESETS, writePresetGguf } from "./presets.ts";
import { ONNX_PRESETS, writePresetOnnx } from "./onnx_writer.ts";

/** Where models come from and go. */
export interface SourceOptions {
  cacheDir: string;
  hubUrl: string;
  log: Logger;
  sha256?: string;
  size?: number;
}

/**
 * The local path of `source`, generating or downloading it when needed. A missing file is an
 * error naming it; there is never a silent fallback to another model.
 */
export async function resolveSource(source: string, opts: SourceOptions): Promise<string> {
  if (source.startsWith("shape:")) {
    throw new Error(`'${source}' is a model shape (header only, no weights): use it with --plan`);
  }
  if (source.startsWith("builtin:")) return await ensurePreset(source.slice("builtin:".length), opts);
  if (source.startsWith("hf:")) {
    return await fetchFromHub(source, { ...opts, progress: Deno.stderr.isTerminal() });
  }
  return await checkModelFile(source);
}

/**
 * The path of a plain file source (a path or a `file:` URL), after checking that it is a readable
 * regular file; the error names the file. `builtin:` and `hf:` sources are not files yet.
 */
export async function checkModelFile(source: string): Promise<string> {
  const path = source.startsWith("file:") ? new URL(source).pathname : source;
  let stat: Deno.FileInfo;
  try {
    stat = await Deno.stat(path);
  } catch (e) {
    throw new Error(`model file '${path}' cannot be read: ${(e as Error).message}`);
  }
  if (!stat.isFile) throw new Error(`model file '${path}' is not a regular file`);
  const f = await Deno.open(path).catch((e) => {
    throw new Error(`model file '${path}' cannot be opened: ${(e as Error).message}`);
  });
  f.close();
  return path;
}

/** Generates a preset into the cache once; concurrent processes race safely via rename. */
async function ensurePreset(name: string, opts: SourceOptions): Promise<string> {
  const onnx = ONNX_PRESETS[name];
  if (!PRESETS[name] && !onnx) {
    throw new Error(
      `unknown builtin preset '${name}' (known: ${
        [...Object.keys(PRESETS), ...Object.keys(ONNX_PRESETS)].join(", ")
      })`,
    );
  }
  const dir = `${opts.cacheDir}/builtin`;
  const path = `${dir}/${name}-g${GENERATOR_VERSION}.${onnx ? "onnx" : "gguf"}`;
  if ((await Deno.stat(path).catch(() => null))?.isFile) return path;
  await Deno.mkdir(dir, { recursive: true });
  const tmp = `${path}.${crypto.randomUUID()}.tmp`;
  const started = performance.now();
  opts.log.info("generating builtin model", { preset: name });
  try {
    if (onnx) await writePresetOnnx(name, tmp);
    else await writePresetGguf(name, tmp);
    await Deno.rename(tmp, path);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
  opts.log.info("generated builtin model", {
    preset: name,
    seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
  });
  return path;
}
