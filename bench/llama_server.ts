/**
 * Runs llama.cpp's `llama-server` as the benchmark's baseline: its command lines (mirroring the settings
 * our engine gives node-llama-cpp) and the child processes, with readiness and peak memory.
 */

/** The chat server's shape: the same as vserve's bench chat model. */
export interface ChatServerShape {
  model: string;
  alias: string;
  threads: number;
  slots: number;
  ctxPerSlot: number;
  apiKey: string;
  /**
   * A recurrent or hybrid model: loaded without repacked (extra) CPU buffers, as vserve loads them
   * (with them llama.cpp's AMX path computes several sequences wrongly and here crashes).
   */
  hybrid?: boolean;
}

/** The embedding server's shape: the same as vserve's bench embedding model. */
export interface EmbeddingServerShape {
  model: string;
  alias: string;
  threads: number;
  slots: number;
  maxInputTokens: number;
  apiKey: string;
}

/** llama.cpp pads a context to 256 cells; node-llama-cpp asks for the padded size up front. */
const pad256 = (n: number) => Math.ceil(n / 256) * 256;

/** Settings both servers share: no automatic resizing, nothing but the API. */
function common(threads: number, apiKey: string): string[] {
  return [
    "--host",
    "127.0.0.1",
    "-t",
    String(threads),
    "-tb",
    String(threads),
    "--api-key",
    apiKey,
    "-fit",
    "off", // keep exactly the context asked for
    "--no-webui",
  ];
}

/**
 * Arguments of the chat server: `slots` slots of `ctxPerSlot` tokens each (`-c` is the total, split
 * evenly, as vserve gives each of its sequences its own share) and the GGUF's own chat template
 * (`--jinja`). Batch sizes are llama-server's defaults (2,048 logical, 512 physical); vserve feeds
 * prompts in 512-token chunks too. Its host-memory prompt cache stays at its default (`--cache-ram`
 * 8,192 MiB), as vserve's.
 *
 * @example
 * ```ts
 * chatServerArgs({ model: "m.gguf", alias: "chat", threads: 2, slots: 8, ctxPerSlot: 4096, apiKey: "k" });
 * // [..., "-np", "8", "-c", "32768", ...]
 * ```
 */
export function chatServerArgs(s: ChatServerShape): string[] {
  return [
    "-m",
    s.model,
    "--alias",
    s.alias,
    ...common(s.threads, s.apiKey),
    "-np",
    String(s.slots),
    "-c",
    String(pad256(s.slots * s.ctxPerSlot)),
    "--no-kv-unified", // a fixed share per slot
    "--jinja",
    ...(s.hybrid ? ["--no-repack"] : []),
  ];
}

/** KV cells beyond the longest input, so that short inputs run beside a long one (vserve does the same). */
export const EMBEDDING_KV_RESERVE = 2048;

/**
 * Arguments of the embedding server: last-token pooling, no prompt cache, `slots` slots sharing one KV
 * cache of the longest input plus a reserve, and one physical batch that holds the longest input
 * (llama-server embeds an input in one batch): `maxInputTokens` plus the end-of-text token.
 */
export function embeddingServerArgs(s: EmbeddingServerShape): string[] {
  const batch = String(s.maxInputTokens + 1);
  return [
    "-m",
    s.model,
    "--alias",
    s.alias,
    ...common(s.threads, s.apiKey),
    "--embeddings",
    "--pooling",
    "last",
    // Without this a slot re-embeds only the tokens after the prefix it shares with its previous input
    // (the benchmark repeats its sentences): vserve embeds every token of every input.
    "--no-cache-prompt",
    "--cache-ram",
    "0", // no host-memory prompt cache either

    "-np",
    String(s.slots),
    "-c",
    String(pad256(s.maxInputTokens + 1 + EMBEDDING_KV_RESERVE)),
    "--kv-unified",
    "-b",
    batch,
    "-ub",
    batch,
  ];
}

/** A running llama-server. */
export interface LlamaServerProcess {
  url: string;
  pid: number;
  logPath: string;
  /** Peak resident memory so far (VmHWM), MiB. */
  peakRssMiB(): Promise<number>;
  stop(): Promise<void>;
}

/** Peak resident memory (VmHWM) of a live process, MiB; NaN when unknown. */
export async function peakRssMiB(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`).catch(() => "");
  return Number(status.match(/VmHWM:\s+(\d+) kB/)?.[1] ?? NaN) / 1024;
}

/**
 * Starts `binary` with `args` on a free loopback port, its output going to `logPath`, and waits until
 * `GET /health` answers 200 (the model is loaded).
 */
export async function startLlamaServer(
  binary: string,
  args: string[],
  logPath: string,
  timeoutMs = 600_000,
): Promise<LlamaServerProcess> {
  const port = freePort();
  const log = await Deno.open(logPath, { write: true, create: true, truncate: true });
  const child = new Deno.Command(binary, {
    args: [...args, "--port", String(port)],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).spawn();
  const pump = async (s: ReadableStream<Uint8Array>) => {
    for await (const chunk of s) await log.write(chunk).catch(() => 0);
  };
  const pumps = Promise.all([pump(child.stdout), pump(child.stderr)]).finally(() => log.close());
  let exited: Deno.CommandStatus | undefined;
  const status = child.status.then((s) => (exited = s));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (!exited) child.kill("SIGTERM");
    const timer = setTimeout(() => exited || child.kill("SIGKILL"), 10_000);
    await status;
    clearTimeout(timer);
    await pumps;
  };
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (exited) {
      await pumps;
      const tail = (await Deno.readTextFile(logPath).catch(() => "")).trimEnd().split("\n").slice(-15);
      throw new Error(
        `llama-server exited with ${exited.code} before ready; log: ${logPath}\n${tail.join("\n")}`,
      );
    }
    const ok = await fetch(`${url}/health`).then(async (r) => {
      await r.body?.cancel();
      return r.ok;
    }, () => false);
    if (ok) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`llama-server not ready after ${timeoutMs / 1000} s; log: ${logPath}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  return { url, pid: child.pid, logPath, peakRssMiB: () => peakRssMiB(child.pid), stop };
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}
