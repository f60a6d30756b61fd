/** Reads a request body as JSON within a byte limit, with OpenAI-style errors for each fault. */
import { abortedError, ApiError, badRequest } from "./errors.ts";
import { Slicer } from "../event_loop.ts";
import { JsonBodyError, parseJsonInSlices } from "./json_slices.ts";

/**
 * Parses the JSON body of `req`, refusing non-JSON content types and content encodings other than
 * gzip and deflate (415), bodies over `limitBytes` sent or decompressed (413), invalid UTF-8,
 * malformed JSON, nesting deeper than 512 levels and more than 100,000 arrays and objects (400). A large body is parsed in slices with
 * turns of the event loop between them (see json_slices.ts).
 *
 * @example
 * ```ts
 * const req = new Request("http://localhost/v1/embeddings", {
 *   method: "POST",
 *   headers: { "content-type": "application/json" },
 *   body: '{"input":"hi"}',
 * });
 * const body = await readJsonBody(req, 8 * 1024 * 1024); // { input: "hi" }
 * ```
 */
export async function readJsonBody(req: Request, limitBytes: number, timeoutMs = 0): Promise<unknown> {
  const type = req.headers.get("content-type") ?? "";
  if (!/^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i.test(type)) {
    throw new ApiError(
      415,
      "invalid_request_error",
      `Unsupported Content-Type '${type || "(none)"}': send 'Content-Type: application/json' ` +
        `(with curl: -H 'Content-Type: application/json').`,
      null,
      "unsupported_media_type",
    );
  }
  const encoding = contentEncoding(req.headers.get("content-encoding"));
  const declared = Number(req.headers.get("content-length") ?? NaN);
  if (declared > limitBytes) throw tooLarge(limitBytes);
  // A declared length within the limit (HTTP framing holds the body to it) and no decompression: read
  // whole, one op instead of a stream reader's (a short request's body: 5 against 20 µs, hot).
  const bytes = Number.isFinite(declared) && !encoding
    ? await readDeclared(req, timeoutMs)
    : await readLimited(req, limitBytes, timeoutMs, encoding);
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    throw badRequest("The request body is not valid UTF-8.", null, "invalid_json");
  }
  if (text.trim() === "") throw badRequest("The request body is empty; send a JSON object.");
  let body: unknown;
  try {
    body = await parseJsonInSlices(text, new Slicer(10, req.signal));
  } catch (e) {
    if (!(e instanceof JsonBodyError)) throw abortedError(e);
    if (e.limit === "depth") throw badRequest(e.message, null, "json_too_deep");
    if (e.limit === "containers") throw badRequest(e.message, null, "json_too_large");
    throw badRequest(`The request body is not valid JSON (${e.message}).`, null, "invalid_json");
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest("The request body must be a JSON object.", null, "invalid_json");
  }
  return body;
}

/**
 * The decompression a body needs: none, or gzip / deflate (as llama-server's HTTP library decodes
 * them); any other `Content-Encoding` is a 415 naming it.
 */
function contentEncoding(header: string | null): CompressionFormat | undefined {
  const value = header?.trim().toLowerCase() ?? "";
  if (value === "" || value === "identity") return undefined;
  if (value === "gzip" || value === "x-gzip") return "gzip";
  if (value === "deflate") return "deflate";
  throw new ApiError(
    415,
    "invalid_request_error",
    `Unsupported Content-Encoding '${
      value.slice(0, 64)
    }': send the body uncompressed, or as gzip or deflate.`,
    null,
    "unsupported_content_encoding",
  );
}

/** The body of a request that declared its length (see {@link readJsonBody}), within `timeoutMs` (if > 0). */
async function readDeclared(req: Request, timeoutMs: number): Promise<Uint8Array> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    if (timeoutMs > 0) timer = setTimeout(() => reject(bodyTimeout(timeoutMs)), timeoutMs);
  });
  late.catch(() => {});
  try {
    return await Promise.race([req.bytes(), late]);
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw abortedError(new DOMException("the client aborted the upload", "AbortError"));
  } finally {
    clearTimeout(timer);
  }
}

/** Compressed bytes given to the decompressor at once (deflate inflates at most ~1032:1). */
const INFLATE_STEP = 1024;

/** Decodes request bodies; `fatal`: invalid UTF-8 is an error, not replaced. */
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * The body, within `limitBytes` (sent and, when `encoding` is given, decompressed) and (if > 0)
 * `timeoutMs`; a client that aborts its upload is a 499, a body that does not decompress a 400.
 */
async function readLimited(
  req: Request,
  limitBytes: number,
  timeoutMs: number,
  encoding?: CompressionFormat,
): Promise<Uint8Array> {
  if (!req.body) return new Uint8Array();
  let sent = 0;
  const stream = encoding
    ? req.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          sent += chunk.byteLength;
          if (sent > limitBytes) throw tooLarge(limitBytes);
          // The decompressor inflates each chunk it is given in one step: 64 KB of a gzip bomb is
          // 64 MB (170 ms of the event loop, and the memory) before the limit below could see it.
          // Fed 1 KB at a time, a step makes at most ~1 MB.
          for (let at = 0; at < chunk.byteLength; at += INFLATE_STEP) {
            controller.enqueue(chunk.subarray(at, at + INFLATE_STEP));
          }
        },
      }),
    ).pipeThrough(new DecompressionStream(encoding) as unknown as TransformStream<Uint8Array, Uint8Array>)
    : req.body;
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  let yielded = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    if (timeoutMs > 0) timer = setTimeout(() => reject(bodyTimeout(timeoutMs)), timeoutMs);
  });
  late.catch(() => {});
  try {
    for (;;) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await Promise.race([reader.read(), late]);
      } catch (e) {
        if (e instanceof ApiError) throw e;
        if (encoding && !req.signal.aborted && e instanceof TypeError) {
          throw badRequest(
            `The request body is not valid ${encoding} data.`,
            null,
            "invalid_content_encoding",
          );
        }
        throw abortedError(new DOMException("the client aborted the upload", "AbortError"));
      }
      if (next.done) break;
      total += next.value.byteLength;
      if (total > limitBytes) throw tooLarge(limitBytes);
      chunks.push(next.value);
      // Decompressing runs in promise jobs, which never give timers or sockets a turn: other
      // requests get one every MB (ten gzip bombs at once held /health for 250 ms without).
      if (encoding && total - yielded >= 1 << 20) {
        yielded = total;
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
    }
  } finally {
    clearTimeout(timer);
    reader.cancel().catch(() => {});
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

function bodyTimeout(ms: number): ApiError {
  return new ApiError(
    408,
    "invalid_request_error",
    `The request body was not received within ${ms / 1000} s (setting body-timeout).`,
    null,
    "request_timeout",
    { connection: "close" },
  );
}

function tooLarge(limitBytes: number): ApiError {
  return new ApiError(
    413,
    "invalid_request_error",
    `The request body is larger than the limit of ${limitBytes} bytes (setting body-limit).`,
    null,
    "request_too_large",
  );
}
