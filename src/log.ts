/** Structured logging: one JSON object per line (or a readable line on a terminal), to stderr. */

export type LogLevel = "debug" | "info" | "warn" | "error";
const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** What the rest of the code logs through; pass it in, never import a global. */
export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

/**
 * A logger writing to `write` (stderr by default).
 *
 * @example
 * ```ts
 * const log = createLogger({ level: "info", format: "json" });
 * log.info("listening", { port: 8080 });
 * ```
 */
export function createLogger(opts: {
  level: LogLevel;
  format: "json" | "pretty";
  write?: (line: string) => void;
}): Logger {
  const encoder = new TextEncoder();
  const write = opts.write ?? ((line: string) => Deno.stderr.writeSync(encoder.encode(line + "\n")));
  const emit = (level: LogLevel, msg: string, fields: Record<string, unknown> = {}) => {
    if (RANK[level] < RANK[opts.level]) return;
    const time = new Date().toISOString();
    if (opts.format === "json") {
      write(JSON.stringify({ time, level, msg, ...fields }));
    } else {
      const extra = Object.entries(fields).map(([k, v]) =>
        `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`
      );
      write(`${time} ${level.toUpperCase().padEnd(5)} ${msg}${extra.length ? " " + extra.join(" ") : ""}`);
    }
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
  };
}

/** A logger that drops everything (unit tests). */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };
