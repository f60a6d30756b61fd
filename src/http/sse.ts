/** Server-sent events: `data: <json>\n\n` frames, comment pings and the `[DONE]` terminator. */
import { Slicer } from "../event_loop.ts";
import { isSmallJson, jsonPieces } from "./json_writer.ts";

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
  return encoder.encode(`${eventHead(name)}${JSON.stringify(payload)}\n\n`);
}

function eventHead(name: string | undefined): string {
  return `${name ? `event: ${name.replace(/[\r\n]+/g, " ")}\n` : ""}data: `;
}

/** Work units of an event's payload written with one `JSON.stringify` (see json_writer.ts). */
const SMALL_EVENT = 16_384;

/**
 * Enqueues the event of `payload`: at once when it is small, else its JSON a slice at a time with
 * turns of the event loop between slices (an echoed prompt's 8,000 log-probabilities of 20
 * alternatives each took 110 ms to stringify), until `stopped` says the stream ended.
 */
async function enqueueEvent(
  controller: ReadableStreamDefaultController<Uint8Array>,
  payload: unknown,
  name: string | undefined,
  stopped: () => boolean,
  sliceMs = 10,
): Promise<void> {
  if (isSmallJson(payload, SMALL_EVENT)) {
    controller.enqueue(sseData(payload, name));
    return;
  }
  const slices = new Slicer(sliceMs);
  let text = eventHead(name);
  for (const piece of jsonPieces(payload)) {
    text += piece;
    if (!slices.due) continue;
    controller.enqueue(encoder.encode(text));
    text = "";
    await slices.pause();
    if (stopped()) return;
  }
  controller.enqueue(encoder.encode(`${text}\n\n`));
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
 * async function* chunks() {
 *   yield { n: 1 };
 * }
 * const res = new Response(sseStream(chunks()), { headers: SSE_HEADERS });
 * await res.text(); // 'data: {"n":1}\n\ndata: [DONE]\n\n'
 * ```
 */
export function sseStream<T>(
  source: AsyncIterable<T>,
  opts: {
    pingMs?: number;
    onError?: (e: unknown) => unknown;
    done?: boolean;
    event?: (payload: T) => string | undefined;
    /** What a ping sends (default: a comment line). */
    ping?: Uint8Array;
    /** Milliseconds of a large event written before a turn of the event loop (default 10). */
    sliceMs?: number;
  } = {},
): ReadableStream<Uint8Array> {
  const end = () => (opts.done === false ? [] : [SSE_DONE]);
  const iterator = source[Symbol.asyncIterator]();
  let ping: ReturnType<typeof setInterval> | undefined;
  let finished = false;
  const ending: StreamEnding = { ended: false, cut: false };
  const settle = (cut: boolean) => {
    if (ending.ended) return;
    Object.assign(ending, { ended: true, cut });
    ending.done?.(cut);
  };
  /** An event is being written in slices: a ping now would land inside it. */
  let writing = false;
  const stop = () => {
    finished = true;
    if (ping !== undefined) clearInterval(ping);
  };
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      if (opts.pingMs) {
        ping = setInterval(() => {
          if (!finished && !writing) controller.enqueue(opts.ping ?? sseComment("ping"));
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
          settle(false);
        } else {
          writing = true;
          try {
            await enqueueEvent(
              controller,
              next.value,
              opts.event?.(next.value),
              () => finished,
              opts.sliceMs,
            );
          } finally {
            writing = false;
          }
        }
      } catch (e) {
        if (finished) return;
        stop();
        // After the first byte the status is sent: the error travels as an event, then [DONE].
        if (opts.onError) controller.enqueue(sseData(opts.onError(e)));
        for (const b of end()) controller.enqueue(b);
        controller.close();
        settle(false);
      }
    },
    async cancel() {
      stop();
      await iterator.return?.()?.catch(() => {});
      settle(true);
    },
  });
  endings.set(stream, ending);
  return stream;
}

/** How an event stream ended (`cut`: cancelled before its end), and who to tell. */
interface StreamEnding {
  ended: boolean;
  cut: boolean;
  done?: (cut: boolean) => void;
}

const endings = new WeakMap<ReadableStream<Uint8Array>, StreamEnding>();

/**
 * When `body` is an {@link sseStream}, calls `done` once it ends (`cut`: the client went away first)
 * and returns true; false for any other body. (The server then needs no stream stage of its own to
 * see the end: one promise and a copy fewer for every event.)
 */
export function onSseEnd(body: ReadableStream<Uint8Array> | null, done: (cut: boolean) => void): boolean {
  const ending = body ? endings.get(body) : undefined;
  if (!ending) return false;
  if (ending.ended) done(ending.cut);
  else ending.done = done;
  return true;
}
