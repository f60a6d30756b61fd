/**
 * `/v1/embeddings` for an engine that reads the entries itself (a model served by upstreams):
 * the same contract as local models — entry limits, `dimensions` from `minDims` to the native size
 * (truncate, then renormalise), unit-length vectors, `float` or `base64` — with tokenization and
 * token limits left to the upstream.
 */
import { badRequest } from "../http/errors.ts";
import type { EmbeddingsRequest } from "../protocol/embeddings.ts";
import type { EmbeddingEngine } from "../engines/types.ts";
import {
  checkDimensions,
  type EmbeddingLimits,
  type EmbeddingsBody,
  embeddingsResponse,
  queryEntries,
} from "./embeddings.ts";

/**
 * Answers one embeddings request with an engine that reads the entries itself.
 *
 * @example
 * ```ts
 * import type { EmbeddingsRequest } from "../protocol/embeddings.ts";
 * import type { EmbeddingEngine } from "../engines/types.ts";
 * import { createEmbeddings, type EmbeddingLimits } from "./embeddings.ts";
 * async function embed(body: EmbeddingsRequest, engine: EmbeddingEngine, limits: EmbeddingLimits, signal: AbortSignal) {
 *   return await (engine.embedEntries ? createEntryEmbeddings : createEmbeddings)(body, engine, limits, signal);
 * }
 * ```
 */
export async function createEntryEmbeddings(
  req: EmbeddingsRequest,
  engine: EmbeddingEngine,
  limits: EmbeddingLimits,
  signal?: AbortSignal,
  requestId?: string,
): Promise<EmbeddingsBody> {
  if (!engine.embedEntries) {
    throw new Error("createEntryEmbeddings needs an engine that reads entries itself");
  }
  const entries = checkEntries(queryEntries(req, limits).input, limits.maxEntries);
  // The native size is known from the registry or an earlier answer; else checked after this one.
  if (engine.nativeDims > 0) checkDimensions(req.dimensions, engine.nativeDims, limits);
  const { vectors, promptTokens } = await engine.embedEntries(entries, {
    truncate: req.truncate === true,
    signal,
    requestId,
  });
  const dims = checkDimensions(req.dimensions, vectors[0].length, limits);
  return await embeddingsResponse(req, vectors, dims, promptTokens, signal);
}

/** The entries of `input` with the checks that need no tokenizer (count, empty entries). */
function checkEntries(input: EmbeddingsRequest["input"], maxEntries: number): (string | number[])[] {
  const single = typeof input === "string" || (input.length > 0 && typeof input[0] === "number");
  const entries = single ? [input as string | number[]] : input as (string | number[])[];
  if (entries.length === 0) throw badRequest("input must not be an empty array.", "input", "invalid_value");
  if (entries.length > maxEntries) {
    throw badRequest(
      `input has ${entries.length} entries; at most ${maxEntries} are allowed per request.`,
      "input",
      "too_many_inputs",
    );
  }
  entries.forEach((e, i) => {
    const param = single ? "input" : `input[${i}]`;
    if (e.length === 0) {
      throw badRequest(
        `${param} is ${
          typeof e === "string" ? "an empty string" : "an empty token array"
        }; every entry needs text.`,
        param,
        "invalid_value",
      );
    }
  });
  return entries;
}
