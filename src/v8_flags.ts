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
 */
export const V8_FLAGS = ["--max-semi-space-size=1"] as const;

/** {@link V8_FLAGS} as one `deno run` / `deno compile` argument. */
export const V8_FLAGS_ARG = `--v8-flags=${V8_FLAGS.join(",")}`;
