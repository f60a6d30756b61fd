/** Picks the engine implementation for a registry entry. */
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import type { ModelSpec } from "../registry.ts";
import type { ChatEngine, EmbeddingEngine } from "./types.ts";

/** Loads the engine for `spec`. */
export function loadEngine(
  spec: ModelSpec,
  _config: Config,
  _log: Logger,
  _report: (details: Record<string, unknown>) => void,
): Promise<ChatEngine | EmbeddingEngine> {
  return Promise.reject(new Error(`no engine for backend '${spec.backend}' yet`));
}
