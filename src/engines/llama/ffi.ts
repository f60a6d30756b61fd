/**
 * The C API of the llama.cpp library that node-llama-cpp ships (its prebuilt `libllama`), bound
 * with Deno FFI. node-llama-cpp picks and loads the right build (CPU, CUDA or Vulkan) and its
 * backends; this module binds the same loaded library, so both share one llama.cpp instance.
 * We drive decoding ourselves because node-llama-cpp's JS API cannot batch several sequences'
 * embeddings into one decode, copy a sequence's state, or return raw logits.
 *
 * Struct layouts match `include/llama.h` of the llama.cpp release node-llama-cpp 3.21.1 ships
 * (`llama/llama.cpp.info.json`: v0.4.0); {@link checkLayouts} verifies them against the
 * library's defaults at start.
 */
import { noticeThreads } from "../../compute_priority.ts";

/** Byte offsets in `struct llama_model_params` (80 bytes). */
export const MODEL_PARAMS = {
  size: 80,
  /** `const struct llama_model_tensor_buft_override *`: {pattern, buft} pairs, a null pattern ends them. */
  tensorBuftOverrides: 8,
  nGpuLayers: 16,
  splitMode: 20,
  loadMode: 24,
  mainGpu: 32,
  /** `const float *` of `llama_max_devices()` proportions. */
  tensorSplit: 40,
  vocabOnly: 72,
  checkTensors: 73,
  useExtraBufts: 74,
  /** Read the header and size every buffer without allocating or reading weights. */
  noAlloc: 76,
} as const;

/** `enum llama_split_mode`. */
export const SPLIT_MODE = { none: 0, layer: 1, row: 2 } as const;

/** Byte offsets in `struct llama_context_params` (160 bytes). */
export const CONTEXT_PARAMS = {
  size: 160,
  nCtx: 0,
  nBatch: 4,
  nUbatch: 8,
  nSeqMax: 12,
  nRsSeq: 16,
  nOutputsMax: 20,
  nThreads: 28,
  nThreadsBatch: 32,
  poolingType: 44,
  attentionType: 48,
  flashAttnType: 52,
  /** `cb_eval`: called by ggml's scheduler before and after graph nodes (see native.ts). */
  cbEval: 88,
  typeK: 104,
  typeV: 108,
  embeddings: 128,
  offloadKqv: 129,
  noPerf: 130,
  swaFull: 132,
  kvUnified: 133,
} as const;

/** `llama_pooling_type`. */
export const POOLING = { unspecified: -1, none: 0, mean: 1, cls: 2, last: 3 } as const;

/** `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: only the parts that cannot be rolled back (recurrent state). */
export const STATE_PARTIAL_ONLY = 1;

const modelParams = { struct: Array(10).fill("u64") } as const;
const contextParams = { struct: Array(20).fill("u64") } as const;
const batch = { struct: Array(7).fill("u64") } as const;

const SYMBOLS = {
  llama_backend_init: { parameters: [], result: "void" },
  llama_model_default_params: { parameters: [], result: modelParams },
  llama_context_default_params: { parameters: [], result: contextParams },
  llama_model_load_from_file: { parameters: ["buffer", modelParams], result: "pointer", nonblocking: true },
  llama_model_free: { parameters: ["pointer"], result: "void" },
  /** The same, on a thread of the runtime's pool: freeing a vocabulary held the event loop 37-44 ms. */
  llama_model_free_async: {
    name: "llama_model_free",
    parameters: ["pointer"],
    result: "void",
    nonblocking: true,
  },
  llama_model_get_vocab: { parameters: ["pointer"], result: "pointer" },
  llama_model_n_embd: { parameters: ["pointer"], result: "i32" },
  llama_model_n_embd_out: { parameters: ["pointer"], result: "i32" },
  llama_model_n_ctx_train: { parameters: ["pointer"], result: "i32" },
  llama_model_n_layer: { parameters: ["pointer"], result: "i32" },
  llama_model_is_recurrent: { parameters: ["pointer"], result: "bool" },
  llama_model_is_hybrid: { parameters: ["pointer"], result: "bool" },
  llama_model_has_encoder: { parameters: ["pointer"], result: "bool" },
  llama_model_size: { parameters: ["pointer"], result: "u64" },
  llama_model_n_params: { parameters: ["pointer"], result: "u64" },
  llama_model_meta_val_str: { parameters: ["pointer", "buffer", "buffer", "usize"], result: "i32" },
  llama_model_chat_template: { parameters: ["pointer", "pointer"], result: "pointer" },
  llama_vocab_n_tokens: { parameters: ["pointer"], result: "i32" },
  llama_vocab_bos: { parameters: ["pointer"], result: "i32" },
  llama_vocab_eos: { parameters: ["pointer"], result: "i32" },
  llama_vocab_eot: { parameters: ["pointer"], result: "i32" },
  llama_vocab_fim_pre: { parameters: ["pointer"], result: "i32" },
  llama_vocab_fim_suf: { parameters: ["pointer"], result: "i32" },
  llama_vocab_fim_mid: { parameters: ["pointer"], result: "i32" },
  llama_vocab_is_eog: { parameters: ["pointer", "i32"], result: "bool" },
  llama_vocab_is_control: { parameters: ["pointer", "i32"], result: "bool" },
  llama_vocab_get_attr: { parameters: ["pointer", "i32"], result: "i32" },
  llama_vocab_get_add_bos: { parameters: ["pointer"], result: "bool" },
  llama_tokenize: {
    parameters: ["pointer", "buffer", "i32", "buffer", "i32", "bool", "bool"],
    result: "i32",
  },
  // The same on a thread of its own: llama.cpp tokenizes about 1-4 MB of text a second.
  llama_tokenize_nonblocking: {
    name: "llama_tokenize",
    parameters: ["pointer", "buffer", "i32", "buffer", "i32", "bool", "bool"],
    result: "i32",
    nonblocking: true,
  },
  llama_token_to_piece: { parameters: ["pointer", "i32", "buffer", "i32", "i32", "bool"], result: "i32" },
  llama_init_from_model: { parameters: ["pointer", contextParams], result: "pointer", nonblocking: true },
  llama_free: { parameters: ["pointer"], result: "void" },
  llama_n_ctx: { parameters: ["pointer"], result: "u32" },
  llama_n_ctx_seq: { parameters: ["pointer"], result: "u32" },
  llama_n_batch: { parameters: ["pointer"], result: "u32" },
  llama_n_ubatch: { parameters: ["pointer"], result: "u32" },
  llama_n_seq_max: { parameters: ["pointer"], result: "u32" },
  llama_pooling_type: { parameters: ["pointer"], result: "i32" },
  llama_get_memory: { parameters: ["pointer"], result: "pointer" },
  llama_memory_clear: { parameters: ["pointer", "bool"], result: "void" },
  llama_memory_seq_rm: { parameters: ["pointer", "i32", "i32", "i32"], result: "bool" },
  llama_memory_seq_cp: { parameters: ["pointer", "i32", "i32", "i32", "i32"], result: "void" },
  llama_memory_seq_pos_min: { parameters: ["pointer", "i32"], result: "i32" },
  llama_memory_seq_pos_max: { parameters: ["pointer", "i32"], result: "i32" },
  llama_state_seq_get_size_ext: { parameters: ["pointer", "i32", "u32"], result: "usize" },
  llama_state_seq_get_data_ext: {
    parameters: ["pointer", "buffer", "usize", "i32", "u32"],
    result: "usize",
    nonblocking: true,
  },
  // The same on the calling thread, for snapshots small enough not to be worth a hand-off (native.ts).
  llama_state_seq_get_data_ext_sync: {
    name: "llama_state_seq_get_data_ext",
    parameters: ["pointer", "buffer", "usize", "i32", "u32"],
    result: "usize",
  },
  llama_state_seq_set_data_ext: {
    parameters: ["pointer", "buffer", "usize", "i32", "u32"],
    result: "usize",
    nonblocking: true,
  },
  llama_batch_init: { parameters: ["i32", "i32", "i32"], result: batch },
  llama_batch_free: { parameters: [batch], result: "void" },
  llama_decode: { parameters: ["pointer", batch], result: "i32", nonblocking: true },
  // The same on the calling thread, for decodes too short to be worth a hand-off (see pace.ts).
  llama_decode_sync: { name: "llama_decode", parameters: ["pointer", batch], result: "i32" },
  llama_set_n_threads: { parameters: ["pointer", "i32", "i32"], result: "void" },
  llama_set_embeddings: { parameters: ["pointer", "bool"], result: "void" },
  llama_synchronize: { parameters: ["pointer"], result: "void" },
  llama_get_logits_ith: { parameters: ["pointer", "i32"], result: "pointer" },
  llama_get_logits: { parameters: ["pointer"], result: "pointer" },
  llama_get_embeddings_seq: { parameters: ["pointer", "i32"], result: "pointer" },
  llama_get_embeddings_ith: { parameters: ["pointer", "i32"], result: "pointer" },
  llama_sampler_init_grammar: { parameters: ["pointer", "buffer", "buffer"], result: "pointer" },
  llama_sampler_init_grammar_lazy_patterns: {
    parameters: ["pointer", "buffer", "buffer", "buffer", "usize", "buffer", "usize"],
    result: "pointer",
  },
  // The same two, parsed on a thread of their own: a large grammar takes tens of milliseconds to parse.
  llama_sampler_init_grammar_nonblocking: {
    name: "llama_sampler_init_grammar",
    parameters: ["pointer", "buffer", "buffer"],
    result: "pointer",
    nonblocking: true,
  },
  llama_sampler_init_grammar_lazy_patterns_nonblocking: {
    name: "llama_sampler_init_grammar_lazy_patterns",
    parameters: ["pointer", "buffer", "buffer", "buffer", "usize", "buffer", "usize"],
    result: "pointer",
    nonblocking: true,
  },
  llama_sampler_apply: { parameters: ["pointer", "buffer"], result: "void" },
  // Masking the whole vocabulary with a grammar takes 15-25 ms: on a thread of its own.
  llama_sampler_apply_nonblocking: {
    name: "llama_sampler_apply",
    parameters: ["pointer", "buffer"],
    result: "void",
    nonblocking: true,
  },
  llama_sampler_accept: { parameters: ["pointer", "i32"], result: "void" },
  // A grammar with many open alternatives takes milliseconds to seconds a token (grammar.ts).
  llama_sampler_accept_nonblocking: {
    name: "llama_sampler_accept",
    parameters: ["pointer", "i32"],
    result: "void",
    nonblocking: true,
  },
  llama_sampler_clone: { parameters: ["pointer"], result: "pointer" },
  llama_sampler_free: { parameters: ["pointer"], result: "void" },
  llama_attach_threadpool: { parameters: ["pointer", "pointer", "pointer"], result: "void" },
  llama_max_devices: { parameters: [], result: "usize" },
} as const satisfies Deno.ForeignLibraryInterface;

/** ggml's backend registry (libggml) and threadpool settings (libggml-base). */
const GGML_SYMBOLS = {
  ggml_backend_dev_by_type: { parameters: ["i32"], result: "pointer" },
  ggml_backend_dev_count: { parameters: [], result: "usize" },
  ggml_backend_dev_get: { parameters: ["usize"], result: "pointer" },
} as const satisfies Deno.ForeignLibraryInterface;
const GGML_BASE_SYMBOLS = {
  ggml_backend_dev_backend_reg: { parameters: ["pointer"], result: "pointer" },
  ggml_backend_reg_get_proc_address: { parameters: ["pointer", "buffer"], result: "pointer" },
  ggml_threadpool_params_init: { parameters: ["buffer", "i32"], result: "void" },
  ggml_backend_dev_name: { parameters: ["pointer"], result: "pointer" },
  ggml_backend_dev_description: { parameters: ["pointer"], result: "pointer" },
  ggml_backend_dev_type: { parameters: ["pointer"], result: "i32" },
  ggml_backend_dev_memory: { parameters: ["pointer", "buffer", "buffer"], result: "void" },
  ggml_backend_dev_buffer_type: { parameters: ["pointer"], result: "pointer" },
  ggml_backend_buft_name: { parameters: ["pointer"], result: "pointer" },
  ggml_log_get: { parameters: ["buffer", "buffer"], result: "void" },
} as const satisfies Deno.ForeignLibraryInterface;

/** `enum ggml_backend_dev_type`. */
const DEVICE_TYPES = ["CPU", "GPU", "IGPU", "ACCEL", "META"] as const;

/** A ggml backend device as llama.cpp sees it. */
export interface BackendDevice {
  /** `CPU`, `CUDA0`, `Vulkan0`, … */
  name: string;
  description: string;
  type: (typeof DEVICE_TYPES)[number] | "unknown";
  /** Bytes free and in all, as the backend reports them (0 when it cannot tell). */
  free: number;
  total: number;
  /** The device's default buffer type: what a tensor override to this device names. */
  bufferType: Deno.PointerObject;
  /** Its name (`CPU`, `CUDA0`, …): the `DEVICE` of `--override-tensor PATTERN=DEVICE`. */
  bufferTypeName: string;
}

/** The bound library. */
export type LlamaSymbols = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

let ggmlLibs:
  | {
    ggml: Deno.DynamicLibrary<typeof GGML_SYMBOLS>["symbols"];
    base: Deno.DynamicLibrary<typeof GGML_BASE_SYMBOLS>["symbols"];
  }
  | undefined;

/** libggml and libggml-base beside the loaded libllama (bound once). */
function ggmlLibraries(llamaPath: string): NonNullable<typeof ggmlLibs> {
  if (ggmlLibs) return ggmlLibs;
  const dir = llamaPath.replace(/\/[^/]+$/, "");
  const ggmlName = [...Deno.readDirSync(dir)].map((e) => e.name).find((n) =>
    /^libggml(\.v[\d.]+)?\.so$/.test(n)
  );
  if (!ggmlName) throw new Error(`libggml is not beside '${llamaPath}'`);
  ggmlLibs = {
    ggml: Deno.dlopen(`${dir}/${ggmlName}`, GGML_SYMBOLS).symbols,
    base: Deno.dlopen(`${dir}/libggml-base.so`, GGML_BASE_SYMBOLS).symbols,
  };
  return ggmlLibs;
}

/**
 * The backend devices the loaded llama.cpp build has (the CPU, and each GPU of a CUDA or Vulkan
 * build), with their memory as the backends report it.
 *
 * @example
 * ```ts
 * // After node-llama-cpp's getLlama() has loaded the library:
 * const gpus = () => backendDevices(openLlamaLibrary()).filter((d) => d.type === "GPU");
 * ```
 */
export function backendDevices(lib: LlamaLibrary): BackendDevice[] {
  const { ggml, base } = ggmlLibraries(lib.path);
  const out: BackendDevice[] = [];
  const count = Number(ggml.ggml_backend_dev_count());
  for (let i = 0; i < count; i++) {
    const dev = ggml.ggml_backend_dev_get(BigInt(i));
    if (!dev) continue;
    const free = new BigUint64Array(1);
    const total = new BigUint64Array(1);
    base.ggml_backend_dev_memory(dev, free, total);
    const buft = base.ggml_backend_dev_buffer_type(dev);
    if (!buft) continue;
    out.push({
      name: readCString(base.ggml_backend_dev_name(dev)),
      description: readCString(base.ggml_backend_dev_description(dev)),
      type: DEVICE_TYPES[base.ggml_backend_dev_type(dev)] ?? "unknown",
      free: Number(free[0]),
      total: Number(total[0]),
      bufferType: buft,
      bufferTypeName: readCString(base.ggml_backend_buft_name(buft)),
    });
  }
  return out;
}

/** `GGML_LOG_LEVEL_ERROR`: a level no log filter drops. */
const GGML_LOG_LEVEL_ERROR = 4;

/**
 * Hands `text` to the log callback llama.cpp and ggml now use (node-llama-cpp's), as if llama.cpp
 * had logged it; false when no callback is set. That callback queues every line for the JavaScript
 * thread in the order it was called, from whichever thread logged: once a mark written after an
 * operation arrives, every line the operation logged has arrived (a load logs from a worker thread,
 * and its lines can still be queued when the load's promise settles).
 *
 * @example
 * ```ts
 * function mark(lib: LlamaLibrary): boolean {
 *   return writeLogMark(lib, "vserve-log-mark 1");
 * }
 * ```
 */
export function writeLogMark(lib: LlamaLibrary, text: string): boolean {
  const { base } = ggmlLibraries(lib.path);
  const fn = new BigUint64Array(1);
  const data = new BigUint64Array(1);
  base.ggml_log_get(fn, data);
  const callback = Deno.UnsafePointer.create(fn[0]);
  if (!callback) return false;
  const call = new Deno.UnsafeFnPointer(callback as Deno.PointerObject<never>, {
    parameters: ["i32", "buffer", "pointer"],
    result: "void",
  });
  call.call(GGML_LOG_LEVEL_ERROR, cString(`${text}\n`), Deno.UnsafePointer.create(data[0]));
  return true;
}

/** A bound libllama and where it came from. */
export interface LlamaLibrary {
  path: string;
  symbols: LlamaSymbols;
  /** A persistent CPU thread pool of `threads` workers, shared by every context (see below). */
  threadpool(threads: number): Deno.PointerValue;
  /**
   * Puts the pools' workers to sleep when no compute is running or queued. Engines call it when
   * their loop runs out of work: after a decode the workers otherwise spin for new work (ggml's
   * polling, ~100 ms of a core on this Xeon), taking a core from the HTTP side and from other
   * processes while the server is idle. The next decode wakes them.
   */
  idle(): void;
}

let opened: LlamaLibrary | undefined;

/**
 * Binds the libllama that node-llama-cpp loaded into this process (call after `getLlama()`).
 *
 * @example
 * ```ts
 * import { llamaRuntime } from "./runtime.ts";
 * import type { Logger } from "../../log.ts";
 * async function bind(log: Logger) {
 *   await llamaRuntime("cpu", log);
 *   return openLlamaLibrary();
 * }
 * ```
 */
export function openLlamaLibrary(): LlamaLibrary {
  if (opened) return opened;
  const path = loadedLibraryPath();
  const lib = Deno.dlopen(path, SYMBOLS);
  const pools = new Map<number, Deno.PointerValue>();
  let pause: ((pool: Deno.PointerValue) => void) | undefined;
  opened = {
    path,
    symbols: lib.symbols,
    threadpool: (threads) => {
      if (!pools.has(threads)) {
        pools.set(threads, createThreadpool(path, threads));
        // Its workers start now: below the JavaScript thread at once (compute_priority.ts).
        noticeThreads();
      }
      return pools.get(threads)!;
    },
    idle: () => {
      if (inFlight > 0 || pools.size === 0) return;
      pause ??= threadpoolPause() ?? (() => {});
      for (const pool of pools.values()) if (pool) pause(pool);
    },
  };
  checkLayouts(opened.symbols);
  return opened;
}

/** `sizeof(struct ggml_threadpool_params)`: bool cpumask[512], n_threads, prio, poll, two bools. */
const THREADPOOL_PARAMS_BYTES = 528;

/**
 * A persistent ggml CPU thread pool (as llama-server attaches one): without it every decode starts
 * and joins its worker threads, which costs milliseconds per decode. Null when the CPU backend does
 * not export the pool functions (then llama.cpp falls back to per-decode threads).
 */
function createThreadpool(llamaPath: string, threads: number): Deno.PointerValue {
  try {
    const dir = llamaPath.replace(/\/[^/]+$/, "");
    const ggmlName = [...Deno.readDirSync(dir)].map((e) => e.name).find((n) =>
      /^libggml(\.v[\d.]+)?\.so$/.test(n)
    );
    if (!ggmlName) return null;
    const ggml = Deno.dlopen(`${dir}/${ggmlName}`, GGML_SYMBOLS).symbols;
    const base = Deno.dlopen(`${dir}/libggml-base.so`, GGML_BASE_SYMBOLS).symbols;
    const cpu = ggml.ggml_backend_dev_by_type(0);
    if (!cpu) return null;
    const reg = base.ggml_backend_dev_backend_reg(cpu);
    const fn = reg && base.ggml_backend_reg_get_proc_address(reg, cString("ggml_threadpool_new"));
    if (!fn) return null;
    const create = new Deno.UnsafeFnPointer(fn as Deno.PointerObject<never>, {
      parameters: ["buffer"],
      result: "pointer",
    });
    const params = new Uint8Array(new ArrayBuffer(THREADPOOL_PARAMS_BYTES));
    base.ggml_threadpool_params_init(params, threads);
    return create.call(params);
  } catch {
    return null;
  }
}

/**
 * `ggml_threadpool_pause` of the CPU backend variant ggml loaded (`libggml-cpu-<variant>.so`, or
 * `libggml-cpu.so`), which exports it; undefined when it cannot be found.
 */
function threadpoolPause(): ((pool: Deno.PointerValue) => void) | undefined {
  try {
    const path = mappedLibraries().find((p) => /\/libggml-cpu(-[\w]+)?\.so$/.test(p));
    if (!path) return undefined;
    const cpu = Deno.dlopen(path, { ggml_threadpool_pause: { parameters: ["pointer"], result: "void" } });
    return (pool) => cpu.symbols.ggml_threadpool_pause(pool);
  } catch {
    return undefined;
  }
}

let computing: Promise<unknown> = Promise.resolve();
/** Compute calls queued or running in {@link serialized}. */
let inFlight = 0;

/**
 * Runs native compute work one at a time in this process. Every context shares one thread pool
 * sized to the cores: two decodes at once (chat and embeddings, say) would oversubscribe the cores,
 * and llama.cpp's spinning workers then slow down many times over. Serialized, each decode gets
 * every core.
 *
 * @example
 * ```ts
 * async function decode(lib: LlamaLibrary, ctx: Deno.PointerValue, batch: Uint8Array<ArrayBuffer>) {
 *   return await serialized(() => lib.symbols.llama_decode(ctx, batch));
 * }
 * ```
 */
export function serialized<T>(work: () => Promise<T>): Promise<T> {
  inFlight++;
  const start = () => {
    const running = work();
    // A hand-off may have started a new blocking-pool thread: below the JavaScript thread at once.
    noticeThreads();
    return running;
  };
  const run = computing.then(start, start).finally(() => inFlight--);
  computing = run.catch(() => {});
  return run;
}

/**
 * Runs `work` (synchronous native compute) at once on this thread if no compute is queued or running
 * in {@link serialized}, so the order and exclusion it keeps hold; undefined when something is.
 *
 * @example
 * ```ts
 * function decodeHere(lib: LlamaLibrary, ctx: Deno.PointerValue, batch: Uint8Array<ArrayBuffer>) {
 *   return computeNow(() => lib.symbols.llama_decode_sync(ctx, batch)); // undefined: compute is queued
 * }
 * ```
 */
export function computeNow<T>(work: () => T): { result: T } | undefined {
  if (inFlight > 0) return undefined;
  inFlight++;
  try {
    return { result: work() };
  } finally {
    inFlight--;
  }
}

/** The paths of the files mapped into this process (Linux). */
function mappedLibraries(): string[] {
  return Deno.readTextFileSync("/proc/self/maps").split("\n")
    .map((line) => line.trim().split(/\s+/).slice(5).join(" "));
}

/** The path of the libllama mapped into this process by node-llama-cpp's addon. */
function loadedLibraryPath(): string {
  let maps: string[];
  try {
    maps = mappedLibraries();
  } catch {
    throw new Error("cannot find node-llama-cpp's libllama: /proc/self/maps is not readable (Linux only)");
  }
  const path = maps.find((p) => /\/libllama(\.v[\d.]+(\.\w+)?)?\.so$/.test(p));
  if (!path) throw new Error("node-llama-cpp's libllama is not loaded; call getLlama() first");
  return path;
}

/**
 * Verifies the struct layouts against the library's own defaults, so a different llama.cpp
 * build fails loudly at start instead of corrupting memory.
 */
function checkLayouts(s: LlamaSymbols): void {
  const modelBytes = s.llama_model_default_params();
  const model = new DataView(modelBytes.buffer);
  const ctx = s.llama_context_default_params();
  const view = new DataView(ctx.buffer);
  const ok = model.byteLength === MODEL_PARAMS.size && model.getInt32(MODEL_PARAMS.nGpuLayers, true) === -1 &&
    modelBytes[MODEL_PARAMS.vocabOnly] === 0 && modelBytes[MODEL_PARAMS.useExtraBufts] === 1 &&
    model.getInt32(MODEL_PARAMS.splitMode, true) === SPLIT_MODE.layer &&
    model.getInt32(MODEL_PARAMS.loadMode, true) === -1 && model.getInt32(MODEL_PARAMS.mainGpu, true) === 0 &&
    model.getBigUint64(MODEL_PARAMS.tensorBuftOverrides, true) === 0n &&
    model.getBigUint64(MODEL_PARAMS.tensorSplit, true) === 0n && modelBytes[MODEL_PARAMS.noAlloc] === 0 &&
    Number(s.llama_max_devices()) >= 1 &&
    ctx.byteLength === CONTEXT_PARAMS.size && view.getUint32(CONTEXT_PARAMS.nCtx, true) === 512 &&
    view.getUint32(CONTEXT_PARAMS.nBatch, true) === 2048 &&
    view.getUint32(CONTEXT_PARAMS.nSeqMax, true) === 1 &&
    view.getInt32(CONTEXT_PARAMS.poolingType, true) === POOLING.unspecified &&
    view.getInt32(CONTEXT_PARAMS.flashAttnType, true) === -1 && ctx[CONTEXT_PARAMS.offloadKqv] === 1;
  if (!ok) {
    throw new Error(
      "the llama.cpp library does not have the struct layout this server was built for " +
        "(node-llama-cpp must be 3.21.1)",
    );
  }
}

const encoder = new TextEncoder();

/** A NUL-terminated UTF-8 copy of `text` for `const char *` parameters. */
export function cString(text: string): Uint8Array<ArrayBuffer> {
  const bytes = encoder.encode(text);
  const out = new Uint8Array(new ArrayBuffer(bytes.length + 1));
  out.set(bytes);
  return out;
}

/** Reads a NUL-terminated string at `ptr` (empty for null). */
export function readCString(ptr: Deno.PointerValue): string {
  return ptr ? Deno.UnsafePointerView.getCString(ptr) : "";
}

/** A typed-array view of `count` elements of native memory at `ptr`. */
export function nativeView<T extends Int32Array | Float32Array | Int8Array | BigUint64Array>(
  kind: { new (buffer: ArrayBuffer): T; BYTES_PER_ELEMENT: number },
  ptr: Deno.PointerValue,
  count: number,
): T {
  if (!ptr) throw new Error("null pointer from llama.cpp");
  return new kind(Deno.UnsafePointerView.getArrayBuffer(ptr, count * kind.BYTES_PER_ELEMENT));
}
