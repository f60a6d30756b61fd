/** Starts the real server (`main.ts`) as a child process on a free port, for HTTP tests. */

/** Parsed JSON of a response under test: its shape is what the test asserts. */
// deno-lint-ignore no-explicit-any
export type Json = any;

import { V8_FLAGS_ARG } from "../../src/v8_flags.ts";

const ROOT = new URL("../../", import.meta.url);

/** A running server process. */
export interface TestServer {
  url: string;
  pid: number;
  /**
   * Every log line the process has written so far (stderr and stdout): read from its log file at each
   * access, so read `server.logs` again to see later lines (a kept array does not grow).
   */
  readonly logs: string[];
  /** Sends a signal without waiting. */
  signal(signal: Deno.Signal): void;
  /** Sends SIGTERM and waits for exit; returns the exit code. */
  stop(signal?: Deno.Signal): Promise<number>;
  /** Resolves with the exit code when the process ends by itself. */
  exited: Promise<number>;
}

/**
 * Starts `main.ts` with `args` (plus `--port 0`), waits for its `listening` line, and optionally
 * for every model to be loaded.
 *
 * @example
 * ```ts
 * async function healthOfAKeyedServer() {
 *   const server = await startServer(["--api-key", "k"], { waitReady: true });
 *   const health = await (await fetch(`${server.url}/health`)).json();
 *   await server.stop();
 *   return health;
 * }
 * ```
 */
export async function startServer(
  args: string[] = [],
  opts: { env?: Record<string, string>; waitReady?: boolean; timeoutMs?: number; client?: Deno.HttpClient } =
    {},
): Promise<TestServer> {
  // The process writes its log to a file that `logs` reads on demand: no read of a pipe is left
  // under way between tests, so the tests can run with Deno's op sanitizer on.
  const logFile = await Deno.makeTempFile({ prefix: "vserve-test-", suffix: ".log" });
  const command = new Deno.Command("/bin/sh", {
    args: [
      "-c",
      'log=$1; shift; exec "$@" >"$log" 2>&1',
      "sh",
      logFile,
      Deno.execPath(),
      // One thread per engine: test files run in parallel, and llama.cpp's spinning thread pools
      // slow down many times over when more threads than cores compete (a later --threads wins).
      ...[
        "run",
        "--allow-all",
        V8_FLAGS_ARG,
        "main.ts",
        "--port",
        "0",
        "--log-format",
        "json",
        "--threads",
        "1",
        ...args,
      ],
    ],
    cwd: ROOT,
    env: { NO_COLOR: "1", ...opts.env },
    stdin: "null",
    stdout: "null",
    stderr: "null",
  });
  const child = command.spawn();
  const logs = new LogLines(logFile);
  let ended = false;
  const exited = child.status.then((s) => {
    ended = true;
    logs.close();
    return s.code;
  });
  // A guard against a hang, not a bound on speed: a loaded 2-core machine has taken over two minutes
  // to load the built-in models.
  const timeoutMs = opts.timeoutMs ?? 600_000;
  const deadline = Date.now() + timeoutMs;
  let url: string | undefined;
  while (!url) {
    const line = logs.lines.find((l) => l.includes('"msg":"listening"'));
    if (line) {
      const { port, tls } = JSON.parse(line);
      url = `${tls ? "https" : "http"}://127.0.0.1:${port}`;
    } else if (ended) {
      throw new Error(`server exited with ${await exited} before listening:\n${logs.lines.join("\n")}`);
    } else if (Date.now() > deadline) {
      throw new Error(`server did not listen:\n${logs.lines.join("\n")}`);
    } else await new Promise((r) => setTimeout(r, 20));
  }
  const server: TestServer = {
    url,
    pid: child.pid,
    get logs() {
      return logs.lines;
    },
    exited,
    signal(signal: Deno.Signal) {
      child.kill(signal);
    },
    async stop(signal: Deno.Signal = "SIGTERM") {
      try {
        child.kill(signal);
      } catch { /* already gone */ }
      return await exited;
    },
  };
  if (opts.waitReady) {
    while (true) {
      const health = await (await fetch(`${url}/health`, opts.client ? { client: opts.client } : {})).json();
      if (health.ready) break;
      const failed = health.models.find((m: { status: string }) => m.status === "failed");
      if (failed) {
        await server.stop();
        throw new Error(`model failed: ${JSON.stringify(failed)}\n${logs.lines.join("\n")}`);
      }
      if (Date.now() > deadline) throw new Error(`models not ready:\n${logs.lines.join("\n")}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return server;
}

/** Logs of servers still running; a file's servers stopped at unload leave no file behind. */
const openLogs = new Set<LogLines>();
globalThis.addEventListener("unload", () => {
  for (const log of [...openLogs]) log.close();
});

/** The lines of a log file that a process appends to, read as far as it has written whenever asked. */
class LogLines {
  readonly #path: string;
  readonly #lines: string[] = [];
  readonly #decoder = new TextDecoder();
  #offset = 0;
  #partial = "";
  #closed = false;

  constructor(path: string) {
    this.#path = path;
    openLogs.add(this);
  }

  /** Every complete line so far (the same array, grown). */
  get lines(): string[] {
    if (this.#closed) return this.#lines;
    const file = Deno.openSync(this.#path);
    try {
      file.seekSync(this.#offset, Deno.SeekMode.Start);
      const chunk = new Uint8Array(1 << 16);
      for (let n = file.readSync(chunk); n !== null && n > 0; n = file.readSync(chunk)) {
        this.#offset += n;
        const text = this.#partial + this.#decoder.decode(chunk.subarray(0, n), { stream: true });
        const parts = text.split("\n");
        this.#partial = parts.pop()!;
        this.#lines.push(...parts);
      }
    } finally {
      file.close();
    }
    return this.#lines;
  }

  /** Reads the rest (the process has exited) and removes the file; `lines` keeps what was read. */
  close(): void {
    if (this.#closed) return;
    void this.lines;
    if (this.#partial) this.#lines.push(this.#partial);
    this.#closed = true;
    openLogs.delete(this);
    try {
      Deno.removeSync(this.#path);
    } catch { /* already gone */ }
  }
}

/**
 * Writes `value` as JSON to a new temporary file and returns its path (a `--models` registry, a
 * config file).
 *
 * @example
 * ```ts ignore
 * const registry = await writeJsonFile({ models: [{ id: "m", kind: "chat", source: "builtin:tiny-chat" }] });
 * const server = await startServer(["--models", registry]);
 * ```
 */
export async function writeJsonFile(value: unknown): Promise<string> {
  const path = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(path, JSON.stringify(value));
  return path;
}

/** Runs `main.ts` with `args` to completion (for start-up failures); returns code and output. */
export async function runMain(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", V8_FLAGS_ARG, "main.ts", ...args],
    cwd: ROOT,
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** POSTs JSON with a bearer key (over `client` when given, e.g. for a test CA); returns status, headers and parsed body. */
export async function postJson(
  url: string,
  body: unknown,
  key: string | null = "test-key",
  headers: Record<string, string> = {},
  client?: Deno.HttpClient,
): Promise<{ status: number; headers: Headers; body: Json }> {
  const res = await fetch(url, {
    ...(client ? { client } : {}),
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...headers,
    },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch { /* not JSON: keep the text */ }
  return { status: res.status, headers: res.headers, body: parsed };
}
