/**
 * The benchmark harness: its options, statistics, report, llama-server command lines and build stamp
 * (unit), and a quick run on the tiny presets (smoke). The llama-server build itself never runs here.
 */
import assert from "node:assert/strict";
import { baselineRatio, markdownReport, percentile, ratio, type Row, summarize } from "../bench/stats.ts";
import { parseBenchArgs, UsageError } from "../bench/options.ts";
import { runOrder } from "../bench/workload.ts";
import { chatServerArgs, embeddingServerArgs } from "../bench/llama_server.ts";
import {
  buildProgress,
  type BuildStamp,
  cacheRoot,
  CMAKE_FLAGS,
  cpuFlags,
  stampMatches,
} from "../bench/llama_server_build.ts";

Deno.test("summarize gives median, min, max and count", () => {
  assert.deepEqual(summarize([5, 1, 3]), { median: 3, min: 1, max: 5, n: 3 });
  assert.deepEqual(summarize([4, 1, 3, 2]), { median: 2.5, min: 1, max: 4, n: 4 });
  assert.ok(Number.isNaN(summarize([]).median));
});

Deno.test("percentile interpolates between ranks", () => {
  const sorted = Array.from({ length: 101 }, (_, i) => i);
  assert.equal(percentile(sorted, 50), 50);
  assert.equal(percentile(sorted, 99), 99);
  assert.equal(percentile([1, 2], 50), 1.5);
});

Deno.test("ratio is oriented so that below 1 means HTTP is slower", () => {
  const s = (median: number) => ({ median, min: median, max: median, n: 1 });
  const throughput: Row = {
    scenario: "a",
    metric: "m",
    unit: "tok/s",
    better: "higher",
    http: s(90),
    inProcess: s(100),
  };
  const latency: Row = {
    scenario: "b",
    metric: "m",
    unit: "ms",
    better: "lower",
    http: s(20),
    inProcess: s(10),
  };
  assert.equal(ratio(throughput), 0.9);
  assert.equal(ratio(latency), 0.5);
  assert.equal(ratio({ ...latency, inProcess: undefined }), undefined);
});

Deno.test("the markdown report has the machine facts, one row per metric and the ratio", () => {
  const s = (median: number) => ({ median, min: median - 1, max: median + 1, n: 3 });
  const md = markdownReport({ cores: 2, threads: 2 }, [
    { scenario: "chat", metric: "decode", unit: "tok/s", better: "higher", http: s(48), inProcess: s(50) },
  ]);
  assert.match(md, /cores: 2 · threads: 2/);
  assert.match(
    md,
    /\| chat \| decode \(tok\/s\) \| 48\.0 \(47\.0–49\.0\) \| 50\.0 \(49\.0–51\.0\) \| 0\.960× \|/,
  );
});

Deno.test("vserve / baseline ratio is above 1 when vserve is better, for throughput and latency", () => {
  const s = (median: number) => ({ median, min: median, max: median, n: 1 });
  const row = (better: Row["better"], http: number, baseline: number): Row => ({
    scenario: "s",
    metric: "m",
    unit: "u",
    better,
    http: s(http),
    baseline: s(baseline),
  });
  assert.equal(baselineRatio(row("higher", 30, 20)), 1.5); // more tok/s
  assert.equal(baselineRatio(row("lower", 20, 30)), 1.5); // fewer ms
  assert.equal(baselineRatio(row("lower", 30, 15)), 0.5);
  assert.equal(baselineRatio({ ...row("lower", 1, 1), baseline: undefined }), undefined);
});

Deno.test("the report gets baseline columns named for the baseline, and drops absent in-process ones", () => {
  const s = (median: number) => ({ median, min: median - 1, max: median + 1, n: 3 });
  const md = markdownReport({ threads: 2 }, [
    { scenario: "chat", metric: "decode", unit: "tok/s", better: "higher", http: s(30), baseline: s(20) },
    { scenario: "memory", metric: "peak RSS", unit: "MiB", better: "lower", http: summarize([900]) },
  ], { baselineLabel: "llama-server" });
  assert.match(md, /\| llama-server median \(min–max\) \| vserve \/ llama-server \(> 1: vserve better\) \|/);
  assert.doesNotMatch(md, /in-process/);
  assert.match(
    md,
    /\| chat \| decode \(tok\/s\) \| 30\.0 \(29\.0–31\.0\) \| 20\.0 \(19\.0–21\.0\) \| 1\.50× \|/,
  );
  // A single figure has no range; a missing one is a dash.
  assert.match(md, /\| memory \| peak RSS \(MiB\) \| 900 \| – \| – \|/);
});

Deno.test("bench options: defaults keep the HTTP vs in-process comparison", () => {
  const o = parseBenchArgs([], {});
  assert.equal(o.inProcess, true);
  assert.equal(o.baseline, undefined);
  assert.deepEqual(o.concurrency, [1, 2, 4, 8]);
  assert.equal(o.slots, 8);
  assert.equal(o.ctxPerSlot, 1024);
  assert.equal(o.reps, 3);
  const q = parseBenchArgs(["--quick"], {});
  assert.deepEqual([q.reps, q.decodeTokens, q.slots], [1, 32, 4]);
});

Deno.test("bench options: the shapes of the prompt burst and the agent conversations", () => {
  const o = parseBenchArgs([], {});
  assert.deepEqual(o.burst, { prompts: 8, words: 800, replyTokens: 32 });
  assert.deepEqual(o.agents, {
    conversations: 16,
    turns: 3,
    concurrency: 8,
    prefixWords: 1250,
    messageWords: 40,
    replyTokens: 64,
  });
  assert.ok(o.scenarios.has("agents") && o.scenarios.has("burst"));
  const set = parseBenchArgs([
    "--quick",
    "--agent-conversations",
    "12",
    "--agent-turns",
    "3",
    "--agent-concurrency",
    "4",
    "--agent-prefix",
    "2000",
    "--agent-reply",
    "32",
    "--burst",
    "4",
    "--burst-words",
    "500",
  ], {});
  assert.deepEqual(set.agents, {
    conversations: 12,
    turns: 3,
    concurrency: 4,
    prefixWords: 2000,
    messageWords: 20,
    replyTokens: 32,
  });
  assert.deepEqual(set.burst, { prompts: 4, words: 500, replyTokens: 8 });
  for (const args of [["--agent-turns", "0"], ["--burst", "x"], ["--agent-prefix", "-5"]]) {
    assert.throws(() => parseBenchArgs(args, {}), UsageError, args.join(" "));
  }
});

Deno.test("bench options: --baseline llama-server uses 8 slots of 4096 tokens and no in-process column", () => {
  const o = parseBenchArgs(["--baseline", "llama-server", "--quick"], {});
  assert.deepEqual(o.baseline, {
    kind: "llama-server",
    binary: undefined,
    cache: undefined,
    cpu: "prebuilt",
  });
  assert.equal(o.inProcess, false);
  assert.deepEqual(o.concurrency, [1, 4, 8]);
  assert.deepEqual([o.slots, o.ctxPerSlot], [8, 4096]);
  assert.equal(parseBenchArgs(["--baseline", "llama-server", "--in-process"], {}).inProcess, true);
  assert.equal(parseBenchArgs(["--no-in-process"], {}).inProcess, false);
});

Deno.test("bench options: a prebuilt llama-server from the flag or VSERVE_BENCH_LLAMA_SERVER", () => {
  const env = { VSERVE_BENCH_LLAMA_SERVER: "/opt/env/llama-server" };
  const fromEnv = parseBenchArgs(["--baseline", "llama-server"], env).baseline;
  assert.equal(fromEnv?.kind === "llama-server" && fromEnv.binary, "/opt/env/llama-server");
  const fromFlag = parseBenchArgs(
    [
      "--baseline",
      "llama-server",
      "--llama-server-bin",
      "/opt/flag/llama-server",
      "--llama-server-cache",
      "/c",
      "--llama-server-cpu",
      "native",
    ],
    env,
  ).baseline;
  assert.deepEqual(fromFlag, {
    kind: "llama-server",
    binary: "/opt/flag/llama-server",
    cache: "/c",
    cpu: "native",
  });
});

Deno.test("bench options: contradictions and bad values are usage errors", () => {
  const bad = [
    ["--baseline", "vllm"],
    ["--baseline", "llama-server", "--baseline-url", "http://x"],
    ["--baseline", "llama-server", "--embed-backend", "onnx"],
    ["--llama-server-bin", "/x"],
    ["--in-process", "--no-in-process"],
    ["--slots", "2"], // fewer than the 8 streams measured
    ["--reps", "0"],
    ["--scenarios", "chat,speed"],
    ["--unknown-flag"],
  ];
  for (const args of bad) assert.throws(() => parseBenchArgs(args, {}), UsageError, args.join(" "));
});

Deno.test("runOrder alternates which side goes first", () => {
  assert.deepEqual(runOrder(["vserve", "llama-server"], 0), ["vserve", "llama-server"]);
  assert.deepEqual(runOrder(["vserve", "llama-server"], 1), ["llama-server", "vserve"]);
});

Deno.test("llama-server chat: the same threads, slots and context per slot as vserve's bench model", () => {
  const args = chatServerArgs({
    model: "/m/chat.gguf",
    alias: "bench/chat",
    threads: 2,
    slots: 8,
    ctxPerSlot: 4096,
    apiKey: "k",
  });
  const flag = (name: string) => args[args.indexOf(name) + 1];
  assert.equal(flag("-m"), "/m/chat.gguf");
  assert.deepEqual([flag("-t"), flag("-tb"), flag("-np"), flag("-c")], ["2", "2", "8", "32768"]);
  assert.ok(!args.includes("--cache-ram"), "its prompt cache at its default, as vserve's");
  for (const f of ["--jinja", "--no-kv-unified"]) assert.ok(args.includes(f), f);
  assert.ok(!args.includes("--embeddings"));
  assert.ok(!args.includes("--no-repack"), "dense models keep repacked weights, as in vserve");
  const hybrid = chatServerArgs({
    model: "/m/moe.gguf",
    alias: "bench/moe",
    threads: 2,
    slots: 8,
    ctxPerSlot: 4096,
    apiKey: "k",
    hybrid: true,
  });
  assert.ok(hybrid.includes("--no-repack"), "hybrid models load without extra CPU buffers, as in vserve");
});

Deno.test("llama-server embeddings: last-token pooling, shared cache, one batch fits the longest input", () => {
  const args = embeddingServerArgs({
    model: "/m/embed.gguf",
    alias: "bench/embed",
    threads: 2,
    slots: 64,
    maxInputTokens: 4096,
    apiKey: "k",
  });
  const flag = (name: string) => args[args.indexOf(name) + 1];
  for (const f of ["--embeddings", "--kv-unified", "--no-cache-prompt"]) assert.ok(args.includes(f), f);
  assert.equal(flag("--pooling"), "last");
  assert.equal(flag("--cache-ram"), "0");
  // 4,096 tokens + end of text in one batch; a shared cache of that plus the 2,048-cell reserve.
  assert.deepEqual([flag("-np"), flag("-b"), flag("-ub"), flag("-c")], ["64", "4097", "4097", "6400"]);
});

Deno.test("llama-server cache: flag, then VSERVE_BENCH_LLAMA_CACHE, then XDG_CACHE_HOME, then HOME", () => {
  const env = { HOME: "/home/me", XDG_CACHE_HOME: "/xdg", VSERVE_BENCH_LLAMA_CACHE: "/env" };
  assert.equal(cacheRoot("/flag", env), "/flag");
  assert.equal(cacheRoot(undefined, env), "/env");
  assert.equal(
    cacheRoot(undefined, { ...env, VSERVE_BENCH_LLAMA_CACHE: undefined }),
    "/xdg/vserve/llama-server",
  );
  assert.equal(cacheRoot(undefined, { HOME: "/home/me" }), "/home/me/.cache/vserve/llama-server");
  assert.throws(() => cacheRoot(undefined, {}));
});

Deno.test("llama-server build stamp: reused only when tag, commit, patches, flags and host all match", () => {
  const stamp: BuildStamp = {
    tag: "v0.4.0",
    commit: "80fb11ac73e66d89eae2c6a91d8a77428fa733ed",
    patches: { "PR-22566.diff": "ab" },
    generator: "Ninja",
    cmakeFlags: [...CMAKE_FLAGS],
    target: "llama-server",
    host: "linux-x86_64 cpu 123",
  };
  assert.ok(stampMatches(JSON.parse(JSON.stringify(stamp)), stamp));
  // Key order on disk does not matter.
  assert.ok(stampMatches(Object.fromEntries(Object.entries(stamp).reverse()), stamp));
  for (
    const changed of [
      { tag: "v0.5.0" },
      { commit: "0".repeat(40) },
      { patches: {} },
      { cmakeFlags: [...CMAKE_FLAGS, "-DGGML_CUDA=ON"] },
      { host: "linux-x86_64 other 456" },
    ]
  ) {
    assert.ok(!stampMatches({ ...stamp, ...changed }, stamp), JSON.stringify(changed));
  }
  assert.ok(!stampMatches(undefined, stamp));
  assert.ok(!stampMatches("garbage", stamp));
});

Deno.test("llama-server build flags: CPU only, native, nothing downloaded", () => {
  for (
    const f of [
      "-DCMAKE_BUILD_TYPE=Release",
      "-DGGML_CUDA=OFF",
      "-DLLAMA_OPENSSL=OFF",
      "-DLLAMA_BUILD_BORINGSSL=OFF",
      "-DLLAMA_USE_PREBUILT_UI=OFF",
      "-DLLAMA_BUILD_TESTS=OFF",
      "-DLLAMA_BUILD_EXAMPLES=OFF",
    ]
  ) assert.ok(CMAKE_FLAGS.includes(f), f);
});

Deno.test("the baseline's CPU flags: native, or the instruction sets of node-llama-cpp's CPU variant", () => {
  assert.deepEqual(cpuFlags("native"), ["-DGGML_NATIVE=ON"]);
  assert.deepEqual(cpuFlags("haswell"), [
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_F16C=ON",
    "-DGGML_FMA=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_BMI2=ON",
  ]);
  assert.deepEqual(cpuFlags("prebuilt"), [
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_NATIVE=OFF",
  ]);
  assert.throws(() => cpuFlags("pentium"), /unknown CPU variant/);
});

Deno.test("build progress is read from Ninja's or Make's last progress line", () => {
  assert.equal(buildProgress("[1/330] a\n[165/330] b\n"), 0.5);
  assert.equal(buildProgress("[ 10%] a\n[ 42%] Building b\n"), 0.42);
  assert.equal(buildProgress("-- Configuring done"), undefined);
});

Deno.test({
  name: "smoke: deno task bench --tiny --quick runs every scenario and writes the report",
  fn: async () => {
    const out = await Deno.makeTempDir();
    const run = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "bench/main.ts", "--tiny", "--quick", "--out", out],
      cwd: new URL("../", import.meta.url),
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(run.code, 0, new TextDecoder().decode(run.stderr));
    const report = JSON.parse(await Deno.readTextFile(`${out}/latest.json`));
    const scenarios = new Set(report.rows.map((r: Row) => r.scenario));
    for (
      const s of [
        "chat single stream (tiny-chat)",
        "chat single stream (tiny-moe)",
        "chat aggregate decode (tiny-chat)",
        "chat aggregate decode (tiny-moe)",
        "chat prompt burst (tiny-chat)",
        "chat prompt burst (tiny-moe)",
        "agents (tiny-chat): 8 conversations × 2 turns, 4 at a time",
        "agents (tiny-moe): 8 conversations × 2 turns, 4 at a time",
        "embeddings",
        "server overhead",
        "mixed load (tiny-chat + tiny-embed)",
        "fast steps (tiny-chat)",
        "fast steps (tiny-embed)",
      ]
    ) assert.ok(scenarios.has(s), s);
    for (const r of report.rows as Row[]) {
      // A difference of two latencies (what the gateway adds) may be zero or negative under noise, in
      // a short mixed window no request may finish and nothing be held, and a share of decodes may be 0
      // on a machine too loaded for a decode to count as short.
      if (/added by|finished in|held|on the JavaScript thread/.test(r.metric)) {
        assert.ok(Number.isFinite(r.http.median), `${r.scenario} ${r.metric}`);
      } else assert.ok(r.http.median > 0, `${r.scenario} ${r.metric}`);
    }
    assert.equal(report.meta.cores, navigator.hardwareConcurrency);
    assert.match(await Deno.readTextFile(`${out}/latest.md`), /HTTP \/ in-process/);
    await Deno.remove(out, { recursive: true });
  },
});
