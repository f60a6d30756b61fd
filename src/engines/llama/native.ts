/**
 * Thin owners of llama.cpp objects (model, context, batch) over the FFI bindings. They manage
 * native memory and translate return codes into errors; scheduling lives elsewhere.
 */
import {
  computeNow,
  CONTEXT_PARAMS,
  cString,
  type LlamaLibrary,
  MODEL_PARAMS,
  nativeView,
  POOLING,
  readCString,
  serialized,
  SPLIT_MODE,
} from "./ffi.ts";
import type { MarkupToken } from "../markup.ts";
import { helpersBusy, loopTurn, loopTurnsEnabled, Slicer } from "../../event_loop.ts";
import { hostLoad } from "../../host_load.ts";

/** Where a model's weights go, beyond the number of offloaded layers (llama.cpp model parameters). */
export interface ModelPlacement {
  /**
   * Tensor buffer-type overrides, in order (the first pattern that matches a tensor name wins):
   * a regex over names such as `blk.3.ffn_up_exps.weight` and the buffer type of a device.
   */
  overrides?: readonly { pattern: string; bufferType: Deno.PointerObject }[];
  /** How layers are spread over several GPUs (llama.cpp's default: `layer`). */
  splitMode?: keyof typeof SPLIT_MODE;
  /** The GPU used for the whole model with split mode `none` (and for small tensors with `row`). */
  mainGpu?: number;
  /** Proportions of the model per GPU; absent: in proportion to each GPU's free memory. */
  tensorSplit?: readonly number[];
  /**
   * Reads the header and sizes every buffer without allocating them or reading weights: a dry
   * run whose load log gives llama.cpp's own figures. The model cannot compute.
   */
  noAlloc?: boolean;
}
import type { ComputeClient } from "../compute_share.ts";
import { releaseFreedMemory } from "../native_memory.ts";
import { decodeKind, DecodePace } from "./pace.ts";

/**
 * A decode on the JavaScript thread this long, and this many times its kind's usual time, was held
 * up by others on the host (host_load.ts): the next ones run off the thread.
 */
const STALLED_MS = 25;
const STALLED_TIMES = 4;

/** Characters of text tokenized on a thread of its own rather than on the event loop's. */
const LONG_TEXT = 8192;
/** Token ids turned into text in one run. */
const DETOKENIZE_RUN = 16_384;

/**
 * One pace for the process: its bursts of synchronous decodes hold the one event loop, whichever
 * context runs them. `VSERVE_SYNC_DECODE_MS` sets the longest decode run synchronously (0: none).
 */
const pace = new DecodePace(syncDecodeMs());
let contexts = 0;

function syncDecodeMs(): number | undefined {
  try {
    const text = Deno.env.get("VSERVE_SYNC_DECODE_MS");
    const ms = text === undefined ? NaN : Number(text);
    return Number.isFinite(ms) && ms >= 0 ? ms : undefined;
  } catch {
    return undefined; // no permission to read the environment: the default
  }
}

/** Token attribute bits (`llama_token_attr`). */
const ATTR_UNKNOWN = 1 << 0;
const ATTR_CONTROL = 1 << 3;
const ATTR_USER_DEFINED = 1 << 4;

/** Characters of text {@link NativeModel.tokenize} encodes into buffers kept for it. */
const SCRATCH_CHARS = 2048;
const encoder = new TextEncoder();
/** UTF-8 of up to {@link SCRATCH_CHARS} UTF-16 units (3 bytes each at most), and its token ids. */
const scratchBytes = new Uint8Array(SCRATCH_CHARS * 3);
const scratchIds = new Int32Array(SCRATCH_CHARS * 3 + 8);

/** A loaded GGUF model and its vocabulary. */
export class NativeModel {
  readonly nVocab: number;
  readonly nEmbd: number;
  readonly nCtxTrain: number;
  /** Recurrent or hybrid memory: a sequence's tail cannot simply be cut off. */
  readonly recurrent: boolean;
  readonly eos: number;
  readonly bos: number;
  readonly addBos: boolean;
  readonly #pieces = new Map<number, Uint8Array>();
  #freed = false;

  private constructor(
    readonly lib: LlamaLibrary,
    readonly ptr: Deno.PointerObject,
    readonly path: string,
    /** Native memory the model parameters pointed to (override patterns, split), kept with the model. */
    readonly params: unknown = undefined,
  ) {
    const s = lib.symbols;
    this.vocab = s.llama_model_get_vocab(ptr)!;
    this.nVocab = s.llama_vocab_n_tokens(this.vocab);
    this.nEmbd = s.llama_model_n_embd_out(ptr);
    this.nCtxTrain = s.llama_model_n_ctx_train(ptr);
    this.recurrent = s.llama_model_is_recurrent(ptr) || s.llama_model_is_hybrid(ptr);
    this.eos = s.llama_vocab_eos(this.vocab);
    this.bos = s.llama_vocab_bos(this.vocab);
    this.addBos = s.llama_vocab_get_add_bos(this.vocab);
  }

  readonly vocab: Deno.PointerObject;

  /**
   * Loads a GGUF file; `gpuLayers` -1 offloads every layer.
   *
   * @example
   * ```ts
   * import type { LlamaLibrary } from "./ffi.ts";
   * async function open(lib: LlamaLibrary) {
   *   return await NativeModel.load(lib, "model.gguf", 0);
   * }
   * ```
   */
  static async load(
    lib: LlamaLibrary,
    path: string,
    gpuLayers: number,
    placement: ModelPlacement = {},
  ): Promise<NativeModel> {
    const s = lib.symbols;
    const params = s.llama_model_default_params();
    const view = new DataView(params.buffer);
    view.setInt32(MODEL_PARAMS.nGpuLayers, gpuLayers, true);
    const kept = placementParams(lib, view, placement);
    // Recurrent and hybrid models keep their weights in plain CPU buffers: the CPU backend's extra
    // (repacked) buffer types of the llama.cpp node-llama-cpp 3.21.1 ships give wrong results for them
    // (AMX: a matmul over several sequences reads the weights of the first one at a wrong offset,
    // and results change with the micro-batch size). The architecture is read first, vocabulary only.
    if (await NativeModel.#isRecurrent(lib, path)) params[MODEL_PARAMS.useExtraBufts] = 0;
    const ptr = await s.llama_model_load_from_file(cString(path), params);
    if (!ptr) throw new Error(`llama.cpp could not load '${path}' (the log above says why)`);
    return new NativeModel(lib, ptr, path, kept);
  }

  /** Whether the GGUF at `path` has recurrent or hybrid memory (loads its vocabulary only). */
  static async #isRecurrent(lib: LlamaLibrary, path: string): Promise<boolean> {
    const s = lib.symbols;
    const params = s.llama_model_default_params();
    params[MODEL_PARAMS.vocabOnly] = 1;
    const ptr = await s.llama_model_load_from_file(cString(path), params);
    if (!ptr) return false; // the full load reports the reason
    try {
      return s.llama_model_is_recurrent(ptr) || s.llama_model_is_hybrid(ptr);
    } finally {
      // (Freeing 151k tokens' vocabulary takes 37-44 ms: off the event loop.)
      await s.llama_model_free_async(ptr);
      // And its ~45 MiB back to the system before the full load allocates its own (native_memory.ts).
      await releaseFreedMemory();
    }
  }

  /** A metadata value as text, or undefined. */
  meta(key: string): string | undefined {
    const buf = new Uint8Array(256);
    let n = this.lib.symbols.llama_model_meta_val_str(this.ptr, cString(key), buf, BigInt(buf.length));
    if (n < 0) return undefined;
    if (n >= buf.length) {
      const big = new Uint8Array(n + 1);
      n = this.lib.symbols.llama_model_meta_val_str(this.ptr, cString(key), big, BigInt(big.length));
      return new TextDecoder().decode(big.subarray(0, n));
    }
    return new TextDecoder().decode(buf.subarray(0, n));
  }

  /** The GGUF's default chat template (`tokenizer.chat_template`), if any. */
  chatTemplate(): string | undefined {
    const text = readCString(this.lib.symbols.llama_model_chat_template(this.ptr, null));
    return text === "" ? undefined : text;
  }

  /**
   * Tokenizes `text`. `special`: parse special-token text (chat templates) into special tokens;
   * `addSpecial`: add BOS/EOS as the model is configured.
   */
  tokenize(text: string, special: boolean, addSpecial = false): number[] {
    if (text.length <= SCRATCH_CHARS) {
      // A short text (a fragment of a markup-dense one: 800,000 of them in 7.6 MB) goes through
      // buffers kept for it: two array buffers a call made garbage collection steps of 13 ms.
      const { written } = encoder.encodeInto(text, scratchBytes);
      const n = this.lib.symbols.llama_tokenize(
        this.vocab,
        scratchBytes,
        written,
        scratchIds,
        scratchIds.length,
        addSpecial,
        special,
      );
      if (n >= 0) {
        const ids = new Array<number>(n);
        for (let i = 0; i < n; i++) ids[i] = scratchIds[i];
        return ids;
      }
      if (n === -2147483648) throw new Error("the text is too long to tokenize");
    }
    const bytes = encoder.encode(text);
    let cap = bytes.length + 8;
    for (;;) {
      const out = new Int32Array(cap);
      const n = this.lib.symbols.llama_tokenize(
        this.vocab,
        bytes,
        bytes.length,
        out,
        cap,
        addSpecial,
        special,
      );
      if (n >= 0) return Array.from(out.subarray(0, n));
      if (n === -2147483648) throw new Error("the text is too long to tokenize");
      cap = -n;
    }
  }

  /**
   * Tokens of `pieces`: token ids as they are, text as plain text (no special-token parsing),
   * without holding the event loop: a text over 8 KB is tokenized on a thread of its own (llama.cpp
   * takes 2-4 ms per 8 KB), shorter ones here with a turn of the event loop every 10 ms (a text cut
   * into 800,000 fragments took llama.cpp 3.4 s). Appends to `into` (default: a new array); stops
   * once it holds more than `limit` tokens (`complete` false).
   */
  async tokenizePieces(
    pieces: Iterable<string | number>,
    opts: { signal?: AbortSignal; limit?: number; into?: number[] } = {},
  ): Promise<{ tokens: number[]; complete: boolean }> {
    const tokens = opts.into ?? [];
    const limit = opts.limit ?? Infinity;
    const slices = new Slicer(10, opts.signal);
    for (const piece of pieces) {
      if (tokens.length > limit) return { tokens, complete: false };
      if (slices.due) await slices.pause();
      if (typeof piece === "number") tokens.push(piece);
      else if (piece.length > LONG_TEXT) {
        // A long text's ids are copied in slices, and no further than the limit needs: a 7.8 MB
        // text is 3.9 M ids, which copied in one block held the event loop for 300 ms.
        const ids = await this.#tokenizeOffThread(piece, false);
        const room = Math.min(ids.length, limit - tokens.length + 1);
        for (let i = 0; i < room; i++) {
          if (i % 4096 === 0 && slices.due) await slices.pause();
          tokens.push(ids[i]);
        }
        if (room < ids.length) return { tokens, complete: false };
      } else {
        for (const id of this.tokenize(piece, false)) tokens.push(id);
      }
    }
    return { tokens, complete: true };
  }

  /**
   * Tokenizes `text` on a thread of its own (a long text takes llama.cpp a second per megabyte or
   * so); as {@link tokenize} without BOS/EOS.
   */
  async tokenizeAsync(text: string, special: boolean): Promise<number[]> {
    return Array.from(await this.#tokenizeOffThread(text, special));
  }

  /** {@link tokenizeAsync}'s ids as llama.cpp wrote them. */
  async #tokenizeOffThread(text: string, special: boolean): Promise<Int32Array> {
    const bytes = new TextEncoder().encode(text);
    // A token holds at least one byte: this many always suffice.
    const cap = bytes.length + 8;
    const out = new Int32Array(cap);
    const n = await this.lib.symbols.llama_tokenize_nonblocking(
      this.vocab,
      bytes,
      bytes.length,
      out,
      cap,
      false,
      special,
    );
    if (n < 0) throw new Error("the text is too long to tokenize");
    return out.subarray(0, n);
  }

  /**
   * One pass over the vocabulary: its markup tokens, the ones llama.cpp turns special-token text
   * into when asked to parse it (control and unknown tokens, and user-defined ones such as
   * `<think>`, which it matches in plain text too), and the longest token's bytes. 30-80 ms for
   * 151k tokens: in slices that leave the event loop free.
   */
  async scanVocabulary(): Promise<{ markup: MarkupToken[]; longestToken: number }> {
    const markup: MarkupToken[] = [];
    const s = this.lib.symbols;
    const buf = new Uint8Array(1024);
    let longestToken = 1;
    const slices = new Slicer(10);
    for (let id = 0; id < this.nVocab; id++) {
      if (id % 1024 === 0 && slices.due) await slices.pause();
      const n = s.llama_token_to_piece(this.vocab, id, buf, buf.length, 0, false);
      longestToken = Math.max(longestToken, n < 0 ? -n : n);
      const attr = s.llama_vocab_get_attr(this.vocab, id);
      if ((attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) === 0) continue;
      const text = new TextDecoder().decode(this.piece(id, true));
      // (With text parsing off, llama.cpp skips control and unknown tokens, user-defined or not.)
      markup.push({ id, text, matchedInText: (attr & (ATTR_CONTROL | ATTR_UNKNOWN)) === 0 });
    }
    return { markup, longestToken };
  }

  /** The bytes a token stands for (control tokens render as nothing unless `special`). */
  piece(token: number, special = false): Uint8Array {
    const key = special ? -token - 1 : token;
    const cached = this.#pieces.get(key);
    if (cached) return cached;
    let buf = new Uint8Array(32);
    let n = this.lib.symbols.llama_token_to_piece(this.vocab, token, buf, buf.length, 0, special);
    if (n < 0) {
      buf = new Uint8Array(-n);
      n = this.lib.symbols.llama_token_to_piece(this.vocab, token, buf, buf.length, 0, special);
    }
    const piece = buf.slice(0, Math.max(0, n));
    this.#pieces.set(key, piece);
    return piece;
  }

  /**
   * {@link detokenize} without holding the event loop: a long list (a million ids: ~100 ms, and a
   * 24 MB text) is turned into text a run at a time, with turns of the loop between runs.
   */
  async detokenizeInSlices(tokens: readonly number[], signal?: AbortSignal): Promise<string> {
    if (tokens.length <= DETOKENIZE_RUN) return this.detokenize(tokens, true);
    const decoder = new TextDecoder();
    const parts: string[] = [];
    const slices = new Slicer(10, signal);
    for (let at = 0; at < tokens.length; at += DETOKENIZE_RUN) {
      if (slices.due) await slices.pause();
      const pieces = tokens.slice(at, at + DETOKENIZE_RUN).map((t) => this.piece(t, true));
      const bytes = new Uint8Array(pieces.reduce((n, p) => n + p.length, 0));
      let put = 0;
      for (const p of pieces) {
        bytes.set(p, put);
        put += p.length;
      }
      parts.push(decoder.decode(bytes, { stream: true }));
    }
    parts.push(decoder.decode());
    return parts.join("");
  }

  /** The text of `tokens`, special tokens included (for echoing prompts and /detokenize). */
  detokenize(tokens: readonly number[], special = true): string {
    const parts = tokens.map((t) => this.piece(t, special));
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return new TextDecoder().decode(out);
  }

  /** End of generation (EOS, EOT, `<|im_end|>`, …). */
  isEog(token: number): boolean {
    return this.lib.symbols.llama_vocab_is_eog(this.vocab, token);
  }

  /** A control token (never shown as text). */
  isControl(token: number): boolean {
    return (this.lib.symbols.llama_vocab_get_attr(this.vocab, token) & ATTR_CONTROL) !== 0;
  }

  /** Fill-in-the-middle tokens, when the vocabulary has them. */
  fimTokens(): { prefix: number; suffix: number; middle: number } | undefined {
    const s = this.lib.symbols;
    const prefix = s.llama_vocab_fim_pre(this.vocab);
    const suffix = s.llama_vocab_fim_suf(this.vocab);
    const middle = s.llama_vocab_fim_mid(this.vocab);
    return prefix >= 0 && suffix >= 0 && middle >= 0 ? { prefix, suffix, middle } : undefined;
  }

  /** Parameters in all (token table included). */
  get nParams(): number {
    return Number(this.lib.symbols.llama_model_n_params(this.ptr));
  }

  /** Bytes of weights. */
  get sizeBytes(): number {
    return Number(this.lib.symbols.llama_model_size(this.ptr));
  }

  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.lib.symbols.llama_model_free(this.ptr);
  }
}

/**
 * Writes `placement` into model parameters `view`; returns the native buffers the parameters point
 * to, which must live as long as the model (llama.cpp keeps the pointers).
 *
 * @example
 * ```ts
 * import type { LlamaLibrary } from "./ffi.ts";
 * function rowSplitParams(lib: LlamaLibrary) {
 *   const params = lib.symbols.llama_model_default_params();
 *   const kept = placementParams(lib, new DataView(params.buffer), { splitMode: "row" });
 *   return { params, kept }; // keep `kept` while the model lives
 * }
 * ```
 */
export function placementParams(lib: LlamaLibrary, view: DataView, placement: ModelPlacement): unknown {
  const kept: Uint8Array[] = [];
  const address = (buf: Uint8Array<ArrayBuffer>) => {
    kept.push(buf);
    return BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(buf)));
  };
  if (placement.overrides?.length) {
    // struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }
    const list = new BigUint64Array(new ArrayBuffer((placement.overrides.length + 1) * 16));
    placement.overrides.forEach((o, i) => {
      list[i * 2] = address(cString(o.pattern));
      list[i * 2 + 1] = BigInt(Deno.UnsafePointer.value(o.bufferType));
    });
    view.setBigUint64(MODEL_PARAMS.tensorBuftOverrides, address(new Uint8Array(list.buffer)), true);
  }
  if (placement.splitMode) view.setInt32(MODEL_PARAMS.splitMode, SPLIT_MODE[placement.splitMode], true);
  if (placement.mainGpu !== undefined) view.setInt32(MODEL_PARAMS.mainGpu, placement.mainGpu, true);
  if (placement.tensorSplit?.length) {
    // llama.cpp reads llama_max_devices() floats from the pointer.
    const n = Math.max(Number(lib.symbols.llama_max_devices()), placement.tensorSplit.length);
    const split = new Float32Array(n);
    split.set(placement.tensorSplit);
    view.setBigUint64(MODEL_PARAMS.tensorSplit, address(new Uint8Array(split.buffer)), true);
  }
  if (placement.noAlloc) {
    view.setUint8(MODEL_PARAMS.noAlloc, 1);
    view.setInt32(MODEL_PARAMS.loadMode, 0, true); // a dry run maps nothing (llama.cpp asserts it)
  }
  return kept;
}

/** How to create a context. */
export interface ContextOptions {
  /** Total cells of the KV cache (all sequences). */
  nCtx: number;
  nBatch: number;
  nUbatch: number;
  nSeqMax: number;
  threads: number;
  embeddings: boolean;
  pooling?: keyof typeof POOLING;
  /** One KV buffer shared by all sequences (true) or one per sequence of nCtx / nSeqMax cells. */
  kvUnified: boolean;
  /** llama.cpp's flash attention: `auto` (its default: on where the backend has it), `on` or `off`. */
  flashAttention?: FlashAttention;
  /** Where its decodes run (default: the process's pace, see pace.ts). */
  pace?: DecodePace;
  /** The model's turn on the machine's compute (see compute_share.ts); absent: first come, first served. */
  compute?: ComputeClient;
  /**
   * Compute each decode only up to the final norm, the embeddings (see {@link stopAtEmbeddings}): the
   * projection onto the vocabulary, which llama.cpp computes for every output, is skipped; logits are
   * not to be read. Every decode of such a context runs on the JavaScript thread (the callback that
   * stops the graph is ours), so it is for short decodes only.
   */
  stopAtEmbeddings?: boolean;
}

/** Where a `ggml_tensor`'s name begins (after type, buffer, ne, nb, op, op_params, flags, src[10], view, data). */
const TENSOR_NAME = 256;
/** The names llama.cpp gives the embeddings (the final norm's output) in its graphs. */
const EMBEDDINGS_NODES = new Set(["result_norm", "result_embd_pooled"]);
let stopCallback:
  | Deno.UnsafeCallback<{ parameters: ["pointer", "bool", "pointer"]; result: "bool" }>
  | undefined;

/**
 * The `cb_eval` of a context made with {@link ContextOptions.stopAtEmbeddings}. ggml's scheduler asks
 * it before each node whether the node's result is wanted; for the embeddings' node it says yes, and
 * when then told the node is computed it says stop: the rest of the graph, the projection of every
 * output onto the vocabulary (151k rows: on tiny-embed 1.3 ms of a 7-token input's 2.0 in two decodes,
 * and 5 ms in one), is not computed. A graph without such a node is computed whole, as without it.
 * Called on the thread that runs the decode, which must be this one (see {@link NativeContext.decode}).
 */
function stopAtEmbeddings(): Deno.PointerObject {
  stopCallback ??= new Deno.UnsafeCallback(
    { parameters: ["pointer", "bool", "pointer"], result: "bool" } as const,
    (tensor, ask) => {
      if (!ask) return false; // the embeddings are computed: stop here
      if (!tensor) return false;
      const view = new Deno.UnsafePointerView(tensor);
      // (Most nodes' names do not start with "r": one byte read instead of a string.)
      return view.getUint8(TENSOR_NAME) === 0x72 && EMBEDDINGS_NODES.has(view.getCString(TENSOR_NAME));
    },
  );
  return stopCallback.pointer;
}

/** The `flash_attn_type` values of llama.cpp's context parameters. */
const FLASH_ATTENTION = { auto: -1, off: 0, on: 1 } as const;
/** A flash attention setting, as {@link ContextOptions.flashAttention} takes it. */
export type FlashAttention = keyof typeof FLASH_ATTENTION;

/**
 * State snapshots up to this size are written on the JavaScript thread ({@link NativeContext.saveState}):
 * at memory speed well under a millisecond (4,000 tokens of tiny-moe, 1.1 MB: 0.21 ms).
 */
export const SYNC_STATE_BYTES = 4 * 1024 * 1024;

/** A llama.cpp context: memory (KV cache / recurrent state) for several sequences. */
export class NativeContext {
  readonly nCtx: number;
  /** Cells one sequence may hold. */
  readonly nCtxSeq: number;
  readonly nBatch: number;
  readonly nSeqMax: number;
  readonly mem: Deno.PointerObject;
  #freed = false;
  readonly #id = ++contexts;
  readonly #pace: DecodePace;
  #embeddings: boolean;
  /** The CPU threads llama.cpp computes the next decode with (at most {@link threads}). */
  #threadsNow: number;
  /**
   * A generation context: its decode kinds count the context they attend over (pace.ts); an
   * embedding context's inputs start at position 0, and its own choices look its kinds up by size.
   */
  readonly #generation: boolean;
  /**
   * Decodes run on the JavaScript thread (see pace.ts) and on the blocking pool, and the turns of the
   * event loop taken between bursts of the former; `hostBusy`: decodes kept off the JavaScript thread
   * while other processes kept the host's cores busy (see host_load.ts).
   */
  readonly decodes = { onThread: 0, offThread: 0, turns: 0, fewerThreads: 0, hostBusy: 0 };
  /** State snapshots written on the JavaScript thread and on the blocking pool ({@link saveState}). */
  readonly saves = { onThread: 0, offThread: 0 };
  /**
   * A sequence copy is pending: llama.cpp performs it at the start of the next decode (a whole KV
   * stream, hundreds of MB on a large model), so that decode runs off the JavaScript thread and its
   * time is not taken as its shape's.
   */
  #copyPending = false;
  /** A view of llama.cpp's logits buffer from its start (see {@link logits}). */
  #outputs?: { base: Deno.PointerObject; view: Float32Array };

  private constructor(
    readonly lib: LlamaLibrary,
    readonly model: NativeModel,
    readonly ptr: Deno.PointerObject,
    embeddings: boolean,
    generation: boolean,
    decodePace: DecodePace,
    readonly threads: number,
    readonly compute?: ComputeClient,
    /** Made with {@link ContextOptions.stopAtEmbeddings}: every decode on this thread. */
    readonly syncOnly = false,
  ) {
    const s = lib.symbols;
    this.#threadsNow = threads;
    this.#embeddings = embeddings;
    this.#generation = generation;
    this.#pace = decodePace;
    this.nCtx = s.llama_n_ctx(ptr);
    this.nCtxSeq = s.llama_n_ctx_seq(ptr);
    this.nBatch = s.llama_n_batch(ptr);
    this.nSeqMax = s.llama_n_seq_max(ptr);
    this.mem = s.llama_get_memory(ptr)!;
  }

  /**
   * Creates a context on `model`.
   *
   * @example
   * ```ts
   * async function context(model: NativeModel) {
   *   const opts = { nCtx: 4096, nBatch: 512, nUbatch: 512, nSeqMax: 4, threads: 2, embeddings: false, kvUnified: false };
   *   return await NativeContext.create(model, opts);
   * }
   * ```
   */
  static async create(model: NativeModel, opts: ContextOptions): Promise<NativeContext> {
    const lib = model.lib;
    const params = lib.symbols.llama_context_default_params();
    const v = new DataView(params.buffer);
    v.setUint32(CONTEXT_PARAMS.nCtx, opts.nCtx, true);
    v.setUint32(CONTEXT_PARAMS.nBatch, opts.nBatch, true);
    v.setUint32(CONTEXT_PARAMS.nUbatch, opts.nUbatch, true);
    v.setUint32(CONTEXT_PARAMS.nSeqMax, opts.nSeqMax, true);
    v.setInt32(CONTEXT_PARAMS.nThreads, opts.threads, true);
    v.setInt32(CONTEXT_PARAMS.nThreadsBatch, opts.threads, true);
    v.setInt32(CONTEXT_PARAMS.poolingType, POOLING[opts.pooling ?? "unspecified"], true);
    params[CONTEXT_PARAMS.embeddings] = opts.embeddings ? 1 : 0;
    params[CONTEXT_PARAMS.kvUnified] = opts.kvUnified ? 1 : 0;
    params[CONTEXT_PARAMS.noPerf] = 1;
    v.setInt32(CONTEXT_PARAMS.flashAttnType, FLASH_ATTENTION[opts.flashAttention ?? "auto"], true);
    if (opts.stopAtEmbeddings) {
      v.setBigUint64(CONTEXT_PARAMS.cbEval, BigInt(Deno.UnsafePointer.value(stopAtEmbeddings())), true);
    }
    const ptr = await lib.symbols.llama_init_from_model(model.ptr, params);
    if (ptr) {
      const pool = lib.threadpool(opts.threads);
      if (pool) lib.symbols.llama_attach_threadpool(ptr, pool, pool);
    }
    if (!ptr) {
      throw new Error(
        `llama.cpp could not create a context of ${opts.nCtx} tokens for ${opts.nSeqMax} sequences ` +
          "(not enough memory? the log above says why)",
      );
    }
    // An embedding context is made with outputs off and pooling "none" (the engine turns them on).
    const generation = !opts.embeddings && opts.pooling === undefined;
    return new NativeContext(
      lib,
      model,
      ptr,
      opts.embeddings,
      generation,
      opts.pace ?? pace,
      opts.threads,
      opts.compute,
      opts.stopAtEmbeddings ?? false,
    );
  }

  /** The longest decode expected to run on the JavaScript thread, ms (pace.ts; 0: none does). */
  get syncDecodeMs(): number {
    return this.#pace.maxStepMs;
  }

  /**
   * Ends the current burst of decodes on the JavaScript thread: the next decode lets the event loop
   * wait, which sends what the streams wrote (a request's first token, say) without waiting for the
   * burst's end.
   */
  endBurst(): void {
    this.#pace.endBurst();
  }

  /**
   * The wall time of a decode of `tokens` tokens, with outputs (`embeddings`) or not, in this context:
   * `ms` as expected now (a moving average), `least` the least of the last few (its cost on a quiet
   * machine: see pace.ts), `median` their median (what it usually takes), and how many were measured
   * (0: all NaN).
   */
  expectedDecode(
    tokens: number,
    embeddings: boolean,
    threads = this.threads,
  ): { ms: number; least: number; median: number; samples: number } {
    const kind = this.#kind(tokens, embeddings, threads);
    return {
      ms: this.#pace.expected(kind) ?? NaN,
      least: this.#pace.least(kind) ?? NaN,
      median: this.#pace.median(kind) ?? NaN,
      samples: this.#pace.samples(kind),
    };
  }

  /**
   * The key decode times are kept under: this context, the batch's shape (for generation, with the
   * context it attends over), fewer threads than configured.
   */
  #kind(tokens: number, embeddings: boolean, threads: number, cells = 0): string {
    const fewer = threads < this.threads ? `:t${threads}` : "";
    return `${this.#id}:${decodeKind(tokens, embeddings, cells)}${fewer}`;
  }

  /**
   * Puts the compute threads to sleep if nothing else is computing (call when out of work). Not after
   * a decode on one thread: the other workers did not take part, so they are not spinning, and a pool
   * put to sleep costs the next decode its waking (a short embedding on one thread took 2.1 ms, and
   * every other one 6.3 ms, when the pool was paused after each).
   */
  idle(): void {
    this.#pace.rest();
    this.compute?.idle();
    if (this.#threadsNow === this.threads || this.threads === 1) this.lib.idle();
  }

  /**
   * A first decode of `batch` off this thread, for a context made with
   * {@link ContextOptions.stopAtEmbeddings}: its one-time costs (buffers sized, the graph allocated:
   * 118 ms on tiny-embed) are paid without holding the event loop. Its callback then runs on this
   * thread through the event loop, node by node (slow, but once); its time is not kept as its shape's.
   */
  async warmUp(batch: Batch): Promise<void> {
    stopCallback?.ref();
    try {
      const r = await this.#computeStep(() => this.lib.symbols.llama_decode(this.ptr, batch.struct()));
      if (r !== 0) throw new Error(`llama_decode failed with code ${r}`);
    } finally {
      stopCallback?.unref();
    }
  }

  /** Native compute in this model's turn (one call at a time in the process). */
  #computeStep<T>(work: () => Promise<T>): Promise<T> {
    return this.compute ? this.compute.run(() => serialized(work)) : serialized(work);
  }

  /**
   * `work` (synchronous native compute) at once on this thread, when nothing is queued or running in
   * the process and the arbiter grants this model a turn now; undefined otherwise.
   */
  #computeNow<T>(work: () => T): { result: T } | undefined {
    if (!this.compute) return computeNow(work);
    return computeNow(() => this.compute!.runNow(work))?.result;
  }

  /**
   * Runs the model on `batch`: on the JavaScript thread when a decode of its shape is expected to be
   * short, else off it (see pace.ts); throws with llama.cpp's reason on failure. `threads`: the CPU
   * threads to compute it with, at most the context's (fewer for a batch so small that the threads'
   * synchronisation at every graph node costs more than they share; its times are kept apart).
   */
  async decode(batch: Batch, threads = this.threads): Promise<void> {
    if (batch.size === 0) return;
    const s = this.lib.symbols;
    const n = Math.max(1, Math.min(threads, this.threads));
    if (n !== this.#threadsNow) {
      s.llama_set_n_threads(this.ptr, n, n);
      this.#threadsNow = n;
    }
    if (n < this.threads) this.decodes.fewerThreads++;
    const kind = this.#kind(batch.size, this.#embeddings, n, this.#generation ? batch.cells : 0);
    const copying = this.#copyPending;
    this.#copyPending = false;
    // A short decode whose burst is used up: one turn of the event loop first (its sockets polled,
    // what the streams wrote sent), then a new burst on this thread. The turn costs ~35 µs of this
    // thread; the non-blocking decode it replaces, two thread wake-ups (see pace.ts).
    if (!copying && loopTurnsEnabled() && this.#pace.short(kind) && !this.#pace.onThread(kind)) {
      await loopTurn();
      this.#pace.rest();
      this.decodes.turns++;
    }
    const start = performance.now();
    // Not on this thread while a helper thread of ours is at work (see helperWork), nor, with
    // partner threads, while other processes keep the cores busy (see host_load.ts).
    const load = n > 1 ? hostLoad() : null;
    let onThread = this.syncOnly || (!copying && this.#pace.onThread(kind) && !helpersBusy());
    if (onThread && !this.syncOnly && load?.busy()) {
      onThread = false;
      this.decodes.hostBusy++;
    }
    const now = onThread ? this.#computeNow(() => s.llama_decode_sync(this.ptr, batch.struct())) : undefined;
    let r: number;
    if (now) {
      r = now.result;
      // Wall time, not the thread's CPU: it bounds how long what the streams wrote waits to be sent.
      const ms = performance.now() - start;
      const expected = this.#pace.expected(kind);
      if (expected !== undefined && ms > STALLED_MS && ms > STALLED_TIMES * expected) load?.stalled();
      this.#pace.record(kind, ms, true);
      this.decodes.onThread++;
    } else if (this.syncOnly) {
      // Compute is queued or another model holds the turn: this thread's decode once it is granted
      // (ggml calls this context's callback on the thread that decodes).
      let ms = 0;
      r = await this.#computeStep(() => {
        const t = performance.now();
        const result = s.llama_decode_sync(this.ptr, batch.struct());
        ms = performance.now() - t;
        return Promise.resolve(result);
      });
      this.#pace.record(kind, ms, true);
      this.decodes.onThread++;
    } else {
      let ms = 0;
      r = await this.#computeStep(async () => {
        const t = performance.now();
        const result = await s.llama_decode(this.ptr, batch.struct());
        ms = performance.now() - t;
        return result;
      });
      if (copying) this.#pace.rest();
      else this.#pace.record(kind, ms, false);
      this.decodes.offThread++;
    }
    if (r === 0) return;
    throw new Error(
      r === 1
        ? "llama.cpp found no free KV-cache slot for the batch (the context is full)"
        : r === -1
        ? "llama.cpp rejected the batch as invalid"
        : `llama_decode failed with code ${r}`,
    );
  }

  /**
   * The logits of the batch's output `i` (a view: valid until the next decode). Views share one
   * ArrayBuffer over llama.cpp's output buffer, made again only when that buffer moves or a later
   * row is asked for: V8 counts every ArrayBuffer over native memory as external memory, and one
   * of 600 KB per token and sequence (151k logits) set off a garbage collection every few tokens.
   */
  logits(i: number): Float32Array {
    const s = this.lib.symbols;
    const row = s.llama_get_logits_ith(this.ptr, i);
    const base = s.llama_get_logits(this.ptr);
    if (!row || !base) throw new Error("null pointer from llama.cpp");
    const nVocab = this.model.nVocab;
    const at = (Number(Deno.UnsafePointer.value(row)) - Number(Deno.UnsafePointer.value(base))) / 4;
    const outputs = this.#outputs;
    if (
      !outputs || !Deno.UnsafePointer.equals(outputs.base, base) || at < 0 ||
      at + nVocab > outputs.view.length
    ) {
      // The buffer holds at least the rows up to this one.
      this.#outputs = { base, view: nativeView(Float32Array, base, at + nVocab) };
    }
    return this.#outputs!.view.subarray(at, at + nVocab);
  }

  /** The pooled embedding of sequence `seq` after the last decode (a copy). */
  embeddingOfSequence(seq: number): Float32Array {
    const ptr = this.lib.symbols.llama_get_embeddings_seq(this.ptr, seq);
    return nativeView(Float32Array, ptr, this.model.nEmbd).slice();
  }

  /** Switches embedding output on or off for the next decodes. */
  setEmbeddings(on: boolean): void {
    this.#embeddings = on;
    this.lib.symbols.llama_set_embeddings(this.ptr, on);
  }

  /** Removes positions [p0, p1) of `seq` (-1: open end); false when the memory cannot cut there. */
  removeTokens(seq: number, p0: number, p1 = -1): boolean {
    return this.lib.symbols.llama_memory_seq_rm(this.mem, seq, p0, p1);
  }

  /**
   * Copies all of `src` into `dst` (which must be empty). With a KV stream per sequence llama.cpp
   * copies the whole stream buffer, at the start of the next decode; a recurrent state is shared
   * until either sequence moves on.
   */
  copySequence(src: number, dst: number): void {
    this.lib.symbols.llama_memory_seq_cp(this.mem, src, dst, -1, -1);
    this.#copyPending = true;
  }

  /** Last position held for `seq`, or -1. */
  lastPosition(seq: number): number {
    return this.lib.symbols.llama_memory_seq_pos_max(this.mem, seq);
  }

  /** Empties every sequence. */
  clear(): void {
    this.lib.symbols.llama_memory_clear(this.mem, false);
  }

  /** Bytes of a snapshot of `seq`'s state ({@link saveState}). */
  stateSize(seq: number, flags: number): number {
    return Number(this.lib.symbols.llama_state_seq_get_size_ext(this.ptr, seq, flags));
  }

  /**
   * A snapshot of `seq`'s state (`flags`: 1 = only what cannot be rolled back). One of at most
   * {@link SYNC_STATE_BYTES} is written on the calling thread: a hand-off to the blocking pool cost
   * 0.03-0.2 ms on an idle machine and up to 7 ms beside a prompt burst (tiny-moe: eight saves of
   * 250 KB and sixteen 17 KB checkpoints a burst), where the copy itself takes 3-110 µs.
   */
  async saveState(seq: number, flags: number): Promise<Uint8Array> {
    const s = this.lib.symbols;
    const size = Number(s.llama_state_seq_get_size_ext(this.ptr, seq, flags));
    const buf = new Uint8Array(size);
    const onThread = size <= SYNC_STATE_BYTES;
    if (onThread) this.saves.onThread++;
    else this.saves.offThread++;
    const n = Number(
      onThread
        ? s.llama_state_seq_get_data_ext_sync(this.ptr, buf, BigInt(size), seq, flags)
        : await s.llama_state_seq_get_data_ext(this.ptr, buf, BigInt(size), seq, flags),
    );
    if (n !== size) throw new Error(`llama.cpp saved ${n} of ${size} state bytes`);
    return buf;
  }

  /** Restores a snapshot from {@link saveState} into `seq`. */
  async restoreState(seq: number, data: Uint8Array, flags: number): Promise<void> {
    const n = Number(
      await this.#computeStep(() =>
        this.lib.symbols.llama_state_seq_set_data_ext(
          this.ptr,
          data as Uint8Array<ArrayBuffer>,
          BigInt(data.length),
          seq,
          flags,
        )
      ),
    );
    if (n === 0) throw new Error("llama.cpp could not restore the sequence state");
  }

  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.lib.symbols.llama_free(this.ptr);
  }
}

/** A reusable `llama_batch` whose arrays are written through typed-array views. */
export class Batch {
  readonly capacity: number;
  #struct: Uint8Array<ArrayBuffer>;
  #tokens: Int32Array;
  #pos: Int32Array;
  #nSeq: Int32Array;
  #seq: Int32Array[];
  #logits: Int8Array;
  #n = 0;
  #cells = 0;

  constructor(readonly lib: LlamaLibrary, capacity: number) {
    this.capacity = capacity;
    this.#struct = lib.symbols.llama_batch_init(capacity, 0, 1) as Uint8Array<ArrayBuffer>;
    const f = new BigUint64Array(this.#struct.buffer);
    const ptr = (i: number) => Deno.UnsafePointer.create(f[i]);
    this.#tokens = nativeView(Int32Array, ptr(1), capacity);
    this.#pos = nativeView(Int32Array, ptr(3), capacity);
    this.#nSeq = nativeView(Int32Array, ptr(4), capacity);
    const seqPtrs = nativeView(BigUint64Array, ptr(5), capacity);
    this.#seq = Array.from(seqPtrs, (p) => nativeView(Int32Array, Deno.UnsafePointer.create(p), 1));
    this.#logits = nativeView(Int8Array, ptr(6), capacity);
  }

  /** Tokens in the batch. */
  get size(): number {
    return this.#n;
  }

  /** Free places. */
  get room(): number {
    return this.capacity - this.#n;
  }

  /** The highest position in the batch plus one: the context its decode attends over. */
  get cells(): number {
    return this.#cells;
  }

  clear(): void {
    this.#n = 0;
    this.#cells = 0;
  }

  /** Adds a token; returns its output index (for `logits(i)`) when `output`, else -1. */
  add(token: number, pos: number, seq: number, output: boolean): number {
    if (this.#n >= this.capacity) throw new Error("batch overflow");
    const i = this.#n++;
    this.#tokens[i] = token;
    this.#pos[i] = pos;
    if (pos >= this.#cells) this.#cells = pos + 1;
    this.#nSeq[i] = 1;
    this.#seq[i][0] = seq;
    this.#logits[i] = output ? 1 : 0;
    return output ? i : -1;
  }

  /** The struct passed by value to `llama_decode`, with the current token count. */
  struct(): Uint8Array<ArrayBuffer> {
    new DataView(this.#struct.buffer).setInt32(0, this.#n, true);
    return this.#struct;
  }

  free(): void {
    new DataView(this.#struct.buffer).setInt32(0, 0, true);
    this.lib.symbols.llama_batch_free(this.#struct);
  }
}
