/**
 * JSON text written in pieces, for answers too large for one `JSON.stringify` on the event loop: a
 * 1.3-million-id `/tokenize` answer, `/detokenize` of a million ids (two 12 MB strings: 176 ms), a
 * completion whose thousands of log-probabilities each carry 20 alternatives (150-220 ms), 2,000
 * embedding vectors (0.6 s). A large value is walked; its small parts (most of it) are stringified
 * whole, and long strings in runs of characters, so that each piece is a small amount of work.
 */

/** Work units (about one per value, one more per 64 characters of string) one piece may hold. */
const PIECE_UNITS = 4096;
/** Characters of a long string written per piece. */
const STRING_RUN = 1 << 16;

/**
 * Whether `value` is at most `units` units of work to serialise (about one per value, and one per 64
 * characters of string): it is looked at only until that many are found.
 *
 * @example
 * ```ts
 * isSmallJson({ a: [1, 2, 3] }, 100); // true
 * isSmallJson(Array.from({ length: 1000 }, () => 0), 100); // false
 * ```
 */
export function isSmallJson(value: unknown, units: number): boolean {
  return remaining(value, units) > 0;
}

/** `budget` less the units of `value`, stopping once it is used up. */
function remaining(value: unknown, budget: number): number {
  if (typeof value === "string") return budget - 1 - (value.length >> 6);
  if (value === null || typeof value !== "object") return budget - 1;
  // A typed array is counted without its `toJSON` (a float32 vector's makes a whole array).
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    return budget - 1 - (value as Uint8Array).length;
  }
  const v = toPlain(value);
  if (v !== value) return remaining(v, budget);
  budget -= 1;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length && budget > 0; i++) budget = remaining(value[i], budget);
  } else {
    for (const key in value) {
      if (!Object.hasOwn(value, key)) continue;
      budget = remaining((value as Record<string, unknown>)[key], budget - 1 - (key.length >> 6));
      if (budget <= 0) break;
    }
  }
  return budget;
}

/** What `JSON.stringify` serialises in place of `value` (its `toJSON`, if it has one). */
function toPlain(value: unknown): unknown {
  const toJSON = (value as { toJSON?: unknown } | null)?.toJSON;
  return typeof toJSON === "function" ? toJSON.call(value) : value;
}

/** A value an object's member is left out for, as `JSON.stringify` does (an array writes `null`). */
function omitted(value: unknown): boolean {
  return value === undefined || typeof value === "function" || typeof value === "symbol";
}

/**
 * The text of `JSON.stringify(value)` for plain data, in pieces of about {@link PIECE_UNITS} units
 * of work each (`toJSON` is honoured; its key argument is not passed).
 *
 * @example
 * ```ts
 * const value = { tokens: Array.from({ length: 10_000 }, (_, i) => i), count: 10_000 };
 * [...jsonPieces(value)].join("") === JSON.stringify(value); // true
 * ```
 */
export function* jsonPieces(value: unknown): Generator<string> {
  value = toPlain(value);
  if (typeof value === "string") {
    if (value.length <= STRING_RUN) yield JSON.stringify(value);
    else yield* stringPieces(value);
    return;
  }
  if (value === null || typeof value !== "object" || isSmallJson(value, PIECE_UNITS)) {
    yield JSON.stringify(value) ?? "null";
    return;
  }
  if (Array.isArray(value)) {
    yield "[";
    // Runs of small items are stringified together, a large item walked on its own.
    for (let i = 0; i < value.length;) {
      let budget = PIECE_UNITS;
      let end = i;
      while (end < value.length) {
        const left = remaining(value[end], budget);
        if (left <= 0) break;
        budget = left;
        end++;
      }
      if (end > i) {
        const text = JSON.stringify(value.slice(i, end));
        yield `${i > 0 ? "," : ""}${text.slice(1, -1)}`;
        i = end;
      } else {
        if (i > 0) yield ",";
        if (omitted(value[i])) yield "null";
        else yield* jsonPieces(value[i]);
        i++;
      }
    }
    yield "]";
    return;
  }
  yield "{";
  let first = true;
  for (const key in value) {
    if (!Object.hasOwn(value, key)) continue;
    const member = (value as Record<string, unknown>)[key];
    if (omitted(member)) continue;
    yield `${first ? "" : ","}${JSON.stringify(key)}:`;
    first = false;
    yield* jsonPieces(member);
  }
  yield "}";
}

/** A long string's JSON text, a run of characters at a time (never splitting a surrogate pair). */
function* stringPieces(text: string): Generator<string> {
  yield '"';
  for (let at = 0; at < text.length;) {
    let end = Math.min(text.length, at + STRING_RUN);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end--;
    yield JSON.stringify(text.slice(at, end)).slice(1, -1);
    at = end;
  }
  yield '"';
}
