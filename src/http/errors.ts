/**
 * The one place where failures become HTTP: every {@link ApiError} maps to one status and one
 * OpenAI error body `{"error":{"message","type","param","code"}}`.
 */
import type { z } from "zod";
import { Slicer } from "../event_loop.ts";
import { isSmallJson, jsonPieces } from "./json_writer.ts";
import type { ApiErrorType, ErrorBody } from "../protocol/ops.ts";
import type { EngineUpstreamError } from "../engines/types.ts";

export type { ApiErrorType, ErrorBody };

/**
 * A failure whose cause is known: it carries everything the client is told.
 *
 * @example
 * ```ts
 * const e = new ApiError(400, "invalid_request_error", "dimensions must be 32..4096", "dimensions");
 * e.toBody(); // { error: { message: "dimensions must be 32..4096", type: "invalid_request_error", param: "dimensions", code: null } }
 * ```
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly type: ApiErrorType,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "ApiError";
  }

  /** The JSON body the client receives. */
  toBody(): ErrorBody {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** The API error for a remote engine's refusal or failure: the status, type, param, code and headers it carries. */
export function fromUpstreamError(e: EngineUpstreamError): ApiError {
  return new ApiError(e.status, e.type, e.message, e.param, e.code, e.headers);
}

/** 400 invalid_request_error, the most common fault. */
export function badRequest(message: string, param: string | null = null, code: string | null = null) {
  return new ApiError(400, "invalid_request_error", message, param, code);
}

/** 404 for a model id that the registry does not know. */
export function modelNotFound(model: string): ApiError {
  return new ApiError(
    404,
    "invalid_request_error",
    `The model '${
      model.length <= 256 ? model : `${model.slice(0, 256)}…`
    }' does not exist. GET /v1/models lists the models this server serves.`,
    "model",
    "model_not_found",
  );
}

/** A JSON path such as `messages[2].content[0].text`, as OpenAI reports `param`. */
export function formatPath(path: readonly PropertyKey[]): string | null {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out === "" ? null : out;
}

/**
 * Turns the first zod issue into a 400 that names the offending field.
 *
 * @example
 * ```ts
 * import { z } from "zod";
 * const r = z.object({ dimensions: z.number() }).safeParse({ dimensions: "32" });
 * if (!r.success) fromZodError(r.error).param; // "dimensions"
 * ```
 */
export function fromZodError(error: z.ZodError): ApiError {
  const issue = error.issues[0];
  const param = formatPath(issue.path);
  const where = param ?? "the request body";
  return badRequest(`Invalid value for '${where}': ${humanMessage(issue)}`, param, "invalid_value");
}

function humanMessage(issue: z.core.$ZodIssue): string {
  const text = issue.message.replace(/^Invalid input: /, "");
  if (issue.code === "invalid_type" && text.endsWith("received undefined")) {
    return `this field is required (${text.replace(/, received undefined$/, "")}).`;
  }
  return text.endsWith(".") ? text : `${text}.`;
}

/** A JSON response with the given status (used for bodies and errors alike). */
export function jsonResponse(
  body: unknown,
  status = 200,
  headers: Record<string, string> = {},
): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

/**
 * A JSON response for `body` however large: at most a few thousand values are one `JSON.stringify`
 * here; a larger body is written a slice at a time (about `sliceMs` of work each, with a timer turn
 * between slices; see json_writer.ts), so that it never holds the event loop (2,000 vectors of 4,096
 * floats: 175 MB of JSON, 0.6 s of `JSON.stringify`). The text is that of `JSON.stringify(body)`.
 *
 * @example
 * ```ts
 * const items = Array.from({ length: 100_000 }, (_, i) => ({ index: i }));
 * const res = jsonBody({ object: "list", data: items, model: "m" });
 * await res.text(); // the text of JSON.stringify, written a slice at a time
 * ```
 */
export function jsonBody(
  body: unknown,
  opts: { status?: number; headers?: Record<string, string>; signal?: AbortSignal; sliceMs?: number } = {},
): Response {
  if (isSmallJson(body, SMALL_BODY)) return jsonResponse(body, opts.status, opts.headers);
  return slicedJsonResponse(body, opts);
}

/** Characters of JSON text one slice of a {@link slicedJsonResponse} gathers at most. */
const SLICE_CHARS = 1 << 20;

/** Work units of a body sent with one `JSON.stringify` (a few milliseconds at most). */
const SMALL_BODY = 16_384;

/**
 * A JSON response written a slice at a time (see {@link jsonBody}, which sends small bodies whole).
 *
 * @example
 * ```ts
 * const res = slicedJsonResponse({ data: [1, 2, 3] }, { sliceMs: 0 });
 * await res.text(); // '{"data":[1,2,3]}'
 * ```
 */
export function slicedJsonResponse(
  body: unknown,
  opts: { status?: number; headers?: Record<string, string>; signal?: AbortSignal; sliceMs?: number } = {},
): Response {
  const pieces = jsonPieces(body);
  const encoder = new TextEncoder();
  const slices = new Slicer(opts.sliceMs ?? 10, opts.signal);
  const ending: Ending = { ended: false, cut: false };
  const end = (cut: boolean) => {
    if (ending.ended) return;
    Object.assign(ending, { ended: true, cut });
    opts.signal?.removeEventListener("abort", onAbort);
    ending.done?.(cut);
  };
  // Once `signal` aborts (the client left, the drain time or time limit is over) the request ends at
  // once, even while a slow reader holds the body back, and nothing more is written: the body
  // stays unfinished until the connection closes (the client's leaving, the idle-connection limit
  // or the process's exit). Not failed: Deno.serve prints a failed body's reason to stderr.
  const onAbort = () => end(true);
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  let started = false;
  let written = false;
  // High-water mark 0: a slice is made when the network takes one, and the end comes with the read
  // after the last slice, so a body is not "ended" while its last slice still waits to be sent.
  const stream = new ReadableStream<Uint8Array>({
    start() {
      if (opts.signal?.aborted) onAbort();
    },
    async pull(controller) {
      if (ending.ended) return;
      if (written) {
        controller.close();
        end(false);
        return;
      }
      try {
        if (started) await slices.pause();
      } catch {
        return; // aborted: onAbort ended the request
      }
      started = true;
      // At least one piece a slice, however short the slices, and at most ~1 MB: the text is encoded
      // in one step (a 12 MB text gathered in one slice: ~15 ms more of the same block).
      let text = "";
      let first = true;
      for (;;) {
        if (!first && (slices.due || text.length >= SLICE_CHARS)) break;
        first = false;
        const next = pieces.next();
        if (next.done) {
          written = true;
          break;
        }
        text += next.value;
      }
      controller.enqueue(encoder.encode(text));
    },
    cancel() {
      end(true);
    },
  }, { highWaterMark: 0 });
  const res = new Response(stream, {
    status: opts.status ?? 200,
    headers: { "content-type": "application/json", ...opts.headers },
  });
  slicedBodies.set(res, ending);
  return res;
}

/** How a sliced body ended (`cut`: before its end), and who to tell. */
interface Ending {
  ended: boolean;
  cut: boolean;
  done?: (cut: boolean) => void;
}

const slicedBodies = new WeakMap<Response, Ending>();

/**
 * When `res` is a {@link slicedJsonResponse}, calls `done` once its body ends (`cut`: failed or
 * cancelled before its end) and returns true; false for any other response.
 */
export function onSlicedJsonEnd(res: Response, done: (cut: boolean) => void): boolean {
  const ending = slicedBodies.get(res);
  if (!ending) return false;
  if (ending.ended) done(ending.cut);
  else ending.done = done;
  return true;
}

/** The response for an {@link ApiError}. */
export function errorResponse(error: ApiError): Response {
  return jsonResponse(error.toBody(), error.status, error.headers);
}

/**
 * The error for a request whose signal aborted: 504 on the request time limit, 503 when the
 * server is shutting down, 499 (client closed request) when the client went away.
 */
export function abortedError(reason: unknown): ApiError {
  const name = (reason as { name?: string })?.name;
  if (name === "TimeoutError") {
    return new ApiError(
      504,
      "timeout_error",
      "The request took longer than the server's time limit.",
      null,
      "timeout",
    );
  }
  if (name === "ShutdownError") {
    return new ApiError(
      503,
      "service_unavailable_error",
      "The server is shutting down; retry on another instance.",
      null,
      "shutting_down",
      { "retry-after": "5" },
    );
  }
  return new ApiError(
    499,
    "invalid_request_error",
    "The client closed the request.",
    null,
    "client_closed_request",
  );
}
