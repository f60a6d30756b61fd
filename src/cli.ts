/**
 * The server's command line (started by `main.ts`): read the settings, build the registry, start the
 * server, load models in the background; SIGHUP reloads keys and TLS files; SIGTERM / SIGINT shut
 * down gracefully (and a thread of its own forces the exit if the main thread cannot); systemd is
 * notified when started by it (ready, stopping, watchdog pings).
 */
import { type Config, ConfigError, helpText, isLoopback, loadApiKeys, loadConfig } from "./config.ts";
import { createLogger } from "./log.ts";
import { KeyRing, RateLimiter } from "./http/auth.ts";
import { readTlsFiles, type TlsFiles } from "./http/tls.ts";
import { ConnectionWatch } from "./http/connections.ts";
import { Registry } from "./registry.ts";
import { createServer, type Lifecycle } from "./server.ts";
import { CounterReader, Gauge, Metrics } from "./metrics.ts";
import { enableLoopTurns, EventLoopMonitor } from "./event_loop.ts";
import { resolveModelSpecs } from "./model_specs.ts";
import { loadEngine, planDevices } from "./engines/load.ts";
import { planCommand, startPlan } from "./plan/command.ts";
import { upstreamMetricFamilies } from "./engines/upstream/metrics.ts";
import { poolOf } from "./engines/upstream/load.ts";
import { ReasoningSealer } from "./services/reasoning_seal.ts";
import { warmSchemaCheck } from "./services/schema_check.ts";
import { warmUpGrammar } from "./grammar/mod.ts";
import { startExitGuard } from "./exit_guard.ts";
import { SystemdNotifier } from "./systemd.ts";
import { ComputeShare, type ComputeUse } from "./engines/compute_share.ts";
import { ComputePriority } from "./compute_priority.ts";
import { arenaLimitMissing } from "./malloc_arenas.ts";

/** Runs the command line of this process; the exit code (the server itself runs until a signal). */
export async function main(): Promise<number> {
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
  if (config.plan) return await runPlan(config);
  const log = createLogger({ level: config.logLevel, format: config.logFormat });
  const noArenaLimit = arenaLimitMissing();
  if (noArenaLimit) log.info(`malloc arenas are not limited: ${noArenaLimit}`);
  startExitGuard({
    drainMs: config.drainTimeoutMs,
    log: { level: config.logLevel, format: config.logFormat },
  });
  const fail = (message: string, fields: Record<string, unknown> = {}) => {
    log.error(message, fields);
    return 2;
  };

  let keys: KeyRing;
  try {
    keys = new KeyRing(await loadApiKeys(config));
  } catch (e) {
    return fail(`invalid API keys: ${(e as Error).message}`);
  }
  const loopback = isLoopback(config.host);
  if (keys.isOpen) {
    if (!loopback && !config.noAuth) {
      return fail(
        "refusing to start: no API key is configured and the address is not loopback; " +
          "set --api-key / VSERVE_API_KEY / --api-key-file, or pass --no-auth explicitly",
        { host: config.host },
      );
    }
    log.warn("authentication is OFF: no API key is configured, every request is accepted", {
      host: config.host,
    });
  }
  let tls: TlsFiles | undefined;
  if (config.tlsCert && config.tlsKey) {
    try {
      tls = await readTlsFiles(config.tlsCert, config.tlsKey);
    } catch (e) {
      return fail(`refusing to start: ${(e as Error).message}`);
    }
  } else if (!loopback) {
    log.warn(
      "serving plain HTTP on a non-loopback address: keys and data cross the network unencrypted; " +
        "use --tls-cert / --tls-key or a TLS-terminating proxy",
      { host: config.host },
    );
  }

  let specs;
  try {
    specs = await resolveModelSpecs(config);
  } catch (e) {
    return fail(`invalid model configuration: ${(e as Error).message}`);
  }
  const registry = new Registry(specs, { parallel: config.parallel });
  for (const spec of specs) if (spec.warning) log.warn(`${spec.id}: ${spec.warning}`);
  let planned;
  try {
    planned = await startPlan(specs, config, (c) => planDevices(c, log), log);
  } catch (e) {
    return fail(`refusing to start: ${(e as Error).message}`);
  }
  if ("refusal" in planned) return fail(`refusing to start: ${planned.refusal}`);
  const plans = planned.plans;

  const shutdown = new AbortController();
  const lifecycle: Lifecycle = { draining: false, shutdown: shutdown.signal, inFlight: 0, unread: 0 };
  // Who waits for every request in a handler to have its body read (before a listener closes).
  const readWaiters: (() => void)[] = [];
  lifecycle.onRead = () => {
    for (const resolve of readWaiters.splice(0)) resolve();
  };
  /** Resolves when no request is left unread (see `Lifecycle.unread`), or after `ms`. */
  const bodiesRead = (ms: number) =>
    new Promise<void>((resolve) => {
      if (lifecycle.unread === 0) return resolve();
      readWaiters.push(resolve);
      Deno.unrefTimer(setTimeout(resolve, ms));
    });
  // Every local engine takes its compute steps in turn from this one arbiter (weighted fair share).
  const computeShare = new ComputeShare();
  // Compute threads below the event loop, so a socket event never waits for a core behind our own
  // compute; new threads are caught where they are made (ffi.ts) and on the monitor's ticks.
  const priority = ComputePriority.start(config.computeNice);
  if (config.computeNice > 0 && !priority) {
    log.info("--compute-nice has no effect here: per-thread priorities need Linux", { os: Deno.build.os });
  }
  const metrics = createMetrics(registry, computeShare, lifecycle, priority);
  const loopMonitor = new EventLoopMonitor((stall, lag) => {
    metrics.eventLoopStall.observe({}, stall);
    metrics.eventLoopLag.observe({}, lag);
    priority?.check();
  });
  // Cheap turns of the event loop between bursts of short decodes and slices of long work.
  await enableLoopTurns();
  const sealer = await ReasoningSealer.create(config.reasoningKey);
  if (!sealer.configured) {
    log.info(
      "reasoning blobs (encrypted_content) are sealed with a key made at start: they do not survive a " +
        "restart or reach another replica; set --reasoning-key / VSERVE_REASONING_KEY to share one",
    );
  }
  const handler = createServer({
    onRequest: () => loopMonitor.wake(),
    responses: { hostedTools: config.hostedTools, sealer },
    registry,
    keys,
    limiter: new RateLimiter(),
    opsNeedKey: config.opsAuth === "on" || (config.opsAuth === "auto" && !loopback),
    log,
    metrics,
    lifecycle,
    bodyLimitBytes: config.bodyLimitBytes,
    maxEmbeddingInputs: config.maxEmbeddingInputs,
    maxQueue: config.maxQueue,
    requestTimeoutMs: config.requestTimeoutMs,
    bodyTimeoutMs: config.bodyTimeoutMs,
    maxQueuedEmbeddingTokens: config.maxQueuedEmbeddingTokens,
    corsOrigins: config.corsOrigins,
    connections: () => connections,
    computeUsage: () => computeShare.usage(),
  });
  let connections: ConnectionWatch | null = null;

  const listen = (port: number, files: TlsFiles | undefined, quiet = false) =>
    Deno.serve({
      hostname: config.host,
      port,
      reusePort: files !== undefined,
      ...(files ? { cert: files.cert, key: files.key } : {}),
      onListen: ({ hostname, port }) => {
        if (quiet) return;
        log.info("listening", {
          url: `${files ? "https" : "http"}://${hostname}:${port}`,
          port,
          tls: !!files,
        });
      },
    }, handler);
  let server: Deno.HttpServer<Deno.NetAddr>;
  try {
    server = listen(config.port, tls);
  } catch (e) {
    return fail(`cannot listen on ${config.host}:${config.port}: ${(e as Error).message}`);
  }
  const port = server.addr.port;
  connections = ConnectionWatch.open(port, config.idleTimeoutMs);
  if (!connections) {
    log.warn(
      "cannot watch connections (needs Linux /proc and libc): disconnects of clients with large bodies go unnoticed and there is no idle timeout",
    );
  }

  const notifier = SystemdNotifier.fromEnv(Deno.env.toObject(), log);
  notifier?.send(`READY=1\nSTATUS=listening on port ${port}; loading models`);
  notifier?.startWatchdog();
  // Watched from here: what ran before (the listener, the sealer's key) had no client to hold up, and
  // read as one 35-52 ms first tick (a cold start's compiles), more than any load step since.
  loopMonitor.start();
  // While the models load: the grammar compiler's first runs, so that a first request runs warm code.
  setTimeout(() => warmUpGrammar().catch((e) => log.warn("grammar warm-up failed", { error: String(e) })), 0);
  const loading = registry.loadAll(
    (spec, report) => loadEngine(spec, config, log, report, plans.get(spec.id), computeShare),
    log,
  );
  loading.then(() => {
    priority?.sweep();
    // The output check's worker, ready before the first structured request: made on its first one,
    // its 9-11 ms turn (`new Worker`) fell among that request's grammar passes, cold, and a fresh
    // server's first allOf of 1,000 objects held /health 54-63 ms (warm: 20-36).
    if (registry.slots.some((s) => s.state !== "failed" && s.spec.kind === "chat")) warmSchemaCheck();
    for (const s of registry.slots) if (s.state === "failed") computeShare.forget(s.spec.id);
    const failed = registry.slots.filter((s) => s.state === "failed").length;
    notifier?.send(
      `STATUS=listening on port ${port}; ${registry.slots.length - failed} models loaded` +
        (failed ? `, ${failed} failed` : ""),
    );
  });

  Deno.addSignalListener("SIGHUP", () => void reload());
  async function reload() {
    if (config.apiKeyFile) {
      try {
        keys.replace(await loadApiKeys(config));
        log.info("reloaded API keys", { file: config.apiKeyFile });
      } catch (e) {
        log.error("API key reload failed; keeping the previous keys", { reason: (e as Error).message });
      }
    }
    if (config.tlsCert && config.tlsKey) {
      try {
        const files = await readTlsFiles(config.tlsCert, config.tlsKey);
        if (lifecycle.draining) return;
        // A second listener on the same port takes new connections; the old one finishes its own,
        // closed once the requests in handlers have their bodies (at most the drain time later).
        const next = listen(port, files, true);
        const old = server;
        server = next;
        await bodiesRead(config.drainTimeoutMs);
        await old.shutdown();
        log.info("reloaded TLS certificate", { cert: config.tlsCert });
      } catch (e) {
        log.error("TLS reload failed; keeping the previous certificate", { reason: (e as Error).message });
      }
    }
  }

  let stoppingSince = 0;
  const stop = async (signal: string) => {
    if (stoppingSince) {
      // `deno task` and terminals deliver one Ctrl-C twice (process group + forwarding):
      // only a later, deliberate second signal forces the exit.
      if (performance.now() - stoppingSince < 1000) return;
      log.warn("second signal: exiting now", { signal });
      Deno.exit(1);
    }
    stoppingSince = performance.now();
    lifecycle.draining = true;
    notifier?.send("STOPPING=1\nSTATUS=draining");
    log.info("shutting down: draining in-flight requests", { signal, drain_ms: config.drainTimeoutMs });
    // The listener closes once the requests in handlers have their bodies (new API requests get 503
    // meanwhile): `server.shutdown()` makes a body not read yet unreadable (Deno 2.9), which lost
    // requests that had arrived, their handlers not yet at their bodies.
    let closing: Promise<void> | undefined;
    const close = () => (closing ??= server.shutdown());
    const started = performance.now();
    await bodiesRead(config.drainTimeoutMs);
    const left = Math.max(0, config.drainTimeoutMs - (performance.now() - started));
    const drained = await Promise.race([
      close().then(() => true),
      new Promise<false>((r) => setTimeout(() => r(false), left)),
    ]);
    if (!drained) {
      log.warn("drain time is over: aborting the remaining requests");
      shutdown.abort(new DOMException("the server is shutting down", "ShutdownError"));
      await Promise.race([close(), new Promise((r) => setTimeout(r, 2000))]);
    }
    await loading.catch(() => {});
    await registry.dispose();
    log.info("stopped");
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGTERM", () => void stop("SIGTERM"));
  Deno.addSignalListener("SIGINT", () => void stop("SIGINT"));
  await new Promise(() => {}); // runs until a signal ends the process
  return 0;
}

/** `--plan`: the memory plan of the configured models; 0 fits, 2 does not, 1 cannot plan. */
async function runPlan(config: Config): Promise<number> {
  const log = createLogger({ level: "warn", format: config.logFormat });
  try {
    return await planCommand(await resolveModelSpecs(config), config, (c) => planDevices(c, log));
  } catch (e) {
    console.error(`vserve: cannot plan: ${(e as Error).message}`);
    return 1;
  }
}

/** The metrics, with gauges read from the registry at scrape time. */
function createMetrics(
  registry: Registry,
  share: ComputeShare,
  lifecycle: Lifecycle,
  priority?: ComputePriority,
): Metrics {
  const stateValue = { loading: 0, loaded: 1, failed: -1 } as const;
  const engineCounter = (name: string, help: string) =>
    new CounterReader(`vserve_engine_${name}_total`, help, () =>
      registry.slots.flatMap((s) => {
        const value = s.engine?.counters?.()[name];
        return value === undefined ? [] : [[{ model: s.spec.id }, value] as [Record<string, string>, number]];
      }));
  const engineGauge = (name: string, help: string) =>
    new Gauge(`vserve_engine_${name}`, help, () =>
      registry.slots.flatMap((s) => {
        const value = s.engine?.counters?.()[name];
        return value === undefined ? [] : [[{ model: s.spec.id }, value] as [Record<string, string>, number]];
      }));
  return new Metrics([
    engineCounter("prompt_tokens_evaluated", "Prompt tokens run through the model (reused ones excluded)."),
    engineCounter("prompt_tokens_reused", "Prompt tokens taken from an earlier request's state."),
    engineCounter("tokens_generated", "Tokens sampled, all choices."),
    engineCounter("decodes", "Model evaluations (batches)."),
    engineCounter(
      "draws_off_loop",
      "Tokens drawn off the event loop (a grammar's full mask or many open alternatives) while other sequences decoded.",
    ),
    engineCounter(
      "decodes_on_thread",
      "Model evaluations run on the request thread (short ones, in bursts).",
    ),
    engineCounter(
      "decodes_host_busy",
      "Short multi-threaded evaluations kept off the request thread while other processes kept the host's cores busy (their lowered compute threads would leave it spinning).",
    ),
    engineCounter(
      "decodes_short_pass",
      "Embedding decodes of short steps computed only up to the embeddings (no vocabulary projection).",
    ),
    engineCounter(
      "loop_turns",
      "Turns of the event loop between bursts of decodes on the request thread (its sockets polled).",
    ),
    engineCounter("batched_tokens", "Tokens in all batches (with decodes: the mean batch size)."),
    engineCounter("checkpoints_saved", "Recurrent-state checkpoints taken (hybrid models)."),
    engineCounter("checkpoints_restored", "Recurrent-state checkpoints restored (hybrid models)."),
    engineCounter("prompt_tokens_copied", "Prompt tokens copied from another sequence's memory."),
    engineCounter("prefix_copies", "Prompts that started from a copy of another sequence's prefix."),
    engineCounter(
      "prefix_waits",
      "Prompts that waited for a concurrent prompt to compute their shared prefix.",
    ),
    engineCounter("prompt_cache_hits", "Prompts restored from the host-memory prompt cache."),
    engineCounter("prompt_cache_tokens_restored", "Prompt tokens restored from the prompt cache."),
    engineCounter("prompt_cache_saves", "Sequence states saved into the prompt cache."),
    engineCounter("prompt_cache_evictions", "Prompt cache entries dropped for room (least recently used)."),
    engineCounter("prompt_cache_seconds", "Time saving and restoring prompt cache states."),
    engineGauge("prompt_cache_bytes", "Host memory held by the prompt cache."),
    engineGauge("prompt_cache_entries", "Saved prompts in the prompt cache."),
    engineCounter("decode_seconds", "Time in model evaluation (llama_decode)."),
    engineCounter("sample_seconds", "Time sampling and handling generated tokens."),
    engineCounter("step_seconds", "Time in generation steps altogether."),
    engineCounter("tokens_evaluated", "Embedding tokens run through the model."),
    engineCounter("inputs_embedded", "Embedding inputs finished."),
    new Gauge(
      "vserve_model_state",
      "Model load state: 0 loading, 1 loaded, -1 failed.",
      () => registry.slots.map((s) => [{ model: s.spec.id }, stateValue[s.state]]),
    ),
    new Gauge(
      "vserve_model_load_seconds",
      "How long the model took to load.",
      () =>
        registry.slots.filter((s) => s.loadSeconds !== undefined).map((
          s,
        ) => [{ model: s.spec.id }, s.loadSeconds!]),
    ),
    new Gauge(
      "vserve_http_requests_in_flight",
      "API requests being answered (from the drain check to the answer's end).",
      () => [[{}, lifecycle.inFlight]],
    ),
    new Gauge(
      "vserve_busy_slots",
      "Requests running on the model's sequences or contexts.",
      () => registry.slots.map((s) => [{ model: s.spec.id }, Math.min(s.inFlight, s.parallel)]),
    ),
    new Gauge(
      "vserve_queue_depth",
      "Requests waiting for a free sequence or context.",
      () => registry.slots.map((s) => [{ model: s.spec.id }, Math.max(0, s.inFlight - s.parallel)]),
    ),
    ...computeFamilies(share),
    new Gauge(
      "vserve_compute_nice",
      "Nice levels the compute threads run below the request thread (0: not applied).",
      () => [[{}, priority?.levels ?? 0]],
    ),
    new CounterReader(
      "vserve_compute_threads_reniced_total",
      "Threads of the process set below the request thread (--compute-nice).",
      () => [[{}, priority?.reniced ?? 0]],
    ),
    ...upstreamMetricFamilies(() => registry.slots.flatMap((s) => poolOf(s.engine) ?? [])),
  ]);
}

/** Each model's use of the shared compute (see src/engines/compute_share.ts). */
function computeFamilies(share: ComputeShare) {
  const per = (value: (u: ComputeUse) => number) => (): [Record<string, string>, number][] =>
    share.usage().map((u) => [{ model: u.model }, value(u)]);
  return [
    new CounterReader(
      "vserve_compute_seconds_total",
      "Time in the model's compute steps (decodes, ONNX runs).",
      per((u) => u.seconds),
    ),
    new CounterReader(
      "vserve_compute_held_seconds_total",
      "Time the compute was held for the model between two of its steps (charged to its share).",
      per((u) => u.heldSeconds),
    ),
    new CounterReader("vserve_compute_steps_total", "Compute steps of the model.", per((u) => u.steps)),
    new Gauge(
      "vserve_compute_share",
      "The model's weight over all local models' weights: its share of compute while all are busy.",
      per((u) => u.share),
    ),
  ];
}
