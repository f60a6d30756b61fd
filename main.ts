/**
 * CLI entry. On glibc it first starts itself again with a limit on malloc's arenas
 * (`src/malloc_arenas.ts`), before anything else is loaded; then runs the command line
 * (`src/cli.ts`: settings, registry, server, signals).
 */
import { restartWithArenaLimit } from "./src/malloc_arenas.ts";

if (import.meta.main) {
  restartWithArenaLimit();
  const { main } = await import("./src/cli.ts");
  const code = await main();
  if (code !== 0) Deno.exit(code);
}
