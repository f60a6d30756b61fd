/** Bearer-key authentication for `/v1/*`, with a constant-time comparison. */
import { createHash } from "node:crypto";
import { ApiError } from "./errors.ts";

/** Checks `Authorization: Bearer <key>` against a fixed set of keys. */
export class KeyRing {
  readonly #digests: Uint8Array[];

  constructor(keys: readonly string[]) {
    this.#digests = keys.map(digest);
  }

  /** True when no key is configured (auth is off; the caller decides whether that is allowed). */
  get isOpen(): boolean {
    return this.#digests.length === 0;
  }

  /**
   * Throws a 401 unless the request carries a configured key.
   *
   * @example
   * ```ts
   * new KeyRing(["sk-1"]).authorize(req.headers.get("authorization"));
   * ```
   */
  authorize(header: string | null): void {
    if (this.isOpen) return;
    const match = header?.match(/^Bearer\s+(\S.*)$/i);
    if (!match) {
      throw unauthorized(
        header
          ? "The Authorization header must use the Bearer scheme: 'Authorization: Bearer <key>'."
          : "No API key provided. Send it as 'Authorization: Bearer <key>'.",
      );
    }
    const candidate = digest(match[1].trim());
    // Compare against every key so that timing does not reveal which one (or whether any) matched.
    let ok = false;
    for (const d of this.#digests) ok = constantTimeEqual(d, candidate) || ok;
    if (!ok) throw unauthorized("Incorrect API key provided.");
  }
}

function unauthorized(message: string): ApiError {
  return new ApiError(401, "invalid_request_error", message, null, "invalid_api_key", {
    "www-authenticate": 'Bearer realm="v1"',
  });
}

// Hashing first gives equal-length inputs, so the comparison time does not depend on key length.
function digest(key: string): Uint8Array {
  return createHash("sha256").update(key, "utf8").digest();
}

/** Equal-time comparison of two byte strings of the same length. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}
