/** Client disconnects free the chat sequence at once (a server with a single sequence). */
import assert from "node:assert/strict";
import { postJson, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";
import { SseReader } from "./helpers/sse.ts";
import { engineCounter } from "./helpers/metrics.ts";
import { poll } from "./helpers/poll.ts";

const KEY = "test-key";
const MODEL = "Vendor/Vendor3.6-35B-A3B";
const server = await startServer(["--api-key", KEY, "--parallel", "1"], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = `${server.url}/v1/chat/completions`;
// The end tokens banned: the generation runs to max_tokens unless it is cancelled.
const long = {
  model: MODEL,
  messages: [{ role: "user", content: "Go on" }],
  max_tokens: 4000,
  seed: 1,
  logit_bias: { "151643": -100, "151645": -100 },
};
const generated = () => engineCounter(server.url, "tokens_generated", MODEL);
/** The access-log entry of request `id`, once the request has ended. */
const logged = (id: string) =>
  poll(`request ${id} was logged`, () => {
    const line = server.logs.find((l) => l.includes('"msg":"request"') && l.includes(`"request_id":"${id}"`));
    return line && JSON.parse(line);
  });

/**
 * With one sequence, this waits until the cancelled generation freed it; returns the tokens generated
 * since `before`, less its own 3.
 */
async function nextRequestSucceeds(before: number): Promise<number> {
  const res = await postJson(url, { ...long, max_tokens: 3 }, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.usage.completion_tokens, 3);
  return await generated() - before - 3;
}

serverTest("a stream cancelled mid-way stops generating, frees its sequence and is logged", async () => {
  const before = await generated();
  const stream = await SseReader.open(url, long, { key: KEY });
  await stream.take(5);
  await stream.cancel();
  await poll(
    "the cancellation was logged",
    () => server.logs.some((l) => l.includes('"msg":"stream cancelled"')),
  );
  const cut = await nextRequestSucceeds(before);
  assert.ok(cut >= 3 && cut < long.max_tokens, `${cut} tokens generated before the stream was cut`);
});

serverTest("an aborted non-stream request stops generating and frees its sequence", async () => {
  const before = await generated();
  const id = `abort-${crypto.randomUUID()}`;
  const controller = new AbortController();
  const pending = fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-request-id": id },
    body: JSON.stringify(long),
    signal: controller.signal,
  }).catch(() => null);
  // Leave once generation is under way: 4,000 tokens are far from done by then.
  await poll("generation started", async () => await generated() > before);
  controller.abort();
  assert.equal(await pending, null, "the request did not complete");
  assert.equal((await logged(id)).status, 499, "the request ended as cancelled");
  const cut = await nextRequestSucceeds(before);
  assert.ok(cut > 0 && cut < long.max_tokens, `${cut} tokens generated before the client left`);
});

serverTest("requests beyond the sequences wait their turn and all complete", async () => {
  const results = await Promise.all(
    [1, 2, 3].map((seed) => postJson(url, { ...long, max_tokens: 4, seed }, KEY)),
  );
  assert.deepEqual(results.map((r) => r.status), [200, 200, 200]);
});
