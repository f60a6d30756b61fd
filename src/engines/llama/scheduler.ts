/**
 * The generation loop: every step decodes the next token of every generating sequence in one
 * batch, then the next prompt chunks of new requests (chunks of one length on neighbouring
 * sequences in one batch), and samples each sequence from its logits.
 *
 * A prompt starts from the longest prefix of it that is already computed somewhere: in its own
 * sequence, in another sequence (busy or idle: copied), in the host-memory prompt cache (restored),
 * or in the prompt of a request still being prefilled (it waits until that prefix is computed, then
 * copies it: requests that arrive together with the same prefix compute it once). For recurrent
 * (hybrid) models, whose state cannot be cut back, prefixes are resumed from state checkpoints taken
 * at turn boundaries, or taken at a sequence's end.
 */
import type { Batch, NativeContext, NativeModel } from "./native.ts";
import { STATE_PARTIAL_ONLY } from "./ffi.ts";
import { Slicer } from "../../event_loop.ts";
import type { SampledToken, TokenLogprob, TokenSampler } from "./sampler.ts";
import type { GrammarConstraint } from "./grammar.ts";
import {
  type Checkpoint,
  commonPrefix,
  holdsAll,
  type PrefixHolder,
  type PromptCache,
  type SavedPrompt,
  usablePrefix,
} from "./prompt_cache.ts";

export { commonPrefix };

/** How one choice of a job samples. */
export interface ChoiceSpec {
  sampler: TokenSampler;
  grammar: GrammarConstraint | null;
}

/** Why a choice ended. */
export type FinishCause = "eog" | "length" | "stop";

/** One prompt with one or more choices (n) to generate. */
export interface GenerationJob {
  prompt: readonly number[];
  choices: ChoiceSpec[];
  /** Most tokens per choice (already bounded by the context). */
  maxTokens: number;
  /** Alternatives to report per token (undefined: no log-probabilities). */
  logprobs?: number;
  /** Prompt positions where a state checkpoint pays off (recurrent models), e.g. turn starts. */
  checkpoints?: readonly number[];
  /** False: start from an empty sequence instead of reusing a computed prefix. */
  reusePrefix?: boolean;
  /**
   * Called with the logits after each prompt token but the last (position i predicts token i+1),
   * for prompt log-probabilities; the prompt is then processed in small chunks, every token output.
   */
  onPromptLogits?: (position: number, logits: Float32Array) => void;
  signal: AbortSignal;
  /** The job got its sequences and starts (the end of its wait for them); before its prompt is processed. */
  onStart?(): void;
  /** The prompt is processed; `cachedTokens` of it came from an earlier request's state. */
  onPrompt(info: { promptTokens: number; cachedTokens: number }): void;
  /** A token was generated for `choice`; returning false ends that choice. */
  onToken(choice: number, token: number, logprob?: TokenLogprob): boolean;
  onEnd(choice: number, cause: FinishCause): void;
}

/** Counters for metrics and tests. */
export interface SchedulerStats {
  /** Prompt tokens run through the model (cached ones excluded). */
  promptTokensEvaluated: number;
  /** Prompt tokens taken from earlier state instead (own sequence, copies, the prompt cache). */
  promptTokensReused: number;
  /** Of those, tokens copied from another sequence. */
  promptTokensCopied: number;
  /** Prompts that started from a copy of another sequence's prefix. */
  prefixCopies: number;
  /** Prompts that waited for another prompt to compute their shared prefix, then copied it. */
  prefixWaits: number;
  tokensGenerated: number;
  decodes: number;
  /** Tokens per decode, summed (with `decodes`: the mean batch size). */
  batchedTokens: number;
  checkpointsSaved: number;
  checkpointsRestored: number;
  /** Sequences currently generating or prefilling. */
  busySequences: number;
  /** Milliseconds inside llama_decode (including waiting for the compute lock). */
  decodeMs: number;
  /** Milliseconds sampling and handling generated tokens (JS, per token). */
  sampleMs: number;
  /** Tokens drawn off the event loop while the other sequences decoded (a grammar's mask or accept). */
  drawsOffLoop: number;
  /** Milliseconds in steps altogether (decode + sampling + batch building). */
  stepMs: number;
  /** Milliseconds saving and restoring sequence states for the prompt cache. */
  promptCacheMs: number;
}

interface Slot extends PrefixHolder {
  seq: number;
  /** Tokens in this sequence's memory, in order. */
  tokens: number[];
  /** How many of the first `tokens` came from prompts (the rest were generated). */
  prompted: number;
  checkpoints: Checkpoint[];
  busy: boolean;
  lastUsed: number;
}

interface ChoiceState {
  index: number;
  slot: Slot;
  spec: ChoiceSpec;
  /** Sampled, not yet fed to the model. */
  pending: number;
  generated: number;
  done: boolean;
  /**
   * Its token being drawn off the event loop (a grammar's mask or accept): it sits out decode steps
   * until this settles, and the others go on (see {@link Scheduler.#sample}).
   */
  drawing?: Promise<void>;
}

interface Running {
  job: GenerationJob;
  slots: Slot[];
  /** Next prompt index to feed (prefill phase while < prompt length). */
  fed: number;
  cached: number;
  /** Prompt positions where a chunk must end (a checkpoint may be taken there). */
  boundaries: number[];
  /** When its last prompt chunk ran (-1: none yet). */
  lastChunk: number;
  /** Admission order (ties of {@link key}). */
  order: number;
  /** Prompt tokens evaluated (all prompts) when it was admitted. */
  arrival: number;
  /**
   * Prompt order: `arrival` + the prompt tokens it had to compute at admission, i.e. when it would
   * finish if it ran alone from its arrival. The smallest goes first.
   */
  key: number;
  /** Waiting for `leader`'s prefill to reach `target` prompt tokens, to copy them. */
  follows?: { leader: Running; target: number };
  checkpointAt: Set<number>;
  choices: ChoiceState[];
  resolve: () => void;
  reject: (e: unknown) => void;
  failed: boolean;
  /** Number for the trace. */
  id: number;
}

/** The next piece of a prompt to feed: positions [from, to) of its job's prompt. */
interface PromptChunk {
  r: Running;
  from: number;
  to: number;
}

/** Where a prompt's prefix can come from right now. */
type Source =
  | { kind: "slot"; slot: Slot; tokens: number }
  | { kind: "cache"; entry: SavedPrompt; tokens: number };

/**
 * Fewest prompt tokens worth reusing a slot that holds another prompt, worth a copy or a restore
 * over what a sequence holds itself, worth waiting for, and worth saving into the prompt cache. On
 * bench-chat (Qwen3-0.6B shape, CPU) a copy of a sequence's whole KV stream (470 MB) costs about the
 * prefill of 20–60 tokens.
 */
const MIN_REUSE = 64;

/**
 * Prompt tokens a step may compute: llama-server's `n_batch` (2,048), in chunks of
 * {@link SchedulerOptions.chunk}. While sequences generate, a step takes one chunk's worth of tokens
 * and goes further only while its prompt work has taken under {@link PROMPT_WORK_PER_DECODE} times
 * their last decode step: where a decode step is dear beside a chunk (a small model: 5-7 ms against
 * a 512-token chunk's 12-30 ms) it runs once per several chunks instead of once per chunk, and where a
 * chunk is long (a CPU and a large model: seconds) every 512 tokens are still followed by a decode
 * step, so a streaming client never waits for more than one chunk's worth or this bound.
 */
const STEP_PROMPT_TOKENS = 2048;
/** See {@link STEP_PROMPT_TOKENS}: a decode step costs at most about a sixth of the prompt work beside it. */
const PROMPT_WORK_PER_DECODE = 6;

/** Settings of the loop. */
export interface SchedulerOptions {
  /** Prompt tokens per chunk (llama.cpp's micro-batch). */
  chunk: number;
  /** Most checkpoints kept per sequence (recurrent models). */
  maxCheckpoints: number;
  /** Least distance between two checkpoints of a sequence ({@link checkpointMarks}). */
  checkpointSpacing: number;
  /** Decode each sequence's next token on its own (for backends that batch sequences wrongly). */
  oneSequencePerDecode?: boolean;
  /**
   * Whether same-length prompt chunks of neighbouring sequences share a decode: `measured` (the
   * default) when the decode times measured so far say it brings first tokens earlier on average
   * (`#sharingPays`), `always` whenever they can (tests of the batched path).
   */
  sharePromptChunks?: "measured" | "always";
  /**
   * While sequences generate, a step goes past one chunk's worth of prompt tokens while its prompt
   * work took under this many times their last decode step (default {@link PROMPT_WORK_PER_DECODE});
   * 0: never.
   */
  promptWorkPerDecode?: number;
  /** Saved sequence states in host memory (absent or disabled: none). */
  promptCache?: PromptCache;
  /** Receives the loop's events (a per-request timeline, for diagnosis; see chat.ts). */
  trace?: (event: Record<string, unknown>) => void;
}

/**
 * Runs jobs on a context's sequences.
 *
 * @example
 * ```ts
 * import type { Batch, NativeContext, NativeModel } from "./native.ts";
 * async function generate(model: NativeModel, ctx: NativeContext, batch: Batch, job: GenerationJob) {
 *   const scheduler = new Scheduler(model, ctx, batch, { chunk: 512, maxCheckpoints: 4, checkpointSpacing: 256 });
 *   await scheduler.run(job);
 * }
 * ```
 */
export class Scheduler {
  readonly #model: NativeModel;
  readonly #ctx: NativeContext;
  readonly #batch: Batch;
  readonly #opts: SchedulerOptions;
  readonly #cache: PromptCache | undefined;
  readonly #slots: Slot[];
  readonly #waiting: Running[] = [];
  readonly #running: Running[] = [];
  /**
   * Sequences copied from and to since the last decode: llama.cpp copies a KV stream at the start of
   * the next decode, so until then a copy's source must not be overwritten by a restore, nor its
   * destination saved or restored into.
   */
  readonly #copiedFrom = new Set<number>();
  readonly #copiedTo = new Set<number>();
  /** Sampling a step's sequences in 10 ms slices (one slicer for every step: no allocation a token). */
  readonly #sampleSlices = new Slicer(10);
  #looping = false;
  /** The loop while it runs. */
  #loop: Promise<void> = Promise.resolve();
  #wake: (() => void) | undefined;
  /** Something changed since the loop last looked ({@link #signal}): its next wait returns at once. */
  #signalled = false;
  /** Tokens being drawn off the event loop ({@link ChoiceState.drawing}), of running jobs or ended ones. */
  #drawing = 0;
  #clock = 0;
  #admitted = 0;
  /** Counts prompt chunks: the order in which prompts were last served. */
  #chunkClock = 0;
  /** Milliseconds the last decode step of generating sequences took, sampling included (0: none yet). */
  #lastDecodeStepMs = 0;
  #jobs = 0;
  readonly #trace: ((event: Record<string, unknown>) => void) | undefined;
  readonly stats: SchedulerStats = {
    promptTokensEvaluated: 0,
    promptTokensReused: 0,
    promptTokensCopied: 0,
    prefixCopies: 0,
    prefixWaits: 0,
    tokensGenerated: 0,
    decodes: 0,
    batchedTokens: 0,
    checkpointsSaved: 0,
    checkpointsRestored: 0,
    busySequences: 0,
    decodeMs: 0,
    sampleMs: 0,
    drawsOffLoop: 0,
    stepMs: 0,
    promptCacheMs: 0,
  };

  constructor(model: NativeModel, ctx: NativeContext, batch: Batch, opts: SchedulerOptions) {
    this.#model = model;
    this.#ctx = ctx;
    this.#batch = batch;
    this.#opts = opts;
    this.#cache = opts.promptCache?.enabled ? opts.promptCache : undefined;
    this.#trace = opts.trace;
    this.#slots = Array.from({ length: ctx.nSeqMax }, (_, seq) => ({
      seq,
      tokens: [],
      prompted: 0,
      checkpoints: [],
      busy: false,
      lastUsed: 0,
    }));
  }

  /** Sequences in the context (the most choices one job may have). */
  get sequences(): number {
    return this.#slots.length;
  }

  /** Tokens one sequence may hold. */
  get contextPerSequence(): number {
    return this.#ctx.nCtxSeq;
  }

  /** Runs `job` to its end; rejects with the signal's reason when it aborts. */
  run(job: GenerationJob): Promise<void> {
    if (job.choices.length > this.#slots.length) {
      return Promise.reject(new Error(`a job may have at most ${this.#slots.length} choices`));
    }
    if (job.prompt.length === 0) return Promise.reject(new Error("the prompt is empty"));
    return new Promise<void>((resolve, reject) => {
      const r: Running = {
        job,
        slots: [],
        fed: 0,
        lastChunk: -1,
        order: 0,
        arrival: 0,
        key: 0,
        cached: 0,
        boundaries: [],
        checkpointAt: new Set(),
        choices: [],
        resolve,
        reject,
        failed: false,
        id: ++this.#jobs,
      };
      this.#trace?.({ ev: "submit", id: r.id, prompt: job.prompt.length, waiting: this.#waiting.length });
      this.#waiting.push(r);
      // A job still waiting for sequences leaves at once; a running one at the next step.
      job.signal.addEventListener("abort", () => {
        const i = this.#waiting.indexOf(r);
        if (i >= 0) {
          this.#waiting.splice(i, 1);
          reject(job.signal.reason);
        }
        this.#signal();
      }, { once: true });
      this.#kick();
    });
  }

  #kick() {
    this.#signal();
    if (!this.#looping) this.#loop = this.#run();
  }

  /**
   * Resolves once the loop has stopped (no decode, no grammar step in flight: the context and the
   * model may be freed), or after `boundMs` (a job that is neither cancelled nor done keeps it going).
   */
  async stopped(boundMs: number): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.#loop, new Promise((r) => timer = setTimeout(r, boundMs))]);
    clearTimeout(timer);
  }

  /**
   * Tells the loop that something changed (a job came or left, sequences were freed, a token was
   * drawn): a wait under way ends, and one the loop is about to begin does not start. Draws settle
   * and detached jobs finish between the loop's look and its wait, several awaits apart.
   */
  #signal() {
    this.#signalled = true;
    this.#wake?.();
  }

  /** Waits for a {@link #signal} since the loop's last look. */
  async #sleep() {
    if (this.#signalled) return;
    await new Promise<void>((r) => (this.#wake = r));
    this.#wake = undefined;
  }

  async #run(): Promise<void> {
    this.#looping = true;
    try {
      while (this.#waiting.length > 0 || this.#running.length > 0 || this.#drawing > 0) {
        this.#signalled = false;
        this.#dropCancelled();
        // (Only when there is something to admit: a step of a running generation allocates nothing here.)
        if (this.#waiting.length > 0 || this.#running.some((r) => r.follows?.leader.failed)) {
          await this.#admit();
        }
        if (this.#running.length === 0) {
          if (this.#waiting.length === 0 && this.#drawing === 0) break;
          // Waiting jobs need more free sequences than there are, or tokens of ended jobs are still
          // being drawn (the loop, and the context's busy state, last until their grammar steps
          // are over): wait for a change.
          await this.#sleep();
          continue;
        }
        // Nothing to compute while the only generating choices draw their tokens: wait for one, with
        // the compute threads asleep (not spinning beside the grammar's thread) and the compute
        // share free for other models.
        if (!await this.#step() && this.#drawing > 0) {
          this.#ctx.idle();
          await this.#sleep();
        }
      }
    } finally {
      // In the same turn as the loop's last check (no await between them): a job submitted after
      // it starts a new loop. (Cleared one await later, a job submitted by the continuation of the
      // last one to finish was left waiting for good.)
      this.#looping = false;
      this.#ctx.idle();
    }
  }

  /** Ends jobs whose signal aborted (between decodes: a decode in flight always completes). */
  #dropCancelled() {
    const aborted = (r: Running) => r.job.signal.aborted;
    if (!this.#waiting.some(aborted) && !this.#running.some(aborted)) return;
    for (const r of [...this.#waiting]) {
      if (r.job.signal.aborted) {
        this.#waiting.splice(this.#waiting.indexOf(r), 1);
        r.reject(r.job.signal.reason);
      }
    }
    for (const r of [...this.#running]) if (r.job.signal.aborted) this.#finish(r, r.job.signal.reason);
  }

  /** Starts waiting jobs in order while enough sequences are free. */
  async #admit() {
    // Jobs whose leader went away (cancelled, failed) find their prefix elsewhere first.
    for (const r of [...this.#running]) {
      if (r.follows?.leader.failed) {
        r.follows = undefined;
        await this.#begin(r);
      }
    }
    while (this.#waiting.length > 0) {
      const r = this.#waiting[0];
      const free = this.#slots.filter((s) => !s.busy);
      if (free.length < r.job.choices.length) return;
      this.#waiting.shift();
      const primary = this.#bestSlot(free, r.job.prompt, r.job.reusePrefix !== false);
      // Next to the first one: the job's sequences then share micro-batches (see #decodeStep).
      const others = free.filter((s) => s !== primary)
        .sort((a, b) => Math.abs(a.seq - primary.seq) - Math.abs(b.seq - primary.seq))
        .slice(0, r.job.choices.length - 1);
      r.slots = [primary, ...others];
      for (const s of r.slots) {
        s.busy = true;
        s.lastUsed = ++this.#clock;
      }
      this.stats.busySequences += r.slots.length;
      r.job.onStart?.();
      r.order = ++this.#admitted;
      r.arrival = this.stats.promptTokensEvaluated;
      this.#trace?.({ ev: "admit", id: r.id, seq: primary.seq, held: primary.tokens.length });
      this.#running.push(r);
      await this.#begin(r);
    }
  }

  /**
   * Finds where `r`'s prompt starts: the longest prefix available now (its own sequence, a copy of
   * another one, the prompt cache), or, when a prompt being prefilled will hold a longer one soon,
   * that prompt (`r` waits for it). On failure `r` ends with the error.
   */
  async #begin(r: Running) {
    const prompt = r.job.prompt;
    const primary = r.slots[0];
    try {
      if (r.job.reusePrefix === false) {
        await this.#preserve(primary, r);
        this.#reset(primary);
        return this.#start(r, 0);
      }
      const own = usablePrefix(primary, prompt, this.#model.recurrent);
      const now = this.#bestSource(r, own);
      const available = Math.max(own, now?.tokens ?? 0);
      const leader = this.#bestLeader(r);
      if (leader && leader.target >= available + MIN_REUSE) {
        r.follows = leader;
        r.key = r.arrival + prompt.length - available;
        this.stats.prefixWaits++;
        this.#trace?.({ ev: "follow", id: r.id, leader: leader.leader.id, target: leader.target, available });
        return;
      }
      if (now) return this.#start(r, await this.#take(primary, now, r));
      await this.#preserve(primary, r);
      this.#start(r, await this.#reuse(primary, r));
    } catch (e) {
      this.#reset(primary);
      this.#finish(r, e);
    }
  }

  /** `r`'s prompt holds `cached` tokens: it is cut into chunks and goes to the prompt queue. */
  #start(r: Running, cached: number) {
    this.#trace?.({ ev: "start", id: r.id, cached, key: r.arrival + r.job.prompt.length - cached });
    r.cached = cached;
    r.fed = cached;
    r.key = r.arrival + r.job.prompt.length - cached;
    this.stats.promptTokensReused += cached;
    r.boundaries = this.#cuts(r.job);
    r.checkpointAt.clear();
    if (this.#model.recurrent) {
      for (const p of this.#checkpointMarks(r.job)) if (p > r.fed) r.checkpointAt.add(p);
    }
  }

  /**
   * Where `job`'s prompt chunks end (besides its end). They depend on the prompt alone, so a prompt
   * is always cut the same way, whatever else runs: at multiples of the chunk size and, for
   * recurrent models (where checkpoints are taken), at turn starts.
   */
  #cuts(job: GenerationJob): number[] {
    // Prompt log-probabilities need every token's logits: small chunks bound that output buffer.
    const chunk = job.onPromptLogits ? 64 : this.#opts.chunk;
    const hints = this.#model.recurrent ? this.#checkpointMarks(job) : [];
    const cuts = new Set(hints);
    const length = job.prompt.length;
    let last = 0;
    for (let p = chunk; p < length; p += chunk) last = p;
    // A last chunk under 64 tokens would take flash attention's row-by-row path, at twice the cost
    // of a token in a tile on CPU (bench-chat at 1,400 cells: 63 rows 2.1 s, 64 rows 1.0 s): the
    // last chunk starts 64 tokens before the end instead.
    const tail = chunk >= 2 * ATTENTION_TILE_ROWS && last > 0 && length - last < ATTENTION_TILE_ROWS &&
        !hints.some((h) => h >= length - ATTENTION_TILE_ROWS)
      ? length - ATTENTION_TILE_ROWS
      : last;
    for (let p = chunk; p < last; p += chunk) cuts.add(p);
    if (tail > 0) cuts.add(tail);
    return [...cuts].sort((a, b) => a - b);
  }

  /** Where `job`'s prompt is cut for a checkpoint: {@link checkpointMarks} of its turn starts. */
  #checkpointMarks(job: GenerationJob): number[] {
    return checkpointMarks(
      job.checkpoints ?? [],
      job.prompt.length,
      this.#opts.chunk,
      this.#opts.checkpointSpacing,
    );
  }

  /**
   * The free sequence for a new prompt: one whose memory serves most of it (at least 64 tokens and
   * half of what it holds); otherwise an empty or the least recently used one, so that a few shared
   * template tokens never evict another conversation (llama-server: similarity + LRU). A prefix held
   * elsewhere is then copied into it (see #begin).
   */
  #bestSlot(free: Slot[], prompt: readonly number[], reuse: boolean): Slot {
    let best: Slot | undefined;
    let bestScore = 0;
    for (const s of reuse ? free : []) {
      const score = usablePrefix(s, prompt, this.#model.recurrent);
      if (score < MIN_REUSE || score * 2 < s.tokens.length) continue;
      if (score > bestScore || (score === bestScore && best && s.lastUsed < best.lastUsed)) {
        best = s;
        bestScore = score;
      }
    }
    if (best) return best;
    // Otherwise a slot next to a busy one (busy sequences in one run of ids share a micro-batch: see
    // #decodeStep), then an empty one, then the least recently used (its cache is the stalest).
    const busy = new Set(this.#slots.filter((s) => s.busy).map((s) => s.seq));
    const adjacent = (s: Slot) => busy.has(s.seq - 1) || busy.has(s.seq + 1) ? 0 : 1;
    return [...free].sort((a, b) =>
      adjacent(a) - adjacent(b) ||
      (a.tokens.length === 0 ? 0 : 1) - (b.tokens.length === 0 ? 0 : 1) ||
      a.lastUsed - b.lastUsed ||
      a.seq - b.seq
    )[0];
  }

  /**
   * The longest prefix of `r`'s prompt held by another sequence (busy or idle) or the prompt cache,
   * if it beats `own` (what `r`'s sequence holds itself) by enough to pay for the copy.
   */
  #bestSource(r: Running, own: number): Source | undefined {
    const prompt = r.job.prompt;
    const primary = r.slots[0];
    const recurrent = this.#model.recurrent;
    let best: Source | undefined;
    for (const s of this.#slots) {
      // (A waiting follower's sequence still holds its old memory, which may serve.)
      if (s === primary) continue;
      const tokens = usablePrefix(s, prompt, recurrent);
      if (tokens > (best?.tokens ?? 0)) best = { kind: "slot", slot: s, tokens };
    }
    // A restore writes at once, while a pending copy from or to the sequence would land on it later.
    if (this.#cache && !this.#copiedFrom.has(primary.seq) && !this.#copiedTo.has(primary.seq)) {
      const found = this.#cache.best(prompt);
      if (found && found.tokens > (best?.tokens ?? 0)) best = { kind: "cache", ...found };
    }
    return best && best.tokens >= own + MIN_REUSE ? best : undefined;
  }

  /**
   * The prompt being prefilled that will hold the longest prefix of `r`'s prompt (more than it
   * holds now), and how far `r` must wait for it: for recurrent models, to the end of one of its
   * chunks, where the state can be copied as it is.
   */
  #bestLeader(r: Running): { leader: Running; target: number } | undefined {
    const prompt = r.job.prompt;
    let best: { leader: Running; target: number } | undefined;
    for (const o of this.#running) {
      if (o === r || o.failed || o.follows || o.fed >= o.job.prompt.length) continue;
      const shared = Math.min(commonPrefix(o.job.prompt, prompt), prompt.length - 1);
      let target = exactResume(this.#cuts(r.job), prompt.length, shared);
      if (this.#model.recurrent) {
        target = 0;
        for (const b of [...o.boundaries, o.job.prompt.length]) if (b <= shared && b > target) target = b;
      }
      if (target > o.fed && target > (best?.target ?? 0)) best = { leader: o, target };
    }
    return best;
  }

  /** Followers of `leader` whose prefix it now holds copy it and start. */
  async #wakeFollowers(leader: Running) {
    for (const r of [...this.#running]) {
      if (r.follows?.leader !== leader || leader.fed < r.follows.target || r.failed) continue;
      r.follows = undefined;
      const primary = r.slots[0];
      try {
        const tokens = usablePrefix(leader.slots[0], r.job.prompt, this.#model.recurrent);
        const own = usablePrefix(primary, r.job.prompt, this.#model.recurrent);
        if (tokens > own) {
          this.#start(
            r,
            await this.#take(primary, { kind: "slot", slot: leader.slots[0], tokens }, r),
          );
        } else {
          await this.#preserve(primary, r);
          this.#start(r, await this.#reuse(primary, r));
        }
      } catch (e) {
        this.#reset(primary);
        this.#finish(r, e);
      }
    }
  }

  /**
   * Replaces `slot`'s memory by a copy of `source` (another sequence, or a saved state) and cuts it
   * back to what `prompt` can use; returns that number of tokens.
   */
  async #take(slot: Slot, source: Source, r: Running): Promise<number> {
    await this.#preserve(slot, r);
    this.#reset(slot);
    this.#trace?.({
      ev: "take",
      id: r.id,
      kind: source.kind,
      from: source.kind === "slot" ? source.slot.seq : undefined,
      tokens: source.tokens,
    });
    if (source.kind === "slot") {
      this.#ctx.copySequence(source.slot.seq, slot.seq);
      this.#copiedFrom.add(source.slot.seq);
      this.#copiedTo.add(slot.seq);
      slot.tokens = [...source.slot.tokens];
      slot.prompted = source.slot.prompted;
      slot.checkpoints = [...source.slot.checkpoints];
      const kept = await this.#reuse(slot, r);
      this.stats.prefixCopies++;
      this.stats.promptTokensCopied += kept;
      return kept;
    }
    const started = performance.now();
    try {
      await this.#ctx.restoreState(slot.seq, source.entry.state, 0);
    } finally {
      this.stats.promptCacheMs += performance.now() - started;
      this.#trace?.({ ev: "restored", id: r.id, seq: slot.seq, ms: performance.now() - started });
    }
    slot.tokens = [...source.entry.tokens];
    slot.prompted = slot.tokens.length;
    slot.checkpoints = [...source.entry.checkpoints];
    const kept = await this.#reuse(slot, r);
    this.#cache!.hit(source.entry, kept);
    return kept;
  }

  /**
   * Saves `slot`'s memory into the prompt cache before `r`'s prompt replaces it, unless what would
   * be lost is held elsewhere (another sequence, an entry) or is not worth the save: when `r` keeps
   * all but fewer than 64 tokens of the prompts `slot` computed (beyond its common prefix with
   * them), `r` continues the conversation `slot` holds, and all it drops is that conversation's
   * generated tail, which the client sent back in another form (reasoning left out, the reply
   * tokenized anew), so that no later request starts with it. A save copies the whole state
   * (bench-chat: 175 MB and 0.13–0.58 s for a 1,500-token sequence) on the way to the next
   * prompt's first token; an agent turn waited for one each.
   */
  async #preserve(slot: Slot, r: Running) {
    const cache = this.#cache;
    const lost = Math.min(slot.prompted, slot.tokens.length) - commonPrefix(slot.tokens, r.job.prompt);
    if (!cache || lost < MIN_REUSE || this.#copiedTo.has(slot.seq)) return;
    const recurrent = this.#model.recurrent;
    // A waiting follower's sequence is about to be replaced: it keeps nothing for anyone.
    const replaced = new Set(this.#running.filter((r) => r.follows).map((r) => r.slots[0]));
    const elsewhere = this.#slots.some((s) =>
      s !== slot && !replaced.has(s) && holdsAll(s, slot.tokens, recurrent)
    );
    if (elsewhere || cache.covers(slot.tokens)) return;
    const started = performance.now();
    try {
      const bytes = this.#ctx.stateSize(slot.seq, 0) +
        slot.checkpoints.reduce((n, c) => n + c.data.length, 0);
      if (!cache.fits(bytes)) return;
      const state = await this.#ctx.saveState(slot.seq, 0);
      cache.put({ tokens: [...slot.tokens], state, checkpoints: [...slot.checkpoints] });
      this.#trace?.({
        ev: "saved",
        seq: slot.seq,
        tokens: slot.tokens.length,
        bytes: state.length,
        ms: performance.now() - started,
      });
    } catch {
      // Out of host memory, or llama.cpp could not write the state: nothing is saved, nothing lost.
    } finally {
      this.stats.promptCacheMs += performance.now() - started;
    }
  }

  /** Cuts `slot`'s memory back to what `r`'s prompt can reuse; returns the number of reused tokens. */
  async #reuse(slot: Slot, r: Running): Promise<number> {
    const prompt = r.job.prompt;
    let p = Math.min(commonPrefix(slot.tokens, prompt), prompt.length - 1);
    if (!this.#model.recurrent) p = exactResume(this.#cuts(r.job), prompt.length, p);
    if (p === slot.tokens.length) return p;
    if (!this.#model.recurrent) {
      if (this.#ctx.removeTokens(slot.seq, p)) {
        slot.tokens.length = p;
        slot.prompted = Math.min(slot.prompted, p);
        return p;
      }
      this.#reset(slot);
      return 0;
    }
    const checkpoint = slot.checkpoints.filter((c) => c.pos <= p).sort((a, b) => b.pos - a.pos)[0];
    if (!checkpoint) {
      this.#reset(slot);
      return 0;
    }
    await this.#ctx.restoreState(slot.seq, checkpoint.data, STATE_PARTIAL_ONLY);
    if (!this.#ctx.removeTokens(slot.seq, checkpoint.pos)) {
      this.#reset(slot);
      return 0;
    }
    this.stats.checkpointsRestored++;
    slot.tokens.length = checkpoint.pos;
    slot.prompted = Math.min(slot.prompted, checkpoint.pos);
    slot.checkpoints = slot.checkpoints.filter((c) => c.pos <= checkpoint.pos);
    return checkpoint.pos;
  }

  #reset(slot: Slot) {
    this.#ctx.removeTokens(slot.seq, -1, -1);
    slot.tokens = [];
    slot.prompted = 0;
    slot.checkpoints = [];
  }

  /**
   * One batch: decode tokens of generating choices, then prompt chunks while there is room. False
   * when there was nothing to compute.
   */
  async #step(): Promise<boolean> {
    const started = performance.now();
    try {
      return await this.#stepInner();
    } finally {
      this.stats.stepMs += performance.now() - started;
    }
  }

  async #stepInner(): Promise<boolean> {
    let worked = await this.#decodeStep();
    // Before the prompt chunks (seconds on a CPU): a request whose last token came settles now,
    // and its sequence is free for the next one (an agent's next turn waited for the chunks).
    // Every step of every generation runs this: nothing is allocated unless there is work.
    this.#finishDone();
    if (this.#waiting.length > 0 || this.#running.some((r) => r.fed < r.job.prompt.length)) {
      if (await this.#prefillStep()) worked = true;
    }
    this.#finishDone();
    return worked;
  }

  #finishDone() {
    const finished = (r: Running) => r.choices.length > 0 && r.choices.every((c) => c.done);
    if (this.#running.some(finished)) {
      for (const r of this.#running.filter(finished)) this.#finish(r);
    }
  }

  /** Whether a sequence is generating (its prompt computed, a choice not done). */
  #generating(): boolean {
    return this.#running.some((r) => r.fed >= r.job.prompt.length && r.choices.some((c) => !c.done));
  }

  /** The next token of every generating choice, in one decode; false when there was none. */
  async #decodeStep(): Promise<boolean> {
    const decodes: { choice: ChoiceState; running: Running; out: number }[] = [];
    for (const r of this.#running) {
      if (r.fed < r.job.prompt.length) continue;
      for (const c of r.choices) if (!c.done && !c.drawing) decodes.push({ choice: c, running: r, out: -1 });
    }
    if (decodes.length === 0) return false;
    const stepStart = performance.now();
    // In sequence order: with a KV stream per sequence (and for recurrent state), llama.cpp puts only
    // runs of consecutive sequence ids into one micro-batch, so any other order costs a model pass per
    // run (8 streams: up to 8 passes a step instead of 1).
    decodes.sort((a, b) => a.choice.slot.seq - b.choice.slot.seq);
    const groups = this.#opts.oneSequencePerDecode ? decodes.map((d) => [d]) : [decodes];
    const batch = this.#batch;
    for (const [i, group] of groups.entries()) {
      // (One decode per sequence: a request whose client left during an earlier one gets none.)
      if (i > 0) this.#dropCancelled();
      if (group.every((d) => d.running.failed)) continue;
      batch.clear();
      for (const d of group) {
        d.out = batch.add(d.choice.pending, d.choice.slot.tokens.length, d.choice.slot.seq, true);
      }
      const t0 = performance.now();
      if (!await this.#decode(new Set(group.map((d) => d.running)))) continue;
      const sampleStart = performance.now();
      this.#trace?.({ ev: "decode", n: group.length, ms: sampleStart - t0 });
      // Sampling with 20 log-probabilities is ~5 ms a sequence: 8 of them held the event loop for
      // 40 ms a step. The logits stay valid across a pause: nothing decodes on this context meanwhile.
      const slices = this.#sampleSlices;
      slices.restart();
      for (const d of group) {
        if (slices.due) await slices.pause();
        d.choice.slot.tokens.push(d.choice.pending);
        if (!d.running.failed) this.#sample(d.running, d.choice, d.out);
      }
      this.stats.sampleMs += performance.now() - sampleStart;
    }
    this.#lastDecodeStepMs = performance.now() - stepStart;
    return true;
  }

  /**
   * Prompt chunks, up to {@link STEP_PROMPT_TOKENS} in all (at least one chunk; fewer while sequences
   * wait for their next token), the prompt with the smallest {@link Running.key} first, to its end if
   * the step has room: the one that would finish first had it run alone since it arrived. Prompts
   * that arrive together are finished one after the other, shortest first, instead of all together
   * at the end; a short request never waits for a long prompt; and a long prompt moves ahead of
   * newer ones once it has waited as long as its own work takes. A prompt that others wait for to
   * copy its prefix goes at the earliest of their keys. (One chunk per prompt and step, as before,
   * served prompts of two chunks round robin: 8 agent turns of ~130 tokens cut at 1,536 all got
   * their first token after the last one's second chunk.)
   *
   * Greedy output must not depend on load: a sequence has to compute exactly as it would alone.
   * llama.cpp splits a batch of several sequences into micro-batches of equal length per sequence
   * (recurrent layers, and per-sequence KV streams, need that), so a prompt chunk sharing a batch
   * with a chunk of another length would be cut into other pieces than when it runs alone, and its
   * numbers would differ in the last bits. A chunk therefore shares its decode only with chunks of
   * the same length on neighbouring sequences (one micro-batch, each sequence cut as when alone:
   * a burst of same-length prompts takes one pass over the weights instead of one each).
   */
  async #prefillStep(): Promise<boolean> {
    const chunk = this.#opts.chunk;
    const most = Math.max(chunk, STEP_PROMPT_TOKENS);
    const ratio = this.#opts.promptWorkPerDecode ?? PROMPT_WORK_PER_DECODE;
    const started = performance.now();
    let taken = 0;
    // Prompts whose next chunk is longer than what is left of this step's tokens.
    const deferred = new Set<Running>();
    for (;;) {
      // A request whose client left during an earlier decode of this step gets no chunk; one that
      // came meanwhile starts (it may go first).
      this.#dropCancelled();
      await this.#admit();
      const chunks = this.#nextChunks().filter((c) => !deferred.has(c.r));
      if (chunks.length === 0) break;
      // Sequences waiting for their next token get it after one chunk's worth of tokens, unless
      // their decode step is cheap beside the prompt work done so far (STEP_PROMPT_TOKENS).
      let room = most - taken;
      if (taken > 0 && this.#generating() && performance.now() - started >= ratio * this.#lastDecodeStepMs) {
        room = chunk - taken;
      }
      if (room <= 0) break;
      const c = chunks[0];
      const length = c.to - c.from;
      if (length > room && taken > 0) {
        deferred.add(c.r);
        continue;
      }
      // One decode holds one chunk's worth of tokens at most (the batch's size).
      const group = this.#sameLengthRun(c, chunks, Math.max(Math.min(room, chunk), length));
      // A chunk of a prompt whose log-probabilities are wanted counts as a whole chunk: each of its
      // (64) tokens has its logits computed and passed over. Counted by its tokens, 8 of them ran
      // between two decode steps (1.1 s on tiny-chat), and a chat beside a 24,000-token echo waited
      // for the whole echo (52 s against 0.2 alone).
      taken += (c.r.job.onPromptLogits ? Math.max(length, chunk) : length) * group.length;
      await this.#prefill(group);
    }
    return taken > 0;
  }

  /** The next chunk of every prompt being computed, in the order prompts are served. */
  #nextChunks(): PromptChunk[] {
    const key = new Map<Running, number>();
    for (const r of this.#running) {
      if (r.follows) {
        const leader = r.follows.leader;
        key.set(leader, Math.min(key.get(leader) ?? leader.key, r.key));
      } else if (!key.has(r)) key.set(r, r.key);
    }
    return this.#running.filter((r) => r.fed < r.job.prompt.length && !r.follows && !r.failed)
      .sort((a, b) => key.get(a)! - key.get(b)! || a.order - b.order)
      .map((r) => ({ r, from: r.fed, to: r.boundaries.find((p) => p > r.fed) ?? r.job.prompt.length }));
  }

  /**
   * `c` and the chunks of `candidates` that can share its decode: the same length, on the sequences
   * next to its own (llama.cpp puts only consecutive sequence ids into one micro-batch), within
   * `tokens` in all, when sharing pays ({@link #sharingPays}). A one-token chunk always runs alone:
   * it is shaped like a decode step, and alone it can take llama.cpp's split-KV flash attention on
   * CPU (one query row in one KV stream of 512 cells or more), which rounds differently from the
   * path of a batch of several sequences.
   */
  #sameLengthRun(c: PromptChunk, candidates: PromptChunk[], tokens: number): PromptChunk[] {
    const length = c.to - c.from;
    const alone = (o: PromptChunk) => o.r.job.onPromptLogits !== undefined || o.r.failed;
    if (this.#opts.oneSequencePerDecode || alone(c) || length === 1 || !this.#sharingPays(length)) return [c];
    const bySeq = new Map<number, PromptChunk>();
    for (const o of candidates) if (o.to - o.from === length && !alone(o)) bySeq.set(o.r.slots[0].seq, o);
    const most = Math.floor(tokens / length);
    const seq = c.r.slots[0].seq;
    let low = seq;
    let high = seq;
    while (high - low + 1 < most && (bySeq.has(high + 1) || bySeq.has(low - 1))) {
      if (bySeq.has(high + 1)) high++;
      else low--;
    }
    const run: PromptChunk[] = [];
    for (let s = low; s <= high; s++) run.push(bySeq.get(s) ?? c);
    return run;
  }

  /**
   * Whether chunks of `length` tokens on k sequences finish earlier on average in one decode than
   * one after another. A decode costs about a + b·tokens: in one decode all k finish after
   * a + k·length·b; one after another the i-th after i·(a + length·b). One decode has the lower
   * mean when length·b < a, that is when a chunk alone costs less than two one-token decodes (as
   * measured: see pace.ts). So on a GPU, where a decode's fixed cost dominates, they share; on a
   * CPU they do not (bench-chat, one thread, at 1,400 cells: 64 tokens 1.0 s, one token 0.09 s;
   * four chunks of 64 in one decode took 7% less than one after another, and all waited for the
   * last). Unmeasured: alone.
   */
  #sharingPays(length: number): boolean {
    if (this.#opts.sharePromptChunks === "always") return true;
    const one = this.#ctx.expectedDecode(1, false);
    const chunk = this.#ctx.expectedDecode(length, false);
    return one.samples > 0 && chunk.samples > 0 && chunk.ms < 2 * one.ms;
  }

  /** Runs chunks (sequence order, one length) as one decode, then takes each one's prompt further. */
  async #prefill(group: PromptChunk[]) {
    const batch = this.#batch;
    batch.clear();
    const outs: number[] = [];
    for (const { r, from, to } of group) {
      const every = r.job.onPromptLogits !== undefined;
      let out = -1;
      for (let i = from; i < to; i++) {
        out = batch.add(r.job.prompt[i], i, r.slots[0].seq, every || i === r.job.prompt.length - 1);
      }
      outs.push(out);
      r.lastChunk = ++this.#chunkClock;
    }
    const t0 = performance.now();
    if (!await this.#decode(new Set(group.map((g) => g.r)))) return;
    const sampleStart = performance.now();
    this.#trace?.({
      ev: "chunk",
      ids: group.map((g) => g.r.id),
      from: group[0].from,
      to: group[0].to,
      ms: sampleStart - t0,
    });
    let first = 0;
    for (const [k, { r, from, to }] of group.entries()) {
      const slot = r.slots[0];
      for (let i = from; i < to; i++) slot.tokens.push(r.job.prompt[i]);
      slot.prompted = slot.tokens.length;
      if (r.job.onPromptLogits) {
        try {
          // A position's log-probabilities are passes over the whole vocabulary (3-5 ms at 151k
          // entries): a 64-token chunk held the event loop for 200-300 ms, and a long echoed prompt
          // for the whole of its prefill. The views stay valid across a pause: nothing decodes on
          // this context until this returns.
          const slices = new Slicer(10);
          for (let i = from; i < Math.min(to, r.job.prompt.length - 1); i++) {
            if (slices.due) await slices.pause();
            r.job.onPromptLogits(i, this.#ctx.logits(first + i - from));
          }
        } catch (e) {
          this.#finish(r, e);
        }
      }
      first += to - from;
      r.fed = to;
      this.stats.promptTokensEvaluated += to - from;
      if (r.checkpointAt.has(to)) await this.#checkpoint(slot, to);
      // A finished prompt's first token before its followers start: each may first save the sequence
      // it takes (on bench-chat 7 saves of 97 MB held a leader's first token 1.8 s). Either way before
      // the next chunk, so that a recurrent state is copied as it is at this boundary. (Followers of a
      // leader that failed find their prefix elsewhere: #admit.)
      if (r.fed === r.job.prompt.length && !r.failed) await this.#startChoices(r, outs[k]);
      if (!r.failed) await this.#wakeFollowers(r);
    }
    this.stats.sampleMs += performance.now() - sampleStart;
  }

  /** Runs the batch; on failure the memory of `jobs`' sequences is unknown: it is dropped and they fail. */
  async #decode(jobs: Set<Running>): Promise<boolean> {
    this.stats.decodes++;
    this.stats.batchedTokens += this.#batch.size;
    const decodeStart = performance.now();
    try {
      await this.#ctx.decode(this.#batch);
      this.#copiedFrom.clear();
      this.#copiedTo.clear();
      return true;
    } catch (e) {
      for (const r of jobs) {
        for (const s of r.slots) this.#reset(s);
        this.#finish(r, e);
      }
      return false;
    } finally {
      this.stats.decodeMs += performance.now() - decodeStart;
    }
  }

  async #checkpoint(slot: Slot, pos: number) {
    try {
      const data = await this.#ctx.saveState(slot.seq, STATE_PARTIAL_ONLY);
      slot.checkpoints.push({ pos, data });
      if (slot.checkpoints.length > this.#opts.maxCheckpoints) slot.checkpoints.shift();
      this.stats.checkpointsSaved++;
    } catch {
      // A missing checkpoint only costs recomputation later.
    }
  }

  /** The prompt is in memory: copy it to the other choices' sequences and sample each first token. */
  async #startChoices(r: Running, out: number) {
    const [primary, ...others] = r.slots;
    for (const s of others) {
      await this.#preserve(s, r);
      this.#reset(s);
      this.#ctx.copySequence(primary.seq, s.seq);
      this.#copiedFrom.add(primary.seq);
      this.#copiedTo.add(s.seq);
      s.tokens = [...primary.tokens];
      s.prompted = primary.prompted;
    }
    this.#trace?.({ ev: "prompted", id: r.id, cached: r.cached });
    r.choices = r.job.choices.map((spec, index) => ({
      index,
      slot: r.slots[index],
      spec,
      pending: -1,
      generated: 0,
      done: false,
      drawing: undefined,
    }));
    try {
      r.job.onPrompt({ promptTokens: r.job.prompt.length, cachedTokens: r.cached });
    } catch (e) {
      this.#finish(r, e);
      return;
    }
    // max_tokens 0 (legacy completions with echo): the prompt alone was wanted.
    if (r.job.maxTokens <= 0) { for (const c of r.choices) this.#end(r, c, "length"); }
    else {
      const slices = new Slicer(10);
      for (const c of r.choices) {
        if (slices.due) await slices.pause();
        this.#sample(r, c, out);
      }
    }
  }

  /**
   * Draws the next token of `c` from the logits of batch row `out` and hands it on. On the event
   * loop when it can be; a draw that needs a grammar's full mask, or a grammar's accept with many
   * open alternatives, goes on off the loop ({@link ChoiceState.drawing}) while the other sequences
   * decode: with hundreds of alternatives a mask takes 0.15-5 s a token, which held every request on
   * the model to its pace when the step waited for it. The logits are read before this returns (the
   * sampler's own copy), so the next decode may overwrite them.
   */
  #sample(r: Running, c: ChoiceState, out: number): void {
    if (r.failed || c.done) return;
    try {
      const drawn = c.spec.sampler.sampleNow(
        this.#ctx.logits(out),
        c.spec.grammar ?? undefined,
        r.job.logprobs,
      );
      if (drawn instanceof Promise) this.#offLoop(r, c, drawn.then((d) => this.#use(r, c, d)));
      else {
        const accepting = this.#use(r, c, drawn);
        if (accepting) this.#offLoop(r, c, accepting);
      }
    } catch (e) {
      this.#finish(r, e);
    }
  }

  /**
   * Takes a drawn token: the end of the choice, or the grammar's step and the job's token; a promise
   * when the grammar's step runs off the event loop.
   */
  #use(r: Running, c: ChoiceState, { token, logprob }: SampledToken): void | Promise<void> {
    if (r.failed || c.done) return;
    if (this.#model.isEog(token)) return this.#end(r, c, "eog");
    // Off the event loop (a promise) when the grammar has many open alternatives (grammar.ts).
    const accepted = c.spec.grammar?.accept(token);
    if (accepted) return accepted.then(() => this.#took(r, c, token, logprob));
    this.#took(r, c, token, logprob);
  }

  #took(r: Running, c: ChoiceState, token: number, logprob: TokenLogprob | undefined) {
    if (r.failed || c.done) return;
    c.spec.sampler.accept(token);
    c.generated++;
    this.stats.tokensGenerated++;
    if (!r.job.onToken(c.index, token, logprob)) return this.#end(r, c, "stop");
    if (c.generated >= r.job.maxTokens || c.slot.tokens.length + 1 >= this.#ctx.nCtxSeq) {
      return this.#end(r, c, "length");
    }
    c.pending = token;
  }

  /** `c` sits out decode steps until `work` settles; an error ends its job. */
  #offLoop(r: Running, c: ChoiceState, work: Promise<void>) {
    this.#drawing++;
    this.stats.drawsOffLoop++;
    c.drawing = work.catch((e) => this.#finish(r, e)).finally(() => {
      c.drawing = undefined;
      this.#drawing--;
      this.#signal();
    });
  }

  #end(r: Running, c: ChoiceState, cause: FinishCause) {
    c.done = true;
    try {
      r.job.onEnd(c.index, cause);
    } catch (e) {
      this.#finish(r, e);
    }
  }

  /** Removes a job, frees its sequences (their memory stays for reuse) and settles it. */
  #finish(r: Running, error?: unknown) {
    if (r.failed) return;
    r.failed = true;
    this.#trace?.({ ev: "end", id: r.id, error: error !== undefined });
    const i = this.#running.indexOf(r);
    if (i >= 0) this.#running.splice(i, 1);
    this.#releaseSlots(r);
    const settle = () => error !== undefined ? r.reject(error) : r.resolve();
    // Its grammars stay allocated until no token of theirs is being drawn (the job's owner frees them).
    const drawing = r.choices.flatMap((c) => c.drawing ? [c.drawing] : []);
    if (drawing.length === 0) settle();
    else void Promise.allSettled(drawing).then(settle);
  }

  #releaseSlots(r: Running) {
    for (const s of r.slots) {
      if (s.busy) this.stats.busySequences--;
      s.busy = false;
    }
    this.#signal();
  }
}

/**
 * ggml's CPU flash attention computes a chunk of at least this many query rows in tiles (F32 matrix
 * products), fewer row by row (F16 dot products), and one row over 512 or more KV cells split across
 * threads: the three round differently. (`GGML_FA_TILE_Q`.)
 */
const ATTENTION_TILE_ROWS = 64;

/**
 * The turn starts (`hints`) of a prompt of `length` tokens where it is cut and a recurrent-state
 * checkpoint is taken: none before `first` (a shorter prefix is cheap to recompute), then each one at
 * least `spacing` after the last one kept. Every cut costs the chunk before it a pass over the
 * weights: a cut at every turn start made a conversation of 3,000 short turns compute its prompt in
 * chunks of a few tokens. The choice depends only on the turn starts before a position, so a longer
 * prompt that extends this one keeps every cut this one had, and a prompt resumed from one of these
 * checkpoints computes exactly as it does alone.
 *
 * @example
 * ```ts
 * checkpointMarks([100, 600, 650, 900, 1000], 1200, 512, 256); // [600, 900]
 * ```
 */
export function checkpointMarks(
  hints: readonly number[],
  length: number,
  first: number,
  spacing: number,
): number[] {
  const marks: number[] = [];
  let last = -Infinity;
  for (const p of [...hints].sort((a, b) => a - b)) {
    if (p < first || p >= length || p - last < spacing) continue;
    marks.push(p);
    last = p;
  }
  return marks;
}

/**
 * Where a prompt (cut at `cuts`) whose first `held` tokens are in memory resumes, for a KV cache
 * that can be cut anywhere: at most `held`, and far enough back that the chunk it then computes up
 * to the next cut takes the attention path of the chunk the prompt computes there alone (at least
 * 64 rows, 2 to 63, or one). Then it computes exactly as alone (flash attention on CPU included),
 * for at most 63 tokens recomputed.
 *
 * @example
 * ```ts
 * exactResume([512], 722, 708); // 658: rows 658-721 in one chunk of 64, as 512-721 alone
 * ```
 */
export function exactResume(cuts: readonly number[], length: number, held: number): number {
  let start = 0;
  let end = length;
  for (const c of cuts) {
    if (c <= held) start = c;
    else {
      end = c;
      break;
    }
  }
  const alone = end - start;
  if (alone >= ATTENTION_TILE_ROWS) return Math.min(held, end - ATTENTION_TILE_ROWS);
  if (alone === 1) return held;
  return Math.min(held, end - 2);
}
