/**
 * A limit on glibc's malloc arenas, set by starting the process again with `MALLOC_ARENA_MAX`.
 *
 * glibc gives a thread that allocates an arena of its own, up to 8 per core, and keeps what a thread
 * freed in that thread's arena, resident, for that arena's reuse. The FFI calls that run off the event
 * loop go to whichever thread of the runtime's pool is free, so native work that allocates and frees
 * much spreads over all of them: a grammar masking the whole vocabulary (llama.cpp decodes each of
 * the 151k candidates into a vector of its own, ~20 MiB a call) left that much resident in each of
 * up to 16 arenas on 2 cores. Twelve schema-constrained requests on tiny-chat took the process from
 * 200 to 590-700 MiB; with 2 arenas to 300-330 (peak 330-365), and the requests were no slower.
 *
 * glibc reads the limit only as the process starts, and the runtime's threads have made their
 * arenas before any of our code runs (`mallopt` then changed nothing measurable), so the server
 * starts itself again, the same executable with the same arguments and environment plus
 * `MALLOC_ARENA_MAX`, before it loads anything else (`execve`: same process id, ~50 ms). Not where
 * `MALLOC_ARENA_MAX` is already set (choose another limit that way; then there is no second start),
 * not under a debugger (`--inspect*`), not without the permission to read `/proc/self` (`--allow-all`),
 * and not where the C library is not glibc; the start-up log says so ({@link arenaLimitMissing}).
 */

/** The arenas the server runs with unless `MALLOC_ARENA_MAX` says otherwise. */
export const ARENA_LIMIT = 2;

/**
 * Set in the restarted process's environment: there is no second restart even where the C library
 * drops `MALLOC_ARENA_MAX` (a binary given capabilities runs in glibc's secure mode).
 */
const RESTARTED = "VSERVE_ARENA_RESTART";

const NUL = 0;

/**
 * Starts the process again with `MALLOC_ARENA_MAX` set when it should (see the module's note);
 * returns when it does not, or when it cannot.
 *
 * @example
 * ```ts
 * async function entry() {
 *   restartWithArenaLimit(); // first thing, before the server's modules are loaded
 *   await import("./cli.ts");
 * }
 * ```
 */
export function restartWithArenaLimit(): void {
  if (Deno.build.os !== "linux") return;
  let args: Uint8Array[];
  let env: Uint8Array[];
  try {
    if (Deno.env.get("MALLOC_ARENA_MAX") !== undefined || Deno.env.get(RESTARTED) !== undefined) return;
    // The arguments and environment as the process got them, byte for byte.
    args = split(Deno.readFileSync("/proc/self/cmdline"));
    env = split(Deno.readFileSync("/proc/self/environ"));
  } catch {
    return;
  }
  const text = new TextDecoder();
  if (args.length === 0 || args.some((a) => text.decode(a).startsWith("--inspect"))) return;
  let libc;
  try {
    libc = Deno.dlopen("libc.so.6", {
      // Not called: bound so that the open fails where the C library is not glibc.
      gnu_get_libc_version: { parameters: [], result: "pointer" },
      execve: { parameters: ["buffer", "buffer", "buffer"], result: "i32" },
    });
  } catch {
    return; // not glibc
  }
  const encode = (s: string) => new TextEncoder().encode(s + "\0");
  const argv = args.map((a) => withNul(a));
  const envp = [
    ...env.map((e) => withNul(e)),
    encode(`MALLOC_ARENA_MAX=${ARENA_LIMIT}`),
    encode(`${RESTARTED}=1`),
  ];
  // Returns only when it failed: the process then goes on with glibc's default (logged at start).
  // By its path, not /proc/self/exe: the kernel names the process after the file it executed, and
  // `ps -C deno`, `pgrep deno` and `killall` go by that name ("exe" otherwise).
  libc.symbols.execve(encode(Deno.execPath()), pointers(argv), pointers(envp));
  libc.close();
}

/**
 * Why the process runs without the arena limit, or null when it has one (or is not on Linux):
 * for the start-up log.
 *
 * @example
 * ```ts
 * const why = arenaLimitMissing(); // null after restartWithArenaLimit() restarted the process
 * ```
 */
export function arenaLimitMissing(): string | null {
  if (Deno.build.os !== "linux") return null;
  try {
    if (Deno.env.get("MALLOC_ARENA_MAX") !== undefined) return null;
  } catch {
    return "the environment cannot be read (--allow-env)";
  }
  return "MALLOC_ARENA_MAX is not set and the restart that sets it did not happen (under --inspect, " +
    "without --allow-all, or not glibc): native memory freed on many threads may stay resident";
}

/** The NUL-separated strings of a `/proc` file. */
function split(bytes: Uint8Array): Uint8Array[] {
  const out: Uint8Array[] = [];
  let start = 0;
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] !== NUL) continue;
    out.push(bytes.subarray(start, i));
    start = i + 1;
  }
  if (start < bytes.length) out.push(bytes.subarray(start));
  return out;
}

function withNul(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** A NULL-terminated array of pointers to `strings` (which must outlive its use). */
function pointers(strings: Uint8Array[]): BigUint64Array {
  const out = new BigUint64Array(strings.length + 1);
  strings.forEach((s, i) => out[i] = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(s))));
  return out;
}
