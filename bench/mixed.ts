/**
 * The `mixed` scenario of `deno task bench`: a chat model and an embedding model on one machine,
 * each loaded by its own clients (streaming chats; one-text embedding requests), alone and then
 * together. Per model: throughput (chat tokens/s and embeddings/s, from the server's own counters
 * over the window) and request latency p50/p99 (chat: time to first token; embeddings: the whole
 * request). Requests still waiting when a window closes count with their wait so far (a lower
 * bound), so a starved model shows as such instead of dropping out of the percentiles. Together,
 * the chat model's part of the compute the server charged to the two models is reported too
 * (`vserve_compute_*`), when the server exports it.
 *
 * Also runs alone against any server, e.g. an older build, for before/after figures:
 * `deno run -A bench/mixed.ts --url http://127.0.0.1:8080 --key K --chat-model C --embedding-model E`.
 */
import { parseArgs } from "node:util";
import { percentile } from "./stats.ts";
import { chatBody, loadLeads, promptText, sentences } from "./workload.ts";

/** What the scenario needs from the benchmark run. */
export interface MixedBench {
  url: string;
  key: string;
  chatId: string;
  embedId: string;
  /** Concurrent clients of each model. */
  clients: number;
  /** Length of each window. */
  seconds: number;
  reps: number;
  decodeTokens: number;
  record(metric: string, unit: string, better: "higher" | "lower", values: number[]): void;
  log(message: string): void;
}

/** What one window measured (NaN: that model had no clients). */
interface Window {
  chatTokPerS: number;
  chatRequests: number;
  ttftP50: number;
  ttftP99: number;
  embedPerS: number;
  embedP50: number;
  embedP99: number;
  /** The chat model's part of the compute charged to the two models (NaN: not exported). */
  chatPart: number;
  /** Parts of the window in compute steps (both models) and held for a model between its steps. */
  busy: number;
  held: number;
}

const PROMPT_WORDS = 50;

/** Every series of /metrics, by `name{labels}`. */
async function scrape(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || !line.includes(" ")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

const metric = (m: Map<string, number>, name: string, model: string) =>
  m.get(`${name}{model="${model}"}`) ?? NaN;
const charged = (m: Map<string, number>, model: string) =>
  metric(m, "vserve_compute_seconds_total", model) + metric(m, "vserve_compute_held_seconds_total", model);

/**
 * One streaming chat request: the time to its first text (its wait so far when `stop` aborts it
 * first; undefined when refused) and whether it finished.
 */
async function chatOnce(
  b: MixedBench,
  tag: string,
  stop: AbortSignal,
): Promise<{ ttft?: number; finished: boolean }> {
  const start = performance.now();
  let first: number | undefined;
  try {
    const res = await fetch(`${b.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${b.key}` },
      body: JSON.stringify({
        ...chatBody(promptText(tag, PROMPT_WORDS), b.decodeTokens),
        model: b.chatId,
        stream: true,
      }),
      signal: stop,
    });
    if (res.status !== 200) {
      await res.body?.cancel();
      await new Promise((r) => setTimeout(r, 100));
      return { finished: false };
    }
    for await (const text of res.body!.pipeThrough(new TextDecoderStream())) {
      if (first === undefined && /"(content|reasoning_content)":"[^"]/.test(text)) first = performance.now();
    }
    return { ttft: (first ?? performance.now()) - start, finished: true };
  } catch {
    // aborted at the end of the window
    return { ttft: (first ?? performance.now()) - start, finished: false };
  }
}

/** One embedding request of one sentence; its latency (its wait so far when aborted). */
async function embedOnce(b: MixedBench, tag: string, stop: AbortSignal): Promise<number> {
  const start = performance.now();
  try {
    const res = await fetch(`${b.url}/v1/embeddings`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${b.key}` },
      body: JSON.stringify({ model: b.embedId, input: sentences(1, tag)[0] }),
      signal: stop,
    });
    await res.arrayBuffer();
  } catch {
    // aborted at the end of the window
  }
  return performance.now() - start;
}

/** Waits until neither model has a request in flight (aborted ones end at their next step). */
async function idle(b: MixedBench) {
  for (let i = 0; i < 600; i++) {
    const health = await (await fetch(`${b.url}/health`)).json();
    const busy = health.models.some((m: { id: string; in_flight?: number }) =>
      (m.id === b.chatId || m.id === b.embedId) && (m.in_flight ?? 0) > 0
    );
    if (!busy) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 500));
}

/** One window of `b.seconds` with chat clients, embedding clients, or both. */
async function window(b: MixedBench, chat: boolean, embed: boolean, tag: string): Promise<Window> {
  const stop = new AbortController();
  const ttft: number[] = [];
  const embedLatency: number[] = [];
  let requests = 0;
  const m0 = await scrape(b.url);
  const t0 = performance.now();
  const clients = [
    ...Array.from({ length: chat ? b.clients : 0 }, async (_, c) => {
      for (let k = 0; !stop.signal.aborted; k++) {
        const { ttft: t, finished } = await chatOnce(b, `${tag}c${c}r${k}`, stop.signal);
        if (t !== undefined) ttft.push(t);
        if (finished) requests++;
      }
    }),
    ...Array.from({ length: embed ? b.clients : 0 }, async (_, c) => {
      for (let k = 0; !stop.signal.aborted; k++) {
        embedLatency.push(await embedOnce(b, `${tag}e${c}r${k}`, stop.signal));
      }
    }),
  ];
  await new Promise((r) => setTimeout(r, b.seconds * 1000));
  const m1 = await scrape(b.url);
  const seconds = (performance.now() - t0) / 1000;
  stop.abort();
  await Promise.all(clients);
  await idle(b);
  const sorted = (v: number[]) => v.sort((x, y) => x - y);
  const chatCharged = charged(m1, b.chatId) - charged(m0, b.chatId);
  const embedCharged = charged(m1, b.embedId) - charged(m0, b.embedId);
  const delta = (name: string, model: string) => metric(m1, name, model) - metric(m0, name, model);
  return {
    chatTokPerS: chat ? delta("vserve_engine_tokens_generated_total", b.chatId) / seconds : NaN,
    chatRequests: chat ? requests : NaN,
    ttftP50: chat ? percentile(sorted(ttft), 50) : NaN,
    ttftP99: chat ? percentile(sorted(ttft), 99) : NaN,
    embedPerS: embed ? delta("vserve_engine_inputs_embedded_total", b.embedId) / seconds : NaN,
    embedP50: embed ? percentile(sorted(embedLatency), 50) : NaN,
    embedP99: embed ? percentile(sorted(embedLatency), 99) : NaN,
    chatPart: chat && embed ? chatCharged / (chatCharged + embedCharged) : NaN,
    busy:
      (delta("vserve_compute_seconds_total", b.chatId) + delta("vserve_compute_seconds_total", b.embedId)) /
      seconds,
    held: (delta("vserve_compute_held_seconds_total", b.chatId) +
      delta("vserve_compute_held_seconds_total", b.embedId)) / seconds,
  };
}

/**
 * Runs the windows (chat alone, embeddings alone, both) `b.reps` times and records each figure.
 *
 * @example
 * ```ts
 * async function mixedAgainst(url: string, key: string, record: MixedBench["record"]) {
 *   const ids = { chatId: "tiny-chat", embedId: "tiny-embed" };
 *   await mixedLoad({ url, key, ...ids, clients: 16, seconds: 20, reps: 1, decodeTokens: 32, record, log: console.log });
 * }
 * ```
 */
export async function mixedLoad(b: MixedBench): Promise<void> {
  const runs: { chat: Window; embed: Window; both: Window }[] = [];
  for (let rep = 0; rep < b.reps; rep++) {
    const chat = await window(b, true, false, `mc${rep}`);
    b.log(`mixed: chat alone ${chat.chatTokPerS.toFixed(1)} tok/s, ttft p50 ${chat.ttftP50.toFixed(0)} ms`);
    const embed = await window(b, false, true, `me${rep}`);
    b.log(`mixed: embeddings alone ${embed.embedPerS.toFixed(1)}/s, p50 ${embed.embedP50.toFixed(0)} ms`);
    const both = await window(b, true, true, `mb${rep}`);
    b.log(
      `mixed: together chat ${both.chatTokPerS.toFixed(1)} tok/s (ttft p50 ${both.ttftP50.toFixed(0)} ms), ` +
        `embeddings ${both.embedPerS.toFixed(1)}/s (p50 ${both.embedP50.toFixed(0)} ms); rep ${
          rep + 1
        }/${b.reps}`,
    );
    runs.push({ chat, embed, both });
  }
  const n = b.clients;
  const rows: [string, string, "higher" | "lower", (r: (typeof runs)[number]) => number][] = [
    [`chat alone, ${n} streams: decode`, "tok/s", "higher", (r) => r.chat.chatTokPerS],
    [`chat beside ${n} embedding clients: decode`, "tok/s", "higher", (r) => r.both.chatTokPerS],
    [`chat alone: requests finished in ${b.seconds} s`, "requests", "higher", (r) => r.chat.chatRequests],
    [
      `chat beside embeddings: requests finished in ${b.seconds} s`,
      "requests",
      "higher",
      (r) => r.both.chatRequests,
    ],
    ["chat alone: time to first token p50", "ms", "lower", (r) => r.chat.ttftP50],
    ["chat alone: time to first token p99", "ms", "lower", (r) => r.chat.ttftP99],
    ["chat beside embeddings: time to first token p50", "ms", "lower", (r) => r.both.ttftP50],
    ["chat beside embeddings: time to first token p99", "ms", "lower", (r) => r.both.ttftP99],
    [`embeddings alone, ${n} clients`, "inputs/s", "higher", (r) => r.embed.embedPerS],
    [`embeddings beside ${n} chat streams`, "inputs/s", "higher", (r) => r.both.embedPerS],
    ["embeddings alone: request p50", "ms", "lower", (r) => r.embed.embedP50],
    ["embeddings alone: request p99", "ms", "lower", (r) => r.embed.embedP99],
    ["embeddings beside chat: request p50", "ms", "lower", (r) => r.both.embedP50],
    ["embeddings beside chat: request p99", "ms", "lower", (r) => r.both.embedP99],
    ["together: chat's part of the compute charged", "fraction", "higher", (r) => r.both.chatPart],
    ["together: part of the window in compute steps", "fraction", "higher", (r) => r.both.busy],
    ["together: part of the window held between a model's steps", "fraction", "lower", (r) => r.both.held],
  ];
  for (const [name, unit, better, f] of rows) {
    const values = runs.map(f).filter(Number.isFinite);
    if (values.length > 0) b.record(name, unit, better, values);
  }
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      url: { type: "string", default: "http://127.0.0.1:8080" },
      key: { type: "string", default: "none" },
      "chat-model": { type: "string" },
      "embedding-model": { type: "string" },
      clients: { type: "string", default: "16" },
      seconds: { type: "string", default: "30" },
      reps: { type: "string", default: "1" },
      tokens: { type: "string", default: "64" },
    },
  });
  if (!values["chat-model"] || !values["embedding-model"]) {
    console.error(
      "usage: deno run -A bench/mixed.ts --url U --key K --chat-model C --embedding-model E " +
        "[--clients 16] [--seconds 30] [--reps 1] [--tokens 64]",
    );
    Deno.exit(2);
  }
  await loadLeads();
  const rows: string[] = [];
  await mixedLoad({
    url: values.url!.replace(/\/$/, ""),
    key: values.key!,
    chatId: values["chat-model"],
    embedId: values["embedding-model"],
    clients: Number(values.clients),
    seconds: Number(values.seconds),
    reps: Number(values.reps),
    decodeTokens: Number(values.tokens),
    record: (metricName, unit, _better, v) =>
      rows.push(
        `| ${metricName} (${unit}) | ${v.map((x) => x.toFixed(unit === "fraction" ? 3 : 1)).join(", ")} |`,
      ),
    log: (m) => console.error(m),
  });
  console.log(["| metric | runs |", "|---|---|", ...rows].join("\n"));
}
