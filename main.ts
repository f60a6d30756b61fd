/**
 * CLI entry: read the settings, build the registry, start the server, load models in the
 * background, shut down gracefully on SIGTERM / SIGINT.
 */
import { ConfigError, helpText, isLoopback, loadConfig } from "./src/config.ts";
import { createLogger } from "./src/log.ts";
import { KeyRing } from "./src/http/auth.ts";
import { Registry } from "./src/registry.ts";
import { createServer } from "./src/server.ts";
import { resolveModelSpecs } from "./src/model_specs.ts";
import { loadEngine } from "./src/engines/load.ts";

async function main(): Promise<number> {
  let loaded;
  try {
    loaded = await loadConfig(Deno.args, Deno.env.toObject());
  } catch (e) {
    if (e instanceof ConfigError) {
      console.error(`vserve: ${e.message}`);
      return 2;
    }
    throw e;
  }
  if (loaded.help) {
    console.log(helpText());
    return 0;
  }
  const config = loaded.config;
  const log = createLogger({ level: config.logLevel, format: config.logFormat });

  const keys = new KeyRing(config.apiKeys);
  if (keys.isOpen) {
    if (!isLoopback(config.host) && !config.noAuth) {
      log.error(
        "refusing to start: no API key is configured and the address is not loopback; " +
          "set --api-key / VSERVE_API_KEY / --api-key-file, or pass --no-auth explicitly",
        { host: config.host },
      );
      return 2;
    }
    log.warn("authentication is OFF: no API key is configured, every request is accepted", {
      host: config.host,
    });
  }

  let specs;
  try {
    specs = await resolveModelSpecs(config);
  } catch (e) {
    log.error(`invalid model configuration: ${(e as Error).message}`);
    return 2;
  }
  const registry = new Registry(specs);
  for (const spec of specs) {
    if (spec.warning) log.warn(`${spec.id}: ${spec.warning}`);
  }

  const handler = createServer({
    registry,
    keys,
    log,
    bodyLimitBytes: config.bodyLimitBytes,
    maxEmbeddingInputs: config.maxEmbeddingInputs,
    corsOrigins: config.corsOrigins,
  });
  const server = Deno.serve({
    hostname: config.host,
    port: config.port,
    onListen: ({ hostname, port }) => log.info("listening", { url: `http://${hostname}:${port}`, port }),
  }, handler);

  const loading = registry.loadAll((spec, report) => loadEngine(spec, config, log, report), log);

  const stop = async (signal: string) => {
    log.info("shutting down", { signal, drain_ms: config.drainTimeoutMs });
    const drained = await Promise.race([
      server.shutdown().then(() => true),
      new Promise<false>((r) => setTimeout(() => r(false), config.drainTimeoutMs)),
    ]);
    if (!drained) log.warn("drain timeout reached; aborting remaining requests");
    await loading.catch(() => {});
    await registry.dispose();
    log.info("stopped");
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGTERM", () => stop("SIGTERM"));
  Deno.addSignalListener("SIGINT", () => stop("SIGINT"));
  await server.finished;
  return 0;
}

if (import.meta.main) {
  const code = await main();
  if (code !== 0) Deno.exit(code);
}
