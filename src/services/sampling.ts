/** The sampling fields that chat and legacy completions requests share, mapped to the engine's settings. */
import type { SamplingOptions } from "../engines/types.ts";

/** The wire fields both request kinds carry (null: not given). */
export interface SamplingFields {
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  seed?: number | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  repeat_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
}

/**
 * The engine's sampling settings for a request: fields not given stay unset (the engine's defaults),
 * logit-bias keys become token ids.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * assert.deepEqual(samplingOptions({ top_p: 0.9, logit_bias: { "42": -100 } }).logitBias, { 42: -100 });
 * ```
 */
export function samplingOptions(req: SamplingFields): SamplingOptions {
  return {
    temperature: req.temperature ?? undefined,
    topP: req.top_p ?? undefined,
    topK: req.top_k ?? undefined,
    minP: req.min_p ?? undefined,
    seed: req.seed ?? undefined,
    presencePenalty: req.presence_penalty ?? undefined,
    frequencyPenalty: req.frequency_penalty ?? undefined,
    repeatPenalty: req.repeat_penalty ?? undefined,
    logitBias: req.logit_bias
      ? Object.fromEntries(Object.entries(req.logit_bias).map(([k, v]) => [Number(k), v]))
      : undefined,
  };
}
