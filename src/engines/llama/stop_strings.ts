/** OpenAI `stop` sequences over streamed text: cut at the first match, which is not returned. */

/**
 * Holds back text that may be the start of a stop sequence until it is known not to be one.
 *
 * @example
 * ```ts
 * const s = new StopMatcher(["END"]);
 * s.push("abc E"); // { text: "abc ", stopped: false }
 * s.push("ND!");   // { text: "", stopped: true, matched: "END" }
 * ```
 */
export class StopMatcher {
  readonly #stops: readonly string[];
  #held = "";

  constructor(stops: readonly string[]) {
    this.#stops = stops.filter((s) => s !== "");
  }

  /** The text that is safe to pass on, and the stop sequence found (if any). */
  push(chunk: string): { text: string; stopped: boolean; matched?: string } {
    if (this.#stops.length === 0) return { text: chunk, stopped: false };
    const text = this.#held + chunk;
    let first = -1;
    let matched = "";
    for (const s of this.#stops) {
      const at = text.indexOf(s);
      if (at >= 0 && (first < 0 || at < first)) [first, matched] = [at, s];
    }
    if (first >= 0) {
      this.#held = "";
      return { text: text.slice(0, first), stopped: true, matched };
    }
    let keep = 0;
    for (const s of this.#stops) {
      for (let k = Math.min(s.length - 1, text.length); k > keep; k--) {
        if (text.endsWith(s.slice(0, k))) {
          keep = k;
          break;
        }
      }
    }
    this.#held = text.slice(text.length - keep);
    return { text: text.slice(0, text.length - keep), stopped: false };
  }

  /** What is still held back (the output ended without a stop sequence). */
  flush(): string {
    const text = this.#held;
    this.#held = "";
    return text;
  }
}
