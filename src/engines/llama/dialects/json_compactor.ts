/** Compact JSON text as the dialects stream call arguments: whitespace outside strings removed. */

/**
 * Removes whitespace outside strings from streamed JSON text, keeping state across pieces.
 *
 * @example
 * ```ts
 * const c = new JsonCompactor();
 * c.push('{ "a": "x y",') + c.push(' "b": 1 }'); // '{"a":"x y","b":1}'
 * ```
 */
export class JsonCompactor {
  #inString = false;
  #escaped = false;

  push(text: string): string {
    let out = "";
    for (const ch of text) {
      if (this.#inString) {
        out += ch;
        if (this.#escaped) this.#escaped = false;
        else if (ch === "\\") this.#escaped = true;
        else if (ch === '"') this.#inString = false;
      } else if (ch === '"') {
        this.#inString = true;
        out += ch;
      } else if (ch !== " " && ch !== "\n" && ch !== "\t" && ch !== "\r") out += ch;
    }
    return out;
  }
}
