/**
 * `deno task gpu-check [-- bench flags]`: one command for whoever has a CUDA GPU VM. It checks the
 * GPU (nvidia-smi), installs node-llama-cpp's CUDA prebuilt packages from npm, checks that their
 * libraries find the CUDA runtime, plans and serves the generated bench-moe and bench-embed models
 * with `--gpu cuda`, runs `deno task bench --gpu cuda` (against llama-server's CUDA build when this
 * machine can build it: nvcc, cmake, git and a C++ compiler), and writes everything with the
 * nvidia-smi facts to one file: bench/results/gpu-check-<date>.md. Not part of CI; without a GPU it
 * stops at once, saying why.
 */
import { startServer } from "../tests/helpers/server.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const CUDA_PACKAGES = ["@node-llama-cpp/linux-x64-cuda@3.21.1", "@node-llama-cpp/linux-x64-cuda-ext@3.21.1"];
const KEY = "gpu-check";

/** The output of a command, or undefined when it cannot run. */
async function run(cmd: string, args: string[], opts: { cwd?: string } = {}) {
  try {
    const out = await new Deno.Command(cmd, { args, cwd: opts.cwd ?? ROOT, stdin: "null" }).output();
    const dec = new TextDecoder();
    return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
  } catch {
    return undefined;
  }
}

function fail(message: string): never {
  console.error(`gpu-check: ${message}`);
  Deno.exit(1);
}

const log = (m: string) => console.error(`gpu-check: ${m}`);
const report: string[] = [];
const section = (title: string, body: string) => report.push(`## ${title}\n\n${body.trim()}\n`);
const fenced = (text: string, lang = "") => "```" + lang + "\n" + text.trim() + "\n```";

// 1. The GPU, as the driver sees it.
const smi = await run("nvidia-smi", [
  "--query-gpu=index,name,memory.total,memory.free,driver_version,compute_cap,pcie.link.gen.max,pcie.link.width.max",
  "--format=csv",
]);
if (!smi) {
  fail("no NVIDIA GPU here: nvidia-smi is not installed (this check needs a CUDA GPU VM and its driver)");
}
if (smi.code !== 0) fail(`nvidia-smi failed (exit ${smi.code}): ${(smi.stderr || smi.stdout).trim()}`);
const gpuLines = smi.stdout.trim().split("\n").slice(1).filter((l) => l.trim());
if (gpuLines.length === 0) fail("nvidia-smi lists no GPU");
log(`GPUs: ${gpuLines.join("; ")}`);
section("nvidia-smi", fenced(smi.stdout + "\n" + ((await run("nvidia-smi", []))?.stdout ?? "")));

// 2. node-llama-cpp's CUDA prebuilt binaries, from npm.
log(`installing ${CUDA_PACKAGES.join(", ")}`);
const install = await run(Deno.execPath(), [
  "cache",
  "--no-lock",
  "--node-modules-dir=auto",
  ...CUDA_PACKAGES.map((p) => `npm:${p}`),
]);
if (!install || install.code !== 0) fail(`npm install of the CUDA packages failed: ${install?.stderr ?? ""}`);
const found = [...Deno.readDirSync(`${ROOT}node_modules/.deno`)].map((e) => e.name)
  .filter((n) => n.startsWith("@node-llama-cpp+linux-x64-cuda@"));
if (found.length === 0) fail("the CUDA package is not in node_modules after the install");
const bins = `${ROOT}node_modules/.deno/${
  found[0]
}/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda`;

// 3. Their libraries must find the CUDA runtime and the driver: the main build (CUDA 13) or the
// extension's fallback build (CUDA 12), which node-llama-cpp tries next.
const ext = found[0].replace("linux-x64-cuda@", "linux-x64-cuda-ext@");
const builds = [
  { name: "CUDA 13 build", lib: `${bins}/libggml-cuda.so` },
  {
    name: "CUDA 12 fallback",
    lib:
      `${ROOT}node_modules/.deno/${ext}/node_modules/@node-llama-cpp/linux-x64-cuda-ext/bins/linux-x64-cuda/fallback/libggml-cuda.so`,
  },
];
const missing: string[] = [];
let usable: string | undefined;
for (const b of builds) {
  const ldd = await run("ldd", [b.lib]);
  const lacks = (ldd?.stdout ?? "").split("\n").filter((l) => l.includes("not found"))
    .map((l) => l.trim()).filter((l) => !/^lib(ggml|llama)/.test(l)); // node-llama-cpp's own, found at run time
  section(`${b.name} (ldd libggml-cuda.so)`, fenced(ldd?.stdout ?? `ldd unavailable (${b.lib})`));
  if (ldd && lacks.length === 0) usable ??= b.name;
  else missing.push(`${b.name}: ${lacks.join(", ") || "cannot be inspected"}`);
}
if (!usable) {
  fail(
    `node-llama-cpp's CUDA builds cannot load (${missing.join("; ")}). Install the CUDA runtime one was ` +
      "built for (libcudart and libcublas 13 or 12, e.g. from NVIDIA's apt repository) and the NVIDIA " +
      "driver (libcuda.so.1), or put them on LD_LIBRARY_PATH",
  );
}
log(`node-llama-cpp's ${usable} finds its libraries`);

// 4. node-llama-cpp loads its CUDA backend and sees the GPUs.
const probe = await run(Deno.execPath(), [
  "eval",
  `import { getLlama } from "node-llama-cpp";
   const llama = await getLlama({ build: "never", gpu: "cuda", logLevel: "error" });
   console.log(JSON.stringify({ gpu: llama.gpu, devices: await llama.getGpuDeviceNames(), vram: await llama.getVramState() }));`,
]);
if (!probe || probe.code !== 0) {
  fail(
    `node-llama-cpp could not load its CUDA backend: ${
      (probe?.stderr ?? "").trim().split("\n").slice(-5).join(" | ")
    }`,
  );
}
const probed = JSON.parse(probe.stdout.trim().split("\n").pop()!);
if (probed.gpu !== "cuda") fail(`node-llama-cpp loaded '${probed.gpu}', not CUDA`);
log(`node-llama-cpp CUDA: ${probed.devices.join(", ")}`);
section("node-llama-cpp", fenced(JSON.stringify(probed, null, 2), "json"));

// 5. The plan of the bench models on this GPU, then a real start with --gpu cuda.
const models = ["--chat-model", "builtin:bench-moe", "--embedding-model", "builtin:bench-embed"];
const plan = await run(Deno.execPath(), [
  "run",
  "--allow-all",
  "main.ts",
  "--plan",
  "--gpu",
  "cuda",
  ...models,
]);
section("--plan --gpu cuda (bench-moe, bench-embed)", fenced(plan?.stdout || plan?.stderr || "no output"));
log("starting vserve with --gpu cuda on bench-moe and bench-embed (generated on first use: ~5 GB)");
const threads = String(navigator.hardwareConcurrency || 1);
const server = await startServer(["--gpu", "cuda", "--threads", threads, "--api-key", KEY, ...models], {
  waitReady: true,
  timeoutMs: 1_800_000,
});
try {
  const health = await (await fetch(`${server.url}/health`)).json();
  const headers = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
  const chat = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers,
    body: JSON.stringify({
      model: "Vendor/Vendor3.6-35B-A3B",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 16,
    }),
  });
  const embed = await fetch(`${server.url}/v1/embeddings`, {
    method: "POST",
    headers,
    body: JSON.stringify({ model: "Vendor/Vendor3-Embedding-8B", input: "Hello" }),
  });
  section(
    "vserve --gpu cuda: /health and one request each",
    fenced(JSON.stringify(health, null, 2), "json") +
      `\n\nchat: HTTP ${chat.status}; embeddings: HTTP ${embed.status}\n`,
  );
  await chat.body?.cancel();
  await embed.body?.cancel();
} finally {
  await server.stop();
}

// 6. The benchmark on the GPU, against llama-server's CUDA build when it can be built here.
const tools = await Promise.all(
  ["nvcc", "cmake", "git", "c++"].map(async (t) => [t, await run("which", [t])] as const),
);
const canBuild = tools.every(([, r]) => r?.code === 0);
const out = `${ROOT}bench/results/gpu`;
const benchArgs = [
  "run",
  "--allow-all",
  "bench/main.ts",
  "--gpu",
  "cuda",
  "--out",
  out,
  ...(canBuild ? ["--baseline", "llama-server", "--llama-server-cpu", "cuda"] : []),
  ...Deno.args,
];
log(
  `running deno task bench ${benchArgs.slice(3).join(" ")}${
    canBuild ? "" : " (no llama-server baseline: nvcc, cmake, git or c++ missing)"
  }`,
);
const bench = await new Deno.Command(Deno.execPath(), {
  args: benchArgs,
  cwd: ROOT,
  stdout: "inherit",
  stderr: "inherit",
})
  .output();
const latest = await Deno.readTextFile(`${out}/latest.md`).catch(() => "(no results: the benchmark failed)");
section(
  `deno task bench ${benchArgs.slice(3).join(" ")} (exit ${bench.code})`,
  (canBuild
    ? ""
    : `llama-server baseline skipped: ${
      tools.filter(([, r]) => r?.code !== 0).map(([t]) => t).join(", ")
    } missing.\n\n`) +
    latest,
);

const file = `${ROOT}bench/results/gpu-check-${new Date().toISOString().slice(0, 10)}.md`;
await Deno.writeTextFile(file, `# GPU check, ${new Date().toISOString()}\n\n${report.join("\n")}`);
log(`wrote ${file}`);
Deno.exit(bench.code === 0 ? 0 : 1);
