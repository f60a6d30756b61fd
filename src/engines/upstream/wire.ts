/**
 * The HTTP exchange with one upstream: a POST under connect and first-byte time limits, the
 * server-sent events of its answer, and its error bodies (in the shapes OpenAI, vLLM, TEI,
 * llama-server and FastAPI write them) turned into our OpenAI errors.
 */
import { EngineUpstreamError } from "../types.ts";
import type { Routing } from "../../model_spec.ts";
import { UpstreamFailure } from "./failure.ts";
import type { Upstream } from "./pool.ts";

/** A request sent and its response headers received; the body is still to be read. */
export interface Exchange {
  res: Response;
  /** Ends the first-byte time limit (call it once the first byte of the body is read). */
  settle(): void;
  /** The failure for an error thrown while reading the body (a timeout, a broken connection). */
  failure(e: unknown): unknown;
  /**
   * The `data:` payloads of an event-stream answer, in order: the first under the first-byte limit,
   * each later one within `streamIdleTimeoutMs` of waiting for the upstream (else the request is
   * aborted and a timeout failure thrown). Errors come as failures; returning early closes the
   * connection.
   */
  events(): AsyncGenerator<string>;
}

/**
 * POSTs `body` as JSON to `<upstream base><path>`. Throws an {@link UpstreamFailure} for a
 * connection that cannot be made (refused, or no TCP connection within `connectTimeoutMs`), no
 * answer within `firstByteTimeoutMs`, or a non-2xx answer; the client's own abort is rethrown as is.
 * The first-byte limit runs on while the caller reads the first byte of the body: it calls
 * `settle()` then (`events()` does so itself, and keeps the idle limit of a stream).
 *
 * @example
 * ```ts
 * import type { Upstream } from "./pool.ts";
 * import type { Routing } from "../../model_spec.ts";
 * async function embedThenChat(u: Upstream, routing: Routing, signal: AbortSignal, input: string[], chat: unknown) {
 *   const ex = await post(u, "/embeddings", { model: u.model, input }, { signal, routing, model: "m" });
 *   const json = await ex.res.json().catch((e) => {
 *     throw ex.failure(e);
 *   });
 *   ex.settle();
 *   for await (const data of (await post(u, "/chat/completions", chat, { signal, routing, model: "m" })).events()) {
 *     console.log(data);
 *   }
 *   return json;
 * }
 * ```
 */
export async function post(
  u: Upstream,
  path: string,
  body: unknown,
  opts: { signal: AbortSignal; routing: Routing; model: string; requestId?: string },
): Promise<Exchange> {
  const { routing } = opts;
  const limit = new AbortController();
  const signal = AbortSignal.any([opts.signal, limit.signal]);
  let answered = false;
  const firstByte = setTimeout(() =>
    limit.abort(
      UpstreamFailure.timeout(`no answer within ${routing.firstByteTimeoutMs} ms (first-byte timeout)`),
    ), routing.firstByteTimeoutMs);
  // fetch has no connect timeout: when no answer came in time, check that a connection can be made.
  const connect = setTimeout(async () => {
    if (answered || await canConnect(u.base, routing.connectTimeoutMs) || answered) return;
    limit.abort(
      UpstreamFailure.broken(`no TCP connection within ${routing.connectTimeoutMs} ms (connect timeout)`),
    );
  }, routing.connectTimeoutMs);
  const settle = () => {
    clearTimeout(firstByte);
    clearTimeout(connect);
  };
  const failure = (e: unknown): unknown => {
    settle();
    if (opts.signal.aborted) return opts.signal.reason ?? e;
    if (limit.signal.aborted) return limit.signal.reason;
    if (e instanceof UpstreamFailure) return e;
    const why = (e as Error)?.message ?? String(e);
    return UpstreamFailure.broken(answered ? `the answer broke off: ${why}` : `connection failed: ${why}`);
  };
  let res: Response;
  try {
    res = await fetch(`${u.base}${path}`, {
      method: "POST",
      headers: u.headers(opts.requestId),
      body: JSON.stringify(body),
      signal,
    });
  } catch (e) {
    throw failure(e);
  }
  answered = true;
  clearTimeout(connect);
  if (!res.ok) {
    let text = "";
    try {
      text = await readCapped(res, 64 << 10);
    } catch (e) {
      throw failure(e);
    }
    settle();
    throw statusFailure(res.status, text, res.headers, u, opts.model);
  }
  const idleMs = routing.streamIdleTimeoutMs;
  const idle = idleMs > 0
    ? {
      ms: idleMs,
      expired: () =>
        limit.abort(
          UpstreamFailure.timeout(`no stream event for ${idleMs} ms mid-answer (stream idle timeout)`),
        ),
    }
    : undefined;
  async function* events(): AsyncGenerator<string> {
    const data = sseData(res.body!, idle);
    try {
      for (let first = true;; first = false) {
        let r: IteratorResult<string>;
        try {
          r = await data.next();
        } catch (e) {
          throw failure(e);
        }
        if (first) settle();
        if (r.done) return;
        yield r.value;
      }
    } finally {
      settle();
      await data.return(undefined).catch(() => {});
    }
  }
  return { res, settle, failure, events };
}

/** At most `max` bytes of a body as text (an error body is only for the log and the message). */
async function readCapped(res: Response, max: number): Promise<string> {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < max) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
      size += value.length;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const p of parts) all.set(p, (at += p.length) - p.length);
  return new TextDecoder().decode(all.subarray(0, max));
}

/** Whether a TCP connection to the upstream's host can be made within `ms` (the attempt is then abandoned). */
async function canConnect(base: string, ms: number): Promise<boolean> {
  const url = new URL(base);
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  try {
    const conn = await Deno.connect({
      hostname: url.hostname.replace(/^\[|\]$/g, ""),
      port,
      signal: AbortSignal.timeout(ms),
    });
    conn.close();
    return true;
  } catch {
    return false;
  }
}

/** The error fields an upstream's body carries, whatever its shape. */
interface ErrorFields {
  message?: string;
  param?: string;
  code?: string;
}

/**
 * Reads an upstream error body: OpenAI / vserve / llama-server `{"error":{message,type,param,code}}`,
 * vLLM's `{"object":"error","message",…,"code":400}`, TEI's `{"error":"…","error_type":"…"}`,
 * FastAPI's `{"detail":[{loc,msg}]}`, or plain text.
 *
 * @example
 * ```ts
 * errorFields('{"error":"Input validation error","error_type":"Validation"}'); // { message: "Input validation error" }
 * ```
 */
export function errorFields(text: string): ErrorFields {
  const str = (v: unknown) => (typeof v === "string" && v !== "" ? v : undefined);
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(text);
  } catch {
    return { message: str(text.trim().slice(0, 1000)) };
  }
  if (!j || typeof j !== "object") return { message: str(String(j)) };
  const e = j.error as Record<string, unknown> | string | undefined;
  if (e && typeof e === "object") return { message: str(e.message), param: str(e.param), code: str(e.code) };
  if (typeof e === "string") return { message: e };
  if (typeof j.message === "string") return { message: j.message, param: str(j.param), code: str(j.code) };
  if (typeof j.detail === "string") return { message: j.detail };
  if (Array.isArray(j.detail)) {
    const items = j.detail as { loc?: unknown[]; msg?: string }[];
    const path = (d: { loc?: unknown[] }) =>
      (d.loc ?? []).filter((p) => p !== "body").map((p) => typeof p === "number" ? `[${p}]` : `.${p}`).join(
        "",
      )
        .replace(/^\./, "");
    return {
      message: items.map((d) => `${path(d) || "body"}: ${d.msg ?? "invalid"}`).join("; "),
      param: items[0] ? path(items[0]) || undefined : undefined,
    };
  }
  return {};
}

/**
 * The failure for a non-2xx answer (or an error event inside a stream, with its code as status):
 * 429 → busy, retried elsewhere, then 429 to the client; 5xx, 401/403 (our key), 404/405 (our
 * configuration), 408 → broken, retried, then 502; other 4xx → the client's fault, passed on as a
 * 400 (413 as 413) with the upstream's message, the upstream's model name replaced by ours.
 */
export function statusFailure(
  status: number,
  text: string,
  headers: Headers | undefined,
  u: Upstream,
  model: string,
): UpstreamFailure {
  const f = errorFields(text);
  const detail = `HTTP ${status} from the upstream${f.message ? `: ${clip(f.message, 500)}` : ""}`;
  if (status === 429) {
    const after = headers?.get("retry-after");
    return new UpstreamFailure(detail, "busy", true, (m) =>
      new EngineUpstreamError(
        `The engines serving '${m}' are busy; retry shortly.`,
        429,
        "rate_limit_error",
        null,
        "upstream_busy",
        { "retry-after": after && /^\d{1,4}$/.test(after) ? after : "1" },
      ), status);
  }
  if (status >= 500 || [401, 403, 404, 405, 408].includes(status) || status < 400) {
    return UpstreamFailure.broken(detail, true, status);
  }
  const message = f.message
    ? clip(f.message.split(u.model).join(model), 1000)
    : `The engine serving '${model}' refused the request (HTTP ${status}).`;
  const code = f.code ??
    (/context length|context window|maximum.*tokens|too long|too many tokens/i.test(message)
      ? "context_length_exceeded"
      : "invalid_value");
  return new UpstreamFailure(detail, "rejected", false, () =>
    new EngineUpstreamError(
      message,
      status === 413 ? 413 : 400,
      "invalid_request_error",
      f.param ?? null,
      code,
    ), status);
}

/**
 * The `data:` payloads of a server-sent event stream, in order; comments and other fields are
 * skipped. Returning early (or an abort) cancels the body, which closes the upstream connection.
 * With `idle`, once the first payload is out, `idle.expired` is called when the reads since the
 * last payload have waited `idle.ms` in all (time the consumer holds a payload does not count: a
 * slow client is not a stalled upstream); it should abort the request, which ends the read.
 */
export async function* sseData(
  body: ReadableStream<Uint8Array>,
  idle?: { ms: number; expired: () => void },
): AsyncGenerator<string> {
  // Decoded here rather than through a TextDecoderStream: that stage's two streams cost more per
  // relayed token than the rest of the reading.
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let waited = 0;
  let started = false;
  try {
    while (true) {
      const timer = idle && started ? setTimeout(idle.expired, Math.max(0, idle.ms - waited)) : undefined;
      const before = performance.now();
      let read: ReadableStreamReadResult<Uint8Array>;
      try {
        read = await reader.read();
      } finally {
        clearTimeout(timer);
      }
      waited += performance.now() - before;
      const { value, done } = read;
      if (done) return;
      // CRLF and CR line ends as LF; a CR at the end may be half of a CRLF split across reads.
      buf = buf + decoder.decode(value, { stream: true });
      if (buf.includes("\r")) buf = buf.replace(/\r\n|\r(?!$)/g, "\n");
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(l.startsWith("data: ") ? 6 : 5)).join("\n");
        if (data === "") continue;
        started = true;
        waited = 0;
        yield data;
      }
      if (buf.length > MAX_EVENT) throw UpstreamFailure.broken(`a stream event over ${MAX_EVENT} characters`);
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** The largest server-sent event accepted from an upstream (a broken one must not fill the memory). */
const MAX_EVENT = 16 << 20;

function clip(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max)}…`;
}
