/** Reads a request body as JSON within a byte limit, with OpenAI-style errors for each fault. */
import { abortedError, ApiError, badRequest } from "./errors.ts";
import { heldMs, Slicer } from "../event_loop.ts";
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
  try {
    return await readJson(req, limitBytes, timeoutMs);
  } finally {
    bodyDone(req);
  }
}

/** Who waits for a request's body to be read: see {@link whenBodyRead}. */
const bodyWaiters = new WeakMap<Request, () => void>();

/**
 * Calls `done` once {@link readJsonBody} has read `req`'s body or given up on it (the server's
 * drain closes the listener only then: `Deno.serve`'s shutdown makes a body not read yet unreadable).
 *
 * @example
 * ```ts
 * function watch(req: Request) {
 *   whenBodyRead(req, () => console.log("body in"));
 * }
 * ```
 */
export function whenBodyRead(req: Request, done: () => void): void {
  bodyWaiters.set(req, done);
}

function bodyDone(req: Request): void {
  const done = bodyWaiters.get(req);
  if (!done) return;
  bodyWaiters.delete(req);
  done();
}

async function readJson(req: Request, limitBytes: number, timeoutMs: number): Promise<unknown> {
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
  // Starts the watch of the loop's turns, so that the steps after the parse know how long they held it.
  heldMs();
  const declared = Number(req.headers.get("content-length") ?? NaN);
  if (declared > limitBytes) throw tooLarge(limitBytes);
  // A declared length within the limit (HTTP framing holds the body to it) and no decompression: read
  // whole, one op instead of a stream reader's (a short request's body: 5 against 20 µs, hot).
  const bytes = Number.isFinite(declared) && !encoding
    ? await readDeclared(req, timeoutMs)
    : await readLimited(req, limitBytes, timeoutMs, encoding);
  // The slice starts before the decoding (a body at the limit: ~8 ms), so the parse's first turn
  // of the event loop comes in time.
  const slices = new Slicer(10, req.signal);
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    throw badRequest("The request body is not valid UTF-8.", null, "invalid_json");
  }
  if (text.trim() === "") throw badRequest("The request body is empty; send a JSON object.");
  let body: unknown;
  try {
    body = await parseJsonInSlices(text, slices);
  } catch (e) {
    if (!(e instanceof JsonBodyError)) throw abortedError(e);
    if (e.limit === "depth") throw badRequest(e.message, null, "json_too_deep");
    if (e.limit === "containers" || e.limit === "members") {
      throw badRequest(e.message, e.path ?? null, "json_too_large");
    }
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

/**
 * Pieces (chunks as they arrive) a body without a declared length may come in. Reading one costs the
 * event loop ~100 µs in the runtime's stream reader, so 8 MB sent in 16-byte chunks (500,000 of
 * them) was 50 s of the thread's time; clients that stream a body send kilobytes a chunk (8 MB in
 * 16 KB chunks is 512).
 */
export const MAX_BODY_PIECES = 65_536;

/** Decodes request bodies; `fatal`: invalid UTF-8 is an error, not replaced. */
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * The body, within `limitBytes` (sent and, when `encoding` is given, decompressed), {@link
 * MAX_BODY_PIECES} pieces and (if > 0) `timeoutMs`; a client that aborts its upload is a 499, a body
 * that does not decompress a 400. Pieces the client sent ahead are read in promise jobs, which never
 * give timers or sockets a turn: the loop takes one every 10 ms of reading (8 MB in 16-byte chunks
 * held `/health` for 57 s), and the pieces are copied into one buffer as they come rather than kept
 * (half a million small arrays made single garbage collections of a quarter of a second).
 */
async function readLimited(
  req: Request,
  limitBytes: number,
  timeoutMs: number,
  encoding?: CompressionFormat,
): Promise<Uint8Array> {
  if (!req.body) return new Uint8Array();
  let sent = 0;
  let pieces = 0;
  const stream = encoding
    ? req.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          sent += chunk.byteLength;
          if (sent > limitBytes) throw tooLarge(limitBytes);
          if (++pieces > MAX_BODY_PIECES) throw tooFragmented();
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
  let buffer = new Uint8Array(Math.min(limitBytes, 64 * 1024));
  let total = 0;
  // The time limit ends the pending read by letting go of the stream (a race with one pending promise
  // per read piled a reaction on it for every piece; cancelling makes the runtime drain the body).
  let late = false;
  const timer = timeoutMs > 0
    ? setTimeout(() => {
      late = true;
      reader.releaseLock();
    }, timeoutMs)
    : undefined;
  const slices = new Slicer(10);
  let yielded = 0;
  let reads = 0;
  try {
    for (;;) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await reader.read();
      } catch (e) {
        if (late) throw bodyTimeout(timeoutMs);
        if (e instanceof ApiError) throw e;
        if (encoding && !req.signal.aborted && e instanceof TypeError) {
          throw badRequest(
            `The request body is not valid ${encoding} data.`,
            null,
            "invalid_content_encoding",
          );
        }
        // Deno's HTTP parser refusing the rest of the body (a chunked body in chunks of 64 KB or more
        // stops at 4 MB): the client is still there, and is told why.
        if (!req.signal.aborted && e instanceof Error && /^invalid HTTP/i.test(e.message)) {
          throw unreadableBody(e.message);
        }
        throw abortedError(new DOMException("the client aborted the upload", "AbortError"));
      }
      if (late) throw bodyTimeout(timeoutMs);
      if (next.done) break;
      const piece = next.value;
      if (total + piece.byteLength > limitBytes) throw tooLarge(limitBytes);
      if (!encoding && ++pieces > MAX_BODY_PIECES) throw tooFragmented();
      if (total + piece.byteLength > buffer.byteLength) {
        const grown = new Uint8Array(
          Math.min(limitBytes, Math.max(2 * buffer.byteLength, total + piece.byteLength)),
        );
        grown.set(buffer.subarray(0, total));
        buffer = grown;
      }
      buffer.set(piece, total);
      total += piece.byteLength;
      // Decompression runs in the same promise jobs: a turn at least every MB it makes too, and every
      // 4,096 reads whatever the clock says.
      if (slices.due || (encoding && total - yielded >= 1 << 20) || ++reads % 4096 === 0) {
        yielded = total;
        await slices.pause();
      }
    }
  } finally {
    clearTimeout(timer);
    // Let go, not cancel: cancelling the body made the runtime read all the client still sent on the
    // event loop in one block (4 MB of 16-byte chunks after a refusal: 4.7 s); the error answer
    // closes the connection instead.
    reader.releaseLock();
  }
  return buffer.subarray(0, total);
}

/** A body the runtime's HTTP parser stopped reading (it says why). */
function unreadableBody(reason: string): ApiError {
  return new ApiError(
    400,
    "invalid_request_error",
    `The request body could not be read (${reason.slice(0, 200)}): send it with a Content-Length, or in ` +
      "chunks under 64 KB.",
    null,
    "invalid_body",
    { connection: "close" },
  );
}

/** A body without a declared length that came in more than {@link MAX_BODY_PIECES} pieces. */
function tooFragmented(): ApiError {
  return new ApiError(
    400,
    "invalid_request_error",
    `The request body came in more than ${MAX_BODY_PIECES} pieces: send it with a Content-Length, ` +
      "or in larger chunks.",
    null,
    "body_too_fragmented",
    { connection: "close" },
  );
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
    // The rest of the body is not read: the connection closes rather than have it drained (a body
    // refused midway in tiny chunks was read on for 30 s at full CPU to keep the connection).
    { connection: "close" },
  );
}
