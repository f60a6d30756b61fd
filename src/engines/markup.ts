/**
 * Client text is data, never control. A vocabulary's markup tokens (control tokens such as
 * `<|im_start|>`, and tags such as `<think>` or `<tool_call>` that tokenizers match even in plain
 * text) are what a chat template writes around the messages; the same strings inside a message,
 * a tool definition or an embedding input are text and must tokenize as text.
 *
 * For a chat prompt, every markup string in the client's strings is replaced by a placeholder (a
 * private-use character) before the template renders; the rendered text is split at the markup
 * strings it now holds, which are the template's own (each becomes its token); the text between
 * them gets its placeholders back and is tokenized as plain text, in fragments cut inside any
 * markup string so that no tokenizer turns it into a markup token (llama.cpp itself splits a
 * prompt at special tokens first and tokenizes each fragment apart).
 */

/** A markup token of a vocabulary. */
export interface MarkupToken {
  text: string;
  id: number;
  /**
   * The tokenizer matches it in plain text too (llama.cpp's user-defined tokens, every added token
   * of a Hugging Face tokenizer): plain text holding it is cut inside it before tokenizing.
   */
  matchedInText: boolean;
}

/** A rendered prompt: its text, and its pieces: markup token ids and plain text to tokenize as text. */
export interface PromptPieces {
  text: string;
  pieces: (number | string)[];
}

/** The placeholders: Unicode's private-use area of the basic plane. The first one escapes. */
const PUA_FIRST = 0xe000;
const PUA_LAST = 0xf8ff;
const ESCAPE = String.fromCharCode(PUA_FIRST);
/** Distinct markup strings one request may hold (one placeholder each). */
export const MAX_HIDDEN_STRINGS = PUA_LAST - PUA_FIRST;

/**
 * The markup strings of a vocabulary and the operations that keep client text from becoming them.
 *
 * @example
 * ```ts
 * const markup = new Markup([{ text: "<|im_end|>", id: 151645, matchedInText: false }]);
 * const hider = markup.hider();
 * const text = hider.hide("hi<|im_end|>"); // "hi\ue001"
 * markup.split(`<|im_end|>${text}`, hider); // { text: "<|im_end|>hi<|im_end|>", pieces: [151645, "hi<|im_end|>"] }
 * ```
 */
export class Markup {
  readonly tokens: readonly MarkupToken[];
  readonly #ids = new Map<string, number>();
  /** Every markup string, longest first (as llama.cpp tries them). */
  readonly #find: RegExp | null;
  /** Markup strings and private-use characters (which client text must not smuggle in as placeholders). */
  readonly #hide: RegExp;
  /** The markup strings tokenizers match in plain text. */
  readonly #cut: RegExp | null;

  constructor(tokens: readonly MarkupToken[]) {
    // Single characters and whitespace are no markup anyone can forge a turn with.
    this.tokens = tokens.filter((t) => t.text.length >= 2 && t.text.trim() !== "");
    for (const t of this.tokens) if (!this.#ids.has(t.text)) this.#ids.set(t.text, t.id);
    const texts = [...this.#ids.keys()].sort((a, b) => b.length - a.length);
    const alternation = texts.map(escapeRegExp).join("|");
    this.#find = texts.length > 0 ? new RegExp(alternation, "g") : null;
    this.#hide = new RegExp(
      `${alternation ? `${alternation}|` : ""}[\\u${hex(PUA_FIRST)}-\\u${hex(PUA_LAST)}]`,
      "g",
    );
    const cut = texts.filter((t) => this.tokens.some((m) => m.text === t && m.matchedInText));
    this.#cut = cut.length > 0 ? new RegExp(cut.map(escapeRegExp).join("|"), "g") : null;
  }

  /** A fresh set of placeholders for one request's strings. */
  hider(): Hider {
    return new Hider(this.#hide);
  }

  /**
   * Splits a rendered prompt at its markup strings: each one is its token id; the text between
   * them is restored (`hider`'s placeholders) and cut into fragments that tokenize as plain text.
   */
  split(rendered: string, hider: Hider): PromptPieces {
    const pieces: (number | string)[] = [];
    const parts: string[] = [];
    const text = (segment: string) => {
      if (segment === "") return;
      const restored = hider.used ? hider.restore(segment) : segment;
      parts.push(restored);
      if (hider.used) { for (const f of this.fragments(restored)) pieces.push(f); }
      else pieces.push(restored);
    };
    let at = 0;
    if (this.#find) {
      this.#find.lastIndex = 0;
      for (let m = this.#find.exec(rendered); m; m = this.#find.exec(rendered)) {
        text(rendered.slice(at, m.index));
        pieces.push(this.#ids.get(m[0])!);
        parts.push(m[0]);
        at = m.index + m[0].length;
      }
    }
    text(rendered.slice(at));
    return { text: parts.join(""), pieces };
  }

  /**
   * `text` as fragments to tokenize one by one, none holding a markup string the tokenizer would
   * match in plain text: each such string is cut after its leading punctuation (`<|`, `</`, `<`),
   * where a byte-level BPE pre-tokenizer splits it anyway. Lazy: a text holding a million markup
   * strings is cut as its consumer goes (which can pause between fragments).
   */
  *fragments(text: string): Generator<string> {
    const cut = this.#cut;
    if (!cut) {
      yield text;
      return;
    }
    // A pattern of its own: another walk may be under way on the shared one (at a consumer's pause).
    const find = new RegExp(cut);
    let start = 0;
    for (let m = find.exec(text); m; m = find.exec(text)) {
      const at = m.index + cutOffset(m[0]);
      yield text.slice(start, at);
      start = at;
      find.lastIndex = at;
    }
    yield text.slice(start);
  }

  /**
   * `text` as the tokenizer reads a prompt with special-token parsing on (a raw prompt in the
   * client's own template): each markup string is its token id, the text between them plain text
   * (it holds none). One pass, lazy like {@link fragments}: llama.cpp's own parsing went on for over
   * 16 minutes on the event loop for 7.6 MB holding 800,000 markup strings. Where two markup
   * strings overlap, the one that starts first wins (llama.cpp takes longer ones first; the
   * vocabularies served have no such overlaps).
   */
  *specialPieces(text: string): Generator<string | number> {
    if (!this.#find) {
      yield text;
      return;
    }
    const find = new RegExp(this.#find);
    let start = 0;
    for (let m = find.exec(text); m; m = find.exec(text)) {
      if (m.index > start) yield text.slice(start, m.index);
      yield this.#ids.get(m[0])!;
      start = m.index + m[0].length;
    }
    if (start < text.length) yield text.slice(start);
  }

  /** Whether `text` holds a markup string the tokenizer matches in plain text (it has fragments). */
  holdsCut(text: string): boolean {
    if (!this.#cut) return false;
    this.#cut.lastIndex = 0;
    return this.#cut.test(text);
  }

  /** Whether `text` holds a markup string. */
  holdsMarkup(text: string): boolean {
    if (!this.#find) return false;
    this.#find.lastIndex = 0;
    return this.#find.test(text);
  }
}

/**
 * One request's placeholders: each distinct markup string in the client's strings gets a
 * private-use character; a private-use character the client sent is escaped (the escape
 * character, then itself), so that restoring gives back exactly the client's text.
 */
export class Hider {
  readonly #pattern: RegExp;
  readonly #originals: string[] = [];
  readonly #placeholders = new Map<string, string>();
  #used = false;

  constructor(pattern: RegExp) {
    this.#pattern = pattern;
  }

  /** Whether any string held markup or private-use characters. */
  get used(): boolean {
    return this.#used;
  }

  /** `text` with its markup strings replaced by placeholders. */
  hide(text: string): string {
    this.#pattern.lastIndex = 0;
    if (!this.#pattern.test(text)) return text;
    this.#used = true;
    this.#pattern.lastIndex = 0;
    return text.replace(this.#pattern, (s) => {
      if (s.length === 1) return ESCAPE + s; // a private-use character of the client's
      let p = this.#placeholders.get(s);
      if (p === undefined) {
        if (this.#originals.length >= MAX_HIDDEN_STRINGS) throw new TooManyMarkupStrings();
        p = String.fromCharCode(PUA_FIRST + 1 + this.#originals.length);
        this.#originals.push(s);
        this.#placeholders.set(s, p);
      }
      return p;
    });
  }

  /** A copy of `value` with every string in it (object keys too) hidden. */
  hideDeep<T>(value: T): T {
    if (typeof value === "string") return this.hide(value) as T;
    if (Array.isArray(value)) return value.map((v) => this.hideDeep(v)) as T;
    if (value !== null && typeof value === "object") {
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(value)) out[this.hide(k)] = this.hideDeep(v);
      return out as T;
    }
    return value;
  }

  /** Puts the client's text back in place of placeholders and escapes. */
  restore(text: string): string {
    return text.replace(RESTORE, (s, escaped: string | undefined) => {
      if (escaped !== undefined) return escaped;
      return this.#originals[s.charCodeAt(0) - PUA_FIRST - 1] ?? s;
    });
  }
}

const RESTORE = new RegExp(
  `\\u${hex(PUA_FIRST)}([\\u${hex(PUA_FIRST)}-\\u${hex(PUA_LAST)}])|[\\u${hex(PUA_FIRST + 1)}-\\u${
    hex(PUA_LAST)
  }]`,
  "g",
);

/** A request holding more distinct markup strings than there are placeholders. */
export class TooManyMarkupStrings extends Error {
  override name = "TooManyMarkupStrings";
  constructor() {
    super(`the request holds more than ${MAX_HIDDEN_STRINGS} distinct special-token strings`);
  }
}

/** Where to cut a markup string: after its leading punctuation, inside the string. */
function cutOffset(text: string): number {
  const lead = /^[^\p{L}\p{N}]+/u.exec(text)?.[0].length ?? 1;
  return Math.min(Math.max(lead, 1), text.length - 1);
}

function hex(code: number): string {
  return code.toString(16).padStart(4, "0");
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
