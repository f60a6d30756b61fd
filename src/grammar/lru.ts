/**
 * A map that keeps its most recently used entries, within a number of entries and a total size
 * (what `size` means is the caller's: characters, say). `onDrop` is told of each value let go of:
 * pushed out, replaced, or too large to keep.
 *
 * @example
 * ```ts
 * const texts = new LruCache<string>(2);
 * texts.set("a", "root ::= \"a\"", 14);
 * texts.get("a"); // 'root ::= "a"'
 * ```
 */
export class LruCache<V> {
  readonly #entries = new Map<string, { value: V; size: number }>();
  #size = 0;

  constructor(
    readonly maxEntries: number,
    readonly maxSize = Infinity,
    readonly onDrop?: (key: string, value: V) => void,
  ) {}

  /** The value for `key`, now the most recently used; undefined when absent. */
  get(key: string): V | undefined {
    const entry = this.#entries.get(key);
    if (!entry) return undefined;
    this.#entries.delete(key);
    this.#entries.set(key, entry);
    return entry.value;
  }

  /** Stores `value`, dropping the least recently used entries beyond the bounds. */
  set(key: string, value: V, size = 0): void {
    const old = this.#entries.get(key);
    if (old) {
      this.#entries.delete(key);
      this.#size -= old.size;
      if (old.value !== value) this.onDrop?.(key, old.value);
    }
    if (size > this.maxSize) return this.onDrop?.(key, value);
    this.#entries.set(key, { value, size });
    this.#size += size;
    for (const [k, e] of this.#entries) {
      if (this.#entries.size <= this.maxEntries && this.#size <= this.maxSize) break;
      this.#entries.delete(k);
      this.#size -= e.size;
      this.onDrop?.(k, e.value);
    }
  }

  /** Entries held. */
  get size(): number {
    return this.#entries.size;
  }
}
