/**
 * Hands memory that native code freed back to the system. glibc's malloc keeps freed blocks in the
 * arena of the thread that allocated them, resident, for reuse; a model load frees a lot at once (a
 * vocabulary-only load of a 151k-token GGUF, ~45 MiB, read to learn the architecture; the parsing
 * buffers of the full load), on FFI worker threads with arenas of their own that later work does not
 * reuse. On the tiny presets that was ~115 MiB of the process's resident memory after start.
 * `malloc_trim(0)` returns the free pages of every arena (glibc 2.8 and later; 0.3-8 ms here).
 */

let trim: (() => Promise<unknown>) | null | undefined;

/** glibc's `malloc_trim`, or null where there is none (macOS, musl, Windows). */
function mallocTrim(): (() => Promise<unknown>) | null {
  if (trim !== undefined) return trim;
  trim = null;
  if (Deno.build.os !== "linux") return trim;
  try {
    const libc = Deno.dlopen("libc.so.6", {
      // Off the JavaScript thread: it walks every arena (and waits for each one's lock).
      malloc_trim: { parameters: ["usize"], result: "i32", nonblocking: true },
    });
    trim = () => libc.symbols.malloc_trim(0n);
  } catch {
    // Not glibc: its allocator returns memory its own way.
  }
  return trim;
}

/**
 * Returns the pages native code has freed to the system, where the C library can (glibc); never
 * throws.
 *
 * @example
 * ```ts
 * await releaseFreedMemory(); // after a model load, say
 * ```
 */
export async function releaseFreedMemory(): Promise<void> {
  try {
    await mallocTrim()?.();
  } catch {
    // Only memory is at stake.
  }
}
