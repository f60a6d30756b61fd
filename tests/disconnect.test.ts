/** Client disconnects free the chat sequence at once (a server with a single sequence). */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const server = await startServer(["--api-key", KEY, "--parallel", "1"], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = `${server.url}/v1/chat/completions`;
const long = { model: MODEL, messages: [{ role: "user", content: "Go on" }], max_tokens: 4000, seed: 1 };

async function nextRequestSucceeds() {
  // With one sequence, this waits forever unless the cancelled generation freed it.
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ ...long, max_tokens: 3 }),
    signal: AbortSignal.timeout(20_000),
  });
  assert.equal(res.status, 200);
  assert.equal((await res.json()).usage.completion_tokens, 3);
}

serverTest("a stream cancelled mid-way frees its sequence and is logged", async () => {
  const controller = new AbortController();
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ ...long, stream: true }),
    signal: controller.signal,
  });
  const reader = res.body!.getReader();
  for (let got = 0; got < 5;) if ((await reader.read()).value) got++;
  controller.abort();
  await reader.cancel().catch(() => {});
  await nextRequestSucceeds();
  assert.ok(server.logs.some((l) => l.includes('"msg":"stream cancelled"')), "the cancellation is logged");
});

serverTest("an aborted non-stream request frees its sequence", async () => {
  const controller = new AbortController();
  const pending = fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify(long),
    signal: controller.signal,
  }).catch(() => null);
  await new Promise((r) => setTimeout(r, 500));
  controller.abort();
  await pending;
  await nextRequestSucceeds();
});

serverTest("requests beyond the sequences wait their turn and all complete", async () => {
  const results = await Promise.all(
    [1, 2, 3].map((seed) => postJson(url, { ...long, max_tokens: 4, seed }, KEY)),
  );
  assert.deepEqual(results.map((r) => r.status), [200, 200, 200]);
});
