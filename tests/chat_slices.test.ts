/**
 * A request's tool schemas are measured in slices: 20,000 tools (~150 ms of measuring here) leave
 * the event loop turns between them. Asserted by order: a timer set before the measuring fires
 * before it ends (it could not while the measuring ran in one block).
 */
import assert from "node:assert/strict";
import { toJob } from "../src/services/chat.ts";
import type { ChatRequest } from "../src/protocol/chat.ts";

Deno.test("toJob measures 20,000 tool schemas with turns of the event loop between them", async () => {
  const tools = Array.from({ length: 20_000 }, (_, i) => ({
    type: "function" as const,
    function: {
      name: `tool_${i}`,
      parameters: {
        type: "object",
        properties: { a: { type: "string" }, b: { type: "integer" } },
        required: ["a"],
      },
    },
  }));
  const req = { model: "m", messages: [{ role: "user", content: "hi" }], tools } as unknown as ChatRequest;
  let fired = false;
  const timer = setTimeout(() => (fired = true), 0);
  const job = await toJob(req);
  clearTimeout(timer);
  assert.equal(job.tools?.length, 20_000);
  assert.ok(fired, "a timer set before ran while the schemas were measured");
});
