/**
 * The stateless reasoning round trip of the Responses API: with
 * `include: ["reasoning.encrypted_content"]` a turn's thinking is returned sealed (AES-256-GCM,
 * authenticated), and a reasoning item sent back with it restores the thinking into the history.
 * The server keeps nothing: the blob is the state. Blobs open only under the key that sealed them.
 */

const PREFIX = "vsr1_";
const AAD = new TextEncoder().encode("vserve reasoning.encrypted_content v1");
const IV_BYTES = 12;

/** Seals and opens `encrypted_content` blobs under one key. */
export class ReasoningSealer {
  readonly #key: CryptoKey;
  /** Whether the key came from configuration (blobs survive restarts and open on every replica). */
  readonly configured: boolean;

  private constructor(key: CryptoKey, configured: boolean) {
    this.#key = key;
    this.configured = configured;
  }

  /**
   * A sealer whose key is derived from `secret` (HKDF-SHA-256), or a random key when none is given
   * (blobs then open only in this process).
   *
   * @example
   * ```ts
   * const sealer = await ReasoningSealer.create(Deno.env.get("VSERVE_REASONING_KEY"));
   * const blob = await sealer.seal("thinking");
   * await sealer.open(blob); // "thinking"
   * ```
   */
  static async create(secret?: string): Promise<ReasoningSealer> {
    const usage: KeyUsage[] = ["encrypt", "decrypt"];
    if (secret === undefined || secret === "") {
      const key = await crypto.subtle.generateKey({ name: "AES-GCM", length: 256 }, false, usage);
      return new ReasoningSealer(key, false);
    }
    const material = await crypto.subtle.importKey(
      "raw",
      new TextEncoder().encode(secret),
      "HKDF",
      false,
      ["deriveKey"],
    );
    const key = await crypto.subtle.deriveKey(
      {
        name: "HKDF",
        hash: "SHA-256",
        salt: new TextEncoder().encode("vserve"),
        info: new TextEncoder().encode("reasoning.encrypted_content v1"),
      },
      material,
      { name: "AES-GCM", length: 256 },
      false,
      usage,
    );
    return new ReasoningSealer(key, true);
  }

  /** The opaque blob of `text`. */
  async seal(text: string): Promise<string> {
    const iv = crypto.getRandomValues(new Uint8Array(IV_BYTES));
    const sealed = new Uint8Array(
      await crypto.subtle.encrypt(
        { name: "AES-GCM", iv, additionalData: AAD },
        this.#key,
        new TextEncoder().encode(text),
      ),
    );
    const out = new Uint8Array(IV_BYTES + sealed.length);
    out.set(iv);
    out.set(sealed, IV_BYTES);
    return PREFIX + out.toBase64({ alphabet: "base64url", omitPadding: true });
  }

  /** The text sealed in `blob`; null when the blob was not sealed under this key or was altered. */
  async open(blob: string): Promise<string | null> {
    if (!blob.startsWith(PREFIX)) return null;
    let bytes: Uint8Array<ArrayBuffer>;
    try {
      bytes = Uint8Array.fromBase64(blob.slice(PREFIX.length), { alphabet: "base64url" });
    } catch {
      return null;
    }
    if (bytes.length < IV_BYTES + 16) return null;
    try {
      const plain = await crypto.subtle.decrypt(
        { name: "AES-GCM", iv: bytes.subarray(0, IV_BYTES), additionalData: AAD },
        this.#key,
        bytes.subarray(IV_BYTES),
      );
      return new TextDecoder("utf-8", { fatal: true }).decode(plain);
    } catch {
      return null;
    }
  }
}
