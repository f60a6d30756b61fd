/**
 * Watches the server's TCP connections through the kernel, for two things `Deno.serve` does not do
 * by itself in Deno 2.9:
 *
 * - **Client gone.** Deno's HTTP/1.1 path notices a closed connection only when the request body
 *   fit in its first read (about 1 KB); for larger bodies `request.signal` never fires while a
 *   non-streaming handler runs. A request whose connection is no longer ESTABLISHED (the peer sent
 *   FIN, or the socket is gone) is aborted here within one poll interval.
 * - **Idle and half-sent connections.** `Deno.serve` has no header read timeout. A connection that
 *   has no request in a handler for longer than the idle limit (a slowloris sending headers byte by
 *   byte, or an idle keep-alive socket) is shut down with `shutdown(2)` on its descriptor; Deno
 *   then closes it itself.
 *
 * The process's own socket descriptors (`/proc/self/fd`) are asked directly (`getsockname`,
 * `getpeername`, `TCP_INFO`): a few microseconds each. Reading the kernel's table `/proc/net/tcp`
 * instead walks every bucket of the host's connection hash, 1.2 ms a read here, which at four polls
 * a second took a measurable share of the CPU the model needs.
 *
 * Linux only; elsewhere `ConnectionWatch.open` returns null and both features are off.
 */

/** A request in a handler, by the client's address. */
interface Tracked {
  key: string;
  gone: () => void;
}

/** How often to look for gone clients while requests are running. */
const POLL_MS = 250;
/** `tcp_info.tcpi_state` of an established connection. */
const ESTABLISHED = 1;

const LIBC = {
  shutdown: { parameters: ["i32", "i32"], result: "i32" },
  getsockname: { parameters: ["i32", "buffer", "buffer"], result: "i32" },
  getpeername: { parameters: ["i32", "buffer", "buffer"], result: "i32" },
  getsockopt: { parameters: ["i32", "i32", "i32", "buffer", "buffer"], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;
type Libc = Deno.DynamicLibrary<typeof LIBC>["symbols"];

const IPPROTO_TCP = 6;
const TCP_INFO = 11;
const AF_INET = 2;
const AF_INET6 = 10;

/** One accepted connection of the listener. */
interface Connection {
  key: string;
  state: number;
  fd: number;
}

/** The kernel's view of the server's connections, polled. */
export class ConnectionWatch {
  readonly #port: number;
  readonly #idleMs: number;
  readonly #libc: Libc;
  readonly #addr = new Uint8Array(128);
  readonly #len = new Uint32Array(1);
  /** {@link #len} as the `socklen_t *` argument. */
  readonly #lenArg = new Uint8Array(this.#len.buffer);
  readonly #info = new Uint8Array(256);
  readonly #tracked = new Set<Tracked>();
  /** Connection key → requests of it in a handler. */
  readonly #busy = new Map<string, number>();
  /** Connection key → when it last had no request in a handler (or was first seen). */
  readonly #idleSince = new Map<string, number>();
  /** Connection key → its descriptor, as the last listing found it. */
  readonly #fds = new Map<string, number>();
  #pollTimer?: ReturnType<typeof setTimeout>;
  #closed = false;
  #sweepTimer?: ReturnType<typeof setInterval>;
  /** Connections shut down for idleness, for metrics and tests. */
  reaped = 0;

  private constructor(port: number, idleMs: number, libc: Libc) {
    this.#port = port;
    this.#idleMs = idleMs;
    this.#libc = libc;
  }

  /**
   * Starts watching the connections of the listener on `port`; null where the kernel table or
   * libc is not available.
   *
   * @example
   * ```ts
   * function watch(info: Deno.ServeHandlerInfo<Deno.NetAddr>, controller: AbortController) {
   *   const watch = ConnectionWatch.open(8080, 60_000);
   *   return watch?.track(info.remoteAddr, () => controller.abort());
   * }
   * ```
   */
  static open(port: number, idleMs: number): ConnectionWatch | null {
    try {
      Deno.readDirSync("/proc/self/fd");
      const libc = Deno.dlopen("libc.so.6", LIBC);
      const watch = new ConnectionWatch(port, idleMs, libc.symbols);
      if (idleMs > 0) {
        const timer = setInterval(() => watch.#sweep(), Math.min(1000, idleMs / 2));
        Deno.unrefTimer(timer);
        watch.#sweepTimer = timer;
      }
      return watch;
    } catch {
      return null;
    }
  }

  /** Calls `gone` once if the client at `remote` disconnects; the returned function stops that. */
  track(remote: Deno.NetAddr, gone: () => void): () => void {
    const entry: Tracked = { key: addressKey(remote.hostname, remote.port), gone };
    this.#tracked.add(entry);
    this.#busy.set(entry.key, (this.#busy.get(entry.key) ?? 0) + 1);
    this.#idleSince.delete(entry.key);
    // One timer at a time, armed again by the poll while requests run: a short request neither
    // starts nor stops a timer of its own.
    if (this.#pollTimer === undefined) this.#armPoll();
    return () => {
      if (!this.#tracked.delete(entry)) return;
      this.#release(entry.key);
    };
  }

  close(): void {
    this.#closed = true;
    clearTimeout(this.#pollTimer);
    this.#pollTimer = undefined;
    clearInterval(this.#sweepTimer);
  }

  #armPoll() {
    if (this.#closed) return;
    const timer = setTimeout(() => {
      this.#pollTimer = undefined;
      if (this.#tracked.size === 0) return;
      this.#poll();
      if (this.#tracked.size > 0) this.#armPoll();
    }, POLL_MS);
    Deno.unrefTimer(timer);
    this.#pollTimer = timer;
  }

  /** One request on connection `key` left its handler. */
  #release(key: string) {
    const n = (this.#busy.get(key) ?? 1) - 1;
    if (n > 0) {
      this.#busy.set(key, n);
      return;
    }
    this.#busy.delete(key);
    this.#idleSince.set(key, Date.now());
  }

  #poll() {
    // A tracked connection seen before is asked through its descriptor (three system calls); the
    // process's descriptors are listed only for one not seen yet, or whose descriptor now holds
    // another connection (or none).
    let scanned: Map<string, number> | undefined;
    for (const t of [...this.#tracked]) {
      let state = this.#stateOf(t.key);
      if (state === undefined) {
        scanned ??= new Map(this.#connections().map((c) => [c.key, c.state]));
        state = scanned.get(t.key);
      }
      if (state === ESTABLISHED) continue;
      this.#tracked.delete(t);
      this.#release(t.key);
      t.gone();
    }
  }

  /** The TCP state of connection `key` through its last known descriptor; undefined if unknown. */
  #stateOf(key: string): number | undefined {
    const fd = this.#fds.get(key);
    if (fd === undefined) return undefined;
    const c = this.#connection(fd);
    if (c?.key === key) return c.state;
    this.#fds.delete(key);
    return undefined;
  }

  #sweep() {
    const now = Date.now();
    const busy = this.#busy;
    const seen = new Set<string>();
    for (const c of this.#connections()) {
      seen.add(c.key);
      if (busy.has(c.key)) continue;
      const since = this.#idleSince.get(c.key) ?? now;
      this.#idleSince.set(c.key, since);
      // Shut down, not closed: the descriptor stays Deno's to close.
      if (now - since >= this.#idleMs && this.#libc.shutdown(c.fd, 2) === 0) this.reaped++;
    }
    for (const key of [...this.#idleSince.keys()]) if (!seen.has(key)) this.#idleSince.delete(key);
  }

  /**
   * This listener's accepted connections, from the process's own socket descriptors (remembered by
   * key for {@link #stateOf}).
   */
  #connections(): Connection[] {
    const out: Connection[] = [];
    this.#fds.clear();
    for (const entry of Deno.readDirSync("/proc/self/fd")) {
      // No readlink to tell sockets apart: getsockname fails at once on anything else (ENOTSOCK,
      // or EBADF for a descriptor closed meanwhile), and a readlink per descriptor and poll cost
      // more than the rest of the poll (a model server holds dozens of descriptors).
      const c = this.#connection(Number(entry.name));
      if (!c) continue;
      this.#fds.set(c.key, c.fd);
      out.push(c);
    }
    return out;
  }

  /** The accepted connection of this listener on descriptor `fd`, if that is one. */
  #connection(fd: number): Connection | undefined {
    const local = this.#address(fd, "getsockname");
    if (!local || local.port !== this.#port) return undefined;
    const remote = this.#address(fd, "getpeername");
    if (!remote) return undefined; // the listener (no peer)
    this.#len[0] = this.#info.length;
    if (this.#libc.getsockopt(fd, IPPROTO_TCP, TCP_INFO, this.#info, this.#lenArg) !== 0) return undefined;
    return { key: addressKey(remote.host, remote.port), state: this.#info[0], fd };
  }

  /** The local or peer address of socket `fd`, or undefined (not a connected IP socket). */
  #address(fd: number, which: "getsockname" | "getpeername"): { host: string; port: number } | undefined {
    this.#len[0] = this.#addr.length;
    if (this.#libc[which](fd, this.#addr, this.#lenArg) !== 0) return undefined;
    const view = new DataView(this.#addr.buffer);
    const family = view.getUint16(0, true);
    const port = view.getUint16(2, false);
    if (family === AF_INET) return { host: [...this.#addr.subarray(4, 8)].join("."), port };
    if (family !== AF_INET6) return undefined;
    const bytes = [...this.#addr.subarray(8, 24)];
    const mapped = bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 && bytes[11] === 255;
    const host = mapped
      ? bytes.slice(12).join(".")
      : bytes.map((b) => b.toString(16).padStart(2, "0")).join("");
    return { host, port };
  }
}

/** One spelling per address: IPv4 (also IPv4-mapped IPv6) dotted, IPv6 as 32 hex digits. */
export function addressKey(host: string, port: number): string {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  if (mapped) return `${mapped[1]}:${port}`;
  if (/^\d+\.\d+\.\d+\.\d+$/.test(h)) return `${h}:${port}`;
  return `${expandIPv6(h)}:${port}`;
}

function expandIPv6(text: string): string {
  if (/^[0-9a-f]{32}$/.test(text)) return text;
  const [head, tail] = text.includes("::") ? text.split("::") : [text, undefined];
  const parts = (s: string | undefined) => (s ? s.split(":") : []);
  const h = parts(head);
  const t = parts(tail);
  const groups = tail === undefined ? h : [...h, ...Array(8 - h.length - t.length).fill("0"), ...t];
  return groups.map((g) => g.padStart(4, "0")).join("");
}
