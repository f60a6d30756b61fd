/**
 * The output-check worker: checks values against schemas with Ajv on a thread of its own, so that
 * neither compiling a large schema nor a costly check holds the server's event loop (see
 * `SchemaChecker` in schema_check.ts). One message in, one answer out, in order.
 *
 * Each check runs under a time limit of its own (`node:vm`'s `timeout`: V8 stops the script, a
 * catastrophic `pattern`'s backtracking included, and the worker goes on). Ending the worker from
 * outside does not stop it: Deno 2.9's `Worker.terminate()` leaves a thread that runs JavaScript
 * running, so a check cut off that way kept a core busy for good.
 */
import vm from "node:vm";
import { type CheckResult, validateJson } from "./schema_ajv.ts";

/** A check: the schema as JSON text (its cache key), the value, and its time limit. */
export interface CheckRequest {
  id: number;
  key: string;
  value: unknown;
  timeoutMs: number;
}

/** The answer to {@link CheckRequest} `id`, or (first, once) that the worker is ready. */
export type CheckReply = { id: number; result: CheckResult } | { ready: true };

const scope = globalThis as unknown as {
  onmessage: ((e: MessageEvent<CheckRequest>) => void) | null;
  postMessage(reply: CheckReply): void;
};

/** The context the limited script runs in: it only calls `check`. */
const sandbox = vm.createContext({ check: null as (() => CheckResult) | null });
const limited = new vm.Script("check()");

scope.onmessage = ({ data: { id, key, value, timeoutMs } }) => {
  let result: CheckResult;
  sandbox.check = () => validateJson(key, value);
  try {
    result = limited.runInContext(sandbox, { timeout: timeoutMs });
  } catch (err) {
    const message = (err as Error).message ?? String(err);
    // A cut-off check: the checker words the answer (schema_check.ts).
    result = /timed out/i.test(message)
      ? { ok: false, reason: "timed out", timedOut: true }
      : { ok: false, reason: `the check failed: ${message}` };
  } finally {
    sandbox.check = null;
  }
  scope.postMessage({ id, result });
};
scope.postMessage({ ready: true });
