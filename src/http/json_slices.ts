/**
 * JSON request bodies parsed without holding the event loop: a scan first refuses nesting deeper
 * than a limit, then a large body is parsed piece by piece (one `JSON.parse` per run of values of
 * at most {@link PIECE} characters), with a turn of the event loop between slices.
 *
 * One `JSON.parse` of a body at the 8 MB limit took, on a 2-vCPU EPYC: a string 5 ms, integers
 * 17-93 ms, 4M empty arrays 290-360 ms, 1.2M small objects 155-225 ms, arrays nested 200 deep
 * side by side 0.9-1.4 s; 8 MB of `[` 500 ms before its error. Parsing on a worker does not help:
 * the structured clone back costs as much as the parse (v8 deserialize of the same values: 60-72,
 * 490-566, 245-1,317 ms).
 */
import type { Slicer } from "../event_loop.ts";

/** Nesting of arrays and objects accepted (a 64-level schema inside a request is well below it). */
export const MAX_JSON_DEPTH = 512;

/**
 * Arrays and objects accepted in one body: far more than any conversation, tool list or schema
 * holds (16,384 messages with a few parts each, a schema's 10,000 values), and what checking a
 * body's fields costs stays within a slice: zod took 50-160 ms for 300,000 content parts, 90 ms
 * for 180,000 tools.
 */
export const MAX_JSON_CONTAINERS = 100_000;

/**
 * Members one object may hold: a `logit_bias` over a whole 256K vocabulary. Each member is a property
 * of one growing object: 600,000 of them (8 MB of `metadata`) held the event loop 25-36 ms a slice,
 * and `/health` up to 55-64 ms, where 300,000 held it under 30.
 */
export const MAX_OBJECT_MEMBERS = 262_144;

/** Most characters one `JSON.parse` is given in a large body (~5 ms of the densest JSON). */
const PIECE = 32 * 1024;
/** Characters scanned between two looks at the clock. */
const STEP = 1 << 16;

/** A body that is not JSON, or past a limit: nesting too deep, too many arrays and objects or members. */
export class JsonBodyError extends Error {
  /** `path`: the field past a limit (an object of too many members), as `logit_bias` or `a[2].b`. */
  constructor(message: string, readonly limit?: "depth" | "containers" | "members", readonly path?: string) {
    super(message);
  }
}

const OPEN_ARRAY = 91, CLOSE_ARRAY = 93, OPEN_OBJECT = 123, CLOSE_OBJECT = 125;
const QUOTE = 34, BACKSLASH = 92, COMMA = 44;

function isSpace(c: number): boolean {
  return c === 32 || c === 10 || c === 13 || c === 9;
}

/**
 * Parses `text` as `JSON.parse` does, pausing through `slices`; throws {@link JsonBodyError} for
 * nesting deeper than `maxDepth` or more than `maxContainers` arrays and objects (found before any
 * parsing) and for text that is not JSON.
 *
 * @example
 * ```ts
 * import { Slicer } from "../event_loop.ts";
 * const value = await parseJsonInSlices('{"input":[[1,2],[3]]}', new Slicer(10));
 * // { input: [[1, 2], [3]] }
 * ```
 */
export async function parseJsonInSlices(
  text: string,
  slices: Slicer,
  maxDepth = MAX_JSON_DEPTH,
  maxContainers = MAX_JSON_CONTAINERS,
): Promise<unknown> {
  const big = await scan(text, slices, maxDepth, maxContainers);
  if (text.length <= 2 * PIECE) return parsePiece(text, 0);
  if (typeof big === "string") throw new JsonBodyError(big);
  let s = 0, e = text.length;
  while (s < e && isSpace(text.charCodeAt(s))) s++;
  while (e > s && isSpace(text.charCodeAt(e - 1))) e--;
  return await new Pieces(text, big, slices).value(s, e);
}

/**
 * One pass over `text`: the nesting depth outside strings (throws past `maxDepth`), and where each
 * container longer than {@link PIECE} ends, by where it starts; or what is wrong with the brackets.
 */
async function scan(
  text: string,
  slices: Slicer,
  maxDepth: number,
  maxContainers: number,
): Promise<Map<number, number> | string> {
  const opens = new Int32Array(maxDepth + 1);
  /** Members of each open object so far (its commas). */
  const members = new Int32Array(maxDepth + 1);
  /** Where the key of each open object's current member starts (its opening quote). */
  const keyAt = new Int32Array(maxDepth + 1);
  /** The next string is a key: after an object's `{` or one of its commas. */
  let expectKey = false;
  const big = new Map<number, number>();
  let depth = 0;
  let containers = 0;
  let fault: string | undefined;
  const n = text.length;
  let look = STEP;
  for (let i = 0; i < n; i++) {
    if (i >= look) {
      look = i + STEP;
      if (slices.due) await slices.pause();
    }
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      if (expectKey) {
        keyAt[depth - 1] = i;
        expectKey = false;
      }
      // To the closing quote, stepping over escapes.
      for (i++; i < n; i++) {
        const d = text.charCodeAt(i);
        if (d === BACKSLASH) i++;
        else if (d === QUOTE) break;
        if (i >= look) {
          look = i + STEP;
          if (slices.due) await slices.pause();
        }
      }
      if (i >= n) fault ??= "a string is not closed";
    } else if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
      if (depth >= maxDepth) {
        throw new JsonBodyError(
          `The request body nests arrays and objects more than ${maxDepth} levels deep (at character ${i}).`,
          "depth",
        );
      }
      if (++containers > maxContainers) {
        throw new JsonBodyError(
          `The request body holds more than ${maxContainers} arrays and objects (at character ${i}).`,
          "containers",
        );
      }
      members[depth] = 0;
      opens[depth++] = i;
      expectKey = c === OPEN_OBJECT;
    } else if (c === COMMA) {
      expectKey = depth > 0 && text.charCodeAt(opens[depth - 1]) === OPEN_OBJECT;
      if (expectKey && ++members[depth - 1] >= MAX_OBJECT_MEMBERS) {
        const path = depth > 1 ? pathOf(text, depth - 1, opens, members, keyAt) : undefined;
        throw new JsonBodyError(
          `The request body holds an object of more than ${MAX_OBJECT_MEMBERS} members ` +
            `(${path ?? "the body itself"}, at character ${i}).`,
          "members",
          path,
        );
      } else if (!expectKey && depth > 0) {
        members[depth - 1]++;
      }
    } else if (c === CLOSE_ARRAY || c === CLOSE_OBJECT) {
      expectKey = false;
      if (depth === 0) {
        fault ??= `unexpected '${text[i]}' at position ${i}`;
        continue;
      }
      const open = opens[--depth];
      if (text.charCodeAt(open) !== (c === CLOSE_ARRAY ? OPEN_ARRAY : OPEN_OBJECT)) {
        fault ??= `'${text[i]}' at position ${i} does not close the '${text[open]}' at position ${open}`;
      } else if (i + 1 - open > PIECE) big.set(open, i + 1);
    }
  }
  if (depth > 0) fault ??= `the '${text[opens[depth - 1]]}' at position ${opens[depth - 1]} is not closed`;
  return fault ?? big;
}

/**
 * The field holding the open container at `level` (0: the body), as `messages[3].content`: each open
 * object's current key and each open array's current index.
 */
function pathOf(
  text: string,
  level: number,
  opens: Int32Array,
  members: Int32Array,
  keyAt: Int32Array,
): string {
  let path = "";
  for (let k = 0; k < level; k++) {
    if (text.charCodeAt(opens[k]) !== OPEN_OBJECT) {
      path += `[${members[k]}]`;
      continue;
    }
    let end = keyAt[k] + 1;
    while (end < text.length && text.charCodeAt(end) !== QUOTE) {
      end += text.charCodeAt(end) === BACKSLASH ? 2 : 1;
    }
    let key: string;
    try {
      key = String(JSON.parse(text.slice(keyAt[k], end + 1)));
    } catch {
      key = "?";
    }
    // A key of megabytes is not echoed whole.
    if (key.length > 64) key = `${key.slice(0, 64)}…`;
    path += /^[A-Za-z_$][\w$]*$/.test(key) ? `${path ? "." : ""}${key}` : `[${JSON.stringify(key)}]`;
  }
  // Nor a path of hundreds of levels: its two ends.
  return path.length > 256 ? `${path.slice(0, 127)}…${path.slice(-127)}` : path;
}

function parsePiece(text: string, at: number): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    const where = at > 0 ? ` in the part from position ${at}` : "";
    throw new JsonBodyError(`${(e as Error).message}${where}`);
  }
}

/** The parse of a large body: containers longer than a piece are walked, the rest parsed whole. */
class Pieces {
  constructor(
    readonly text: string,
    readonly big: Map<number, number>,
    readonly slices: Slicer,
  ) {}

  async #parse(from: number, to: number, open = "", close = ""): Promise<unknown> {
    if (this.slices.due) await this.slices.pause();
    return parsePiece(open + this.text.slice(from, to) + close, from);
  }

  /** The value spanning [from, to), which starts and ends with no whitespace. */
  async value(from: number, to: number): Promise<unknown> {
    const end = this.big.get(from);
    if (end === undefined) return await this.#parse(from, to);
    if (end !== to) throw new JsonBodyError(`unexpected text after the value at position ${end}`);
    return await this.#container(from, to);
  }

  /**
   * The array or object spanning [from, to): its members split at its own commas, runs of small
   * members parsed together, each large member (a container longer than a piece) walked in turn.
   */
  async #container(from: number, to: number): Promise<unknown> {
    const { text, big } = this;
    const isArray = text.charCodeAt(from) === OPEN_ARRAY;
    const [open, close] = isArray ? ["[", "]"] : ["{", "}"];
    const out: unknown[] | Record<string, unknown> = isArray ? [] : {};
    const last = to - 1;
    /** Where the current run of small members starts, and its members' count. */
    let runFrom = from + 1;
    let members = 0;
    /** The current member: where it starts, whether it holds text, its large container if any. */
    let memberFrom = from + 1;
    let filled = false;
    let inner: [number, number] | undefined;
    let depth = 0;
    const flushRun = async (runTo: number) => {
      if (runTo <= runFrom) return;
      const part = await this.#parse(runFrom, runTo, open, close);
      if (isArray) (out as unknown[]).push(...part as unknown[]);
      else {
        // Plain assignment, twice as fast as defining (600,000 keys: 300 against 600 ms); only
        // `__proto__` must be defined, as JSON.parse makes it an own key.
        const into = out as Record<string, unknown>;
        for (const [k, v] of Object.entries(part as object)) {
          if (k === "__proto__") define(into, k, v);
          else into[k] = v;
        }
      }
    };
    const endMember = async (at: number) => {
      if (!filled && (members > 0 || at < last)) {
        throw new JsonBodyError(`a value is missing before position ${at}`);
      }
      members++;
      if (inner) {
        await flushRun(memberFrom - 1);
        const [s, e] = inner;
        if (!blank(text, e, at)) throw new JsonBodyError(`unexpected text after the value at position ${e}`);
        const value = await this.value(s, e);
        if (isArray) {
          if (!blank(text, memberFrom, s)) {
            throw new JsonBodyError(`unexpected text before the value at position ${s}`);
          }
          (out as unknown[]).push(value);
        } else {
          // The key and its colon, checked and read by the parser itself.
          const key = Object.keys(await this.#parse(memberFrom, s, "{", "0}") as object)[0];
          define(out as Record<string, unknown>, key, value);
        }
        runFrom = at + 1;
      } else if (at + 1 - runFrom > PIECE) {
        await flushRun(at);
        runFrom = at + 1;
      }
      memberFrom = at + 1;
      filled = false;
      inner = undefined;
    };
    let look = from + STEP;
    for (let i = from + 1; i < last; i++) {
      if (i >= look) {
        look = i + STEP;
        if (this.slices.due) await this.slices.pause();
      }
      const c = text.charCodeAt(i);
      if (c === QUOTE) {
        for (i++; i < last; i++) {
          const d = text.charCodeAt(i);
          if (d === BACKSLASH) i++;
          else if (d === QUOTE) break;
          if (i >= look) {
            look = i + STEP;
            if (this.slices.due) await this.slices.pause();
          }
        }
        filled = true;
      } else if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
        const end = depth === 0 ? big.get(i) : undefined;
        if (end !== undefined) {
          if (inner) throw new JsonBodyError(`unexpected value at position ${i}`);
          inner = [i, end];
          i = end - 1;
        } else depth++;
        filled = true;
      } else if (c === CLOSE_ARRAY || c === CLOSE_OBJECT) {
        depth--;
      } else if (c === COMMA && depth === 0) {
        await endMember(i);
      } else if (!isSpace(c)) filled = true;
    }
    await endMember(last);
    // The last run: members after the last large one.
    if (runFrom < last) await flushRun(last);
    return out;
  }
}

/** Whether [from, to) of `text` is JSON whitespace only. */
function blank(text: string, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (!isSpace(text.charCodeAt(i))) return false;
  return true;
}

/** Sets `key` as an own property, as `JSON.parse` does (`__proto__` included). */
function define(obj: Record<string, unknown>, key: string, value: unknown) {
  Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
}
