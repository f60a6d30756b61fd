/**
 * A GBNF grammar enforced by llama.cpp's grammar sampler (through FFI), as a {@link TokenFilter}.
 * Only tokens the grammar allowed are ever accepted into it: llama.cpp aborts the process on a
 * rejected token.
 */
import { cString, type LlamaLibrary } from "./ffi.ts";
import type { NativeModel } from "./native.ts";
import type { TokenFilter } from "./sampler.ts";
import { EngineInputError } from "../types.ts";
import { helperWork } from "../../event_loop.ts";

/** Bytes of one `llama_token_data` (id i32, logit f32, p f32). */
const TOKEN_DATA = 12;

/**
 * Open alternatives (llama.cpp's grammar stacks) up to which accepting a token runs on the event
 * loop. llama.cpp keeps one stack per way the output so far can be read, and accepting a token costs
 * about their number after it squared (each new stack is compared with all others): 0.1-0.3 ms from
 * 60-92 on the 2-vCPU EPYC, 0.76 ms from 60 to 495, 4.7-7 ms at 450-1,176. Schemas of the grammar
 * tests and of the random-schema test reach at most 47.
 */
export const SYNC_STACKS = 64;
/**
 * Most open alternatives a grammar may hold after a token; past it the request is refused (400
 * `schema_too_large`). Alternatives that begin alike and nest inside each other (a `oneOf` of a
 * schema and an object holding it, 30 levels deep) multiply at every level: 11 stacks at the start,
 * 1,176 after four levels with ten of them, and at thirty a single token took minutes. JSON schemas
 * whose alternatives part early (a discriminating property, different types) stay in the tens.
 */
export const MAX_STACKS = 1024;
/** `llama_grammar_get_stacks(llama_grammar *)` (C++, exported by libllama). */
const GET_STACKS = "_Z24llama_grammar_get_stacksP13llama_grammar";
/**
 * Where a grammar sampler's context (`llama_sampler_grammar`: vocab, two std::strings, grammar)
 * holds its `llama_grammar *`.
 */
const SAMPLER_GRAMMAR_OFFSET = 8 + 32 + 32;
/** Bytes of a `std::vector<const llama_grammar_element *>` (libstdc++: three pointers). */
const STACK_BYTES = 24n;

const stacksOf = new Map<string, ((grammar: Deno.PointerObject) => Deno.PointerValue) | null>();

/**
 * The vector of a grammar sampler's open alternatives, to read their number, or null when this
 * library does not have the layout it is read with (then every step runs off the event loop, unbounded).
 */
function stacksVector(lib: LlamaLibrary, vocab: Deno.PointerValue, sampler: Deno.PointerObject) {
  if (!stacksOf.has(lib.path)) {
    try {
      const { symbols } = Deno.dlopen(lib.path, {
        [GET_STACKS]: { parameters: ["pointer"], result: "pointer" },
      });
      stacksOf.set(lib.path, symbols[GET_STACKS] as (grammar: Deno.PointerObject) => Deno.PointerValue);
    } catch {
      stacksOf.set(lib.path, null);
    }
  }
  const get = stacksOf.get(lib.path);
  const ctx = new Deno.UnsafePointerView(sampler).getPointer(8);
  const grammar = ctx && new Deno.UnsafePointerView(ctx).getPointer(SAMPLER_GRAMMAR_OFFSET);
  // A llama_grammar starts with its vocabulary: the check that this is one.
  if (!get || !grammar) return null;
  if (
    Deno.UnsafePointer.value(new Deno.UnsafePointerView(grammar).getPointer(0)) !==
      Deno.UnsafePointer.value(vocab)
  ) {
    return null;
  }
  const vector = get(grammar);
  return vector ? new Deno.UnsafePointerView(vector) : null;
}

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
  readonly #vocab: Deno.PointerValue;
  /** Its open alternatives (null: not readable, every step off the event loop). */
  readonly #stacks: Deno.UnsafePointerView | null;
  /** The request field its refusal names. */
  readonly #param: string;
  /** Tokens accepted so far. */
  #accepted = 0;
  /** Whether heavy steps go off the event loop (made by {@link parse}; {@link create}'s block). */
  readonly #offLoop: boolean;
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

  private constructor(
    lib: LlamaLibrary,
    ptr: Deno.PointerObject,
    nVocab: number,
    vocab: Deno.PointerValue,
    param: string,
    offLoop: boolean,
  ) {
    this.#lib = lib;
    this.#offLoop = offLoop;
    this.#ptr = ptr;
    this.#nVocab = nVocab;
    this.#vocab = vocab;
    this.#param = param;
    this.#stacks = stacksVector(lib, vocab, ptr);
    this.#oneArray = tokenDataArray(this.#one, 1);
  }

  /** Its open alternatives now (NaN when they cannot be read). */
  get stacks(): number {
    const v = this.#stacks;
    return v ? Number((v.getBigUint64(8) - v.getBigUint64(0)) / STACK_BYTES) : NaN;
  }

  /** Whether its next step runs on the calling thread: cheap enough, or made by {@link create}. */
  get #light(): boolean {
    return !this.#offLoop || this.stacks <= SYNC_STACKS;
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
  static create(
    model: NativeModel,
    gbnf: string,
    trigger?: GrammarTrigger,
    param = "response_format",
  ): GrammarConstraint | null {
    const s = model.lib.symbols;
    const a = grammarArgs(gbnf, trigger);
    const ptr = a.lazy
      ? s.llama_sampler_init_grammar_lazy_patterns(model.vocab, a.text, a.root, ...a.lazy)
      : s.llama_sampler_init_grammar(model.vocab, a.text, a.root);
    return ptr ? new GrammarConstraint(model.lib, ptr, model.nVocab, model.vocab, param, false) : null;
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
    param = "response_format",
  ): Promise<GrammarConstraint | null> {
    const s = model.lib.symbols;
    const a = grammarArgs(gbnf, trigger);
    // A llama.cpp thread at work meanwhile (see helperWork).
    const done = helperWork();
    const ptr =
      await (a.lazy
        ? s.llama_sampler_init_grammar_lazy_patterns_nonblocking(model.vocab, a.text, a.root, ...a.lazy)
        : s.llama_sampler_init_grammar_nonblocking(model.vocab, a.text, a.root)).finally(done);
    // The native side read these buffers until now: they stay referenced until the call returned.
    a.keep.length = 0;
    return ptr ? new GrammarConstraint(model.lib, ptr, model.nVocab, model.vocab, param, true) : null;
  }

  /**
   * One token's check costs about a microsecond per open alternative (0.36 ms at 495), and there are
   * at most {@link MAX_STACKS}: on the event loop. False when they cannot be counted (the caller then
   * masks, off the loop).
   */
  allows(token: number): boolean {
    if (this.#offLoop && this.#stacks === null) return false;
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
    await this.#lib.symbols.llama_sampler_apply_nonblocking(this.#live(), array).finally(helperWork());
    for (let i = 0; i < n; i++) if (values[i * 3 + 1] === -Infinity) logits[ids[i * 3]] = -Infinity;
  }

  /**
   * Advances the grammar by a token it allowed: on the event loop while it has few open
   * alternatives, else on a thread of llama.cpp's own (a promise). Throws (rejects) an
   * {@link EngineInputError} when the token left more than {@link MAX_STACKS} of them.
   */
  accept(token: number): void | Promise<void> {
    this.#accepted++;
    if (this.#light) {
      this.#lib.symbols.llama_sampler_accept(this.#live(), token);
      this.#bound();
      return;
    }
    return this.#lib.symbols.llama_sampler_accept_nonblocking(this.#live(), token).finally(helperWork())
      .then(() => this.#bound());
  }

  #bound(): void {
    const n = this.stacks;
    if (!(n > MAX_STACKS)) return;
    throw new EngineInputError(
      `The output grammar of ${this.#param} became too ambiguous to follow: after ${this.#accepted} tokens ` +
        `the output could be read ${n} ways (at most ${MAX_STACKS}). anyOf/oneOf alternatives that begin ` +
        "alike and nest inside each other multiply at every level: let them differ early (a distinct type " +
        "or a leading discriminating property) or nest them less deep.",
      this.#param,
      "schema_too_large",
    );
  }

  /**
   * The error when this grammar allows no token at all: what it asks for next cannot be written in
   * the model's tokens (llama.cpp reads a character U+0000 as the end of a token's text).
   */
  deadEnd(): EngineInputError {
    return new EngineInputError(
      `The output grammar of ${this.#param} allows no token after ${this.#accepted} tokens: what the schema ` +
        "asks for next cannot be generated (a U+0000 character, say).",
      this.#param,
      "invalid_schema",
    );
  }

  /** An independent copy of the current state (for n > 1 choices). */
  clone(): GrammarConstraint {
    const ptr = this.#lib.symbols.llama_sampler_clone(this.#live());
    if (!ptr) throw new Error("llama.cpp could not copy a grammar");
    const copy = new GrammarConstraint(this.#lib, ptr, this.#nVocab, this.#vocab, this.#param, this.#offLoop);
    copy.#accepted = this.#accepted;
    return copy;
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
