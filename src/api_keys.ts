/**
 * API keys as configured: a flag's plain secret, or the lines of a key file (name, allowed models,
 * rate limits). Only each secret's SHA-256 is kept; `http/auth.ts` checks requests against them.
 */
import { createHash } from "node:crypto";

/** One configured key. The secret itself is never kept: only its SHA-256. */
export interface ApiKey {
  name: string;
  digest: Uint8Array;
  /** Model ids (or aliases) this key may use; undefined = all. */
  models?: ReadonlySet<string>;
  /** Requests per minute; undefined = unlimited. */
  rpm?: number;
  /** Tokens (prompt + completion) per minute; undefined = unlimited. */
  tpm?: number;
}

/** The SHA-256 of a secret: what is kept, and what a request's key is compared by. */
export function sha256(text: string): Uint8Array {
  return createHash("sha256").update(text, "utf8").digest();
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A key given as a flag or env var: a plain secret with no limits. */
export function plainKey(secret: string): ApiKey {
  const digest = sha256(secret);
  return { name: `key-${hex(digest).slice(0, 8)}`, digest };
}

/**
 * Parses a key file: one key a line, `#` comments. A line is the secret or `sha256:<hex>` (so the
 * file need not hold secrets), then optional `name=…`, `models=a,b`, `rpm=N`, `tpm=N`.
 *
 * @example
 * ```ts
 * // The key "test", stored as its SHA-256.
 * parseKeyFile("sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 name=ci rpm=60", "keys");
 * ```
 */
export function parseKeyFile(text: string, origin: string): ApiKey[] {
  const keys: ApiKey[] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const [secret, ...fields] = line.split(/\s+/);
    const where = `${origin} line ${i + 1}`;
    let key: ApiKey;
    if (secret.startsWith("sha256:")) {
      const h = secret.slice(7).toLowerCase();
      if (!/^[0-9a-f]{64}$/.test(h)) throw new Error(`${where}: sha256: needs 64 hex digits`);
      key = {
        name: `key-${h.slice(0, 8)}`,
        digest: Uint8Array.from(h.match(/../g)!.map((b) => parseInt(b, 16))),
      };
    } else key = plainKey(secret);
    for (const field of fields) {
      const m = field.match(/^(name|models|rpm|tpm)=(.+)$/);
      if (!m) {
        throw new Error(`${where}: unknown field '${field.split("=")[0]}' (name=, models=, rpm=, tpm=)`);
      }
      const [, k, v] = m;
      if (k === "name") key.name = v;
      else if (k === "models") key.models = new Set(v.split(",").filter((s) => s !== ""));
      else {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 1) throw new Error(`${where}: ${k} must be a positive integer`);
        key[k as "rpm" | "tpm"] = n;
      }
    }
    keys.push(key);
  });
  return keys;
}
