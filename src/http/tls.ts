/** TLS certificate and key files: read, check that they belong together, name the file at fault. */
import { createPrivateKey, X509Certificate } from "node:crypto";

/** PEM certificate chain and private key for `Deno.serve`. */
export interface TlsFiles {
  cert: string;
  key: string;
}

/**
 * Reads and validates a PEM certificate (chain) and its private key; throws a message naming the
 * file when one is missing, unreadable, not PEM, or when the key does not match the certificate.
 *
 * @example
 * ```ts
 * async function load() {
 *   return await readTlsFiles("/etc/vserve/cert.pem", "/etc/vserve/key.pem");
 * }
 * ```
 */
export async function readTlsFiles(certPath: string, keyPath: string): Promise<TlsFiles> {
  const read = async (path: string, what: string) => {
    try {
      return await Deno.readTextFile(path);
    } catch (e) {
      throw new Error(`TLS ${what} file '${path}' cannot be read: ${(e as Error).message}`);
    }
  };
  const cert = await read(certPath, "certificate");
  const key = await read(keyPath, "key");
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(cert);
  } catch (e) {
    throw new Error(`TLS certificate file '${certPath}' is not a PEM certificate: ${(e as Error).message}`);
  }
  let privateKey;
  try {
    privateKey = createPrivateKey(key);
  } catch (e) {
    throw new Error(`TLS key file '${keyPath}' is not a PEM private key: ${(e as Error).message}`);
  }
  if (!x509.checkPrivateKey(privateKey)) {
    throw new Error(`TLS key file '${keyPath}' does not match the certificate in '${certPath}'`);
  }
  return { cert, key };
}
