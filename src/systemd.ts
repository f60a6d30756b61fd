/**
 * systemd's service notification protocol (`sd_notify`): `READY=1` once serving, `STATUS=` lines,
 * `STOPPING=1` at shutdown, and `WATCHDOG=1` pings from the main event loop while it is responsive,
 * so that with `WatchdogSec=` systemd restarts a process whose loop is stuck. Datagrams go to the
 * unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace), sent from a
 * socket of our own: no process is started per message.
 */
import type { Logger } from "./log.ts";

/**
 * Notifications to systemd, or nothing when not started by it (no `$NOTIFY_SOCKET`).
 *
 * @example
 * ```ts
 * import type { Logger } from "./log.ts";
 * function ready(log: Logger) {
 *   const notifier = SystemdNotifier.fromEnv(Deno.env.toObject(), log);
 *   notifier?.send("READY=1");
 * }
 * ```
 */
export class SystemdNotifier {
  readonly #socket: Deno.DatagramConn;
  readonly #target: Deno.UnixAddr;
  readonly #log: Logger;
  /** How often to ping the watchdog (half its timeout), when systemd watches this process. */
  readonly watchdogIntervalMs?: number;
  #timer?: ReturnType<typeof setInterval>;
  #failed = false;

  private constructor(socket: Deno.DatagramConn, target: string, log: Logger, watchdogIntervalMs?: number) {
    this.#socket = socket;
    this.#target = { transport: "unixpacket", path: target };
    this.#log = log;
    this.watchdogIntervalMs = watchdogIntervalMs;
  }

  /** A notifier for `$NOTIFY_SOCKET`, or undefined without one (or where it cannot be opened). */
  static fromEnv(env: Record<string, string>, log: Logger): SystemdNotifier | undefined {
    const path = env.NOTIFY_SOCKET;
    if (!path) return undefined;
    const target = path.startsWith("@") ? `\0${path.slice(1)}` : path;
    // `$WATCHDOG_PID`, when set, names the process systemd watches.
    const usec = Number(env.WATCHDOG_USEC);
    const watched = usec > 0 && (!env.WATCHDOG_PID || Number(env.WATCHDOG_PID) === Deno.pid);
    try {
      // Deno sends datagrams from a bound socket: bind one in a private directory and unlink it
      // at once (sending goes on working; nothing is left behind).
      const dir = Deno.makeTempDirSync({ prefix: "vserve-notify-" });
      const socket = Deno.listenDatagram({ transport: "unixpacket", path: `${dir}/s` });
      Deno.removeSync(dir, { recursive: true });
      return new SystemdNotifier(socket, target, log, watched ? Math.max(1, usec / 2000) : undefined);
    } catch (e) {
      log.warn("cannot open a socket to notify systemd", { reason: (e as Error).message });
      return undefined;
    }
  }

  /** Sends one notification (`KEY=value` lines), after those before it; a failure is logged once. */
  send(state: string): void {
    const data = new TextEncoder().encode(state);
    this.#sending = this.#sending.then(() => this.#socket.send(data, this.#target)).then(() => {}, (e) => {
      if (this.#failed) return;
      this.#failed = true;
      this.#log.warn("cannot notify systemd", {
        socket: this.#target.path.replace("\0", "@"),
        reason: (e as Error).message,
      });
    });
  }

  #sending: Promise<void> = Promise.resolve();

  /**
   * Pings the watchdog every {@link watchdogIntervalMs} from a timer of the event loop: a loop
   * that is stuck sends nothing, and systemd restarts the service after `WatchdogSec`.
   */
  startWatchdog(): void {
    if (this.watchdogIntervalMs === undefined || this.#timer !== undefined) return;
    this.send("WATCHDOG=1");
    this.#timer = setInterval(() => this.send("WATCHDOG=1"), this.watchdogIntervalMs);
    Deno.unrefTimer(this.#timer);
  }
}
