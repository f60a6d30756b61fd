/**
 * The host-memory prompt cache: saved sequence states (KV cache and recurrent state, as llama.cpp's
 * `llama_state_seq_get_data` writes them) keyed by the tokens they hold, bounded in bytes, least
 * recently used out. The scheduler saves a sequence here before it gives the sequence's memory to
 * another prompt, and restores an entry into any free sequence when it serves a new prompt's prefix
 * better than what the sequences hold. Pure bookkeeping: no native calls.
 */

/** A recurrent-state snapshot (`STATE_PARTIAL_ONLY`) taken after `pos` tokens. */
export interface Checkpoint {
  pos: number;
  data: Uint8Array;
}

/** What holds a prompt prefix: a sequence's memory or a cache entry. */
export interface PrefixHolder {
  /** The tokens whose state is held, in order. */
  readonly tokens: readonly number[];
  /** Recurrent-state checkpoints at earlier positions (recurrent and hybrid models). */
  readonly checkpoints: readonly Checkpoint[];
}

/** A saved sequence. */
export interface SavedPrompt extends PrefixHolder {
  /** The whole sequence state (`llama_state_seq_get_data_ext`, flags 0). */
  readonly state: Uint8Array;
}

/**
 * How many leading tokens of `prompt` a holder can give, at most `limit` (by default all but the
 * last token, whose logits must be computed). A KV cache can be cut anywhere; a recurrent state only
 * where it was taken: at the holder's end or at one of its checkpoints.
 *
 * @example
 * ```ts
 * usablePrefix({ tokens: [1, 2, 3, 4], checkpoints: [] }, [1, 2, 3, 9], false); // 3
 * usablePrefix({ tokens: [1, 2, 3, 4], checkpoints: [] }, [1, 2, 3, 9], true); // 0
 * ```
 */
export function usablePrefix(
  holder: PrefixHolder,
  prompt: readonly number[],
  recurrent: boolean,
  limit = prompt.length - 1,
): number {
  const p = Math.min(commonPrefix(holder.tokens, prompt), limit);
  if (!recurrent || p === holder.tokens.length) return p;
  let best = 0;
  for (const c of holder.checkpoints) if (c.pos <= p && c.pos > best) best = c.pos;
  return best;
}

/** Whether `holder` can give all of `tokens` (so a copy of them elsewhere is redundant). */
export function holdsAll(holder: PrefixHolder, tokens: readonly number[], recurrent: boolean): boolean {
  return usablePrefix(holder, tokens, recurrent, tokens.length) === tokens.length;
}

/** Length of the common prefix of two token lists. */
export function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Bytes an entry takes: its state and its checkpoints. */
export function entryBytes(entry: SavedPrompt): number {
  return entry.state.length + entry.checkpoints.reduce((n, c) => n + c.data.length, 0);
}

/** Counters and sizes of a {@link PromptCache}. */
export interface PromptCacheStats {
  /** Prompts that started from an entry. */
  hits: number;
  /** Tokens those prompts took from their entry. */
  tokensRestored: number;
  /** Entries stored. */
  saves: number;
  /** Entries dropped for room (least recently used first). */
  evictions: number;
  /** Entries dropped because a newer one holds all of theirs. */
  replaced: number;
  /** Bytes held now. */
  bytes: number;
  /** Entries held now. */
  entries: number;
}

/**
 * Saved prompts, at most `limitBytes` in all and `maxEntries` entries (a lookup compares the prompt
 * with every entry).
 *
 * @example
 * ```ts
 * const cache = new PromptCache(8192 * 1024 * 1024, false);
 * cache.put({ tokens: [1, 2, 3, 4], state: new Uint8Array(64), checkpoints: [] });
 * const found = cache.best([1, 2, 3, 9]); // { entry, tokens: 3 }, or undefined
 * ```
 */
export class PromptCache {
  /** Entries in use order: the first is the least recently used. */
  readonly #entries = new Set<SavedPrompt>();
  readonly stats: PromptCacheStats = {
    hits: 0,
    tokensRestored: 0,
    saves: 0,
    evictions: 0,
    replaced: 0,
    bytes: 0,
    entries: 0,
  };

  constructor(
    readonly limitBytes: number,
    readonly recurrent: boolean,
    readonly maxEntries = 256,
  ) {}

  /** Whether anything may be stored (a limit of 0 turns the cache off). */
  get enabled(): boolean {
    return this.limitBytes > 0 && this.maxEntries > 0;
  }

  /** Whether an entry of `bytes` may be stored at all. */
  fits(bytes: number): boolean {
    return this.enabled && bytes <= this.limitBytes;
  }

  /** The entry that gives `prompt` the most tokens (see {@link usablePrefix}), if any gives one. */
  best(prompt: readonly number[]): { entry: SavedPrompt; tokens: number } | undefined {
    let found: { entry: SavedPrompt; tokens: number } | undefined;
    for (const entry of this.#entries) {
      const tokens = usablePrefix(entry, prompt, this.recurrent);
      if (tokens > 0 && tokens >= (found?.tokens ?? 0)) found = { entry, tokens }; // later = fresher
    }
    return found;
  }

  /** Whether an entry holds all of `tokens`. */
  covers(tokens: readonly number[]): boolean {
    for (const entry of this.#entries) if (holdsAll(entry, tokens, this.recurrent)) return true;
    return false;
  }

  /** Records that a prompt took `tokens` from `entry`, which becomes the most recently used. */
  hit(entry: SavedPrompt, tokens: number): void {
    if (!this.#entries.delete(entry)) return;
    this.#entries.add(entry);
    this.stats.hits++;
    this.stats.tokensRestored += tokens;
  }

  /**
   * Stores `entry` as the most recently used; entries it holds all of are dropped, then the least
   * recently used ones until it fits. False (nothing changed) when it is larger than the limit.
   */
  put(entry: SavedPrompt): boolean {
    const bytes = entryBytes(entry);
    if (!this.fits(bytes)) return false;
    for (const old of [...this.#entries]) {
      if (holdsAll(entry, old.tokens, this.recurrent)) {
        this.#drop(old);
        this.stats.replaced++;
      }
    }
    for (const old of this.#entries) {
      if (this.stats.bytes + bytes <= this.limitBytes && this.#entries.size < this.maxEntries) break;
      this.#drop(old);
      this.stats.evictions++;
    }
    this.#entries.add(entry);
    this.stats.bytes += bytes;
    this.stats.entries = this.#entries.size;
    this.stats.saves++;
    return true;
  }

  #drop(entry: SavedPrompt) {
    this.#entries.delete(entry);
    this.stats.bytes -= entryBytes(entry);
    this.stats.entries = this.#entries.size;
  }
}
