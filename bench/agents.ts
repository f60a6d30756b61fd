/**
 * Prompts under concurrency, as clients send them: agent conversations that share a long system prompt
 * (a coding agent's instructions and tool definitions) and run several turns each, more conversations
 * than slots; and a burst of distinct long prompts that arrive together. The same client code for every
 * server (see bench/README.md).
 */
import { chatBody, promptText, type StreamTiming } from "./workload.ts";

/** One chat generation on the side measured. */
export type ChatCall = (body: Record<string, unknown>) => Promise<StreamTiming>;

/** The agent scenario's shape. */
export interface AgentShape {
  conversations: number;
  turns: number;
  /** Conversations running at once (each runs its turns one after another). */
  concurrency: number;
  /** Words of the shared system prompt (about 1.0–1.2 tokens each). */
  prefixWords: number;
  /** Words of each user message. */
  messageWords: number;
  /** `max_tokens` of each reply. */
  replyTokens: number;
}

/** What one run of the agent scenario measured. */
export interface AgentRun {
  /** Time to first token of each conversation's first turn, ms. */
  firstTurn: number[];
  /** Time to first token of the later turns, ms. */
  laterTurns: number[];
  promptTokens: number;
  /** Prompt tokens the server took from its cache (its `cached_tokens`). */
  cachedTokens: number;
  /** Prompt tokens of the first request (the shared prefix and one message). */
  firstPromptTokens: number;
  wallMs: number;
}

/**
 * Runs `shape.conversations` conversations, `shape.concurrency` at a time, each `shape.turns` turns:
 * the shared system prompt (made unique by `tag`, so that no run finds another run's prefix cached),
 * then per turn a user message of its own and the reply the server gave, as a client keeps history.
 */
export async function agentConversations(chat: ChatCall, shape: AgentShape, tag: string): Promise<AgentRun> {
  const system = promptText(`Agent instructions and tool definitions ${tag}`, shape.prefixWords);
  const run: AgentRun = {
    firstTurn: [],
    laterTurns: [],
    promptTokens: 0,
    cachedTokens: 0,
    firstPromptTokens: 0,
    wallMs: 0,
  };
  const queue = Array.from({ length: shape.conversations }, (_, i) => i);
  const start = performance.now();
  await Promise.all(Array.from({ length: Math.min(shape.concurrency, shape.conversations) }, async () => {
    for (let c = queue.shift(); c !== undefined; c = queue.shift()) {
      const messages: { role: string; content: string }[] = [{ role: "system", content: system }];
      for (let turn = 0; turn < shape.turns; turn++) {
        messages.push({
          role: "user",
          content: promptText(`conversation ${tag}-${c}, turn ${turn}`, shape.messageWords),
        });
        const t = await chat({ ...chatBody("", shape.replyTokens), messages: [...messages] });
        (turn === 0 ? run.firstTurn : run.laterTurns).push(t.first - t.start);
        run.promptTokens += t.promptTokens;
        run.cachedTokens += t.cachedTokens ?? 0;
        run.firstPromptTokens ||= t.promptTokens;
        messages.push({ role: "assistant", content: t.text ?? "" });
      }
    }
  }));
  run.wallMs = performance.now() - start;
  return run;
}

/** What one burst measured: each prompt's first token after the burst started, ms (sorted). */
export interface BurstRun {
  firsts: number[];
  promptTokens: number;
}

/** `count` distinct prompts of `words` words sent at once. */
export async function promptBurst(
  chat: ChatCall,
  count: number,
  words: number,
  replyTokens: number,
  tag: string,
): Promise<BurstRun> {
  const start = performance.now();
  const timings = await Promise.all(
    Array.from(
      { length: count },
      (_, i) => chat(chatBody(promptText(`burst ${tag}-${i}`, words), replyTokens)),
    ),
  );
  return {
    firsts: timings.map((t) => t.first - start).sort((a, b) => a - b),
    promptTokens: timings.reduce((n, t) => n + t.promptTokens, 0),
  };
}
