/**
 * Downloads `hf:<owner>/<repo>/<file>[@<revision>]` sources from a Hugging Face-style hub into the
 * model cache: resumable (`.part` file + HTTP Range), verified (size and SHA-256 when given).
 */
import { createHash } from "node:crypto";
import type { Logger } from "../log.ts";

/** A parsed `hf:` reference. */
export interface HubRef {
  repo: string;
  file: string;
  revision: string;
}

/** Parses `hf:owner/repo/path/to/file.gguf[@revision]`. */
export function parseHubRef(source: string): HubRef {
  const m = source.match(/^hf:([\w.-]+\/[\w.-]+)\/([^@]+?)(?:@([\w.\/-]+))?$/);
  if (!m || m[2].split("/").some((p) => p === ".." || p === "." || p === "")) {
    throw new Error(`'${source}' is not a valid hf: source (hf:<owner>/<repo>/<file>[@<revision>])`);
  }
  return { repo: m[1], file: m[2], revision: m[3] ?? "main" };
}

/** Where a hub file lives in the cache (pre-seed offline machines by copying files here). */
export function hubCachePath(cacheDir: string, ref: HubRef): string {
  return `${cacheDir}/hf/${ref.repo}/${ref.revision}/${ref.file}`;
}

/**
 * Ensures the file of `source` is in the cache and returns its path. An existing complete file
 * is reused (and verified when a hash is known).
 *
 * @example
 * ```ts
 * import type { Logger } from "../log.ts";
 * async function download(hubUrl: string, cacheDir: string, log: Logger) {
 *   return await fetchFromHub("hf:org/repo/model.gguf", { hubUrl, cacheDir, log });
 * }
 * ```
 */
export async function fetchFromHub(
  source: string,
  opts: { hubUrl: string; cacheDir: string; log: Logger; sha256?: string; size?: number; progress?: boolean },
): Promise<string> {
  const ref = parseHubRef(source);
  const target = hubCachePath(opts.cacheDir, ref);
  const part = `${target}.part`;
  if (await exists(target)) {
    await verify(target, opts.sha256, opts.size);
    return target;
  }
  await Deno.mkdir(target.slice(0, target.lastIndexOf("/")), { recursive: true });
  const url = `${opts.hubUrl.replace(/\/$/, "")}/${ref.repo}/resolve/${encodeURIComponent(ref.revision)}/${
    ref.file.split("/").map(encodeURIComponent).join("/")
  }`;
  let have = (await Deno.stat(part).catch(() => null))?.size ?? 0;
  const res = await fetch(url, { headers: have > 0 ? { range: `bytes=${have}-` } : {} });
  if (res.status === 416 && have > 0) {
    await res.body?.cancel();
  } else if (!res.ok || !res.body) {
    await res.body?.cancel();
    throw new Error(`download of ${source} failed: HTTP ${res.status} from the hub`);
  } else {
    if (have > 0 && res.status !== 206) have = 0; // the hub ignored the range: start over
    const total = have + Number(res.headers.get("content-length") ?? NaN);
    const file = await Deno.open(part, { write: true, create: true, append: have > 0, truncate: have === 0 });
    opts.log.info("downloading model", {
      source,
      resume_from: have,
      bytes: Number.isFinite(total) ? total : undefined,
    });
    let got = have;
    let lastReport = 0;
    try {
      for await (const chunk of res.body) {
        let at = 0;
        while (at < chunk.length) at += await file.write(chunk.subarray(at));
        got += chunk.length;
        const pct = Number.isFinite(total) ? Math.floor((got / total) * 100) : 0;
        if (opts.progress) {
          Deno.stderr.writeSync(
            new TextEncoder().encode(`\r${source}: ${pct}% (${(got / 1e6).toFixed(1)} MB)`),
          );
        } else if (pct >= lastReport + 10) {
          lastReport = pct - (pct % 10);
          opts.log.info("download progress", { source, percent: lastReport });
        }
      }
    } finally {
      file.close();
      if (opts.progress) Deno.stderr.writeSync(new TextEncoder().encode("\n"));
    }
  }
  try {
    await verify(part, opts.sha256, opts.size);
  } catch (e) {
    await Deno.remove(part).catch(() => {});
    throw e;
  }
  await Deno.rename(part, target);
  opts.log.info("download complete", { source });
  return target;
}

async function verify(path: string, sha256?: string, size?: number): Promise<void> {
  const stat = await Deno.stat(path);
  if (size !== undefined && stat.size !== size) {
    throw new Error(
      `'${path}' has ${stat.size} bytes, expected ${size}: the download is corrupt or incomplete`,
    );
  }
  if (sha256) {
    const hash = createHash("sha256");
    const file = await Deno.open(path);
    try {
      for await (const chunk of file.readable) hash.update(chunk);
    } catch { /* readable closes the file */ }
    const got = hash.digest("hex");
    if (got !== sha256) {
      throw new Error(`'${path}' has SHA-256 ${got}, expected ${sha256}: the download is corrupt`);
    }
  }
}

async function exists(path: string): Promise<boolean> {
  return (await Deno.stat(path).catch(() => null))?.isFile ?? false;
}
