/** Assertions shared by the HTTP tests. */
import assert from "node:assert/strict";
import type { Json } from "./server.ts";

/** Asserts an OpenAI error body with the given status and (when given) type, param and code. */
export function assertApiError(
  res: { status: number; body: Json },
  status: number,
  expect: { type?: string; param?: string | null; code?: string | null } = {},
): void {
  assert.equal(res.status, status, `status: ${JSON.stringify(res.body)}`);
  const e = res.body?.error;
  assert.ok(e && typeof e === "object", `no error object in ${JSON.stringify(res.body)}`);
  assert.deepEqual(Object.keys(e).sort(), ["code", "message", "param", "type"]);
  assert.equal(typeof e.message, "string");
  assert.ok(e.message.length > 10, "the message explains the fault");
  assert.ok(!/\bat .*\.ts:\d+/.test(e.message), "no stack trace in the body");
  if (expect.type !== undefined) assert.equal(e.type, expect.type);
  if (expect.param !== undefined) assert.equal(e.param, expect.param);
  if (expect.code !== undefined) assert.equal(e.code, expect.code);
}

/**
 * A test against server processes, with Deno's sanitizers on: it must consume every response body,
 * clear its timers and close what it opens. `unsanitized` turns them off, and says why.
 */
export function serverTest(name: string, fn: () => Promise<void>, unsanitized?: { because: string }): void {
  Deno.test({ name, fn, sanitizeOps: !unsanitized, sanitizeResources: !unsanitized });
}
