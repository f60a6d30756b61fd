/**
 * The V8 flags the server runs with: `deno task start`, the compiled binary (`deno task compile`)
 * and the servers the tests and benchmarks start. V8 reads them once, at start (`--v8-flags` or
 * `DENO_V8_FLAGS`; `node:v8`'s `setFlagsFromString` comes too late for the heap's sizes), so
 * deno.json's start task spells them out as well, and a test checks that the two agree.
 *
 * `--max-semi-space-size=1` (MiB): each isolate's young generation stays at most 3 × 1 MiB, where V8
 * grows it to 3 × 16 MiB after a burst of allocation (a large request body, many streams) and keeps
 * it resident. Short-lived objects are what a server allocates per request and per token; they die
 * young either way, and a scavenge of a small space is shorter.
 *
 * `--single-threaded-gc`: each isolate collects its garbage on its own thread, not with V8's helper
 * threads beside it. Those keep the event loop's priority (compute_priority.ts), while ggml's pool
 * worker runs `--compute-nice` levels below; a short decode on the event loop's thread spins at
 * ggml's barriers until that worker has done its part, so a collection's helpers (in the check
 * worker's 50-90 MB heap, say) took the worker's core and held the loop: on the 2-vCPU EPYC, 35
 * catastrophic-pattern requests on a fresh server (five runs each, alternated) had a worst `/health`
 * probe of 30-52 ms (over 40 ms in 3 of 5, the loop's own CPU held over 50 ms in 2) and of 23-35 ms
 * with the flag (none over 40), V8's helpers using 1.0-1.3 s of CPU against 0.56-0.68 s (what is
 * left is compilation). Over a mixed load the main isolate's longest pause went from 8.0 to 13.1 ms
 * and `/health` stayed alike (worst 17-45 against 29-42 ms); a worker's own pauses grow (to 118 ms in
 * one), which delays its work, not the loop.
 */
export const V8_FLAGS = ["--max-semi-space-size=1", "--single-threaded-gc"] as const;

/** {@link V8_FLAGS} as one `deno run` / `deno compile` argument. */
export const V8_FLAGS_ARG = `--v8-flags=${V8_FLAGS.join(",")}`;
