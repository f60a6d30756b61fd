/**
 * A GBNF grammar enforced by llama.cpp's grammar sampler (through FFI), as a {@link TokenFilter}.
 * Only tokens the grammar allowed are ever accepted into it: llama.cpp aborts the process on a
 * rejected token.
 */
import { cString, type LlamaLibrary } from "./ffi.ts";
import type { NativeModel } from "./native.ts";
import type { TokenFilter } from "./sampler.ts";

/** Bytes of one `llama_token_data` (id i32, logit f32, p f32). */
const TOKEN_DATA = 12;

/** Where a lazy grammar starts: the grammar is free until one of these appears in the output. */
export interface GrammarTrigger {
  /** Tokens that start the constrained part (the token itself is its first text). */
  tokens: number[];
  /** Regular expressions over the output; the first group starts the constrained part. */
  patterns: string[];
}

/** One sequence's grammar state. */
export class GrammarConstraint implements TokenFilter {
  readonly #lib: LlamaLibrary;
  #ptr: Deno.PointerObject | null;
  readonly #nVocab: number;
  // Candidate buffers reused across calls: one token for the cheap check, the vocabulary for masks.
  // Backed by explicit ArrayBuffers: those never move, so native code may keep their address.
  readonly #one = new Uint8Array(new ArrayBuffer(TOKEN_DATA));
  readonly #oneArray: Uint8Array<ArrayBuffer>;
  #all?: {
    data: Uint8Array<ArrayBuffer>;
    ids: Int32Array;
    logits: Float32Array;
    array: Uint8Array<ArrayBuffer>;
  };

  private constructor(lib: LlamaLibrary, ptr: Deno.PointerObject, nVocab: number) {
    this.#lib = lib;
    this.#ptr = ptr;
    this.#nVocab = nVocab;
    this.#oneArray = tokenDataArray(this.#one, 1);
  }

  /**
   * Parses `gbnf` (start symbol `root`); null when llama.cpp cannot parse it. Blocks the calling
   * thread for as long as llama.cpp parses: request paths use {@link parse}.
   *
   * @example
   * ```ts
   * import type { NativeModel } from "./native.ts";
   * function yesOrNo(model: NativeModel) {
   *   return GrammarConstraint.create(model, 'root ::= "yes" | "no"');
   * }
   * ```
   */
  static create(model: NativeModel, gbnf: string, trigger?: GrammarTrigger): GrammarConstraint | null {
    const s = model.lib.symbols;
    const a = grammarArgs(gbnf, trigger);
    const ptr = a.lazy
      ? s.llama_sampler_init_grammar_lazy_patterns(model.vocab, a.text, a.root, ...a.lazy)
      : s.llama_sampler_init_grammar(model.vocab, a.text, a.root);
    return ptr ? new GrammarConstraint(model.lib, ptr, model.nVocab) : null;
  }

  /**
   * {@link create} on a thread of llama.cpp's own: a grammar of thousands of rules takes tens of
   * milliseconds to parse, which must not stall the event loop.
   *
   * @example
   * ```ts
   * import type { NativeModel } from "./native.ts";
   * async function yesOrNo(model: NativeModel) {
   *   return await GrammarConstraint.parse(model, 'root ::= "yes" | "no"');
   * }
   * ```
   */
  static async parse(
    model: NativeModel,
    gbnf: string,
    trigger?: GrammarTrigger,
  ): Promise<GrammarConstraint | null> {
    const s = model.lib.symbols;
    const a = grammarArgs(gbnf, trigger);
    const ptr = a.lazy
      ? await s.llama_sampler_init_grammar_lazy_patterns_nonblocking(model.vocab, a.text, a.root, ...a.lazy)
      : await s.llama_sampler_init_grammar_nonblocking(model.vocab, a.text, a.root);
    // The native side read these buffers until now: they stay referenced until the call returned.
    a.keep.length = 0;
    return ptr ? new GrammarConstraint(model.lib, ptr, model.nVocab) : null;
  }

  allows(token: number): boolean {
    const v = new DataView(this.#one.buffer);
    v.setInt32(0, token, true);
    v.setFloat32(4, 0, true);
    this.#lib.symbols.llama_sampler_apply(this.#live(), this.#oneArray);
    return v.getFloat32(4, true) !== -Infinity;
  }

  async mask(logits: Float32Array): Promise<void> {
    if (!this.#all) {
      const data = new Uint8Array(new ArrayBuffer(this.#nVocab * TOKEN_DATA));
      this.#all = {
        data,
        ids: new Int32Array(data.buffer),
        logits: new Float32Array(data.buffer),
        array: tokenDataArray(data, 0),
      };
    }
    const { ids, logits: values, array } = this.#all;
    // Only tokens still possible are checked: the grammar's cost grows with the candidates.
    let n = 0;
    for (let t = 0; t < logits.length; t++) {
      if (logits[t] === -Infinity) continue;
      ids[n * 3] = t;
      values[n * 3 + 1] = 0;
      n++;
    }
    new DataView(array.buffer).setBigUint64(8, BigInt(n), true);
    // Off the event loop: the candidate buffers are this grammar's own, and its sequence waits.
    await this.#lib.symbols.llama_sampler_apply_nonblocking(this.#live(), array);
    for (let i = 0; i < n; i++) if (values[i * 3 + 1] === -Infinity) logits[ids[i * 3]] = -Infinity;
  }

  /** Advances the grammar by a token that {@link allows} accepted. */
  accept(token: number): void {
    this.#lib.symbols.llama_sampler_accept(this.#live(), token);
  }

  /** An independent copy of the current state (for n > 1 choices). */
  clone(): GrammarConstraint {
    const ptr = this.#lib.symbols.llama_sampler_clone(this.#live());
    if (!ptr) throw new Error("llama.cpp could not copy a grammar");
    return new GrammarConstraint(this.#lib, ptr, this.#nVocab);
  }

  free(): void {
    if (this.#ptr) this.#lib.symbols.llama_sampler_free(this.#ptr);
    this.#ptr = null;
  }

  #live(): Deno.PointerObject {
    if (!this.#ptr) throw new Error("the grammar was freed");
    return this.#ptr;
  }
}

/** A `llama_token_data_array` struct (data pointer, size, selected = -1, sorted = false). */
function tokenDataArray(data: Uint8Array, size: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(new ArrayBuffer(32));
  const v = new DataView(out.buffer);
  v.setBigUint64(
    0,
    BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(data as Uint8Array<ArrayBuffer>))),
    true,
  );
  v.setBigUint64(8, BigInt(size), true);
  v.setBigInt64(16, -1n, true);
  return out;
}

/**
 * The C arguments of a grammar sampler: the text, the start symbol and, for a lazy grammar, its
 * trigger patterns and tokens. Every buffer is backed by an ArrayBuffer of its own (those never move).
 */
function grammarArgs(gbnf: string, trigger?: GrammarTrigger) {
  const text = cString(gbnf);
  const root = cString("root");
  if (!trigger) return { text, root, lazy: undefined, keep: [] as unknown[] };
  const patterns = trigger.patterns.map(cString);
  const pointers = new BigUint64Array(new ArrayBuffer(8 * (patterns.length + 1)));
  patterns.forEach((p, i) => (pointers[i] = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(p)))));
  const tokens = new Int32Array(new ArrayBuffer(4 * Math.max(1, trigger.tokens.length)));
  tokens.set(trigger.tokens);
  const lazy = [pointers, BigInt(patterns.length), tokens, BigInt(trigger.tokens.length)] as const;
  return { text, root, lazy, keep: [patterns] as unknown[] };
}
