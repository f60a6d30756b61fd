/**
 * SIGTERM always ends the process. The main thread drains and exits on a signal; if it is stuck (a
 * native call that never returns, a loop of our own), its signal handler never runs. The exit guard
 * is a worker thread that hears the same signals and, at the drain deadline plus a grace period
 * after the first one, or on a second one a second or more later, ends the process itself (exit
 * code 1). While the main thread works it does nothing.
 */
import type { LogLevel } from "./log.ts";
import type { GuardRequest } from "./exit_guard_worker.ts";

/** Time after the drain deadline for aborting requests and unloading models before a forced exit. */
export const EXIT_GRACE_MS = 10_000;

/**
 * Starts the guard thread.
 *
 * @example
 * ```ts
 * const guard = startExitGuard({ drainMs: 30_000, log: { level: "info", format: "json" } });
 * ```
 */
export function startExitGuard(opts: {
  drainMs: number;
  log: { level: LogLevel; format: "json" | "pretty" };
}): Worker {
  const worker = new Worker(new URL("./exit_guard_worker.ts", import.meta.url), { type: "module" });
  const request: GuardRequest = { type: "start", deadlineMs: opts.drainMs + EXIT_GRACE_MS, log: opts.log };
  worker.postMessage(request);
  return worker;
}
