/** The benchmark harness: its statistics and report (unit), and a quick run on the tiny presets (smoke). */
import assert from "node:assert/strict";
import { markdownReport, percentile, ratio, type Row, summarize } from "../bench/stats.ts";

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

Deno.test({
  name: "smoke: deno task bench --tiny --quick runs every scenario and writes the report",
  sanitizeOps: false,
  sanitizeResources: false,
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
    for (const s of ["chat single stream", "chat aggregate decode", "embeddings", "server overhead"]) {
      assert.ok(scenarios.has(s), s);
    }
    for (const r of report.rows as Row[]) assert.ok(r.http.median > 0, `${r.scenario} ${r.metric}`);
    assert.equal(report.meta.cores, navigator.hardwareConcurrency);
    assert.match(await Deno.readTextFile(`${out}/latest.md`), /HTTP \/ in-process/);
    await Deno.remove(out, { recursive: true });
  },
});
