/**
 * Reading server-sent event streams in tests: a whole body, or event by event (to cut a stream
 * mid-way). A parser of our own, independent of the server's, so a framing fault shows.
 */
import type { Json } from "./server.ts";

/** One event: its `event:` name when the server gave one, and its `data:` lines joined by "\n". */
export interface SseEvent {
  event?: string;
  data: string;
}

/**
 * The events of an event-stream text, as a client reads them (the WHATWG rules): CRLF, CR and LF
 * line ends, `data:` lines joined, comments (`: ping`) and frames without data dropped.
 *
 * @example
 * ```ts
 * parseSse(': ping\n\nevent: done\ndata: {"a":1}\n\ndata: [DONE]\n\n');
 * // [{ event: "done", data: '{"a":1}' }, { data: "[DONE]" }]
 * ```
 */
export function parseSse(text: string): SseEvent[] {
  const events: SseEvent[] = [];
  for (const frame of text.replace(/\r\n?/g, "\n").split("\n\n")) {
    const event = frameEvent(frame);
    if (event) events.push(event);
  }
  return events;
}

function frameEvent(frame: string): SseEvent | undefined {
  let name: string | undefined;
  const data: string[] = [];
  for (const line of frame.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") data.push(value);
    else if (field === "event") name = value;
  }
  if (data.length === 0) return undefined;
  return name === undefined ? { data: data.join("\n") } : { event: name, data: data.join("\n") };
}

/** The data of each event as JSON, except `[DONE]`, kept as the string. */
export function eventData(events: readonly SseEvent[]): Json[] {
  return events.map((e) => (e.data === "[DONE]" ? "[DONE]" : JSON.parse(e.data)));
}

/** A streamed answer read to its end. */
export interface StreamResult {
  status: number;
  headers: Headers;
  /** The body as it came. */
  text: string;
  events: SseEvent[];
  /** {@link eventData} of the events (empty when the answer was not a stream). */
  data: Json[];
}

/**
 * POSTs `body` with `stream: true` (a bearer `key`, unless null) and reads the answer to its end.
 *
 * @example
 * ```ts ignore
 * const { data } = await postStream(`${server.url}/v1/chat/completions`, { model, messages });
 * assert.equal(data.at(-1), "[DONE]");
 * ```
 */
export async function postStream(
  url: string,
  body: Record<string, unknown>,
  opts: { key?: string | null; headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<StreamResult> {
  const res = await streamRequest(url, body, opts);
  const text = await res.text();
  const streamed = (res.headers.get("content-type") ?? "").startsWith("text/event-stream");
  const events = streamed ? parseSse(text) : [];
  return { status: res.status, headers: res.headers, text, events, data: streamed ? eventData(events) : [] };
}

/** Sends the request of {@link postStream} and returns the response unread. */
export function streamRequest(
  url: string,
  body: Record<string, unknown>,
  opts: { key?: string | null; headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<Response> {
  const key = opts.key === undefined ? "test-key" : opts.key;
  return fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...opts.headers,
    },
    body: JSON.stringify({ ...body, stream: true }),
    signal: opts.signal,
  });
}

/**
 * Reads an event stream one event at a time, for tests that act in the middle of a stream (cut it,
 * signal the server) and then read the rest or hang up.
 *
 * @example
 * ```ts ignore
 * const stream = await SseReader.open(url, { model, messages, max_tokens: 4000 });
 * await stream.take(3); // the stream is running
 * await stream.cancel(); // the client leaves
 * ```
 */
export class SseReader {
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  readonly #decoder = new TextDecoder();
  readonly #abort?: AbortController;
  #buffer = "";
  #done = false;
  /** Every event read so far. */
  readonly events: SseEvent[] = [];

  /** Reads `response`; `abort`, when given, is the request's own controller (aborted by {@link cancel}). */
  constructor(readonly response: Response, abort?: AbortController) {
    if (!response.body) throw new Error(`no body to read (status ${response.status})`);
    this.#reader = response.body.getReader();
    this.#abort = abort;
  }

  /** Sends the request of {@link postStream}, checks that a stream (status 200) answered, and reads it. */
  static async open(
    url: string,
    body: Record<string, unknown>,
    opts: { key?: string | null; headers?: Record<string, string> } = {},
  ): Promise<SseReader> {
    const abort = new AbortController();
    const res = await streamRequest(url, body, { ...opts, signal: abort.signal });
    if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
    return new SseReader(res, abort);
  }

  /** The next event, or undefined once the stream has ended. */
  async next(): Promise<SseEvent | undefined> {
    for (;;) {
      this.#buffer = this.#buffer.replace(/\r\n?/g, "\n");
      let end;
      while ((end = this.#buffer.indexOf("\n\n")) >= 0) {
        const event = frameEvent(this.#buffer.slice(0, end));
        this.#buffer = this.#buffer.slice(end + 2);
        if (event) {
          this.events.push(event);
          return event;
        }
      }
      if (this.#done) return undefined;
      const { value, done } = await this.#reader.read();
      if (done) {
        this.#done = true;
        this.#buffer += this.#decoder.decode();
        // A last frame without its blank line still counts, as a client reads it.
        if (this.#buffer.trim() !== "") this.#buffer += "\n\n";
      } else this.#buffer += this.#decoder.decode(value, { stream: true });
    }
  }

  /** The next `n` events; fails if the stream ends first. */
  async take(n: number): Promise<SseEvent[]> {
    const got: SseEvent[] = [];
    while (got.length < n) {
      const event = await this.next();
      if (!event) throw new Error(`the stream ended after ${got.length} of ${n} events`);
      got.push(event);
    }
    return got;
  }

  /** The events up to the end of the stream. */
  async rest(): Promise<SseEvent[]> {
    const got: SseEvent[] = [];
    for (let e = await this.next(); e; e = await this.next()) got.push(e);
    return got;
  }

  /** Hangs up: the request is aborted and its connection closed, as a client that leaves does. */
  async cancel(): Promise<void> {
    this.#done = true;
    this.#abort?.abort();
    await this.#reader.cancel().catch(() => {});
  }
}
