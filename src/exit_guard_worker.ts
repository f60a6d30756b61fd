/**
 * The exit guard's thread (see `exit_guard.ts`): it hears SIGTERM and SIGINT itself, so it ends the
 * process when the main thread cannot: at the deadline after the first signal, or at once on a
 * second, deliberate one. Its messages: {@link GuardRequest}.
 */
import { createLogger, type LogLevel } from "./log.ts";

/** What the main thread tells the guard. */
export type GuardRequest = {
  type: "start";
  /** Time from the first signal to a forced exit. */
  deadlineMs: number;
  log: { level: LogLevel; format: "json" | "pretty" };
};

const scope = globalThis as unknown as { onmessage: ((e: MessageEvent<GuardRequest>) => void) | null };

scope.onmessage = ({ data }) => {
  const log = createLogger(data.log);
  let first = 0;
  const onSignal = (signal: Deno.Signal) => {
    const now = performance.now();
    if (!first) {
      first = now;
      setTimeout(() => {
        log.error("the process did not exit in time after the signal: forcing exit", {
          signal,
          deadline_ms: data.deadlineMs,
        });
        forceExit();
      }, data.deadlineMs);
      return;
    }
    // `deno task` and terminals deliver one Ctrl-C twice: only a later second signal counts.
    if (now - first < 1000) return;
    log.error("second signal: forcing exit", { signal });
    forceExit();
  };
  for (const signal of ["SIGTERM", "SIGINT"] as const) Deno.addSignalListener(signal, () => onSignal(signal));
};

/**
 * Ends the process from this thread, whatever the main thread is doing: `_exit(1)` (a worker's own
 * `Deno.exit` ends only the worker), else SIGKILL to itself.
 */
function forceExit(): never {
  try {
    const libc = Deno.dlopen(Deno.build.os === "darwin" ? "libSystem.dylib" : "libc.so.6", {
      _exit: { parameters: ["i32"], result: "void" },
    });
    libc.symbols._exit(1);
  } catch {
    // no libc to bind
  }
  Deno.kill(Deno.pid, "SIGKILL");
  throw new Error("unreachable");
}
