/**
 * The process's life under systemd, through real server processes: the notify protocol (READY=1,
 * WATCHDOG=1 pings while the event loop runs, STOPPING=1) on a fake `$NOTIFY_SOCKET`, and SIGTERM
 * ending a process whose main thread is stuck (frozen through the V8 inspector: no test hook in the
 * server), at the drain deadline or at once on a second signal.
 */
import assert from "node:assert/strict";
import { startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { poll, settles } from "./helpers/poll.ts";

const ROOT = new URL("../", import.meta.url);

/** A fake systemd: a unix datagram socket collecting notifications. */
async function fakeSystemd() {
  const dir = await Deno.makeTempDir();
  const path = `${dir}/notify`;
  const socket = Deno.listenDatagram({ transport: "unixpacket", path });
  const messages: string[] = [];
  const receiving = (async () => {
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
    close: async () => {
      socket.close();
      await receiving;
    },
    registry: async () => {
      const file = `${dir}/models.json`;
      await Deno.writeTextFile(file, JSON.stringify({ models: [] }));
      return file;
    },
  };
}

serverTest("systemd: READY=1 once listening, WATCHDOG=1 pings, STOPPING=1 on SIGTERM, exit 0", async () => {
  const systemd = await fakeSystemd();
  try {
    const server = await startServer(["--no-auth", "--models", await systemd.registry()], {
      env: { NOTIFY_SOCKET: systemd.path, WATCHDOG_USEC: "200000" },
    });
    await poll("three watchdog pings", () => systemd.pings() >= 3, { everyMs: 20 });
    assert.equal((await fetch(`${server.url}/health`).then((r) => r.json())).status, "ok");
    assert.equal(await server.stop("SIGTERM"), 0);
    const states = systemd.states();
    assert.match(states[0], /^READY=1\nSTATUS=listening on port \d+/);
    const stopping = systemd.messages.findIndex((m) => m.startsWith("STOPPING=1"));
    assert.ok(stopping > systemd.messages.indexOf("WATCHDOG=1"), JSON.stringify(systemd.messages));
  } finally {
    await systemd.close();
  }
});

/** The datagram a frozen server sends to the fake systemd just before its main thread stops. */
const FROZEN = "TEST-FROZEN";

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
    /**
     * Runs an endless loop on the server's main thread (through the inspector), after sending
     * {@link FROZEN} to `notify`: the main thread sends nothing after it (every ping it sent is
     * queued before it in the socket), which `frozen` waits for.
     */
    freeze: async (frozen: () => boolean) => {
      const address = await poll("the inspector's address", () => inspector, { everyMs: 20 });
      const ws = new WebSocket(address);
      await new Promise((resolve, reject) => {
        ws.onopen = resolve;
        ws.onerror = reject;
      });
      const expression = `(async () => {
        const dir = Deno.makeTempDirSync();
        const socket = Deno.listenDatagram({ transport: "unixpacket", path: dir + "/s" });
        Deno.removeSync(dir, { recursive: true });
        const target = { transport: "unixpacket", path: ${JSON.stringify(notify)} };
        await socket.send(new TextEncoder().encode(${JSON.stringify(FROZEN)}), target);
        for (;;) {}
      })()`;
      ws.send(JSON.stringify({ id: 1, method: "Runtime.evaluate", params: { expression } }));
      await poll("the main thread is stuck", frozen, { everyMs: 20 });
      return ws;
    },
  };
}

serverTest("a stuck main thread: watchdog pings stop, and SIGTERM still ends the process", async () => {
  const systemd = await fakeSystemd();
  const server = freezableServer(systemd.path, await systemd.registry(), 500);
  let ws: WebSocket | undefined;
  try {
    await poll("pings while the loop runs", () => systemd.pings() >= 2, { everyMs: 20 });
    ws = await server.freeze(() => systemd.messages.includes(FROZEN));
    server.signal("SIGTERM");
    // The guard thread forces the exit at the drain deadline plus its grace (0.5 + 10 s): ten seconds
    // of a stuck loop, in which a watchdog not run by the main thread would have pinged ~100 times.
    assert.equal(await settles("the process exited", server.exited), 1);
    assert.ok(server.logs.some((l) => l.includes("forcing exit")), server.logs.join("\n"));
    const after = systemd.messages.slice(systemd.messages.indexOf(FROZEN) + 1);
    assert.deepEqual(after, [], "the stuck loop sent nothing more (no ping, no STOPPING=1)");
  } finally {
    ws?.close();
    server.kill();
    await server.exited;
    await systemd.close();
  }
});

serverTest("a stuck main thread: a second SIGTERM a second later ends the process at once", async () => {
  const systemd = await fakeSystemd();
  // A drain time far beyond the test's patience: only a second signal can end it in time.
  const server = freezableServer(systemd.path, await systemd.registry(), 600_000);
  let ws: WebSocket | undefined;
  try {
    await poll("pings while the loop runs", () => systemd.pings() >= 1, { everyMs: 20 });
    ws = await server.freeze(() => systemd.messages.includes(FROZEN));
    // A second signal counts when it comes a second or more after the guard heard the first: signal
    // every 1.2 s until the process ends. Each one finds it still running (the first alone waits for
    // the 600 s drain, and so does a signal under a second after it).
    let signals = 0;
    await poll("the process exited", () => {
      if (server.exitCode() !== undefined) return true;
      server.signal("SIGTERM");
      signals++;
    }, { everyMs: 1200 });
    assert.ok(signals >= 2, `${signals} signals`);
    assert.equal(server.exitCode(), 1);
    assert.ok(server.logs.some((l) => l.includes("second signal: forcing exit")), server.logs.join("\n"));
    assert.ok(!server.logs.some((l) => l.includes("did not exit in time")), "not at the drain deadline");
  } finally {
    ws?.close();
    server.kill();
    await server.exited;
    await systemd.close();
  }
});
