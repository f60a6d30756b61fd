/**
 * The output-check worker: checks values against schemas with Ajv on a thread of its own, so that
 * neither compiling a large schema nor a costly check holds the server's event loop (see
 * `SchemaChecker` in schema_check.ts). One message in, one answer out, in order.
 */
import { type CheckResult, validateJson } from "./schema_ajv.ts";

/** A check: the schema as JSON text (its cache key) and the value. */
export interface CheckRequest {
  id: number;
  key: string;
  value: unknown;
}

/** The answer to {@link CheckRequest} `id`, or (first, once) that the worker is ready. */
export type CheckReply = { id: number; result: CheckResult } | { ready: true };

const scope = globalThis as unknown as {
  onmessage: ((e: MessageEvent<CheckRequest>) => void) | null;
  postMessage(reply: CheckReply): void;
};

scope.onmessage = ({ data: { id, key, value } }) => {
  let result: CheckResult;
  try {
    result = validateJson(key, value);
  } catch (err) {
    result = { ok: false, reason: `the check failed: ${(err as Error).message}` };
  }
  scope.postMessage({ id, result });
};
scope.postMessage({ ready: true });
