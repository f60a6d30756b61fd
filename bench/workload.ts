/**
 * The benchmark's workload: prompts, sentences, the chat request body, and the one client code every
 * OpenAI-compatible server is measured with (vserve and any baseline alike).
 */
import type OpenAI from "openai";

const FILLER = "the river carries light across stones while distant bells count the hours of a quiet town"
  .split(" ");

let leads: string[] = [];
let nextLead = 0;

/**
 * Loads the words every text starts with: each is one token of the Qwen3 vocabulary, and no two are
 * the same, so no two texts share even their first token. A server that reuses cached prefixes across
 * requests (llama-server's embedding slots do, even with `--no-cache-prompt`) then has nothing to
 * reuse: a shared "Sentence 1…" start let it embed 2 tokens where vserve embedded 7.
 */
export async function loadLeads(count = 4096): Promise<void> {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const { qwen3TokenizerJsonPath } = await import("../src/models/qwen3_vocab.ts");
  const path = qwen3TokenizerJsonPath();
  const json = JSON.parse(await Deno.readTextFile(path));
  const config = JSON.parse(
    await Deno.readTextFile(path.replace(/tokenizer\.json$/, "tokenizer_config.json")),
  );
  const tokenizer = new Tokenizer(json, config);
  const vocab = Object.keys(json.model.vocab as Record<string, number>).filter((t) =>
    /^[a-z]{5,10}$/.test(t)
  );
  leads = vocab.sort().filter((word) => tokenizer.encode(word).ids.length === 1).slice(0, count);
  nextLead = 0;
}

/** A fresh first word (empty before {@link loadLeads}). */
function lead(): string {
  return leads.length === 0 ? "" : `${leads[nextLead++ % leads.length]} `;
}

/** A prompt of `words` filler words, made unique by a fresh first word and `tag` (no cached prefix to reuse). */
export function promptText(tag: string, words: number): string {
  const out = [`${lead()}Request ${tag}.`];
  for (let i = 0; i < words; i++) out.push(FILLER[i % FILLER.length]);
  return out.join(" ");
}

/**
 * `count` short, distinct sentences, each starting with a fresh first word and made unique by `tag` (a
 * server that caches prompts must not serve a repetition, or a shared start, from its cache).
 */
export function sentences(count: number, tag = ""): string[] {
  return Array.from(
    { length: count },
    (_, i) => `${lead()}sentence ${tag}${i}: ${FILLER.slice(i % 7, (i % 7) + 8).join(" ")}.`,
  );
}

/** A short text (a few tokens) for latency measurements, with a fresh first word. */
export function shortText(tag: string): string {
  return `${lead()}hello world ${tag}`;
}

/**
 * Sampling sent explicitly with every chat request, so that no server's own defaults (llama-server's and
 * OpenAI's differ) decide how much sampling work a token costs. These are llama.cpp's defaults.
 */
export const SAMPLING = { temperature: 0.8, top_p: 0.95, top_k: 40, min_p: 0.05, seed: 1 } as const;

/** The chat request body (without `model`) every side receives. Thinking is off: the same prompt for all. */
export function chatBody(content: string, maxTokens: number): Record<string, unknown> {
  return {
    messages: [{ role: "user", content }],
    max_tokens: maxTokens,
    ...SAMPLING,
    chat_template_kwargs: { enable_thinking: false },
  };
}

/** When one generation started, produced its first token and ended, and its token counts. */
export interface StreamTiming {
  start: number;
  first: number;
  end: number;
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens the server took from its cache (`usage.prompt_tokens_details.cached_tokens`). */
  cachedTokens?: number;
  /** The generated text (content deltas). */
  text?: string;
}

/** Streams one chat completion through the official client; the first token is the first text delta. */
export async function httpStream(
  api: OpenAI,
  model: string,
  body: Record<string, unknown>,
): Promise<StreamTiming> {
  const start = performance.now();
  let first = NaN;
  let text = "";
  let usage: OpenAI.CompletionUsage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  const stream = await api.chat.completions.create({
    ...body,
    model,
    stream: true,
    stream_options: { include_usage: true },
  } as OpenAI.ChatCompletionCreateParamsStreaming);
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
    if (Number.isNaN(first) && (d?.content || d?.reasoning_content)) first = performance.now();
    if (d?.content) text += d.content;
    if (chunk.usage) usage = chunk.usage;
  }
  return {
    start,
    first,
    end: performance.now(),
    promptTokens: usage.prompt_tokens,
    completionTokens: usage.completion_tokens,
    cachedTokens: usage.prompt_tokens_details?.cached_tokens,
    text,
  };
}

/** Sequential calls from `clients` concurrent clients until `total` calls are done; sorted latencies, ms. */
export async function latencies(
  clients: number,
  total: number,
  call: (index: number) => Promise<unknown>,
): Promise<number[]> {
  const out: number[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: clients }, async () => {
    while (next < total) {
      const index = next++;
      const t0 = performance.now();
      await call(index);
      out.push(performance.now() - t0);
    }
  }));
  return out.sort((a, b) => a - b);
}

/**
 * The order of the sides in repetition `rep`: reversed every other repetition, so that neither side
 * always runs first (right after the other's load, or on a cooler machine).
 *
 * @example
 * ```ts
 * runOrder(["a", "b"], 1); // ["b", "a"]
 * ```
 */
export function runOrder<T>(sides: readonly T[], rep: number): T[] {
  return rep % 2 === 0 ? [...sides] : [...sides].reverse();
}
