/** The OpenAI semantics of `/v1/embeddings`: entries, limits, dimensions, encodings, usage. */
import { badRequest } from "../http/errors.ts";
import type { EmbeddingsRequest, EmbeddingsResponse } from "../protocol/embeddings.ts";
import type { EmbeddingEngine } from "../engines/types.ts";
import { float32ToBase64, type JsonFloats, truncateAndNormalize } from "../vectors.ts";
import { Slicer } from "../event_loop.ts";

/** Limits that come from the registry entry and the server settings. */
export interface EmbeddingLimits {
  maxInputTokens: number;
  maxEntries: number;
  matryoshka: boolean;
  /** Charges the request's tokens to the model's work budget (429 when over); returns the release. */
  admitTokens?: (tokens: number) => () => void;
  minDims: number;
  /** The model's default query task and format (see {@link queryEntries}). */
  queryInstruction?: string;
  queryFormat?: string;
}

/** Qwen3-Embedding's query format, for models whose registry entry names none. */
export const DEFAULT_QUERY_FORMAT = "Instruct: {instruction}\nQuery:{text}";

/**
 * The request with its query entries formatted: `input_type: "query"` puts each text entry in the
 * model's query format with `instruction` (or the model's default task). A model without a default
 * embeds queries as sent unless the request names an instruction. Documents are untouched.
 *
 * @example
 * ```ts
 * queryEntries({ model: "m", input: "x", input_type: "query" }, { queryInstruction: "Find" }).input;
 * // "Instruct: Find\nQuery:x"
 * ```
 */
export function queryEntries(
  req: EmbeddingsRequest,
  limits: Pick<EmbeddingLimits, "queryInstruction" | "queryFormat">,
): EmbeddingsRequest {
  if (req.instruction != null && req.input_type !== "query") {
    throw badRequest(
      "instruction applies to queries: send it with input_type 'query'.",
      "instruction",
      "invalid_value",
    );
  }
  if (req.input_type !== "query") return req;
  const instruction = req.instruction ?? limits.queryInstruction;
  if (instruction === undefined) return req;
  const input = req.input;
  const tokenIds = typeof input !== "string" && input.length > 0 && typeof input[0] !== "string";
  if (tokenIds) {
    throw badRequest(
      "input_type 'query' formats text; token-id input is embedded as given: format the query before tokenizing it, or leave input_type out.",
      "input_type",
      "invalid_value",
    );
  }
  const format = limits.queryFormat ?? DEFAULT_QUERY_FORMAT;
  // One pass over the template, so that braces inside the instruction or the text stay literal.
  const apply = (text: string) =>
    format.replace(/\{(instruction|text)\}/g, (_, k: string) => (k === "text" ? text : instruction));
  return {
    ...req,
    input: typeof input === "string"
      ? (input === "" ? input : apply(input))
      : (input as string[]).map((t) => (t === "" ? t : apply(t))),
  };
}

/**
 * Answers one embeddings request with `engine`.
 *
 * @example
 * ```ts
 * import type { EmbeddingEngine } from "../engines/types.ts";
 * async function embed(engine: EmbeddingEngine, limits: EmbeddingLimits) {
 *   return await createEmbeddings({ model: "m", input: "hi" }, engine, limits);
 * }
 * ```
 */
export async function createEmbeddings(
  req: EmbeddingsRequest,
  engine: EmbeddingEngine,
  limits: EmbeddingLimits,
  signal?: AbortSignal,
): Promise<EmbeddingsBody> {
  const dims = checkDimensions(req.dimensions, engine.nativeDims, limits);
  const sequences = await tokenizeEntries(queryEntries(req, limits), engine, limits, signal);
  const promptTokens = sequences.reduce((n, s) => n + s.length, 0);
  const release = limits.admitTokens?.(promptTokens);
  let vectors: Float32Array[];
  try {
    vectors = await engine.embed(sequences, signal);
  } finally {
    release?.();
  }
  return await embeddingsResponse(req, vectors, dims, promptTokens, signal);
}

/**
 * An embeddings response as built: its vectors stay float32 until they are written (each serialises
 * as the array of numbers of {@link EmbeddingsResponse}: see {@link JsonFloats}).
 */
export type EmbeddingsBody = Omit<EmbeddingsResponse, "data"> & {
  data: { object: "embedding"; index: number; embedding: JsonFloats | string }[];
};

/**
 * The response body: each vector cut to `dims` and renormalised, in the requested encoding. Built
 * in slices of a few milliseconds (2,000 vectors of 4,096 floats take 0.3 s), the event loop running
 * between them.
 */
export async function embeddingsResponse(
  req: EmbeddingsRequest,
  vectors: Float32Array[],
  dims: number,
  promptTokens: number,
  signal?: AbortSignal,
): Promise<EmbeddingsBody> {
  const base64 = req.encoding_format === "base64";
  const slices = new Slicer(10, signal);
  const data: EmbeddingsBody["data"] = [];
  for (const [index, v] of vectors.entries()) {
    if (slices.due) await slices.pause();
    const unit = truncateAndNormalize(v, dims);
    data.push({ object: "embedding", index, embedding: base64 ? float32ToBase64(unit) : unit });
  }
  return {
    object: "list",
    model: req.model,
    data,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
  };
}

/** `dimensions` against the native size: the size to return, or 400. */
export function checkDimensions(
  dimensions: number | null | undefined,
  native: number,
  limits: EmbeddingLimits,
): number {
  if (dimensions === undefined || dimensions === null) return native;
  if (!limits.matryoshka) {
    if (dimensions === native) return native;
    throw badRequest(
      `This model does not support 'dimensions' other than its native ${native}.`,
      "dimensions",
      "invalid_value",
    );
  }
  const min = Math.min(limits.minDims, native);
  if (dimensions < min || dimensions > native) {
    throw badRequest(
      `dimensions must be an integer from ${min} to ${native} inclusive; got ${dimensions}.`,
      "dimensions",
      "invalid_value",
    );
  }
  return dimensions;
}

/** The entries as token sequences the model will process, with every limit checked. */
async function tokenizeEntries(
  req: EmbeddingsRequest,
  engine: EmbeddingEngine,
  limits: EmbeddingLimits,
  signal?: AbortSignal,
): Promise<number[][]> {
  const input = req.input;
  let entries: (string | number[])[];
  if (typeof input === "string") entries = [input];
  else if (input.length > 0 && typeof input[0] === "number") entries = [input as number[]];
  else entries = input as (string | number[])[];
  const single = typeof input === "string" || (input.length > 0 && typeof input[0] === "number");
  if (entries.length === 0) throw badRequest("input must not be an empty array.", "input", "invalid_value");
  if (entries.length > limits.maxEntries) {
    throw badRequest(
      `input has ${entries.length} entries; at most ${limits.maxEntries} are allowed per request.`,
      "input",
      "too_many_inputs",
    );
  }
  const out: number[][] = [];
  // llama.cpp's tokenizer runs on this thread (2,000 texts of 1,090 tokens: 1.6 s in one block), in
  // slices; the ONNX models' runs on a worker, many texts a message (one at a time, 2,048 short
  // texts took 330-420 ms instead of 86-91).
  const limit = req.truncate ? undefined : limits.maxInputTokens;
  const ahead = engine.tokenizeMany
    ? new Lookahead(entries, engine.tokenizeMany.bind(engine), limit)
    : undefined;
  const slices = new Slicer(10, signal);
  for (let i = 0; i < entries.length; i++) {
    if (slices.due) await slices.pause();
    const entry = entries[i];
    const param = single ? "input" : `input[${i}]`;
    let ids: number[];
    if (typeof entry === "string") {
      if (entry === "") {
        throw badRequest(`${param} is an empty string; every entry needs text.`, param, "invalid_value");
      }
      // (Past the limit, tokens are only wanted to cut the entry to it.)
      ids = ahead ? await ahead.ids(i) : await engine.tokenize(entry, limit);
    } else {
      if (entry.length === 0) throw badRequest(`${param} is an empty token array.`, param, "invalid_value");
      const bad = entry.findIndex((t) => t >= engine.vocabSize);
      if (bad >= 0) {
        throw badRequest(
          `${param} holds token id ${entry[bad]} at position ${bad}; this model's vocabulary has ids 0..${
            engine.vocabSize - 1
          }.`,
          param,
          "invalid_value",
        );
      }
      ids = engine.completeTokens(entry);
    }
    if (ids.length > limits.maxInputTokens) {
      if (!req.truncate) {
        throw badRequest(
          `Entry ${i} of input has more than ${limits.maxInputTokens} tokens; this model accepts at most ` +
            `${limits.maxInputTokens} ` +
            `per entry. Shorten it, or send "truncate": true to cut it to the limit.`,
          "input",
          "context_length_exceeded",
        );
      }
      // Keep the end-of-text token that last-token pooling reads.
      ids = [...ids.slice(0, limits.maxInputTokens - 1), ids[ids.length - 1]];
    }
    out.push(ids);
  }
  return out;
}

/**
 * The ids of string entries, tokenized a batch ahead: from the entry asked for, up to
 * {@link LOOKAHEAD_ENTRIES} entries or {@link LOOKAHEAD_CHARS} characters in one call (other
 * entries go as empty strings).
 */
class Lookahead {
  #from = 0;
  #ids: number[][] = [];

  constructor(
    readonly entries: readonly (string | number[])[],
    readonly tokenizeMany: (texts: readonly string[], limit?: number) => Promise<number[][]>,
    readonly limit: number | undefined,
  ) {}

  async ids(i: number): Promise<number[]> {
    if (i < this.#from || i >= this.#from + this.#ids.length) {
      const texts: string[] = [];
      let chars = 0;
      for (let k = i; k < this.entries.length && texts.length < LOOKAHEAD_ENTRIES; k++) {
        const entry = this.entries[k];
        const text = typeof entry === "string" ? entry : "";
        if (texts.length > 0 && chars + text.length > LOOKAHEAD_CHARS) break;
        texts.push(text);
        chars += text.length;
      }
      this.#from = i;
      this.#ids = await this.tokenizeMany(texts, this.limit);
    }
    return this.#ids[i - this.#from];
  }
}

/** Most entries in one {@link Lookahead} batch. */
const LOOKAHEAD_ENTRIES = 256;
/** Most characters in one {@link Lookahead} batch (beyond its first entry). */
const LOOKAHEAD_CHARS = 1 << 20;
