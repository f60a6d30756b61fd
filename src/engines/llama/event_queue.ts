/** A push-to-pull bridge from callbacks to an async iterator. */

/**
 * Items pushed by a producer, read with `for await`; `fail` ends the reader with an error.
 *
 * @example
 * ```ts
 * const q = new EventQueue<number>();
 * q.push(1);
 * q.close();
 * for await (const x of q) console.log(x);
 * ```
 */
export class EventQueue<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #closed = false;
  #error: unknown;
  #failed = false;
  #wake: (() => void) | undefined;

  push(item: T): void {
    this.#items.push(item);
    this.#wake?.();
  }

  close(): void {
    this.#closed = true;
    this.#wake?.();
  }

  fail(e: unknown): void {
    this.#failed = true;
    this.#error = e;
    this.#wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    while (true) {
      if (this.#items.length > 0) {
        yield this.#items.shift()!;
        continue;
      }
      if (this.#failed) throw this.#error;
      if (this.#closed) return;
      await new Promise<void>((r) => (this.#wake = r));
      this.#wake = undefined;
    }
  }
}
