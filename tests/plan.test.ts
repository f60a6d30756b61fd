/**
 * GPU placement settings and the memory plan without loading a model: every new flag parsed and
 * refused with a message naming it; the GGUF header reader against the writer; the spec models'
 * shapes against their published configurations; their plans on the GPUs the README names, as
 * fixed expectations; and the plan's refusals (`--plan` exit status 2, a server that will not start).
 */
import assert from "node:assert/strict";
import { ConfigError, loadConfig } from "../src/config.ts";
import { parseRegistry } from "../src/registry.ts";
import { resolveModelSpecs } from "../src/model_specs.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { readGgufHeader } from "../src/plan/gguf_header.ts";
import { headerForSource, presetHeader } from "../src/plan/headers.ts";
import { PRESETS } from "../src/models/presets.ts";
import { modelShape } from "../src/plan/shape.ts";
import { overrideRules } from "../src/plan/placement.ts";
import { parseOverride } from "../src/tensor_override.ts";
import { type Plan, useTotal } from "../src/plan/memory.ts";
import { hostDevice, modelHeaders, plannedGpus, planSpecs } from "../src/plan/run.ts";
import { runMain } from "./helpers/server.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;
const GiB = 1024 ** 3;

const config = async (args: string[], env: Record<string, string> = {}) =>
  (await loadConfig(args, env)).config;
const refused = async (args: string[], pattern: RegExp, env: Record<string, string> = {}) => {
  await assert.rejects(loadConfig(args, env), (e: Error) => {
    assert.ok(e instanceof ConfigError, `a ConfigError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
};

// ---- flags ----

Deno.test("--cpu-moe and --n-cpu-moe parse, from flags and environment", async () => {
  assert.equal((await config(["--cpu-moe"])).cpuMoe, true);
  assert.equal((await config(["--n-cpu-moe", "12"])).nCpuMoe, 12);
  assert.equal((await config([], { VSERVE_N_CPU_MOE: "3" })).nCpuMoe, 3);
  assert.equal((await config([], { VSERVE_CPU_MOE: "true" })).cpuMoe, true);
  assert.equal((await config([])).cpuMoe, undefined, "unset: the registry decides");
});

Deno.test("bad expert placement values are start-up errors naming the flag", async () => {
  await refused(["--n-cpu-moe", "-1"], /--n-cpu-moe \/ VSERVE_N_CPU_MOE/);
  await refused(["--n-cpu-moe", "two"], /--n-cpu-moe: 'two' is not an integer/);
  await refused(["--cpu-moe=maybe"], /--cpu-moe: 'maybe' is not a boolean/);
  await refused(["--cpu-moe", "--n-cpu-moe", "4"], /--cpu-moe and --n-cpu-moe: give one/);
});

Deno.test("--override-tensor takes PATTERN=DEVICE rules, repeated or comma-separated, in order", async () => {
  const c = await config([
    "--override-tensor",
    "blk\\.0\\.attn_q=CPU,token_embd=CUDA0",
    "--override-tensor",
    "x=CUDA1",
  ]);
  assert.deepEqual(c.overrideTensor, ["blk\\.0\\.attn_q=CPU", "token_embd=CUDA0", "x=CUDA1"]);
  assert.deepEqual(parseOverride("a=b=CPU"), { pattern: "a=b", device: "CPU", from: "--override-tensor" });
});

Deno.test("bad --override-tensor entries are start-up errors naming the flag and the fault", async () => {
  await refused(
    ["--override-tensor", "ffn_exps"],
    /--override-tensor \/ VSERVE_OVERRIDE_TENSOR: 'ffn_exps' is not PATTERN=DEVICE/,
  );
  await refused(
    ["--override-tensor", "blk\\.(0=CPU"],
    /--override-tensor .*'blk\\\.\(0' is not a regular expression/,
  );
  await refused(["--override-tensor", "exps=CU DA0"], /--override-tensor .*'CU DA0' is not a device name/);
  await refused(["--override-tensor", "=CPU"], /--override-tensor .*is not PATTERN=DEVICE/);
});

Deno.test("--tensor-split, --main-gpu and --split-mode parse and refuse bad values by name", async () => {
  const c = await config(["--tensor-split", "3,1", "--main-gpu", "1", "--split-mode", "row"]);
  assert.deepEqual(c.tensorSplit, [3, 1]);
  assert.equal(c.mainGpu, 1);
  assert.equal(c.splitMode, "row");
  assert.deepEqual((await config([], { VSERVE_TENSOR_SPLIT: "0.6,0.4" })).tensorSplit, [0.6, 0.4]);
  await refused(["--tensor-split", "3,x"], /--tensor-split: 'x' is not a number/);
  await refused(["--tensor-split", "0,0"], /--tensor-split .*at least one proportion/);
  await refused(["--tensor-split", "-1,2"], /--tensor-split: '-1' is not a number/);
  await refused(["--main-gpu", "-1"], /--main-gpu \/ VSERVE_MAIN_GPU/);
  await refused(["--split-mode", "diagonal"], /--split-mode \/ VSERVE_SPLIT_MODE/);
});

Deno.test("--plan, --json, --vram and --ram parse; --json needs --plan; bad sizes name the flag", async () => {
  const c = await config(["--plan", "--json", "--vram", "24,24", "--ram", "63.5"]);
  assert.deepEqual([c.plan, c.json, c.vram, c.ram], [true, true, [24, 24], 63.5]);
  await refused(["--json"], /--json goes with --plan/);
  await refused(["--plan", "--vram", "0"], /--vram \/ VSERVE_VRAM/);
  await refused(["--plan", "--vram", "24GB"], /--vram: '24GB' is not a number/);
  await refused(["--ram", "-4"], /--ram: '-4' is not a number/);
});

Deno.test("registry entries take the placement settings; bad ones name the entry and field", () => {
  const [spec] = parseRegistry({
    models: [{
      id: "m",
      kind: "chat",
      source: "builtin:tiny-moe",
      nCpuMoe: 2,
      overrideTensor: ["output=CPU"],
      tensorSplit: [1, 1],
      mainGpu: 0,
      splitMode: "layer",
    }],
  }, "test");
  assert.equal(spec.nCpuMoe, 2);
  assert.throws(
    () =>
      parseRegistry({ models: [{ id: "m", kind: "chat", source: "x", cpuMoe: true, nCpuMoe: 1 }] }, "r.json"),
    /r\.json: models\[0\]\.nCpuMoe: give cpuMoe or nCpuMoe, not both/,
  );
  assert.throws(
    () =>
      parseRegistry({ models: [{ id: "m", kind: "chat", source: "x", overrideTensor: ["nope"] }] }, "r.json"),
    /models\[0\]\.overrideTensor\[0\]: 'nope' is not PATTERN=DEVICE/,
  );
  assert.throws(
    () => parseRegistry({ models: [{ id: "m", kind: "chat", source: "x", splitMode: "rows" }] }, "r.json"),
    /models\[0\]\.splitMode/,
  );
});

Deno.test("expert rules are llama-server's patterns: --n-cpu-moe N matches exactly the first N layers' experts", () => {
  const rules = overrideRules({ nCpuMoe: 2 });
  const names = [0, 1, 2, 10, 11].flatMap((l) =>
    ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_gate_inp", "attn_q"].map((t) =>
      `blk.${l}.${t}.weight`
    )
  );
  const matched = names.filter((n) => rules.some((r) => new RegExp(r.pattern).test(n)));
  assert.deepEqual(matched, [
    "blk.0.ffn_gate_exps.weight",
    "blk.0.ffn_up_exps.weight",
    "blk.0.ffn_down_exps.weight",
    "blk.1.ffn_gate_exps.weight",
    "blk.1.ffn_up_exps.weight",
    "blk.1.ffn_down_exps.weight",
  ]);
  const all = overrideRules({ cpuMoe: true, overrideTensor: ["output=CPU"] });
  assert.deepEqual(all.map((r) => r.from), ["--override-tensor", "--cpu-moe"], "explicit rules first");
});

// ---- the header reader ----

Deno.test("the GGUF header reader gives the writer's tensors and metadata (tiny-moe file)", async () => {
  const path = await resolveSource("builtin:tiny-moe", { cacheDir: CACHE, hubUrl: "", log: silentLogger });
  const read = await readGgufHeader(path);
  const built = await presetHeader("tiny-moe", PRESETS["tiny-moe"]);
  assert.deepEqual(read.tensors, built.tensors);
  assert.equal(read.metadata["general.architecture"], "qwen35moe");
  assert.equal(read.metadata["qwen35moe.expert_count"], 8);
  assert.deepEqual(read.metadata["qwen35moe.rope.dimension_sections"], [2, 1, 1, 0]);
  assert.deepEqual(read.metadata["tokenizer.ggml.tokens"], built.metadata["tokenizer.ggml.tokens"]);
  const data = read.tensors.reduce((sum, t) => sum + Math.ceil(t.bytes / 32) * 32, 0);
  const size = (await Deno.stat(path)).size;
  assert.ok(size > data && size - data < 8 << 20, "the tensors are the file's data section");
});

Deno.test("the header reader refuses what is not a GGUF header, naming the file", async () => {
  const file = await Deno.makeTempFile();
  await Deno.writeTextFile(file, "not a model");
  await assert.rejects(readGgufHeader(file), new RegExp(`'${file}' is not a GGUF file`));
  await Deno.writeFile(file, new Uint8Array([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0, 1]));
  await assert.rejects(readGgufHeader(file), /ends inside its GGUF header/);
  await Deno.remove(file);
});

// ---- the spec models' shapes (published config.json figures) ----

Deno.test("shape:qwen3.6-35b-a3b is Qwen3.6-35B-A3B: 40 layers, 10 attention, 256×512 experts, 248,320 tokens", async () => {
  const h = await headerForSource("shape:qwen3.6-35b-a3b", CACHE);
  assert.equal(h.kind, "gguf");
  const s = modelShape(h.kind === "gguf" ? h.header : assert.fail());
  assert.deepEqual([s.arch, s.nLayer, s.nEmbd, s.nVocab, s.nCtxTrain], [
    "qwen35moe",
    40,
    2048,
    248320,
    262144,
  ]);
  assert.deepEqual(s.attentionLayers.map((a) => a.layer), [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]);
  assert.deepEqual(
    s.attentionLayers[0],
    { layer: 3, kValues: 2 * 256, vValues: 2 * 256 },
    "2 KV heads of 256",
  );
  // Gated DeltaNet: 16 key heads and 32 value heads of 128, conv kernel 4 (f32 state).
  assert.deepEqual(s.recurrentLayers[0], {
    layer: 0,
    convValues: 3 * (16 * 128 * 2 + 32 * 128),
    stateValues: 128 * 32 * 128,
  });
  assert.equal(s.recurrentLayers.length, 30);
  assert.deepEqual(s.experts, { count: 256, used: 8, width: 512, sharedWidth: 512 });
  const bytes = (group: string) =>
    s.tensors.filter((t) => t.group === group).reduce((a, t) => a + t.bytes, 0);
  const q8 = (n: number) => (n / 32) * 34;
  assert.equal(
    bytes("experts"),
    40 * (3 * q8(256 * 512 * 2048) + 2048 * 256 * 4),
    "gate/up/down experts in Q8_0 + F32 routers",
  );
  assert.equal(bytes("embeddings"), q8(248320 * 2048));
  const params = s.tensors.reduce((a, t) => a + t.dims.reduce((x, y) => x * y, 1), 0);
  assert.ok(params > 34.6e9 && params < 34.8e9, `~35B parameters, got ${params}`);
  const total = s.tensors.reduce((a, t) => a + t.bytes, 0);
  assert.ok(total > 36.8e9 && total < 37e9, `~37 GB at Q8_0, got ${total}`);
});

Deno.test("shape:qwen3-embedding-8b is Qwen3-Embedding-8B: 36 layers, 4096 wide, 32/8 heads of 128, FFN 12,288", async () => {
  const h = await headerForSource("shape:qwen3-embedding-8b", CACHE);
  const s = modelShape(h.kind === "gguf" ? h.header : assert.fail());
  assert.deepEqual([s.arch, s.nLayer, s.nEmbd, s.nHead, s.ffnWidth, s.pooling], [
    "qwen3",
    36,
    4096,
    32,
    12288,
    "last",
  ]);
  assert.equal(
    s.nVocab,
    151669,
    "the Qwen3 tokenizer (config.json's vocab_size 151,665 leaves out 4 added tokens)",
  );
  assert.equal(s.attentionLayers.length, 36);
  assert.deepEqual(s.attentionLayers[0], { layer: 0, kValues: 8 * 128, vValues: 8 * 128 });
  assert.equal(s.tiedOutput, true, "no LM head: llama.cpp uses the token table");
  const params = s.tensors.reduce((a, t) => a + t.dims.reduce((x, y) => x * y, 1), 0);
  // 36 × (2·4096² + 2·4096·1024 + 3·4096·12288 + norms) + the token table.
  assert.equal(
    params,
    36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128) + 4096 +
      151669 * 4096,
  );
  assert.ok(params > 7.56e9 && params < 7.58e9, "7.57 B (8.19 B counts Qwen3-8B's untied 151,936-row head)");
});

Deno.test("shape: sources are planned, never served, and unknown ones are named", async () => {
  await assert.rejects(
    headerForSource("shape:qwen9-1t", CACHE),
    /unknown shape 'shape:qwen9-1t' \(known: shape:qwen3\.6-35b-a3b/,
  );
  await assert.rejects(
    resolveSource("shape:qwen3.6-35b-a3b", { cacheDir: CACHE, hubUrl: "", log: silentLogger }),
    /shape:qwen3\.6-35b-a3b.*header only.*--plan/,
  );
});

// ---- the real shapes' plans on the GPUs the README names (fixed expectations) ----

async function planFor(args: string[]): Promise<Plan> {
  const c = await config([
    "--plan",
    "--chat-model",
    "shape:qwen3.6-35b-a3b",
    "--embedding-model",
    "shape:qwen3-embedding-8b",
    "--ram",
    "64",
    ...args,
  ]);
  const specs = await resolveModelSpecs(c);
  return planSpecs(specs, c, await modelHeaders(specs, c), [...plannedGpus(c), await hostDevice(c)]).plan;
}

/** A row of the README's GPU table: GPUs, chat sequences × context, and what the plan must choose. */
const README_ROWS: {
  vram: string;
  parallel: number;
  ctx: number;
  nCpuMoe: number;
  gpu: number[];
  host: number;
  /** `--tensor-split` proportions. */
  split?: string;
}[] = [
  { vram: "22.5", parallel: 4, ctx: 32768, nCpuMoe: 32, gpu: [21.86], host: 28.68 },
  { vram: "22.5", parallel: 8, ctx: 32768, nCpuMoe: 35, gpu: [22.21], host: 32.06 },
  { vram: "24", parallel: 8, ctx: 32768, nCpuMoe: 33, gpu: [23.81], host: 30.46 },
  { vram: "45", parallel: 8, ctx: 32768, nCpuMoe: 7, gpu: [44.53], host: 9.74 },
  { vram: "45", parallel: 8, ctx: 131072, nCpuMoe: 26, gpu: [44.39], host: 24.88 },
  { vram: "79.6", parallel: 8, ctx: 32768, nCpuMoe: 0, gpu: [49.84], host: 4.16 },
  { vram: "79.6", parallel: 8, ctx: 131072, nCpuMoe: 0, gpu: [64.84], host: 4.16 },
  { vram: "79.6", parallel: 4, ctx: 262144, nCpuMoe: 0, gpu: [64.59], host: 3.18 },
  { vram: "22.5,22.5", parallel: 8, ctx: 32768, nCpuMoe: 25, gpu: [8.93, 22.27], host: 24.09 },
  { vram: "22.5,22.5", parallel: 8, ctx: 32768, nCpuMoe: 9, gpu: [22.21, 21.47], host: 11.34, split: "4,3" },
];

for (const row of README_ROWS) {
  const split = row.split ? ["--tensor-split", row.split] : [];
  const name =
    `README plan: ${row.vram} GiB${row.split ? ` split ${row.split}` : ""}, ${row.parallel} × ${row.ctx} ` +
    `tokens → --n-cpu-moe ${row.nCpuMoe}`;
  Deno.test(name, async () => {
    const plan = await planFor([
      "--vram",
      row.vram,
      "--parallel",
      String(row.parallel),
      "--ctx-size",
      String(row.ctx),
      ...split,
    ]);
    assert.equal(plan.fits, true);
    const [chat, embed] = plan.models;
    assert.equal(chat.placement.nCpuMoe ?? 0, row.nCpuMoe);
    assert.equal(chat.gpuLayers, 41, "every layer on the GPU (experts aside)");
    assert.equal(embed.gpuLayers, 37, "the embedding model wholly on the GPU");
    const gib = (n: number) => Math.round(n / GiB * 100) / 100;
    const gpus = plan.devices.filter((d) => d.kind === "gpu");
    assert.deepEqual(gpus.map((d) => gib(d.used + d.runtime)), row.gpu);
    assert.equal(gib(plan.devices.find((d) => d.kind === "host")!.used + GiB), row.host);
  });
}

Deno.test("the 35B-A3B's KV cache is kept by its 10 attention layers only; its state per sequence is fixed", async () => {
  const plan = await planFor(["--vram", "79.6", "--parallel", "8", "--ctx-size", "32768"]);
  const chat = plan.models[0].devices.CUDA0;
  assert.equal(
    chat.kv,
    8 * 32768 * 10 * 2 * (2 * 256) * 2,
    "cells × 10 layers × (K + V) × 2 heads × 256 × f16",
  );
  assert.equal(
    chat.recurrent,
    8 * 30 * (3 * 8192 + 128 * 4096) * 4,
    "8 sequences × 30 layers × (conv + state) × f32",
  );
  assert.equal(plan.models[0].devices.CPU.checkpoints, 4 * chat.recurrent, "4 checkpoints per sequence");
  const embed = plan.models[1].devices.CUDA0;
  assert.equal(embed.kv, (8192 + 2048) * 36 * 2 * (8 * 128) * 2);
});

Deno.test("the prompt cache is a host line of its own (--cache-ram, default 8192 MiB), outside the fit; a note when host memory cannot hold it", async () => {
  const plan = await planFor(["--vram", "79.6"]);
  const [chat, embed] = plan.models;
  assert.equal(chat.devices.CPU.promptCache, 8192 * 2 ** 20);
  assert.equal(embed.devices.CPU?.promptCache ?? 0, 0, "an embedding model keeps no prompt cache");
  const u = chat.devices.CPU;
  const weights = Object.values(u.weights).reduce((a, b) => a + (b ?? 0), 0);
  assert.equal(useTotal(u), weights + u.kv + u.recurrent + u.checkpoints + u.output + u.compute);
  assert.ok(!chat.notes.some((n) => n.includes("prompt cache")), "64 GiB of host memory holds it");

  const small = await planFor(["--vram", "79.6", "--cache-ram", "1024", "--ram", "4"]);
  assert.equal(small.models[0].devices.CPU.promptCache, 1024 * 2 ** 20);
  assert.equal(small.fits, true, "the cache is a ceiling: it does not decide the fit");
  const tight = await planFor(["--vram", "79.6", "--ram", "4"]);
  assert.equal(tight.fits, true);
  assert.ok(tight.models[0].notes.some((n) => /prompt cache may fill 8192 MiB .* lower --cache-ram/.test(n)));
});

// ---- refusals ----

Deno.test("--plan exits 2 with the nearest settings when the model cannot fit (--vram 1, all layers)", async () => {
  const out = await runMain([
    "--plan",
    "--vram",
    "1",
    "--ram",
    "64",
    "--gpu-layers",
    "max",
    "--chat-model",
    "shape:qwen3.6-35b-a3b",
  ]);
  assert.equal(out.code, 2, out.stderr);
  assert.match(out.stdout, /CUDA0 .* of 1\.00 GiB \(--vram\): DOES NOT FIT/);
  assert.match(out.stdout, /does not fit\nnearest settings that fit:\n {2}--gpu-layers \d+/);
  assert.match(out.stdout, /weights: experts/);
});

Deno.test("--plan --json is the same plan as JSON, exit 0 when it fits", async () => {
  const out = await runMain(["--plan", "--json", "--vram", "79.6", "--chat-model", "shape:qwen3.6-35b-a3b"]);
  assert.equal(out.code, 0, out.stderr);
  const plan = JSON.parse(out.stdout);
  assert.equal(plan.fits, true);
  assert.deepEqual(plan.devices.map((d: { name: string }) => d.name), ["CUDA0", "CPU"]);
  const chat = plan.models[0];
  assert.equal(chat.id, "Vendor/Vendor3.6-35B-A3B");
  assert.equal(chat.context.sequences, 4);
  assert.ok(chat.devices.CUDA0.weights.experts > 30 * GiB);
  const gpu = chat.devices.CUDA0;
  const weights = (Object.values(gpu.weights) as number[]).reduce((a, b) => a + b, 0);
  assert.equal(gpu.total, weights + gpu.kv + gpu.recurrent + gpu.checkpoints + gpu.output + gpu.compute);
});

Deno.test("--main-gpu and --tensor-split beyond the planned GPUs cannot be planned, naming the flag", async () => {
  const main = await runMain([
    "--plan",
    "--vram",
    "24",
    "--main-gpu",
    "1",
    "--chat-model",
    "shape:qwen3.6-35b-a3b",
  ]);
  assert.equal(main.code, 1);
  assert.match(main.stderr, /--main-gpu 1: there is 1 GPU \(0-0\)/);
  const split = await runMain([
    "--plan",
    "--vram",
    "24",
    "--tensor-split",
    "1,1",
    "--chat-model",
    "shape:qwen3.6-35b-a3b",
  ]);
  assert.match(split.stderr, /--tensor-split has 2 proportions for 1 GPU/);
});

Deno.test("the server refuses to start when the models cannot fit its memory (--ram 0.5), with the plan's message", async () => {
  const out = await runMain(["--port", "0", "--ram", "0.5"]);
  assert.equal(out.code, 2);
  assert.match(
    out.stderr,
    /refusing to start: the configured models do not fit: CPU needs [\d.]+ GiB of 512\.0 MiB \(--ram\)/,
  );
  assert.match(out.stderr, /--plan shows the whole plan/);
  assert.doesNotMatch(out.stderr, /"msg":"listening"/, "it stops before listening");
});

Deno.test({
  name: "--vram on a server without a GPU is a start-up error naming the flag (it plans GPUs with --plan)",
  ignore: await hasNvidiaSmi(),
  fn: async () => {
    const out = await runMain(["--port", "0", "--vram", "24"]);
    assert.equal(out.code, 2);
    assert.match(
      out.stderr,
      /refusing to start: --vram: there is no GPU here \(with --plan, --vram plans GPUs/,
    );
  },
});

Deno.test("--plan with the built-in registry fits this machine's memory (exit 0)", async () => {
  const out = await runMain(["--plan"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stdout, /Vendor\/Vendor3\.6-35B-A3B {2}qwen35moe {2}Q8_0/);
  assert.match(out.stdout, /CPU .* \(MemTotal|cgroup memory\.max\): fits/);
});

Deno.test("a plan's device totals are the sums of its models' uses", async () => {
  const plan = await planFor(["--vram", "22.5,22.5", "--parallel", "8"]);
  for (const d of plan.devices) {
    const sum = plan.models.reduce((a, m) => a + (m.devices[d.name] ? useTotal(m.devices[d.name]) : 0), 0);
    assert.equal(d.used, sum);
  }
});

// ---- the GPU check ----

async function hasNvidiaSmi(): Promise<boolean> {
  try {
    await new Deno.Command("nvidia-smi", { stdout: "null", stderr: "null" }).output();
    return true;
  } catch {
    return false;
  }
}

Deno.test({
  name: "deno task gpu-check stops at once on a machine without a GPU, saying why",
  ignore: await hasNvidiaSmi(),
  fn: async () => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "scripts/gpu_check.ts"],
      cwd: new URL("../", import.meta.url).pathname,
      env: { PATH: "/usr/bin:/bin" },
      stdin: "null",
    }).output();
    assert.equal(out.code, 1);
    assert.match(
      new TextDecoder().decode(out.stderr),
      /gpu-check: no NVIDIA GPU here: nvidia-smi is not installed/,
    );
  },
});
