/**
 * The start of the server, through a real process: it listens (and answers `/health`) while models
 * load, so loading must not hold its event loop. The ONNX models' tokenizer was built on the
 * server's thread (0.3-0.4 s of parsing and building Qwen3's 11 MB `tokenizer.json`) and the
 * hybrid chat model's vocabulary-only probe was freed there (37-44 ms).
 */
import assert from "node:assert/strict";
import { startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const ROOT = new URL("../", import.meta.url);

serverTest(
  "loading the ONNX embedding model and a hybrid chat model holds the event loop under 50 ms",
  async () => {
    const builtin = JSON.parse(await Deno.readTextFile(new URL("models/models.json", ROOT))).models;
    const dir = await Deno.makeTempDir();
    const registry = `${dir}/models.json`;
    await Deno.writeTextFile(
      registry,
      JSON.stringify({
        models: builtin.filter((m: { id: string }) =>
          m.id === "vserve/tiny-embed-onnx" || m.id === "Vendor/Vendor3.6-35B-A3B"
        ),
      }),
    );
    const server = await startServer(["--no-auth", "--models", registry], { waitReady: true });
    try {
      // The monitor's ticks from its start to now: each one's CPU time of the JavaScript thread.
      const text = await (await fetch(`${server.url}/metrics`)).text();
      const read = (series: string) => {
        const line = text.split("\n").find((l) => l.startsWith(series));
        assert.ok(line, `no ${series} in /metrics`);
        return Number(line.split(" ").at(-1));
      };
      const ticks = read("vserve_event_loop_stall_seconds_count");
      const over50ms = ticks - read('vserve_event_loop_stall_seconds_bucket{le="0.05"}');
      assert.ok(ticks > 0);
      assert.equal(over50ms, 0, `${over50ms} of ${ticks} ticks found the thread busy over 50 ms:\n${text}`);
      // And the engine tokenizes (on its worker) as before.
      const res = await fetch(`${server.url}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "vserve/tiny-embed-onnx", content: "hello<|im_end|> world" }),
      });
      const body = await res.json();
      assert.equal(res.status, 200, JSON.stringify(body));
      assert.ok(body.tokens.length > 3 && !body.tokens.includes(151645), JSON.stringify(body));
    } finally {
      await server.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
);
