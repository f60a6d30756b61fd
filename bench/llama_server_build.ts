/**
 * Builds llama.cpp's `llama-server` once, from the llama.cpp source that node-llama-cpp ships
 * (`node_modules/node-llama-cpp/llama/gitRelease.bundle`: the same version as our engine), into a cache
 * directory outside the repository. Used by `deno task bench --baseline llama-server`; never by tests or CI.
 *
 * Layout of `<cache>/<tag>/`: `src/` (the clone, with node-llama-cpp's patches applied), `build/` (CMake),
 * `build.log`, `stamp.json` (what was built: reused while it matches), `build.lock` (one build at a time).
 *
 * Run by hand: `deno run --allow-all bench/llama_server_build.ts [--cache DIR]` prints the binary's path.
 */
import { parseArgs } from "node:util";

/** The CMake cache entries of the build: CPU only, nothing fetched from the network (CPU flags: below). */
export const CMAKE_FLAGS: readonly string[] = [
  "-DCMAKE_BUILD_TYPE=Release",
  "-DBUILD_SHARED_LIBS=OFF", // one self-contained binary
  // node-llama-cpp's prebuilt CPU binaries (what our engine loads) use ggml's own thread pool, not OpenMP.
  "-DGGML_OPENMP=OFF",
  "-DGGML_CCACHE=OFF",
  "-DGGML_CUDA=OFF",
  "-DGGML_VULKAN=OFF",
  "-DGGML_METAL=OFF",
  "-DLLAMA_OPENSSL=OFF", // no HTTPS client: the server never downloads anything here
  "-DLLAMA_BUILD_BORINGSSL=OFF", // would be fetched from the network
  "-DLLAMA_BUILD_UI=OFF", // the web UI needs npm
  "-DLLAMA_USE_PREBUILT_UI=OFF", // would be downloaded from Hugging Face
  "-DLLAMA_LLGUIDANCE=OFF",
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
  "-DLLAMA_BUILD_TOOLS=ON", // the server lives in tools/server
  "-DLLAMA_BUILD_SERVER=ON",
  "-DLLAMA_BUILD_APP=OFF",
];

/**
 * ggml's x86 CPU variants (ggml/src/CMakeLists.txt, `ggml_add_cpu_backend_variant`): node-llama-cpp's
 * prebuilt binaries ship all of them and load the best one for the CPU at run time. Building the
 * baseline with the same variant's instruction sets compares the same kernels, compiled the same way.
 */
export const CPU_VARIANTS: Record<string, readonly string[]> = {
  x64: [],
  sse42: ["SSE42"],
  sandybridge: ["SSE42", "AVX"],
  ivybridge: ["SSE42", "AVX", "F16C"],
  piledriver: ["SSE42", "AVX", "F16C", "FMA"],
  haswell: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"],
  skylakex: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"],
  cannonlake: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI"],
  cascadelake: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI"],
  icelake: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"],
  cooperlake: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"],
  zen4: [
    "SSE42",
    "AVX",
    "F16C",
    "FMA",
    "AVX2",
    "BMI2",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
  ],
  alderlake: ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"],
  sapphirerapids: [
    "SSE42",
    "AVX",
    "F16C",
    "FMA",
    "AVX2",
    "BMI2",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_TILE",
    "AMX_INT8",
  ],
};

/**
 * The CPU flags: `prebuilt` (shared libraries, replaced at run time by node-llama-cpp's own: see
 * {@link assembleRunDir}), `native` (tuned for this machine) or one of {@link CPU_VARIANTS}.
 */
export function cpuFlags(cpu: string): string[] {
  if (cpu === "prebuilt") return ["-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_NATIVE=OFF"];
  if (cpu === "native") return ["-DGGML_NATIVE=ON"];
  // A CUDA build for GPU VMs (needs nvcc): later -D flags win over CMAKE_FLAGS' -DGGML_CUDA=OFF.
  if (cpu === "cuda") return ["-DGGML_NATIVE=ON", "-DGGML_CUDA=ON"];
  const features = CPU_VARIANTS[cpu];
  if (!features) {
    throw new Error(
      `unknown CPU variant '${cpu}' (known: prebuilt, native, cuda, ${Object.keys(CPU_VARIANTS).join(", ")})`,
    );
  }
  return ["-DGGML_NATIVE=OFF", ...features.map((f) => `-DGGML_${f}=ON`)];
}

/** The only target built. */
export const TARGET = "llama-server";
/** Parallel compile jobs: the machine this was written for has 2 cores and is shared. */
export const BUILD_JOBS = 2;

/** What a finished build was made from; a build is reused only while every field matches. */
export interface BuildStamp {
  tag: string;
  commit: string;
  /** sha256 of each patch applied on top of the bundle, by file name. */
  patches: Record<string, string>;
  generator: string;
  cmakeFlags: string[];
  target: string;
  /** `-DGGML_NATIVE=ON` code runs only on this CPU model and feature set. */
  host: string;
}

/** Where the llama.cpp source comes from: node-llama-cpp's package directory. */
export interface LlamaCppSource {
  bundle: string;
  tag: string;
  patches: string[];
}

/**
 * The cache root: `--llama-server-cache`, else `VSERVE_BENCH_LLAMA_CACHE`, else
 * `${XDG_CACHE_HOME:-$HOME/.cache}/vserve/llama-server`. The build goes into `<root>/<tag>/`.
 *
 * @example
 * ```ts
 * cacheRoot(undefined, { HOME: "/home/me" }); // "/home/me/.cache/vserve/llama-server"
 * ```
 */
export function cacheRoot(flag: string | undefined, env: Record<string, string | undefined>): string {
  if (flag) return flag;
  if (env.VSERVE_BENCH_LLAMA_CACHE) return env.VSERVE_BENCH_LLAMA_CACHE;
  const base = env.XDG_CACHE_HOME || (env.HOME ? `${env.HOME}/.cache` : undefined);
  if (!base) throw new Error("no cache directory: set HOME, XDG_CACHE_HOME or VSERVE_BENCH_LLAMA_CACHE");
  return `${base}/vserve/llama-server`;
}

/** True when a stamp on disk describes exactly the build wanted. */
export function stampMatches(onDisk: unknown, wanted: BuildStamp): boolean {
  if (typeof onDisk !== "object" || onDisk === null) return false;
  return JSON.stringify(canonical(onDisk as Record<string, unknown>)) ===
    JSON.stringify(canonical(wanted as unknown as Record<string, unknown>));
}

function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (typeof value !== "object" || value === null) return value;
  return Object.fromEntries(
    Object.keys(value).sort().map((k) => [k, canonical((value as Record<string, unknown>)[k])]),
  );
}

/**
 * The build's progress from the last `[done/total]` line Ninja (or Make's `[ NN%]`) wrote, as a fraction.
 *
 * @example
 * ```ts
 * buildProgress("[12/330] Building CXX object ..."); // 12 / 330
 * ```
 */
export function buildProgress(logTail: string): number | undefined {
  const ninja = [...logTail.matchAll(/^\[(\d+)\/(\d+)\]/gm)].at(-1);
  if (ninja) return Number(ninja[1]) / Number(ninja[2]);
  const make = [...logTail.matchAll(/^\[\s*(\d+)%\]/gm)].at(-1);
  return make ? Number(make[1]) / 100 : undefined;
}

/** node-llama-cpp's bundled llama.cpp source: the git bundle, its release tag, the patches it applies. */
export async function nodeLlamaCppSource(): Promise<LlamaCppSource> {
  const dir = new URL("../node_modules/node-llama-cpp/llama/", import.meta.url).pathname;
  const info = JSON.parse(await Deno.readTextFile(`${dir}llama.cpp.info.json`)) as { tag?: string };
  if (!info.tag) throw new Error(`${dir}llama.cpp.info.json has no tag`);
  const patches: string[] = [];
  try {
    for await (const e of Deno.readDir(`${dir}patches`)) {
      if (e.isFile && e.name.endsWith(".diff")) patches.push(`${dir}patches/${e.name}`);
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  return { bundle: `${dir}gitRelease.bundle`, tag: info.tag, patches: patches.sort() };
}

type Log = (msg: string) => void;

/**
 * Returns the path of a `llama-server` built from `source` under `root`, building it first unless a build
 * with the same stamp exists. Holds `build.lock` while building; waits for another process's build.
 */
export async function ensureLlamaServer(
  root: string,
  log: Log,
  source?: LlamaCppSource,
  cpu = "prebuilt",
): Promise<string> {
  const src = source ?? await nodeLlamaCppSource();
  if (!/^[\w.+-]+$/.test(src.tag)) throw new Error(`unexpected llama.cpp tag '${src.tag}'`);
  const dir = cpu === "native" ? `${root}/${src.tag}` : `${root}/${src.tag}-${cpu}`;
  await Deno.mkdir(dir, { recursive: true });
  const binary = `${dir}/build/bin/${TARGET}`;
  const wanted = await wantedStamp(src, cpu);
  const ready = () => cpu === "prebuilt" ? assembleRunDir(dir, binary) : binary;
  if (await isBuilt(dir, binary, wanted)) return await ready();

  const release = await acquireLock(`${dir}/build.lock`, log);
  try {
    // Another process may have finished the build while we waited for the lock.
    if (!await isBuilt(dir, binary, wanted)) await build(dir, src, wanted, log);
    return await ready();
  } finally {
    await release();
  }
}

/**
 * The `prebuilt` mode: `<dir>/run/` holds the compiled server with its own libraries (server, common,
 * mtmd) and links to node-llama-cpp's prebuilt libllama, libggml and ggml CPU variants, the very files
 * vserve runs; `run/llama-server` is a script that puts that directory first on the library path and
 * execs the server (same pid). Both sides then run identical llama.cpp binaries, so the comparison
 * measures the server code alone. Rebuilt on every call (links only), so it follows node-llama-cpp.
 */
export async function assembleRunDir(dir: string, binary: string): Promise<string> {
  const prebuilt = await prebuiltLibraryDir();
  const run = `${dir}/run`;
  await Deno.remove(run, { recursive: true }).catch(() => {});
  await Deno.mkdir(run, { recursive: true });
  const built = binary.replace(/\/[^/]+$/, "");
  for (const name of ["libllama-server-impl.so", "libllama-common.so.0", "libmtmd.so.0"]) {
    await Deno.symlink(await Deno.realPath(`${built}/${name}`), `${run}/${name}`);
  }
  // A copy, not a link: ggml looks for its CPU backends beside the executable's real path.
  await Deno.copyFile(binary, `${run}/${TARGET}.bin`);
  const files = [...Deno.readDirSync(prebuilt)].map((e) => e.name);
  const find = (re: RegExp) => {
    const name = files.find((n) => re.test(n));
    if (!name) throw new Error(`node-llama-cpp's ${prebuilt} has no file matching ${re}`);
    return `${prebuilt}/${name}`;
  };
  // The names the compiled server asks for (its NEEDED entries), and the names the prebuilt libraries
  // ask for each other by; ggml finds its CPU variants beside the executable.
  const links: Record<string, string> = {
    "libllama.so.0": find(/^libllama(\.v[\d.]+)?\.so$/),
    "libggml.so.0": find(/^libggml(\.v[\d.]+)?\.so$/),
    "libggml-base.so.0": find(/^libggml-base\.so$/),
  };
  for (
    const name of files.filter((n) => /^lib(llama|ggml)[\w.-]*\.so$/.test(n) && n !== "libllama-common.so")
  ) {
    links[name] = `${prebuilt}/${name}`;
  }
  for (const [name, target] of Object.entries(links)) await Deno.symlink(target, `${run}/${name}`);
  const script = `${run}/${TARGET}`;
  await Deno.writeTextFile(
    script,
    `#!/bin/sh\n# llama-server on node-llama-cpp's prebuilt llama.cpp (${prebuilt})\n` +
      `export LD_LIBRARY_PATH="${run}\${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n` +
      `exec "${run}/${TARGET}.bin" "$@"\n`,
  );
  await Deno.chmod(script, 0o755);
  return script;
}

/** The directory of the libllama node-llama-cpp loads on this machine (its prebuilt binaries). */
async function prebuiltLibraryDir(): Promise<string> {
  const { llamaRuntime } = await import("../src/engines/llama/runtime.ts");
  await llamaRuntime("cpu", { debug() {}, info() {}, warn() {}, error() {} });
  const maps = await Deno.readTextFile("/proc/self/maps").catch(() => "");
  const path = maps.split("\n").map((l) => l.trim().split(/\s+/).slice(5).join(" "))
    .find((p) => /\/libllama(\.v[\d.]+)?\.so$/.test(p));
  if (!path) throw new Error("cannot find node-llama-cpp's libllama in this process (Linux only)");
  return path.replace(/\/[^/]+$/, "");
}

async function isBuilt(dir: string, binary: string, wanted: BuildStamp): Promise<boolean> {
  const stamp = await Deno.readTextFile(`${dir}/stamp.json`).then(JSON.parse).catch(() => undefined);
  const exists = await Deno.stat(binary).then((s) => s.isFile).catch(() => false);
  return exists && stampMatches(stamp, wanted);
}

async function wantedStamp(src: LlamaCppSource, cpu: string): Promise<BuildStamp> {
  const heads = await run("git", ["bundle", "list-heads", src.bundle]);
  const commit = heads.stdout.trim().split(/\s+/)[0];
  if (!/^[0-9a-f]{40}$/.test(commit)) throw new Error(`cannot read the commit of ${src.bundle}`);
  const patches: Record<string, string> = {};
  for (const p of src.patches) patches[p.split("/").pop()!] = await sha256(await Deno.readFile(p));
  return {
    tag: src.tag,
    commit,
    patches,
    generator: await hasCommand("ninja") ? "Ninja" : "Unix Makefiles",
    cmakeFlags: [
      ...CMAKE_FLAGS.filter((f) => cpu !== "prebuilt" || !f.startsWith("-DBUILD_SHARED_LIBS=")),
      ...cpuFlags(cpu),
    ],
    target: TARGET,
    host: await hostFingerprint(),
  };
}

async function build(dir: string, src: LlamaCppSource, stamp: BuildStamp, log: Log): Promise<void> {
  const logPath = `${dir}/build.log`;
  await Deno.remove(`${dir}/stamp.json`).catch(() => {});
  const file = await Deno.open(logPath, { write: true, create: true, truncate: true });
  const started = performance.now();
  const elapsed = () => `${((performance.now() - started) / 60_000).toFixed(1)} min`;
  const step = async (name: string, cmd: string, args: string[], cwd = dir) => {
    const line = `$ ${[cmd, ...args].join(" ")}   # in ${cwd}\n`;
    await file.write(new TextEncoder().encode(line));
    const child = new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped", stdin: "null" })
      .spawn();
    let tail = "";
    const pump = async (s: ReadableStream<Uint8Array>) => {
      for await (const chunk of s) {
        await file.write(chunk);
        tail = (tail + new TextDecoder().decode(chunk)).slice(-4000);
      }
    };
    const timer = setInterval(() => {
      const p = buildProgress(tail);
      log(`llama-server: ${name}${p === undefined ? "" : ` ${(p * 100).toFixed(0)}%`} (${elapsed()})`);
    }, 30_000);
    const [status] = await Promise.all([child.status, pump(child.stdout), pump(child.stderr)]);
    clearInterval(timer);
    if (!status.success) {
      const lastLines = tail.trimEnd().split("\n").slice(-15).join("\n");
      throw new Error(
        `llama-server build failed at "${name}" (exit ${status.code}); full log: ${logPath}\n${lastLines}`,
      );
    }
  };

  try {
    log(`llama-server: building ${src.tag} (${stamp.commit.slice(0, 10)}) in ${dir}; log: ${logPath}`);
    log(`llama-server: this takes 15-25 minutes on 2 cores, once; later runs reuse it`);

    // The clone: reuse a checkout of the same commit, else clone afresh (through a temporary directory, so
    // an interrupted clone never looks finished).
    const head = await run("git", ["-C", `${dir}/src`, "rev-parse", "HEAD"]).catch(() => undefined);
    if (head?.stdout.trim() !== stamp.commit) {
      await Deno.remove(`${dir}/src`, { recursive: true }).catch(() => {});
      await Deno.remove(`${dir}/src.partial`, { recursive: true }).catch(() => {});
      await Deno.remove(`${dir}/build`, { recursive: true }).catch(() => {});
      await step("clone", "git", [
        "-c",
        "advice.detachedHead=false",
        "clone",
        "--quiet",
        src.bundle,
        "src.partial",
      ]);
      await Deno.rename(`${dir}/src.partial`, `${dir}/src`);
    }
    // node-llama-cpp applies these to the same source before building its own binaries.
    for (const patch of src.patches) {
      const applied = await run("git", [
        "-C",
        `${dir}/src`,
        "apply",
        "--ignore-whitespace",
        "--reverse",
        "--check",
        patch,
      ])
        .then(() => true, () => false);
      if (!applied) {
        await step(`patch ${patch.split("/").pop()}`, "git", [
          "-C",
          "src",
          "apply",
          "--ignore-whitespace",
          patch,
        ]);
      }
    }
    // A build directory made by another generator cannot be reconfigured in place.
    const cache = await Deno.readTextFile(`${dir}/build/CMakeCache.txt`).catch(() => "");
    const generator = cache.match(/^CMAKE_GENERATOR:INTERNAL=(.*)$/m)?.[1];
    if (generator && generator !== stamp.generator) await Deno.remove(`${dir}/build`, { recursive: true });

    await step("configure", "cmake", [
      "-S",
      "src",
      "-B",
      "build",
      "-G",
      stamp.generator,
      ...stamp.cmakeFlags,
    ]);
    const buildArgs = ["--build", "build", "--target", TARGET, "-j", String(BUILD_JOBS)];
    if (await hasCommand("nice")) await step("compile", "nice", ["-n", "10", "cmake", ...buildArgs]);
    else await step("compile", "cmake", buildArgs);
  } finally {
    file.close();
  }
  await Deno.writeTextFile(`${dir}/stamp.json`, JSON.stringify(stamp, null, 2) + "\n");
  log(`llama-server: built in ${elapsed()}: ${dir}/build/bin/${TARGET}`);
}

/** Takes `path` exclusively; waits while a live process holds it, removes it when its holder is gone. */
async function acquireLock(path: string, log: Log): Promise<() => Promise<void>> {
  let announced = false;
  for (;;) {
    try {
      const f = await Deno.open(path, { write: true, createNew: true });
      await f.write(new TextEncoder().encode(`${Deno.pid} ${Deno.hostname()} ${new Date().toISOString()}\n`));
      f.close();
      return () => Deno.remove(path).catch(() => {});
    } catch (e) {
      if (!(e instanceof Deno.errors.AlreadyExists)) throw e;
    }
    const [pid, host] = (await Deno.readTextFile(path).catch(() => "")).trim().split(" ");
    const alive = host !== Deno.hostname() || await Deno.stat(`/proc/${pid}`).then(() => true, () => false);
    if (!alive) {
      log(`llama-server: removing the stale lock ${path} (process ${pid} is gone)`);
      await Deno.remove(path).catch(() => {});
      continue;
    }
    if (!announced) log(`llama-server: another build (process ${pid} on ${host}) holds ${path}; waiting`);
    announced = true;
    await new Promise((r) => setTimeout(r, 5_000));
  }
}

async function hostFingerprint(): Promise<string> {
  const cpuinfo = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const model = cpuinfo.match(/^model name\s*:\s*(.*)$/m)?.[1] ?? Deno.build.arch;
  const flags = cpuinfo.match(/^(?:flags|Features)\s*:\s*(.*)$/m)?.[1] ?? "";
  return `${Deno.build.os}-${Deno.build.arch} ${model} ${
    (await sha256(new TextEncoder().encode(flags))).slice(0, 12)
  }`;
}

async function sha256(data: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", data);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function hasCommand(name: string): Promise<boolean> {
  return await run("sh", ["-c", `command -v ${name}`]).then(() => true, () => false);
}

async function run(cmd: string, args: string[]): Promise<{ stdout: string }> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped", stdin: "null" }).output();
  const td = new TextDecoder();
  if (!out.success) throw new Error(`${cmd} ${args.join(" ")}: ${td.decode(out.stderr).trim()}`);
  return { stdout: td.decode(out.stdout) };
}

/** The ggml CPU variant node-llama-cpp loads on this machine (e.g. haswell), or native if unknown. */
export async function loadedCpuVariant(): Promise<string> {
  const { llamaRuntime } = await import("../src/engines/llama/runtime.ts");
  await llamaRuntime("cpu", { debug() {}, info() {}, warn() {}, error() {} });
  const maps = await Deno.readTextFile("/proc/self/maps").catch(() => "");
  return maps.match(/libggml-cpu-([\w.]+)\.so/)?.[1] ?? "native";
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { cache: { type: "string" }, cpu: { type: "string", default: "prebuilt" } },
  });
  const log = (msg: string) =>
    console.error(`[llama-server ${new Date().toISOString().slice(11, 19)}] ${msg}`);
  try {
    console.log(
      await ensureLlamaServer(
        cacheRoot(values.cache, Deno.env.toObject()),
        log,
        undefined,
        values.cpu === "same" ? await loadedCpuVariant() : values.cpu,
      ),
    );
  } catch (e) {
    console.error((e as Error).message);
    Deno.exit(1);
  }
}
