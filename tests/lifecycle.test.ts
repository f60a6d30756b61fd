/**
 * The process's life under systemd, through real server processes: the notify protocol (READY=1,
 * WATCHDOG=1 pings while the event loop runs, STOPPING=1) on a fake `$NOTIFY_SOCKET`, and SIGTERM
 * ending a process whose main thread is stuck (frozen through the V8 inspector: no test hook in the
 * server), at the drain deadline or at once on a second signal.
 */
import assert from "node:assert/strict";
import { startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const ROOT = new URL("../", import.meta.url);

/** A fake systemd: a unix datagram socket collecting notifications. */
async function fakeSystemd() {
  const dir = await Deno.makeTempDir();
  const path = `${dir}/notify`;
  const socket = Deno.listenDatagram({ transport: "unixpacket", path });
  const messages: string[] = [];
  (async () => {
    try {
      for (;;) messages.push(new TextDecoder().decode((await socket.receive())[0]));
    } catch { /* closed */ }
  })();
  return {
    path,
    messages,
    /** Watchdog pings so far. */
    pings: () => messages.filter((m) => m === "WATCHDOG=1").length,
    /** The notifications other than pings. */
    states: () => messages.filter((m) => m !== "WATCHDOG=1"),
    close: () => socket.close(),
    registry: async () => {
      const file = `${dir}/models.json`;
      await Deno.writeTextFile(file, JSON.stringify({ models: [] }));
      return file;
    },
  };
}

async function until(check: () => boolean, timeoutMs = 30_000): Promise<boolean> {
  const end = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > end) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

serverTest("systemd: READY=1 once listening, WATCHDOG=1 pings, STOPPING=1 on SIGTERM, exit 0", async () => {
  const systemd = await fakeSystemd();
  try {
    const server = await startServer(["--no-auth", "--models", await systemd.registry()], {
      env: { NOTIFY_SOCKET: systemd.path, WATCHDOG_USEC: "200000" },
    });
    assert.ok(await until(() => systemd.pings() >= 3), `pings: ${JSON.stringify(systemd.messages)}`);
    assert.equal((await fetch(`${server.url}/health`).then((r) => r.json())).status, "ok");
    assert.equal(await server.stop("SIGTERM"), 0);
    const states = systemd.states();
    assert.match(states[0], /^READY=1\nSTATUS=listening on port \d+/);
    const stopping = systemd.messages.findIndex((m) => m.startsWith("STOPPING=1"));
    assert.ok(stopping > systemd.messages.indexOf("WATCHDOG=1"), JSON.stringify(systemd.messages));
  } finally {
    systemd.close();
  }
});

/** A server (no models) started with the V8 inspector, whose main thread the test can freeze. */
function freezableServer(notify: string, registry: string, drainMs: number) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      "--inspect=127.0.0.1:0",
      "main.ts",
      ...["--port", "0", "--log-format", "json", "--no-auth", "--models", registry],
      ...["--drain-timeout-ms", String(drainMs)],
    ],
    cwd: ROOT,
    env: { NOTIFY_SOCKET: notify, WATCHDOG_USEC: "200000", NO_COLOR: "1" },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const logs: string[] = [];
  let inspector = "";
  const pump = (async () => {
    for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) {
      logs.push(...text.split("\n"));
      inspector ||= /ws:\/\/\S+/.exec(text)?.[0] ?? "";
    }
  })();
  let exitCode: number | undefined;
  const exited = child.status.then(async (s) => {
    await pump;
    exitCode = s.code;
    return s.code;
  });
  return {
    logs,
    exited,
    exitCode: () => exitCode,
    signal: (s: Deno.Signal) => child.kill(s),
    kill: () => {
      try {
        child.kill("SIGKILL");
      } catch { /* gone */ }
    },
    /** Runs an endless loop on the server's main thread (through the inspector). */
    freeze: async () => {
      assert.ok(await until(() => inspector !== ""), "the inspector's address");
      const ws = new WebSocket(inspector);
      await new Promise((resolve, reject) => {
        ws.onopen = resolve;
        ws.onerror = reject;
      });
      ws.send(JSON.stringify({ id: 1, method: "Runtime.evaluate", params: { expression: "for (;;) {}" } }));
      return ws;
    },
  };
}

serverTest("a stuck main thread: watchdog pings stop, and SIGTERM still ends the process", async () => {
  const systemd = await fakeSystemd();
  const server = freezableServer(systemd.path, await systemd.registry(), 500);
  let ws: WebSocket | undefined;
  try {
    assert.ok(await until(() => systemd.pings() >= 2), "pings while the loop runs");
    ws = await server.freeze();
    // Pings in flight may still land; then none.
    await new Promise((r) => setTimeout(r, 600));
    const frozen = systemd.pings();
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(systemd.pings(), frozen, "no pings from a stuck loop");
    server.signal("SIGTERM");
    // The guard thread forces the exit at the drain deadline plus its grace (0.5 + 10 s).
    assert.ok(await until(() => server.exitCode() !== undefined, 60_000), "the process exited");
    assert.equal(server.exitCode(), 1);
    assert.ok(server.logs.some((l) => l.includes("forcing exit")), server.logs.join("\n"));
    assert.ok(!systemd.states().some((m) => m.startsWith("STOPPING=1")), "the stuck loop sent nothing more");
  } finally {
    ws?.close();
    server.kill();
    await server.exited;
    systemd.close();
  }
});

serverTest("a stuck main thread: a second SIGTERM a second later ends the process at once", async () => {
  const systemd = await fakeSystemd();
  // A drain time far beyond the test's patience: only the second signal can end it in time.
  const server = freezableServer(systemd.path, await systemd.registry(), 600_000);
  let ws: WebSocket | undefined;
  try {
    assert.ok(await until(() => systemd.pings() >= 1), "pings while the loop runs");
    ws = await server.freeze();
    await new Promise((r) => setTimeout(r, 300));
    server.signal("SIGTERM");
    await new Promise((r) => setTimeout(r, 1300));
    assert.equal(server.exitCode(), undefined, "the first signal alone waits for the drain");
    server.signal("SIGTERM");
    assert.ok(await until(() => server.exitCode() !== undefined, 30_000), "the process exited");
    assert.equal(server.exitCode(), 1);
    assert.ok(server.logs.some((l) => l.includes("second signal: forcing exit")), server.logs.join("\n"));
  } finally {
    ws?.close();
    server.kill();
    await server.exited;
    systemd.close();
  }
});
