/** Wire pieces shared by several endpoints. */
import { z } from "zod";

/** `usage` of embeddings responses. */
export const EmbeddingUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
});

/** `usage` of chat completions, with the details cost and observability tools read. */
export const CompletionUsageSchema = z.object({
  prompt_tokens: z.number().int().min(0),
  completion_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
  /** Prompt tokens served from an earlier request's state instead of being recomputed. */
  prompt_tokens_details: z.object({ cached_tokens: z.number().int().min(0) }).optional(),
  /** Completion tokens spent on reasoning (`reasoning_content`). */
  completion_tokens_details: z.object({ reasoning_tokens: z.number().int().min(0) }).optional(),
});
export type CompletionUsage = z.infer<typeof CompletionUsageSchema>;

/** The model `id` field, named in every request. */
export const ModelIdSchema = z.string({ error: "model must be a string naming a served model" })
  .min(1, "model must not be empty");

/**
 * Most messages (or input items) one request may hold on any chat-shaped API: far more than any
 * context takes (4 tokens a message at least), and checked before the messages themselves
 * (validating 100,000 of them took 130 ms).
 */
export const MAX_MESSAGES = 16_384;

/**
 * A schema checked by one loop over `value` (`check` returns the first fault: a message and the
 * path under the value, or undefined), documented as `jsonSchema`. For the large arrays and maps a
 * body may carry: zod's own per-item parse costs ~75 ms per million token ids, and a union that
 * tries another kind of array first collects an issue per item (1.1 million ids: 1-3 s).
 */
function looped<T>(
  check: (value: unknown) => { message: string; path?: (string | number)[] } | undefined,
  jsonSchema: Record<string, unknown>,
) {
  return z.custom<T>().check((ctx) => {
    const fault = check(ctx.value);
    if (fault) {
      ctx.issues.push({ code: "custom", message: fault.message, input: ctx.value, path: fault.path });
    }
  }).meta(jsonSchema);
}

function isDigits(text: string): boolean {
  if (text === "") return false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 48 || c > 57) return false;
  }
  return true;
}

const isTokenId = (x: unknown) => typeof x === "number" && Number.isInteger(x) && x >= 0;
const TOKEN_ID_JSON = { type: "integer", minimum: 0 };

/** The first fault of `value` as an array of at least `min` token ids. */
function tokenIdsFault(value: unknown, min: number) {
  if (!Array.isArray(value)) return { message: "expected an array of token ids" };
  if (value.length < min) return { message: `expected at least ${min} token id` };
  for (let i = 0; i < value.length; i++) {
    if (!isTokenId(value[i])) return { message: "a token id is an integer from 0", path: [i] };
  }
  return undefined;
}

/** An array of token ids (integers from 0); `min`: fewest ids. */
export function tokenIdsSchema(min = 0) {
  return looped<number[]>(
    (v) => tokenIdsFault(v, min),
    { type: "array", items: TOKEN_ID_JSON, ...(min > 0 ? { minItems: min } : {}) },
  );
}

/** An array of token-id arrays; `min`: fewest arrays and fewest ids in each. */
export function tokenIdListsSchema(min = 0) {
  return looped<number[][]>((v) => {
    if (!Array.isArray(v)) return { message: "expected an array of token-id arrays" };
    if (v.length < min) return { message: `expected at least ${min} token-id array` };
    for (let i = 0; i < v.length; i++) {
      const fault = tokenIdsFault(v[i], min);
      if (fault) return { message: fault.message, path: [i, ...(fault.path ?? [])] };
    }
    return undefined;
  }, {
    type: "array",
    items: { type: "array", items: TOKEN_ID_JSON, ...(min > 0 ? { minItems: min } : {}) },
    ...(min > 0 ? { minItems: min } : {}),
  });
}

/** An array of strings; `min`: fewest strings. */
export function stringsSchema(min = 0) {
  return looped<string[]>((v) => {
    if (!Array.isArray(v)) return { message: "expected an array of strings" };
    if (v.length < min) return { message: `expected at least ${min} string` };
    for (let i = 0; i < v.length; i++) {
      if (typeof v[i] !== "string") return { message: "expected a string", path: [i] };
    }
    return undefined;
  }, { type: "array", items: { type: "string" }, ...(min > 0 ? { minItems: min } : {}) });
}

/**
 * Most `logit_bias` entries (OpenAI takes 300): a vocabulary's worth of them (151,669) took 400 ms
 * of the event loop to check and convert.
 */
export const MAX_LOGIT_BIAS = 65_536;

/** `logit_bias`: token id (a string of digits) → a bias from -100 to 100. */
export const LogitBiasSchema = looped<Record<string, number>>((v) => {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    return { message: "logit_bias must be an object mapping token ids to biases" };
  }
  let entries = 0;
  for (const key in v) {
    if (!Object.hasOwn(v, key)) continue;
    if (++entries > MAX_LOGIT_BIAS) {
      return { message: `logit_bias holds more than ${MAX_LOGIT_BIAS} entries` };
    }
    if (!isDigits(key)) return { message: "logit_bias keys are token ids", path: [key] };
    const bias = (v as Record<string, unknown>)[key];
    if (typeof bias !== "number" || !(bias >= -100 && bias <= 100)) {
      return { message: "a bias is a number from -100 to 100", path: [key] };
    }
  }
  return undefined;
}, {
  type: "object",
  maxProperties: MAX_LOGIT_BIAS,
  propertyNames: { pattern: "^\\d+$" },
  additionalProperties: { type: "number", minimum: -100, maximum: 100 },
});
