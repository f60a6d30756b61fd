/** Server-sent events: `data: <json>\n\n` frames, comment pings and the `[DONE]` terminator. */

const encoder = new TextEncoder();

/** The headers of every event-stream response. */
export const SSE_HEADERS: Record<string, string> = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  "connection": "keep-alive",
  "x-accel-buffering": "no",
};

/** One `data:` event carrying `payload` as JSON (named by an `event:` line when `name` is given). */
export function sseData(payload: unknown, name?: string): Uint8Array {
  const head = name ? `event: ${name.replace(/[\r\n]+/g, " ")}\n` : "";
  return encoder.encode(`${head}data: ${JSON.stringify(payload)}\n\n`);
}

/** The terminal `data: [DONE]` event of OpenAI streams. */
export const SSE_DONE: Uint8Array = encoder.encode("data: [DONE]\n\n");

/** A comment line; clients ignore it, proxies see traffic and keep the connection. */
export function sseComment(text: string): Uint8Array {
  return encoder.encode(`: ${text.replace(/[\r\n]+/g, " ")}\n\n`);
}

/**
 * Turns an async source of payloads into an SSE body that ends with `[DONE]` (unless `done` is
 * false; `event` names each event, as the Responses API does). Pings are sent
 * every `pingMs` while the source is silent. When the client goes away the source's iterator is
 * returned (`finally` blocks run), so producers free their resources.
 *
 * @example
 * ```ts
 * new Response(sseStream(chunks()), { headers: SSE_HEADERS });
 * ```
 */
export function sseStream<T>(
  source: AsyncIterable<T>,
  opts: {
    pingMs?: number;
    onError?: (e: unknown) => unknown;
    done?: boolean;
    event?: (payload: T) => string | undefined;
  } = {},
): ReadableStream<Uint8Array> {
  const end = () => (opts.done === false ? [] : [SSE_DONE]);
  const iterator = source[Symbol.asyncIterator]();
  let ping: ReturnType<typeof setInterval> | undefined;
  let finished = false;
  let ended = false;
  const stop = () => {
    finished = true;
    if (ping !== undefined) clearInterval(ping);
  };
  /** The stream is over (closed, or cancelled by the client): tells the {@link onStreamEnd} listener once. */
  const over = () => {
    if (ended) return;
    ended = true;
    const listener = endListeners.get(stream);
    endListeners.delete(stream);
    listener?.();
  };
  const stream: ReadableStream<Uint8Array> = new ReadableStream<Uint8Array>({
    start(controller) {
      if (opts.pingMs) {
        ping = setInterval(() => {
          if (!finished) controller.enqueue(sseComment("ping"));
        }, opts.pingMs);
      }
    },
    async pull(controller) {
      try {
        const next = await iterator.next();
        if (finished) return;
        if (next.done) {
          stop();
          for (const b of end()) controller.enqueue(b);
          controller.close();
          over();
        } else {
          controller.enqueue(sseData(next.value, opts.event?.(next.value)));
        }
      } catch (e) {
        if (finished) return;
        stop();
        // After the first byte the status is sent: the error travels as an event, then [DONE].
        if (opts.onError) controller.enqueue(sseData(opts.onError(e)));
        for (const b of end()) controller.enqueue(b);
        controller.close();
        over();
      }
    },
    async cancel() {
      stop();
      try {
        await iterator.return?.();
      } finally {
        over();
      }
    },
  });
  endListeners.set(stream, () => {});
  return stream;
}

/** Streams made by {@link sseStream} that are not over yet, with what to call when they are. */
const endListeners = new WeakMap<ReadableStream<Uint8Array>, () => void>();

/**
 * Calls `done` once when `body`, a stream made by {@link sseStream}, has sent its last event or was
 * cancelled; false (and nothing is called) for any other stream, or one already over. This spares
 * every event a wrapping stream stage just to learn where the body ends.
 *
 * @example
 * ```ts
 * if (!onStreamEnd(res.body, finish)) wrapBody(res, finish);
 * ```
 */
export function onStreamEnd(body: ReadableStream<Uint8Array> | null, done: () => void): boolean {
  if (!body || !endListeners.has(body)) return false;
  endListeners.set(body, done);
  return true;
}
