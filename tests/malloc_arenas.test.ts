/**
 * The malloc arena limit (src/malloc_arenas.ts), through real server processes: the server runs
 * with `MALLOC_ARENA_MAX` in the process it was started as, keeps an operator's own value, and
 * schema-constrained requests (a grammar's full masks, on the FFI pool's threads) leave its memory
 * bounded.
 */
import assert from "node:assert/strict";
import { postJson, startServer, type TestServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

/** The process's environment as the kernel holds it (what glibc read at start). */
function environOf(server: TestServer): string[] {
  return new TextDecoder().decode(Deno.readFileSync(`/proc/${server.pid}/environ`)).split("\0");
}

function residentMiB(server: TestServer): number {
  const status = Deno.readTextFileSync(`/proc/${server.pid}/status`);
  return Number(status.match(/VmRSS:\s+(\d+) kB/)![1]) / 1024;
}

const linux = Deno.build.os === "linux";

serverTest("the server runs with MALLOC_ARENA_MAX=2, in the process it was started as", async () => {
  if (!linux) return;
  const server = await startServer(["--models", await writeJsonFile({ models: [] })]);
  try {
    assert.ok(environOf(server).includes("MALLOC_ARENA_MAX=2"), "started again with the limit");
    // The process id the server was started as answers (execve keeps it): systemd's main process.
    const health = await fetch(`${server.url}/health`);
    await health.body?.cancel();
    assert.equal(health.status, 200);
    const cmdline = new TextDecoder().decode(Deno.readFileSync(`/proc/${server.pid}/cmdline`));
    assert.ok(cmdline.includes("main.ts\0--port\0"), "the same arguments");
    // Named after its executable, as before the restart (`ps -C deno`, `pgrep deno`).
    const comm = Deno.readTextFileSync(`/proc/${server.pid}/comm`).trim();
    assert.equal(comm, Deno.execPath().split("/").at(-1)!.slice(0, 15));
  } finally {
    await server.stop();
  }
});

serverTest("an operator's MALLOC_ARENA_MAX is kept (no second start)", async () => {
  if (!linux) return;
  const server = await startServer(["--models", await writeJsonFile({ models: [] })], {
    env: { MALLOC_ARENA_MAX: "5" },
  });
  try {
    const env = environOf(server);
    assert.ok(env.includes("MALLOC_ARENA_MAX=5"));
    assert.ok(!env.includes("MALLOC_ARENA_MAX=2"));
  } finally {
    await server.stop();
  }
});

serverTest(
  "no second restart once restarted (secure mode may drop MALLOC_ARENA_MAX); the log says so",
  async () => {
    if (!linux) return;
    const server = await startServer(["--models", await writeJsonFile({ models: [] })], {
      env: { VSERVE_ARENA_RESTART: "1" },
    });
    try {
      assert.ok(!environOf(server).some((e) => e.startsWith("MALLOC_ARENA_MAX=")));
      assert.ok(server.logs.some((l) => l.includes("malloc arenas are not limited")));
    } finally {
      await server.stop();
    }
  },
);

serverTest("schema-constrained requests leave the process's memory bounded", async () => {
  if (!linux) return;
  const registry = await writeJsonFile({
    models: [{ id: "c", kind: "chat", source: "builtin:tiny-chat", contextSize: 4096, parallel: 4 }],
  });
  const server = await startServer(["--models", registry], { waitReady: true });
  try {
    const ask = (format: unknown) =>
      postJson(`${server.url}/v1/chat/completions`, {
        model: "c",
        messages: [{ role: "user", content: "give json" }],
        max_tokens: 20,
        ...(format ? { response_format: format } : {}),
      });
    for (const r of await Promise.all([0, 1, 2, 3].map(() => ask(undefined)))) assert.equal(r.status, 200);
    const before = residentMiB(server);
    // Each token drawn under the free-JSON grammar may need a full mask of the 151k-token vocabulary:
    // llama.cpp allocates ~20 MiB for it, on whichever thread of the FFI pool runs the call.
    for (let round = 0; round < 3; round++) {
      const answers = await Promise.all([0, 1, 2, 3].map(() => ask({ type: "json_object" })));
      for (const r of answers) assert.equal(r.status, 200);
    }
    const grown = residentMiB(server) - before;
    // With glibc's default (8 arenas a core) 300-450 MiB stayed resident on a 2-core machine; with 2
    // arenas ~100-130 (the output check's worker and the grammars' caches included).
    assert.ok(grown < 220, `resident memory grew by ${grown.toFixed(0)} MiB`);
  } finally {
    await server.stop();
  }
});
