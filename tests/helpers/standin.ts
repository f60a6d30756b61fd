/**
 * A small OpenAI-compatible stand-in upstream on a loopback port, for gateway tests. What it does
 * is chosen per request by the `model` the gateway sends (the registry's upstream `model` field):
 *
 * - `ok` (or anything else): a short stream "Hello", " world", usage, `[DONE]`, every chunk with
 *   `system_fingerprint` "fp_standin"; embeddings of 64 unnormalised dimensions that ignore
 *   `dimensions` and `encoding_format` (as llama-server does); 404 on other paths (no legacy
 *   `/v1/completions`);
 * - `think`: reasoning under vLLM's newer name `reasoning`, then content;
 * - `delay`: `ok` after 300 ms (for load-spreading tests; `heldMs` records the wait as measured here);
 * - `fail500`, `busy` (429), `vllm400`, `tei413`, `fastapi422`, `text400`: error bodies in the shapes
 *   upstreams write them;
 * - `hang`: never answers (until the request is aborted);
 * - `cut`: two chunks, then the connection breaks;
 * - `slow`: a content chunk every 50 ms for 10 s; `slowish`: the same for 1 s;
 * - `stall`: two chunks, then nothing (the connection stays open until the request is aborted).
 *
 * `GET /health` answers 200 while `healthy` is true, else 503 (`healthChecks` counts them); while
 * {@link StandIn.holdHealth} holds them, health checks wait for its release (a model that stays
 * loading until the test says). While
 * `failing` is true every POST answers 500 (its health check still passes). Every request is
 * recorded, with whether its connection was aborted.
 */
import type { Json } from "./server.ts";

/** One request the stand-in received. */
export interface Seen {
  path: string;
  model?: string;
  body: Json;
  headers: Headers;
  aborted: boolean;
  /** `delay`: how long the answer was held back. */
  heldMs?: number;
}

/** A running stand-in. */
export interface StandIn {
  url: string;
  port: number;
  requests: Seen[];
  healthy: boolean;
  /** Health checks answered so far. */
  healthChecks: number;
  /** Every POST answers 500 while its health check passes. */
  failing: boolean;
  /** Holds every health check (those under way and later ones) until the returned release is called. */
  holdHealth(): () => void;
  /** Stops listening (connections refused) until `restart`. */
  stop(): Promise<void>;
  /** Listens again on the same port. */
  restart(): void;
}

/** The 64-dimension vector of input `i`: deliberately not unit length. */
export function standInVector(i: number): number[] {
  return Array.from({ length: 64 }, (_, k) => (k + 1) * (i + 1) * (k % 2 ? -1 : 1));
}

const enc = new TextEncoder();
const sse = (x: unknown) => enc.encode(`data: ${typeof x === "string" ? x : JSON.stringify(x)}\n\n`);
const chunk = (delta: Record<string, unknown>, finish: string | null = null) => ({
  id: "chatcmpl-standin",
  object: "chat.completion.chunk",
  created: 1,
  model: "standin-internal",
  system_fingerprint: "fp_standin",
  choices: [{ index: 0, delta, finish_reason: finish }],
});
const usage = {
  id: "chatcmpl-standin",
  object: "chat.completion.chunk",
  created: 1,
  model: "standin-internal",
  choices: [],
  usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
};
const json = (body: unknown, status = 200, headers: Record<string, string> = {}) =>
  new Response(typeof body === "string" ? body : JSON.stringify(body), {
    status,
    headers: { "content-type": typeof body === "string" ? "text/plain" : "application/json", ...headers },
  });

const ERRORS: Record<string, () => Response> = {
  // The internal detail must never reach the gateway's client.
  fail500: () =>
    json(
      { error: { message: "CUDA out of memory on gpu-node-7.internal", type: "InternalServerError" } },
      500,
    ),
  busy: () =>
    json({ error: { message: "too many requests", type: "rate_limit" } }, 429, { "retry-after": "7" }),
  vllm400: () =>
    json({
      object: "error",
      message: "This model's maximum context length is 10 tokens. However, you requested 20 tokens " +
        "(vllm400 is the upstream name of the model).",
      type: "BadRequestError",
      param: null,
      code: 400,
    }, 400),
  tei413: () =>
    json({
      error: "Input validation error: `inputs` must have less than 512 tokens",
      error_type: "Validation",
    }, 413),
  fastapi422: () =>
    json({
      detail: [{ loc: ["body", "messages", 0, "role"], msg: "Input should be 'user'", type: "literal" }],
    }, 422),
  text400: () => json("bad things happened in the upstream", 400),
};

/**
 * Starts a stand-in on `port` (0: any free port).
 *
 * @example
 * ```ts
 * const s = startStandIn();
 * await fetch(`${s.url}/health`);
 * await s.stop();
 * ```
 */
export function startStandIn(port = 0): StandIn {
  let server: Deno.HttpServer<Deno.NetAddr>;
  let healthGate: Promise<void> | undefined;
  const state: StandIn = {
    url: "",
    port: 0,
    requests: [],
    healthy: true,
    healthChecks: 0,
    failing: false,
    holdHealth: () => {
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      healthGate = held;
      return () => {
        if (healthGate === held) healthGate = undefined;
        release();
      };
    },
    stop: async () => {
      await server.shutdown();
    },
    restart: () => {
      server = listen(state.port);
    },
  };

  const handle = async (req: Request): Promise<Response> => {
    const path = new URL(req.url).pathname;
    if (req.method === "GET" && path === "/health") {
      if (healthGate) await healthGate;
      state.healthChecks++;
      return json({ status: state.healthy ? "ok" : "unhealthy" }, state.healthy ? 200 : 503);
    }
    const body = req.method === "POST" ? await req.json() : {};
    const seen: Seen = { path, model: body.model, body, headers: req.headers, aborted: false };
    state.requests.push(seen);
    req.signal.addEventListener("abort", () => (seen.aborted = true));
    const mode = String(body.model ?? "ok");
    if (state.failing) return ERRORS.fail500();
    if (ERRORS[mode]) return ERRORS[mode]();
    if (mode === "hang") {
      await new Promise((r) => req.signal.addEventListener("abort", r));
      return json({}, 500);
    }
    if (mode === "delay") {
      const held = performance.now();
      await new Promise((r) => setTimeout(r, 300));
      seen.heldMs = performance.now() - held;
    }
    if (path === "/v1/embeddings") {
      const inputs = Array.isArray(body.input) && typeof body.input[0] !== "number"
        ? body.input
        : [body.input];
      return json({
        object: "list",
        model: "standin-internal",
        data: inputs.map((_: unknown, i: number) => ({
          object: "embedding",
          index: i,
          embedding: standInVector(i),
        })),
        usage: { prompt_tokens: 3 * inputs.length, total_tokens: 3 * inputs.length },
      });
    }
    if (path !== "/v1/chat/completions") return json({ error: { message: "no such path" } }, 404);
    let timer: ReturnType<typeof setInterval> | undefined;
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(sse(chunk({ role: "assistant", content: "" })));
        if (mode === "think") c.enqueue(sse(chunk({ reasoning: "Let me think." })));
        if (mode === "slow" || mode === "slowish") {
          let n = 0;
          timer = setInterval(() => {
            if (++n > (mode === "slow" ? 200 : 20)) {
              clearInterval(timer);
              c.enqueue(sse(chunk({}, "stop")));
              c.enqueue(sse(usage));
              c.enqueue(sse("[DONE]"));
              c.close();
            } else c.enqueue(sse(chunk({ content: `${n} ` })));
          }, 50);
          return;
        }
        c.enqueue(sse(chunk({ content: "Hello" })));
        if (mode === "cut") {
          setTimeout(() => c.error(new Error("the upstream process died")), 50);
          return;
        }
        if (mode === "stall") return;
        c.enqueue(sse(chunk({ content: " world" })));
        c.enqueue(sse(chunk({}, "stop")));
        c.enqueue(sse(usage));
        c.enqueue(sse("[DONE]"));
        c.close();
      },
      cancel() {
        clearInterval(timer);
      },
    });
    return new Response(stream, { headers: { "content-type": "text/event-stream" } });
  };

  const listen = (p: number) =>
    Deno.serve({ hostname: "127.0.0.1", port: p, onListen: () => {} }, handle) as Deno.HttpServer<
      Deno.NetAddr
    >;
  server = listen(port);
  state.port = server.addr.port;
  state.url = `http://127.0.0.1:${state.port}`;
  return state;
}

/** A loopback port that accepts no TCP connection (see {@link startBlackHole}). */
export interface BlackHole {
  url: string;
  port: number;
  /** Connections held to fill the listen queue. */
  held: number;
  close(): void;
}

/**
 * A listening socket whose listen queue is full, so that a connect to it hangs (the kernel drops
 * the SYN) instead of being refused: what a host that has gone silent looks like to a client,
 * made on loopback. Connections are opened and never accepted until one no longer completes.
 *
 * @example
 * ```ts
 * const hole = await startBlackHole();
 * const connect = Deno.connect({ hostname: "127.0.0.1", port: hole.port, signal: AbortSignal.timeout(500) });
 * await connect.then((c) => c.close(), (e) => e.name); // "TimeoutError"
 * hole.close();
 * ```
 */
export async function startBlackHole(): Promise<BlackHole> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  const held: Deno.Conn[] = [];
  // Deno's listen queue holds 512 here; the bound keeps a change of that from looping for ever.
  for (let i = 0; i < 65_536; i++) {
    try {
      held.push(await Deno.connect({ hostname: "127.0.0.1", port, signal: AbortSignal.timeout(200) }));
    } catch {
      break;
    }
  }
  const probe = await Deno.connect({ hostname: "127.0.0.1", port, signal: AbortSignal.timeout(300) })
    .then((c) => (c.close(), "connected"), (e: Error) => e.name);
  if (probe !== "TimeoutError") {
    throw new Error(`the black hole on port ${port} did not hang a connect: ${probe}`);
  }
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    held: held.length,
    close: () => {
      listener.close();
      for (const c of held) c.close();
    },
  };
}
