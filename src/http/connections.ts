/**
 * Watches the server's TCP connections through the kernel's table (`/proc/net/tcp{,6}`), for two
 * things `Deno.serve` does not do by itself in Deno 2.9:
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
 * Linux only; elsewhere `ConnectionWatch.open` returns null and both features are off.
 */

/** A request in a handler, by the client's address. */
interface Tracked {
  key: string;
  gone: () => void;
}

/** How often to look for gone clients while requests are running. */
const POLL_MS = 250;
const ESTABLISHED = "01";

/** The kernel's view of the server's connections, polled. */
export class ConnectionWatch {
  readonly #port: number;
  readonly #idleMs: number;
  readonly #shutdown: (fd: number) => number;
  readonly #tracked = new Set<Tracked>();
  /** Connection key → when it last had no request in a handler (or was first seen). */
  readonly #idleSince = new Map<string, number>();
  #pollTimer?: ReturnType<typeof setInterval>;
  #sweepTimer?: ReturnType<typeof setInterval>;
  /** Connections shut down for idleness, for metrics and tests. */
  reaped = 0;

  private constructor(port: number, idleMs: number, shutdown: (fd: number) => number) {
    this.#port = port;
    this.#idleMs = idleMs;
    this.#shutdown = shutdown;
  }

  /**
   * Starts watching the connections of the listener on `port`; null where the kernel table or
   * libc is not available.
   *
   * @example
   * ```ts
   * const watch = ConnectionWatch.open(8080, 60_000);
   * const untrack = watch?.track(info.remoteAddr, () => controller.abort());
   * ```
   */
  static open(port: number, idleMs: number): ConnectionWatch | null {
    try {
      Deno.readTextFileSync("/proc/net/tcp");
      const libc = Deno.dlopen("libc.so.6", { shutdown: { parameters: ["i32", "i32"], result: "i32" } });
      const watch = new ConnectionWatch(port, idleMs, (fd) => libc.symbols.shutdown(fd, 2));
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
    this.#idleSince.delete(entry.key);
    if (this.#pollTimer === undefined) {
      const timer = setInterval(() => this.#poll(), POLL_MS);
      Deno.unrefTimer(timer);
      this.#pollTimer = timer;
    }
    return () => {
      if (!this.#tracked.delete(entry)) return;
      if (![...this.#tracked].some((t) => t.key === entry.key)) this.#idleSince.set(entry.key, Date.now());
      if (this.#tracked.size === 0) this.#stopPoll();
    };
  }

  close(): void {
    this.#stopPoll();
    clearInterval(this.#sweepTimer);
  }

  #stopPoll() {
    clearInterval(this.#pollTimer);
    this.#pollTimer = undefined;
  }

  #poll() {
    const live = new Set(this.#connections().filter((c) => c.state === ESTABLISHED).map((c) => c.key));
    for (const t of [...this.#tracked]) {
      if (live.has(t.key)) continue;
      this.#tracked.delete(t);
      t.gone();
    }
    if (this.#tracked.size === 0) this.#stopPoll();
  }

  #sweep() {
    const now = Date.now();
    const busy = new Set([...this.#tracked].map((t) => t.key));
    const seen = new Set<string>();
    const stale: string[] = [];
    for (const c of this.#connections()) {
      seen.add(c.key);
      if (busy.has(c.key)) continue;
      const since = this.#idleSince.get(c.key) ?? now;
      this.#idleSince.set(c.key, since);
      if (now - since >= this.#idleMs) stale.push(c.inode);
    }
    for (const key of [...this.#idleSince.keys()]) if (!seen.has(key)) this.#idleSince.delete(key);
    if (stale.length > 0) this.#reap(new Set(stale));
  }

  /** Shuts down the sockets with these inodes (the descriptors stay Deno's to close). */
  #reap(inodes: Set<string>) {
    for (const entry of Deno.readDirSync("/proc/self/fd")) {
      let target = "";
      try {
        target = Deno.readLinkSync(`/proc/self/fd/${entry.name}`);
      } catch {
        continue;
      }
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (inode && inodes.has(inode) && this.#shutdown(Number(entry.name)) === 0) this.reaped++;
    }
  }

  /** This listener's accepted connections, from both kernel tables. */
  #connections(): { key: string; state: string; inode: string }[] {
    const out: { key: string; state: string; inode: string }[] = [];
    for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
      let text = "";
      try {
        text = Deno.readTextFileSync(file);
      } catch {
        continue;
      }
      for (const line of text.split("\n").slice(1)) {
        const f = line.trim().split(/\s+/);
        if (f.length < 10) continue;
        const [, localPort] = f[1].split(":");
        if (parseInt(localPort, 16) !== this.#port) continue;
        const [remoteHex, remotePort] = f[2].split(":");
        if (parseInt(remotePort, 16) === 0 || f[9] === "0") continue; // the listener; TIME_WAIT
        out.push({
          key: addressKey(kernelAddress(remoteHex), parseInt(remotePort, 16)),
          state: f[3],
          inode: f[9],
        });
      }
    }
    return out;
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

/** The kernel's hex address (little-endian 32-bit words) as text. */
export function kernelAddress(hex: string): string {
  const words = hex.match(/.{8}/g) ?? [];
  const bytes = words.flatMap((w) => [6, 4, 2, 0].map((i) => parseInt(w.slice(i, i + 2), 16)));
  if (bytes.length === 4) return bytes.join(".");
  const mapped = bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 && bytes[11] === 255;
  if (mapped) return bytes.slice(12).join(".");
  return bytes.map((b) => b.toString(16).padStart(2, "0")).join("");
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
