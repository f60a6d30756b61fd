/** Which models to serve: the registry file, a config file's `models`, or model-path flags. */
import type { Config } from "./config.ts";
import { type ModelSpec, parseRegistry } from "./registry.ts";
import defaultRegistry from "../models/models.json" with { type: "json" };

/**
 * The model specs for `config`. Explicit sources (config `models`, `--models`, `--chat-model`,
 * `--embedding-model`) replace the built-in default; they are never silently ignored.
 */
export async function resolveModelSpecs(config: Config): Promise<ModelSpec[]> {
  if (config.models) return parseRegistry({ models: config.models }, "config file 'models'");
  if (config.modelsFile) {
    let text: string;
    try {
      text = await Deno.readTextFile(config.modelsFile);
    } catch (e) {
      throw new Error(`registry file '${config.modelsFile}' cannot be read: ${(e as Error).message}`);
    }
    return parseRegistry(JSON.parse(text), config.modelsFile);
  }
  return parseRegistry(defaultRegistry, "models/models.json (built-in default)");
}
