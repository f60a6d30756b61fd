/** Which models to serve: the registry file, a config file's `models`, or model-path flags. */
import type { Config } from "./config.ts";
import { parseRegistry } from "./registry.ts";
import type { ModelSpec } from "./model_spec.ts";
import { checkModelFile } from "./models/sources.ts";
import defaultRegistry from "../models/models.json" with { type: "json" };

/** The spec's model ids: what clients name, whatever file serves them. */
export const SPEC_CHAT_ID = "Vendor/Vendor3.6-35B-A3B";
export const SPEC_EMBEDDING_ID = "Vendor/Vendor3-Embedding-8B";
/** Qwen3-Embedding's default query task (its model card's retrieval instruction). */
export const QWEN3_QUERY_INSTRUCTION =
  "Given a web search query, retrieve relevant passages that answer the query";

/**
 * The model specs for `config`. Explicit sources (config `models`, `--models`, `--chat-model`,
 * `--embedding-model`) replace the built-in default; they are never silently ignored, and a
 * model file they name must exist before the server starts.
 *
 * @example
 * ```ts
 * import type { Config } from "./config.ts";
 * async function specs(config: Config) {
 *   return await resolveModelSpecs(config); // throws naming a missing file
 * }
 * ```
 */
export async function resolveModelSpecs(config: Config): Promise<ModelSpec[]> {
  let specs: ModelSpec[];
  const explicit = config.models || config.modelsFile || config.chatModel || config.embeddingModel;
  if (config.models) specs = parseRegistry({ models: config.models }, "config file 'models'");
  else if (config.modelsFile) {
    let text: string;
    try {
      text = await Deno.readTextFile(config.modelsFile);
    } catch (e) {
      throw new Error(`registry file '${config.modelsFile}' cannot be read: ${(e as Error).message}`);
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (e) {
      throw new Error(`registry file '${config.modelsFile}' is not valid JSON: ${(e as Error).message}`);
    }
    specs = parseRegistry(json, config.modelsFile);
  } else if (config.chatModel || config.embeddingModel) {
    specs = parseRegistry({ models: fromPathFlags(config) }, "--chat-model / --embedding-model");
  } else {
    specs = parseRegistry(defaultRegistry, "models/models.json (built-in default)");
  }
  if (explicit) { for (const spec of specs) await checkLocalFile(spec); }
  return applyComputeWeights(specs, config.computeWeights);
}

/** `--compute-weight MODEL=WEIGHT` over the registry's `computeWeight`; an unknown model is an error. */
function applyComputeWeights(specs: ModelSpec[], pairs: readonly string[]): ModelSpec[] {
  for (const pair of pairs) {
    const at = pair.lastIndexOf("=");
    const [name, weight] = [pair.slice(0, at), Number(pair.slice(at + 1))];
    const spec = specs.find((s) => s.id === name || s.aliases.includes(name));
    if (!spec) throw new Error(`--compute-weight ${pair}: no model '${name}' is configured`);
    if (!(weight > 0 && weight <= 1000)) {
      throw new Error(`--compute-weight ${pair}: the weight must be above 0 and at most 1000`);
    }
    spec.computeWeight = weight;
  }
  return specs;
}

function fromPathFlags(config: Config): unknown[] {
  const out: unknown[] = [];
  const alias = (path: string) => path.split("/").pop()!.replace(/\.(gguf|onnx)$/i, "");
  if (config.chatModel) {
    out.push({
      id: SPEC_CHAT_ID,
      aliases: [alias(config.chatModel)],
      kind: "chat",
      source: config.chatModel,
    });
  }
  if (config.embeddingModel) {
    const onnx = /\.onnx$/i.test(config.embeddingModel);
    out.push({
      id: SPEC_EMBEDDING_ID,
      aliases: [alias(config.embeddingModel)],
      kind: "embedding",
      backend: onnx ? "onnx" : "llama",
      source: config.embeddingModel,
      pooling: onnx ? "mean" : "last",
      // A last-token GGUF embedder is taken for the spec's Qwen3-Embedding class: its query task.
      ...(onnx ? {} : { queryInstruction: QWEN3_QUERY_INSTRUCTION }),
    });
  }
  return out;
}

async function checkLocalFile(spec: ModelSpec): Promise<void> {
  if (!spec.source || /^(builtin|hf|shape):/.test(spec.source)) return;
  await checkModelFile(spec.source).catch((e: Error) => {
    throw new Error(`model '${spec.id}': ${e.message}`);
  });
}
