/**
 * Builds the WebAssembly kernels from their text sources: each `src/**\/wasm/*.wat` becomes a
 * `*_wasm.ts` beside it that holds the module's bytes (base64), so that the server needs no build
 * step and no file next to the executable. Run with `deno task wasm`; `--check` only reports whether
 * the generated files match their sources (tests/unit.test.ts runs that check).
 */
import wabtInit from "wabt";

/** The TypeScript module that embeds `bytes`, built from `watName`. */
export function embeddedModule(watName: string, bytes: Uint8Array): string {
  const b64 = bytes.toBase64();
  const lines: string[] = [];
  for (let i = 0; i < b64.length; i += 96) lines.push(`  "${b64.slice(i, i + 96)}"`);
  return [
    `// Generated from ${watName} by \`deno task wasm\`: do not edit.`,
    `/** The WebAssembly binary of ${watName}, base64. */`,
    `export const WASM_BASE64 = [\n${lines.join(",\n")},\n].join("");`,
    "",
  ].join("\n");
}

/** Compiles WebAssembly text (with SIMD) to its binary. */
export async function compileWat(name: string, text: string): Promise<Uint8Array> {
  const wabt = await wabtInit();
  const module = wabt.parseWat(name, text, { simd: true });
  try {
    module.validate();
    return new Uint8Array(module.toBinary({}).buffer);
  } finally {
    module.destroy();
  }
}

/** Every `.wat` under `dir` (recursively). */
export function watFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(dir)) {
    const path = `${dir}/${e.name}`;
    if (e.isDirectory) out.push(...watFiles(path));
    else if (e.name.endsWith(".wat")) out.push(path);
  }
  return out.sort();
}

/** The generated file of `watPath`. */
export function generatedPath(watPath: string): string {
  return watPath.replace(/\.wat$/, "_wasm.ts");
}

if (import.meta.main) {
  const root = new URL("..", import.meta.url).pathname;
  const check = Deno.args.includes("--check");
  let stale = 0;
  for (const wat of watFiles(`${root}src`)) {
    const name = wat.split("/").pop()!;
    const text = embeddedModule(name, await compileWat(name, await Deno.readTextFile(wat)));
    const target = generatedPath(wat);
    const current = await Deno.readTextFile(target).catch(() => "");
    if (current === text) continue;
    stale++;
    if (check) console.error(`${target} does not match ${name}: run deno task wasm`);
    else await Deno.writeTextFile(target, text);
  }
  if (check && stale > 0) Deno.exit(1);
}
