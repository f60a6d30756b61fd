/**
 * The output-check worker (a Node worker thread, which unlike a web worker need not keep the process
 * alive): checks values against schemas with Ajv on a thread of its own, so that neither compiling a
 * large schema nor a costly check holds the server's event loop (see `SchemaChecker` in
 * schema_check.ts). One message in, one answer out, in order.
 */
import { parentPort } from "node:worker_threads";
import { type CheckResult, validateJson } from "./schema_ajv.ts";

/** A check: the schema as JSON text (its cache key) and the value. */
export interface CheckRequest {
  id: number;
  key: string;
  value: unknown;
}

/** The answer to {@link CheckRequest} `id`, or (first, once) that the worker is ready. */
export type CheckReply = { id: number; result: CheckResult } | { ready: true };

const port = parentPort!;

port.on("message", ({ id, key, value }: CheckRequest) => {
  let result: CheckResult;
  try {
    result = validateJson(key, value);
  } catch (err) {
    result = { ok: false, reason: `the check failed: ${(err as Error).message}` };
  }
  port.postMessage({ id, result } satisfies CheckReply);
});
port.postMessage({ ready: true } satisfies CheckReply);
