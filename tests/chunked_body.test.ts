/**
 * A chunked request body that Deno's HTTP parser stops reading (chunks of 64 KB or more: it refuses
 * the rest after 4 MB) is a 400 naming why, not a 499 "client closed request": the client is still
 * there and reads the answer.
 */
import assert from "node:assert/strict";
import { startServer, writeJsonFile } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const registry = await writeJsonFile({
  models: [{ id: "chat", kind: "chat", source: "builtin:tiny-chat", contextSize: 1024, parallel: 1 }],
});

serverTest(
  "a chunked body in 64 KB chunks that the HTTP parser refuses is a 400 the client reads",
  async () => {
    const server = await startServer(["--api-key", "k", "--models", registry]);
    const enc = new TextEncoder();
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(server.url).port) });
    try {
      await conn.write(enc.encode(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n" +
          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
      ));
      const buf = new Uint8Array(8192);
      let answer = "";
      const reading = conn.read(buf).then((
        n,
      ) => (answer = n ? new TextDecoder().decode(buf.subarray(0, n)) : ""));
      const chunk = "[".repeat(65536);
      const frame = enc.encode(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
      // Under the 8 MB body limit: 100 frames are 6.5 MB.
      for (let i = 0; i < 100 && !answer; i++) {
        try {
          await conn.write(frame);
        } catch {
          break; // the server answered and closed
        }
      }
      await reading;
      assert.match(answer, /^HTTP\/1\.1 400 /);
      assert.match(answer, /"code":"invalid_body"/);
    } finally {
      conn.close();
      await server.stop();
    }
  },
);
