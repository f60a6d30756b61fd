/**
 * API keys: bearer (or `x-api-key`) authentication with constant-time comparison, per-key names (logged instead of
 * the key), allowed models and request / token rate limits.
 */
import { type ApiKey, sha256 } from "../api_keys.ts";
import { ApiError } from "./errors.ts";

/** Checks `Authorization: Bearer <key>` (or `x-api-key`) against the configured keys; replaceable on reload. */
export class KeyRing {
  #keys: ApiKey[];

  constructor(keys: readonly ApiKey[]) {
    this.#keys = [...keys];
  }

  /** True when no key is configured (auth is off; the caller decides whether that is allowed). */
  get isOpen(): boolean {
    return this.#keys.length === 0;
  }

  /** Swaps in a new key set (SIGHUP reload). */
  replace(keys: readonly ApiKey[]): void {
    this.#keys = [...keys];
  }

  /**
   * The key of the request, or undefined when auth is off; throws a 401 otherwise. The key comes
   * from `x-api-key` (Anthropic clients) when that header is present, else from
   * `Authorization: Bearer`.
   *
   * @example
   * ```ts
   * function caller(ring: KeyRing, req: Request) {
   *   return ring.authorize(req.headers.get("authorization"), req.headers.get("x-api-key"));
   * }
   * ```
   */
  authorize(header: string | null, apiKey: string | null = null): ApiKey | undefined {
    if (this.isOpen) return undefined;
    let secret: string;
    if (apiKey !== null) {
      secret = apiKey.trim();
      if (secret === "") throw unauthorized("The x-api-key header is empty.");
    } else {
      const match = header?.match(/^Bearer\s+(\S.*)$/i);
      if (!match) {
        throw unauthorized(
          header
            ? "The Authorization header must use the Bearer scheme: 'Authorization: Bearer <key>'."
            : "No API key provided. Send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>').",
        );
      }
      secret = match[1].trim();
    }
    const candidate = sha256(secret);
    // Compare against every key, so the time taken does not reveal which one (or whether any) matched.
    let found: ApiKey | undefined;
    for (const key of this.#keys) if (constantTimeEqual(key.digest, candidate) && !found) found = key;
    if (!found) throw unauthorized("Incorrect API key provided.");
    return found;
  }
}

function unauthorized(message: string): ApiError {
  return new ApiError(401, "invalid_request_error", message, null, "invalid_api_key", {
    "www-authenticate": 'Bearer realm="v1"',
  });
}

/** Equal-time comparison of two byte strings of the same length. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

/** Per-key request and token budgets (token buckets refilled continuously over a minute). */
export class RateLimiter {
  readonly #buckets = new Map<string, { requests: number; tokens: number; at: number }>();
  constructor(private readonly now: () => number = () => performance.now()) {}

  #refill(key: ApiKey) {
    const t = this.now();
    let b = this.#buckets.get(key.name);
    if (!b) this.#buckets.set(key.name, b = { requests: key.rpm ?? 0, tokens: key.tpm ?? 0, at: t });
    const minutes = (t - b.at) / 60_000;
    if (key.rpm) b.requests = Math.min(key.rpm, b.requests + minutes * key.rpm);
    if (key.tpm) b.tokens = Math.min(key.tpm, b.tokens + minutes * key.tpm);
    b.at = t;
    return b;
  }

  /**
   * Takes one request from the key's budget, or throws 429 with `Retry-After`. Returns the
   * `x-ratelimit-*` headers to send.
   */
  admit(key: ApiKey | undefined): Record<string, string> {
    if (!key || (!key.rpm && !key.tpm)) return {};
    const b = this.#refill(key);
    if (key.rpm && b.requests < 1) {
      const wait = Math.ceil(((1 - b.requests) / key.rpm) * 60);
      throw limited(`requests per minute (${key.rpm})`, wait, this.headers(key));
    }
    if (key.tpm && b.tokens <= 0) {
      const wait = Math.ceil(((1 - b.tokens) / key.tpm) * 60);
      throw limited(`tokens per minute (${key.tpm})`, wait, this.headers(key));
    }
    if (key.rpm) b.requests -= 1;
    return this.headers(key);
  }

  /** Charges tokens used by a finished request. */
  charge(key: ApiKey | undefined, tokens: number): void {
    if (!key?.tpm || tokens <= 0) return;
    this.#refill(key).tokens -= tokens;
  }

  /** The `x-ratelimit-*` headers for the key's current budgets. */
  headers(key: ApiKey): Record<string, string> {
    const b = this.#refill(key);
    const out: Record<string, string> = {};
    if (key.rpm) {
      out["x-ratelimit-limit-requests"] = String(key.rpm);
      out["x-ratelimit-remaining-requests"] = String(Math.max(0, Math.floor(b.requests)));
      out["x-ratelimit-reset-requests"] = `${Math.ceil(((key.rpm - b.requests) / key.rpm) * 60)}s`;
    }
    if (key.tpm) {
      out["x-ratelimit-limit-tokens"] = String(key.tpm);
      out["x-ratelimit-remaining-tokens"] = String(Math.max(0, Math.floor(b.tokens)));
      out["x-ratelimit-reset-tokens"] = `${Math.ceil(((key.tpm - Math.max(0, b.tokens)) / key.tpm) * 60)}s`;
    }
    return out;
  }
}

function limited(what: string, seconds: number, headers: Record<string, string>): ApiError {
  return new ApiError(
    429,
    "rate_limit_error",
    `Rate limit reached for this API key: ${what}. Retry in ${seconds} s.`,
    null,
    "rate_limit_exceeded",
    { ...headers, "retry-after": String(Math.max(1, seconds)) },
  );
}
