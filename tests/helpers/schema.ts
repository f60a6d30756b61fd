/** The output check for tests that check a server's answer themselves. */
import { type CheckResult, SchemaChecker } from "../../src/services/schema_check.ts";

/**
 * Whether `value` satisfies `schema`, checked by a checker of its own that is closed before it
 * returns: no worker or timer outlives the test (the server's shared checker keeps its worker).
 *
 * @example
 * ```ts
 * (await checkSchema({ type: "integer" }, 3)).ok; // true
 * ```
 */
export async function checkSchema(schema: unknown, value: unknown): Promise<CheckResult> {
  const checker = new SchemaChecker();
  try {
    return await checker.check(schema, value);
  } finally {
    checker.close();
  }
}
