/** Starts the real server (`main.ts`) as a child process on a free port, for HTTP tests. */

/** Parsed JSON of a response under test: its shape is what the test asserts. */
// deno-lint-ignore no-explicit-any
export type Json = any;

const ROOT = new URL("../../", import.meta.url);

/** A running server process. */
export interface TestServer {
  url: string;
  pid: number;
  /** Every log line the process has written so far (stderr and stdout). */
  logs: string[];
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
  const command = new Deno.Command(Deno.execPath(), {
    // One thread per engine: test files run in parallel, and llama.cpp's spinning thread pools
    // slow down many times over when more threads than cores compete (a later --threads wins).
    args: ["run", "--allow-all", "main.ts", "--port", "0", "--log-format", "json", "--threads", "1", ...args],
    cwd: ROOT,
    env: { NO_COLOR: "1", ...opts.env },
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  });
  const child = command.spawn();
  const logs: string[] = [];
  let resolveUrl!: (url: string) => void;
  const urlPromise = new Promise<string>((r) => (resolveUrl = r));
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    let buf = "";
    for await (const text of stream.pipeThrough(new TextDecoderStream())) {
      buf += text;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        logs.push(line);
        if (line.includes('"msg":"listening"')) {
          const { port, tls } = JSON.parse(line);
          resolveUrl(`${tls ? "https" : "http"}://127.0.0.1:${port}`);
        }
      }
    }
    if (buf) logs.push(buf);
  };
  const pumps = Promise.all([pump(child.stdout), pump(child.stderr)]);
  const exited = child.status.then(async (s) => {
    await pumps;
    return s.code;
  });
  // A guard against a hang, not a bound on speed: a loaded 2-core machine has taken over two minutes
  // to load the built-in models.
  const timeoutMs = opts.timeoutMs ?? 600_000;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const url = await Promise.race([
    urlPromise,
    exited.then((code) => {
      throw new Error(`server exited with ${code} before listening:\n${logs.join("\n")}`);
    }),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`server did not listen:\n${logs.join("\n")}`)), timeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));
  const server: TestServer = {
    url,
    pid: child.pid,
    logs,
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
    const deadline = Date.now() + timeoutMs;
    while (true) {
      const health = await (await fetch(`${url}/health`, opts.client ? { client: opts.client } : {})).json();
      if (health.ready) break;
      const failed = health.models.find((m: { status: string }) => m.status === "failed");
      if (failed) {
        await server.stop();
        throw new Error(`model failed: ${JSON.stringify(failed)}\n${logs.join("\n")}`);
      }
      if (Date.now() > deadline) throw new Error(`models not ready:\n${logs.join("\n")}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return server;
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
    args: ["run", "--allow-all", "main.ts", ...args],
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
