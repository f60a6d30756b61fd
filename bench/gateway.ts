/**
 * The `gateway` scenario of `deno task bench`: vserve in front of vserve (`backend: "openai"`).
 *
 * - Overhead: the same requests direct and through a gateway process, alternating: p50 latency added
 *   for one embedding, decode tok/s of one stream (gateway / direct), req/s of GET /v1/models at 64
 *   concurrent clients (gateway / direct).
 * - Prefix affinity: multi-turn conversations with long system prompts over two upstream processes,
 *   with affinity and without (least outstanding only), alternating: time to first token of the
 *   later turns and the share of prompt tokens the upstreams took from their cache.
 */
import OpenAI from "openai";
import { startServer, type TestServer } from "../tests/helpers/server.ts";
import { percentile } from "./stats.ts";
import { chatBody, httpStream, latencies, promptText, runOrder, shortText } from "./workload.ts";

/** What the scenario needs from the benchmark run. */
export interface GatewayBench {
  /** The vserve process measured directly, and its key. */
  direct: TestServer;
  key: string;
  /** A chat model the direct server serves, and its GGUF file (for the affinity upstreams). */
  chat: { id: string; path: string };
  embedId: string;
  threads: number;
  reps: number;
  quick: boolean;
  decodeTokens: number;
  promptWords: number;
  record(metric: string, unit: string, better: "higher" | "lower", values: number[]): void;
  log(message: string): void;
  /** Registers a process to stop at the end of the run. */
  adopt(server: TestServer): void;
}

const openai = (url: string, apiKey: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });
const cooldown = () => new Promise((r) => setTimeout(r, 300));

async function registryFile(models: unknown[]): Promise<string> {
  const path = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(path, JSON.stringify({ models }));
  return path;
}

/** The handling time (ms) of each request whose id starts with `prefix`, from access-log lines. */
function upstreamTimes(logs: readonly string[], prefix: string): Map<string, number> {
  const times = new Map<string, number>();
  for (const line of logs) {
    if (!line.includes(prefix)) continue;
    try {
      const entry = JSON.parse(line);
      if (entry.msg === "request" && typeof entry.ms === "number") times.set(entry.request_id, entry.ms);
    } catch {
      // not a JSON log line
    }
  }
  return times;
}

/** Gateway overhead: direct vs through a gateway process, alternating. */
export async function gatewayOverhead(b: GatewayBench): Promise<void> {
  const upstream = { url: b.direct.url, key: b.key };
  const registry = await registryFile([
    {
      id: b.chat.id,
      kind: "chat",
      backend: "openai",
      parallel: 64,
      upstreams: [{ ...upstream, model: b.chat.id }],
    },
    {
      id: b.embedId,
      kind: "embedding",
      backend: "openai",
      parallel: 64,
      upstreams: [{ ...upstream, model: b.embedId }],
      routing: { embeddingEncoding: "base64" },
    },
  ]);
  b.log("starting the gateway (vserve with backend openai in front of the measured server)");
  const gw = await startServer(["--models", registry, "--api-key", b.key, "--max-queue", "256"], {
    waitReady: true,
  });
  b.adopt(gw);
  const sides = [
    { name: "direct", url: b.direct.url, api: openai(b.direct.url, b.key) },
    { name: "gateway", url: gw.url, api: openai(gw.url, b.key) },
  ];
  const embed = (api: OpenAI, input: string, id?: string) =>
    api.embeddings.create({ model: b.embedId, input }, id ? { headers: { "x-request-id": id } } : undefined);
  for (const s of sides) {
    await embed(s.api, "warm up");
    await httpStream(s.api, b.chat.id, chatBody("warm up", 4));
  }

  // One short embedding at a time, the two sides interleaved call by call: p50 per repetition.
  const calls = b.quick ? 30 : 100;
  // Each call also carries a request id, which the gateway passes on: the upstream's access log then
  // gives its own handling time of that very call, and the client's time minus it (the HTTP exchange
  // and, through the gateway, the gateway's work) does not carry the model's compute spread, which is
  // larger than the target (±3-5 ms on bench-embed).
  const added: number[] = [];
  const paired: number[] = [];
  const p50s: Record<string, number[]> = { direct: [], gateway: [] };
  const run = crypto.randomUUID().slice(0, 8);
  for (let rep = 0; rep < b.reps; rep++) {
    const lat: Record<string, number[]> = { direct: [], gateway: [] };
    const ids: Record<string, Map<string, number>> = { direct: new Map(), gateway: new Map() };
    for (let i = 0; i < calls; i++) {
      for (const s of runOrder(sides, i)) {
        const id = `bench-${run}-${rep}-${s.name}-${i}`;
        const t0 = performance.now();
        await embed(s.api, shortText(`${rep}-${i}`), id);
        const ms = performance.now() - t0;
        lat[s.name].push(ms);
        ids[s.name].set(id, ms);
      }
    }
    const p = (side: string) => percentile(lat[side].sort((x, y) => x - y), 50);
    p50s.direct.push(p("direct"));
    p50s.gateway.push(p("gateway"));
    added.push(p("gateway") - p("direct"));
    await new Promise((r) => setTimeout(r, 200)); // the upstream's last log lines
    const handled = upstreamTimes(b.direct.logs, `bench-${run}-${rep}-`);
    const outside = (side: string) => {
      const found = [...ids[side]].filter(([id]) => handled.has(id));
      // Every call the upstream served is in its log; fewer means the ids did not reach it.
      if (found.length < 0.9 * ids[side].size) {
        throw new Error(`the upstream's log has ${found.length} of the ${ids[side].size} ${side} calls`);
      }
      return percentile(found.map(([id, ms]) => ms - handled.get(id)!).sort((x, y) => x - y), 50);
    };
    paired.push(outside("gateway") - outside("direct"));
    b.log(`gateway: embedding latency rep ${rep + 1}/${b.reps}`);
  }
  b.record("one embedding, 1 client: p50 direct", "ms", "lower", p50s.direct);
  b.record("one embedding, 1 client: p50 through the gateway", "ms", "lower", p50s.gateway);
  b.record("one embedding: p50 latency added by the gateway", "ms", "lower", added);
  b.record(
    "one embedding: p50 added, each call paired with the upstream's own handling time",
    "ms",
    "lower",
    paired,
  );

  // One stream's decode rate, the sides alternating.
  const decode: number[] = [];
  for (let rep = 0; rep < b.reps; rep++) {
    const rate: Record<string, number> = {};
    for (const s of runOrder(sides, rep)) {
      await cooldown();
      const t = await httpStream(
        s.api,
        b.chat.id,
        chatBody(promptText(`gw${s.name}${rep}`, 16), b.decodeTokens),
      );
      rate[s.name] = (t.completionTokens - 1) / ((t.end - t.first) / 1000);
    }
    decode.push(rate.gateway / rate.direct);
    b.log(
      `gateway: decode rep ${rep + 1}/${b.reps}: ${rate.direct.toFixed(1)} → ${
        rate.gateway.toFixed(1)
      } tok/s`,
    );
  }
  b.record(`decode of one stream (${b.decodeTokens} tokens): gateway / direct`, "×", "higher", decode);

  // GET /v1/models at 64 concurrent clients: what the gateway adds to every request.
  const total = b.quick ? 2000 : 6000;
  const models: number[] = [];
  for (let rep = 0; rep < b.reps; rep++) {
    const rps: Record<string, number> = {};
    for (const s of runOrder(sides, rep)) {
      await cooldown();
      const t0 = performance.now();
      await latencies(64, total, async () => {
        const res = await fetch(`${s.url}/v1/models`, { headers: { authorization: `Bearer ${b.key}` } });
        await res.arrayBuffer();
      });
      rps[s.name] = total / ((performance.now() - t0) / 1000);
    }
    models.push(rps.gateway / rps.direct);
    b.log(
      `gateway: GET /v1/models rep ${rep + 1}/${b.reps}: ${rps.direct.toFixed(0)} / ${
        rps.gateway.toFixed(0)
      } req/s`,
    );
  }
  b.record("GET /v1/models at 64 clients: req/s gateway / direct", "×", "higher", models);
}

/** One streamed turn: time to the first token, and the prompt tokens the upstream had cached. */
async function turn(url: string, key: string, model: string, messages: unknown[]) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 8,
      temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
    }),
  });
  let first = NaN;
  let text = "";
  let answer = "";
  let usage = { prompt_tokens: 0, prompt_tokens_details: { cached_tokens: 0 } };
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    if (Number.isNaN(first)) first = performance.now() - t0;
    text += r.value;
  }
  for (const e of text.split("\n\n")) {
    if (!e.startsWith("data: {")) continue;
    const chunk = JSON.parse(e.slice(6));
    if (chunk.usage) usage = chunk.usage;
    answer += chunk.choices?.[0]?.delta?.content ?? "";
  }
  return {
    ttft: first,
    prompt: usage.prompt_tokens,
    cached: usage.prompt_tokens_details?.cached_tokens ?? 0,
    answer,
  };
}

/**
 * Prefix affinity against least-outstanding routing alone, over two upstream processes: three
 * conversations (an odd number, so that alternation cannot pin them by chance) of several turns,
 * each with its own long system prompt; the turns of all conversations interleaved.
 */
export async function affinityGain(b: GatewayBench): Promise<void> {
  const slots = 4;
  const chatModel = {
    id: b.chat.id,
    kind: "chat",
    source: b.chat.path,
    contextSize: 2048 * slots,
    parallel: slots,
  };
  const upstreamRegistry = await registryFile([chatModel]);
  b.log("starting two upstream processes and a gateway for prefix affinity");
  const threads = String(Math.max(1, Math.floor(b.threads / 2)));
  const ups = await Promise.all(
    [0, 1].map(() =>
      startServer(["--models", upstreamRegistry, "--api-key", b.key, "--threads", threads, "--gpu", "cpu"], {
        waitReady: true,
        timeoutMs: 600_000,
      })
    ),
  );
  ups.forEach((u) => b.adopt(u));
  const upstreams = ups.map((u, i) => ({ url: u.url, key: b.key, model: b.chat.id, name: `u${i}` }));
  const gwRegistry = await registryFile([
    { id: "affine", kind: "chat", backend: "openai", upstreams, routing: { affinityPrefixChars: 1024 } },
    { id: "spread", kind: "chat", backend: "openai", upstreams, routing: { affinityPrefixChars: 0 } },
  ]);
  const gw = await startServer(["--models", gwRegistry, "--api-key", b.key], { waitReady: true });
  b.adopt(gw);

  const conversations = 3;
  const turns = b.quick ? 3 : 5;
  const results: Record<string, { ttft: number[]; prompt: number; cached: number }[]> = {
    affine: [],
    spread: [],
  };
  for (let rep = 0; rep < b.reps; rep++) {
    for (const model of runOrder(["affine", "spread"], rep)) {
      const history = Array.from({ length: conversations }, (_, c) => [
        // Longer than the affinity prefix (1,024 characters), as agent system prompts are.
        { role: "system", content: promptText(`${c}${model}${rep} system`, Math.max(b.promptWords, 300)) },
      ]);
      // Every sequence of both upstreams first holds a prompt older than the conversations and
      // sharing as many first tokens with them as they share with each other: the engine gives a new
      // prompt the sequence with the longest common prefix, however short, and would otherwise evict
      // one conversation for another that shares only the chat template's first tokens.
      await Promise.all(
        ups.flatMap((u) =>
          Array.from({ length: slots }, (_, i) =>
            turn(u.url, b.key, b.chat.id, [
              { role: "system", content: promptText(`${5 + i}w${model}${rep}`, 4) },
              { role: "user", content: "hi" },
            ]))
        ),
      );
      const run = { ttft: [] as number[], prompt: 0, cached: 0 };
      for (let t = 0; t < turns; t++) {
        for (let c = 0; c < conversations; c++) {
          const messages = [...history[c], { role: "user", content: `Question ${t}: what next?` }];
          const r = await turn(gw.url, b.key, model, messages);
          history[c] = [...messages, { role: "assistant", content: r.answer }];
          if (t > 0) {
            run.ttft.push(r.ttft);
            run.prompt += r.prompt;
            run.cached += r.cached;
          }
        }
      }
      results[model].push(run);
      b.log(
        `affinity: ${model} rep ${rep + 1}/${b.reps}: cached ${
          (100 * run.cached / run.prompt).toFixed(0)
        }% of ` +
          `later turns' prompt tokens, mean TTFT ${
            (run.ttft.reduce((x, y) => x + y, 0) / run.ttft.length).toFixed(0)
          } ms`,
      );
    }
  }
  const mean = (xs: number[]) => xs.reduce((x, y) => x + y, 0) / xs.length;
  for (const model of ["affine", "spread"]) {
    const label = model === "affine" ? "with prefix affinity" : "least outstanding only";
    b.record(
      `later turns, ${label}: mean time to first token`,
      "ms",
      "lower",
      results[model].map((r) => mean(r.ttft)),
    );
    b.record(
      `later turns, ${label}: prompt tokens from cache`,
      "%",
      "higher",
      results[model].map((r) => 100 * r.cached / r.prompt),
    );
  }
  b.record(
    "later turns: time to first token, least outstanding / affinity",
    "×",
    "higher",
    results.affine.map((r, i) => mean(results.spread[i].ttft) / mean(r.ttft)),
  );
}
