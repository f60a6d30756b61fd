/**
 * The log-probabilities of a prompt's tokens (a legacy `echo` with `logprobs`), kept as numbers in
 * two typed arrays while the prompt is processed: per position its token id and log-probability and
 * those of up to `k` alternatives. Token texts are looked up only when the answer is written.
 *
 * As objects (one per token and alternative, each with its string and byte array) a 20,000-token
 * echo with 20 alternatives grew the JavaScript heap by ~240 MB over its prefill, and each
 * young-generation collection meanwhile copied ~4 MB of them (10-50 ms pauses of every route). Here
 * they are 12 bytes a number and two objects in all: a collection has nothing of them to copy.
 */
export class PromptLogprobs {
  /** Numbers per position: the token, then `k` alternatives. */
  readonly #stride: number;
  #ids: Int32Array;
  #values: Float64Array;
  #length = 0;

  /** `k`: the alternatives per position (0-20); `capacity`: positions to make room for at first. */
  constructor(readonly k: number, capacity = 64) {
    this.#stride = 1 + k;
    this.#ids = new Int32Array(Math.max(1, capacity) * this.#stride);
    this.#values = new Float64Array(Math.max(1, capacity) * this.#stride);
  }

  /** Positions held. */
  get length(): number {
    return this.#length;
  }

  /**
   * Appends a position: its token and log-probability and its alternatives, most likely first (at
   * most `k` are kept; fewer leave the rest empty).
   *
   * @example
   * ```ts
   * const table = new PromptLogprobs(2);
   * table.push(7, -1.5, [{ token: 7, logprob: -1.5 }, { token: 3, logprob: -2 }]);
   * table.alternatives(0); // 2
   * table.alternativeToken(0, 1); // 3
   * ```
   */
  push(token: number, logprob: number, top: readonly { token: number; logprob: number }[]): void {
    const s = this.#stride;
    if ((this.#length + 1) * s > this.#ids.length) {
      const ids = new Int32Array(this.#ids.length * 2);
      ids.set(this.#ids);
      this.#ids = ids;
      const values = new Float64Array(this.#values.length * 2);
      values.set(this.#values);
      this.#values = values;
    }
    const at = this.#length * s;
    this.#ids[at] = token;
    this.#values[at] = logprob;
    for (let j = 0; j < this.k; j++) {
      this.#ids[at + 1 + j] = j < top.length ? top[j].token : -1;
      this.#values[at + 1 + j] = j < top.length ? top[j].logprob : 0;
    }
    this.#length++;
  }

  /** The token at position `i`. */
  token(i: number): number {
    return this.#ids[i * this.#stride];
  }

  /** The log-probability of the token at position `i`. */
  logprob(i: number): number {
    return this.#values[i * this.#stride];
  }

  /** How many alternatives position `i` holds. */
  alternatives(i: number): number {
    let n = 0;
    while (n < this.k && this.#ids[i * this.#stride + 1 + n] >= 0) n++;
    return n;
  }

  /** The `j`th most likely alternative at position `i`. */
  alternativeToken(i: number, j: number): number {
    return this.#ids[i * this.#stride + 1 + j];
  }

  /** The log-probability of the `j`th alternative at position `i`. */
  alternativeLogprob(i: number, j: number): number {
    return this.#values[i * this.#stride + 1 + j];
  }

  /** Bytes held by the arrays (for tests and metrics: no objects per position). */
  get bytes(): number {
    return this.#ids.byteLength + this.#values.byteLength;
  }
}
