/**
 * The memory plan and the expert placement against llama.cpp itself. The plan's figures are
 * checked, within 10%, against what llama.cpp's load log says it allocated: real loads of the
 * generated stand-ins through the engines (weights, KV cache, recurrent state, logits and compute
 * buffers), and `no_alloc` dry runs of header-only files (sparse, no weights) for bench-moe and
 * the spec models' real shapes, where llama.cpp sizes every buffer without allocating it.
 * Placement: the tensor overrides move exactly the expert tensors of the layers asked for, as
 * llama.cpp's own log reports them, in a dry run of bench-moe and through the server on tiny-moe.
 */
import assert from "node:assert/strict";
import { silentLogger } from "../src/log.ts";
import { loadConfig } from "../src/config.ts";
import { parseRegistry } from "../src/registry.ts";
import { resolveSource } from "../src/models/sources.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { backendDevices, MODEL_PARAMS, openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { placementParams } from "../src/engines/llama/native.ts";
import { writeGgufHeaderOnly } from "../src/models/gguf_writer.ts";
import { loadQwen3Vocab } from "../src/models/qwen3_vocab.ts";
import { PRESETS } from "../src/models/presets.ts";
import { qwen35moeGguf, type Qwen35MoePreset } from "../src/models/qwen35moe_gguf.ts";
import { qwen3Gguf, type Qwen3Preset } from "../src/models/qwen3_gguf.ts";
import { SHAPES } from "../src/plan/headers.ts";
import { readGgufHeader } from "../src/plan/gguf_header.ts";
import { type LlamaAllocations, parseLlamaLog, sumOf } from "../src/plan/llama_log.ts";
import type { DeviceUse, ModelPlan } from "../src/plan/memory.ts";
import { overrideRules, type PlacementSettings } from "../src/plan/placement.ts";
import { hostDevice, planSpecs } from "../src/plan/run.ts";
import { type Json, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;
// The runtime loads the ggml backends the library below lists.
await llamaRuntime("cpu", silentLogger);
const lib = openLlamaLibrary();
const cpu = backendDevices(lib).find((d) => d.type === "CPU")!;

/** `planned` is within 10% of what llama.cpp allocated. */
function assertNear(planned: number, actual: number, what: string) {
  assert.ok(actual > 0, `${what}: llama.cpp's log says nothing of it`);
  const off = (planned - actual) / actual;
  assert.ok(
    Math.abs(off) <= 0.1,
    `${what}: planned ${planned}, llama.cpp ${actual} (${(off * 100).toFixed(1)}%)`,
  );
}

/** The plan of one registry entry on this machine's host memory. */
async function planOf(entry: Record<string, unknown>, path: string, args: string[] = []): Promise<ModelPlan> {
  const { config } = await loadConfig(args, {});
  const [spec] = parseRegistry({ models: [entry] }, "test");
  const header = { kind: "gguf" as const, header: await readGgufHeader(path), origin: path };
  const { plan } = planSpecs([spec], config, new Map([[spec.id, header]]), [await hostDevice(config)]);
  return plan.models[0];
}

/** Every figure of a plan's host use against llama.cpp's allocations. */
function assertPlanMatches(use: DeviceUse, a: LlamaAllocations, what: string, weightsActual?: number) {
  const weights = Object.values(use.weights).reduce((x, y) => x + (y ?? 0), 0);
  assertNear(weights, weightsActual ?? sumOf(a.model), `${what} weights`);
  assertNear(use.kv, a.kvTotal ?? 0, `${what} KV cache`);
  if (use.recurrent || a.recurrentTotal) {
    assertNear(use.recurrent, a.recurrentTotal ?? 0, `${what} recurrent state`);
  }
  assertNear(use.output, sumOf(a.output), `${what} logits buffer`);
  assertNear(use.compute, sumOf(a.compute), `${what} compute buffer`);
}

async function builtin(name: string): Promise<string> {
  return await resolveSource(`builtin:${name}`, { cacheDir: CACHE, hubUrl: "", log: silentLogger });
}

// ---- real loads through the engines ----

/**
 * llama.cpp's load log of an engine, loaded in a process of its own (tests/helpers/load_log_child.ts):
 * in this one, another test module of the parallel run may hold llama.cpp's process-wide log callback.
 */
async function loadLogged(
  kind: "chat" | "embedding",
  options: Record<string, unknown>,
): Promise<LlamaAllocations> {
  const child = new URL("./helpers/load_log_child.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", child, JSON.stringify({ kind, options })],
    stdout: "null",
    stderr: "piped",
  }).output();
  const log = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `the load failed:\n${log.slice(-2000)}`);
  return parseLlamaLog(log.split("\n").map((l) => l.trim()).filter(Boolean));
}

Deno.test("plan vs llama.cpp, tiny-moe chat engine (hybrid: KV in the attention layer, state in DeltaNet layers)", async () => {
  const path = await builtin("tiny-moe");
  const plan = await planOf({ id: "m", kind: "chat", source: path, contextSize: 4096, parallel: 4 }, path);
  const a = await loadLogged("chat", {
    modelPath: path,
    gpuLayers: 0,
    threads: 1,
    parallel: 4,
    contextSize: 4096,
  });
  assert.ok(plan.devices.CPU.recurrent > 0 && plan.devices.CPU.checkpoints > 0);
  assertPlanMatches(plan.devices.CPU, a, "tiny-moe");
});

Deno.test("plan vs llama.cpp, tiny-chat chat engine (dense Qwen3)", async () => {
  const path = await builtin("tiny-chat");
  const plan = await planOf({ id: "m", kind: "chat", source: path, contextSize: 8192, parallel: 2 }, path);
  const a = await loadLogged("chat", {
    modelPath: path,
    gpuLayers: 0,
    threads: 1,
    parallel: 2,
    contextSize: 8192,
  });
  assert.equal(plan.devices.CPU.recurrent, 0);
  assertPlanMatches(plan.devices.CPU, a, "tiny-chat");
});

Deno.test("plan vs llama.cpp, spec-embed embedding engine (4096 wide, tied head, 64 sequences)", async () => {
  const path = await builtin("spec-embed");
  const plan = await planOf({ id: "e", kind: "embedding", source: path, maxInputTokens: 8192 }, path);
  const a = await loadLogged("embedding", {
    modelPath: path,
    gpuLayers: 0,
    threads: 1,
    maxInputTokens: 8192,
    // The plan is of the main context: the short one (scheduling.md) is not in it yet.
    shortPass: "off",
  });
  assertPlanMatches(plan.devices.CPU, a, "spec-embed");
});

// ---- dry runs (no_alloc) of header-only files: bench-moe and the real shapes ----

const dir = await Deno.makeTempDir({ prefix: "vserve-plan-" });
const vocab = await loadQwen3Vocab();

const written = new Map<string, Promise<string>>();

/** A header-only (sparse) GGUF of preset `p`: full size on paper, no weights on disk. */
function headerOnly(name: string, p: Qwen35MoePreset | Qwen3Preset): Promise<string> {
  if (!written.has(name)) {
    const path = `${dir}/${name}.gguf`;
    const { metadata, tensors } = p.arch === "qwen35moe"
      ? qwen35moeGguf(name, p, vocab)
      : qwen3Gguf(name, p, vocab);
    written.set(name, writeGgufHeaderOnly(path, metadata, tensors).then(() => path));
  }
  return written.get(name)!;
}

/**
 * llama.cpp's dry run of `path` with `placement`, and a context as the engine would create it, in a
 * process of its own whose stderr carries llama.cpp's whole log (tests/helpers/dry_run_child.ts).
 */
async function dryRun(
  path: string,
  plan: ModelPlan,
  kind: "chat" | "embedding",
  placement: PlacementSettings = {},
): Promise<{ a: LlamaAllocations; weights: number }> {
  const c = plan.context!;
  const context = {
    nCtx: c.cells,
    nBatch: c.ubatch,
    nUbatch: c.ubatch,
    nSeqMax: c.sequences,
    threads: 1,
    embeddings: false,
    kvUnified: c.unified,
    ...(kind === "embedding" ? { pooling: "none" as const } : {}),
  };
  const patterns = overrideRules(placement).map((r) => r.pattern);
  const child = new URL("./helpers/dry_run_child.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", child, JSON.stringify({ path, patterns, context })],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const log = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `the dry run failed:\n${log.slice(-2000)}`);
  const { weights } = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
  return { a: parseLlamaLog(log.split("\n").map((l) => l.trim()).filter(Boolean)), weights };
}

const SPARSE = [
  {
    name: "bench-moe",
    preset: PRESETS["bench-moe"],
    entry: { kind: "chat", contextSize: 32768, parallel: 4 },
  },
  {
    name: "qwen3.6-35b-a3b",
    preset: SHAPES["qwen3.6-35b-a3b"],
    entry: { kind: "chat", contextSize: 32768, parallel: 2 },
  },
  {
    name: "qwen3.6-35b-a3b",
    preset: SHAPES["qwen3.6-35b-a3b"],
    entry: { kind: "chat", contextSize: 131072, parallel: 1 },
  },
  {
    name: "qwen3-embedding-8b",
    preset: SHAPES["qwen3-embedding-8b"],
    entry: { kind: "embedding", maxInputTokens: 8192 },
  },
] as const;

for (const { name, preset, entry } of SPARSE) {
  const label = entry.kind === "chat"
    ? `${entry.parallel} × ${entry.contextSize}`
    : `${entry.maxInputTokens} tokens`;
  Deno.test(`plan vs llama.cpp dry run, ${name} (${label}): KV, state, logits and compute within 10%`, async () => {
    const path = await headerOnly(name, preset);
    const plan = await planOf({ id: "m", source: path, ...entry }, path);
    const { a, weights } = await dryRun(path, plan, entry.kind);
    assertPlanMatches(plan.devices.CPU, a, name, weights);
  });
}

// ---- placement: the override moves exactly the experts asked for ----

Deno.test("bench-moe dry run: --n-cpu-moe 3 overrides exactly layers 0-2's gate/up/down experts; --cpu-moe all 40 layers'", async () => {
  const path = await headerOnly("bench-moe", PRESETS["bench-moe"]);
  const plan = await planOf({ id: "m", kind: "chat", source: path, contextSize: 4096, parallel: 1 }, path);
  const three = (await dryRun(path, plan, "chat", { nCpuMoe: 3 })).a.overridden;
  const expected = [0, 1, 2].flatMap((l) =>
    ["down", "gate", "up"].map((t) => `blk.${l}.ffn_${t}_exps.weight`)
  );
  assert.deepEqual(three.map((o) => o.tensor).sort(), expected);
  assert.ok(three.every((o) => o.bufferType === "CPU"));
  const all = (await dryRun(path, plan, "chat", { cpuMoe: true })).a.overridden;
  assert.equal(all.length, 40 * 3);
  assert.ok(all.every((o) => /^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$/.test(o.tensor)));
  const none = (await dryRun(path, plan, "chat", {})).a.overridden;
  assert.equal(none.length, 0, "no override, no line");
});

Deno.test("an --override-tensor rule moves what it matches (a searched regex), before the expert rules; the plan agrees", async () => {
  const path = await headerOnly("bench-moe", PRESETS["bench-moe"]);
  const args = ["--override-tensor", "attn_output=CPU", "--n-cpu-moe", "1"];
  const plan = await planOf(
    { id: "m", kind: "chat", source: path, contextSize: 4096, parallel: 1 },
    path,
    args,
  );
  const moved = (await dryRun(path, plan, "chat", plan.placement)).a.overridden.map((o) => o.tensor);
  // Searched, not anchored (std::regex_search): `attn_output` is in the 10 attention layers' names.
  const attention = [3, 7, 11, 15, 19, 23, 27, 31, 35, 39].map((l) => `blk.${l}.attn_output.weight`);
  const experts = ["down", "gate", "up"].map((t) => `blk.0.ffn_${t}_exps.weight`);
  assert.deepEqual(moved.sort(), [...attention, ...experts].sort());
  assert.deepEqual(plan.overrides.map((o) => [o.from, o.tensors]), [["--override-tensor", 10], [
    "--n-cpu-moe",
    3,
  ]]);
});

Deno.test("placement settings land in llama_model_params at llama.h's offsets (overrides list, split, main GPU)", () => {
  const params = lib.symbols.llama_model_default_params();
  const view = new DataView(params.buffer);
  const kept = placementParams(lib, view, {
    overrides: [{ pattern: "exps", bufferType: cpu.bufferType }, {
      pattern: "^output",
      bufferType: cpu.bufferType,
    }],
    splitMode: "row",
    mainGpu: 1,
    tensorSplit: [3, 1],
  });
  assert.ok(kept);
  assert.equal(view.getInt32(MODEL_PARAMS.splitMode, true), 2);
  assert.equal(view.getInt32(MODEL_PARAMS.mainGpu, true), 1);
  const at = (offset: number) => Deno.UnsafePointer.create(view.getBigUint64(offset, true))!;
  const split = new Float32Array(Deno.UnsafePointerView.getArrayBuffer(at(MODEL_PARAMS.tensorSplit), 16 * 4));
  assert.deepEqual([...split.slice(0, 3)], [3, 1, 0], "llama_max_devices() floats, zero-padded");
  const list = new BigUint64Array(
    Deno.UnsafePointerView.getArrayBuffer(at(MODEL_PARAMS.tensorBuftOverrides), 3 * 16),
  );
  const text = (p: bigint) => Deno.UnsafePointerView.getCString(Deno.UnsafePointer.create(p)!);
  assert.deepEqual([text(list[0]), text(list[2])], ["exps", "^output"]);
  assert.equal(list[1], BigInt(Deno.UnsafePointer.value(cpu.bufferType)));
  assert.deepEqual([list[4], list[5]], [0n, 0n], "a null pattern ends the list");
});

async function registryFile(models: unknown[]): Promise<string> {
  const file = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(file, JSON.stringify({ models }));
  return file;
}

serverTest(
  "tiny-moe served with the registry's nCpuMoe 2: llama.cpp moves layers 0-1's experts; /health says so",
  async () => {
    const file = await registryFile([{
      id: "moe",
      kind: "chat",
      source: "builtin:tiny-moe",
      nCpuMoe: 2,
      parallel: 2,
    }]);
    const server = await startServer(["--models", file, "--log-level", "debug"], { waitReady: true });
    try {
      const health: Json = await (await fetch(`${server.url}/health`)).json();
      const placement = health.models[0].placement;
      assert.equal(placement.n_cpu_moe, 2);
      assert.deepEqual(
        placement.overrides.map((o: Json) => [o.pattern, o.device, o.tensors, o.placed]),
        [0, 1].map((l) => [`blk\\.${l}\\.ffn_(up|down|gate|gate_up)_(ch|)exps`, "CPU", 3, { CPU: 3 }]),
      );
      const memory = health.models[0].memory_mib;
      assert.ok(memory.planned.CPU.total > 0 && memory.allocated.compute.CPU > 0);
      const moved = server.logs.map((l) =>
        l.match(/llama\.cpp: tensor (\S+) \(.*\) buffer type overridden to CPU/)?.[1]
      )
        .filter(Boolean).sort();
      assert.deepEqual(
        moved,
        [0, 1].flatMap((l) => ["down", "gate", "up"].map((t) => `blk.${l}.ffn_${t}_exps.weight`)),
      );
    } finally {
      await server.stop();
      await Deno.remove(file);
    }
  },
);

serverTest(
  "--cpu-moe overrides the registry's nCpuMoe (every layer's experts move); /health shows the split settings",
  async () => {
    const file = await registryFile([{
      id: "moe",
      kind: "chat",
      source: "builtin:tiny-moe",
      nCpuMoe: 1,
      parallel: 2,
      splitMode: "row",
    }]);
    const server = await startServer(
      ["--models", file, "--cpu-moe", "--split-mode", "none", "--main-gpu", "0", "--tensor-split", "1"],
      { waitReady: true },
    );
    try {
      const health: Json = await (await fetch(`${server.url}/health`)).json();
      const placement = health.models[0].placement;
      const [rule] = placement.overrides;
      assert.deepEqual([placement.split_mode, placement.main_gpu, placement.tensor_split], ["none", 0, [1]]);
      assert.equal(placement.cpu_moe, true);
      assert.deepEqual(
        [rule.from, rule.tensors, rule.placed],
        ["--cpu-moe", 12, { CPU: 12 }],
        "4 layers × 3",
      );
      assert.ok(
        server.logs.some((l) => l.includes('"msg":"tensor overrides applied"') && l.includes('"CPU":12')),
      );
    } finally {
      await server.stop();
      await Deno.remove(file);
    }
  },
);

serverTest(
  "an override to a device that is not here refuses to start, naming the flag and the devices",
  async () => {
    const server = await startServer([
      "--chat-model",
      await builtin("tiny-moe"),
      "--override-tensor",
      "exps=CUDA0",
    ]).catch((
      e,
    ) => e);
    assert.ok(server instanceof Error, "the server must not start");
    assert.match(server.message, /exited with 2/);
    assert.match(server.message, /--override-tensor 'exps=CUDA0': no device 'CUDA0' \(devices: CPU\)/);
  },
);

Deno.test({
  name: "cleanup: header-only files",
  fn: async () => await Deno.remove(dir, { recursive: true }),
});
