/**
 * Blank text just before a tool call is not a block or message item of its own in the Anthropic and
 * Responses streams (as in their non-streamed answers, where it is trimmed away): a streamed answer
 * holds blank deltas back until visible text follows (then they go out with it), drops them when a
 * call starts, and lets them out at the end only if no call came.
 *
 * @example
 * ```ts
 * const hold = new BlankTextHold();
 * hold.take("\n", false); // undefined: held back
 * hold.take("Hi", false); // "\nHi"
 * ```
 */
export class BlankTextHold {
  #pending = "";

  /** What to write now for the delta `content` (undefined: held back); `textOpen`: a text block is open. */
  take(content: string, textOpen: boolean): string | undefined {
    if (!textOpen && content.trim() === "") {
      this.#pending += content;
      return undefined;
    }
    const out = this.#pending + content;
    this.#pending = "";
    return out;
  }

  /** A tool call starts: what was held back is dropped. */
  drop(): void {
    this.#pending = "";
  }

  /** At the end of the answer: what is still held back ("" if nothing). */
  rest(): string {
    const out = this.#pending;
    this.#pending = "";
    return out;
  }
}
