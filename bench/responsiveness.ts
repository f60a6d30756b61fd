/**
 * The latency the tests no longer bound (they assert order and counts, which a busy machine cannot
 * flip): how long `GET /health` waits while grammars from costly JSON schemas are compiled for other
 * requests, and how long a one-word embedding waits while a large embedding request runs. vserve only.
 */
import { percentile } from "./stats.ts";

/** What the measurements need of the running benchmark. */
export interface ResponsivenessBench {
  url: string;
  key: string;
  chatModel: string;
  embedModel: string;
  reps: number;
  quick: boolean;
  /** Records one metric's values (one a repetition). */
  record: (metric: string, unit: string, values: number[]) => void;
  log: (msg: string) => void;
}

const post = async (b: ResponsivenessBench, path: string, body: unknown) => {
  const res = await fetch(`${b.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${b.key}` },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`${path}: ${res.status} ${text.slice(0, 300)}`);
  return JSON.parse(text);
};

/** A schema of `count` string properties whose pattern needs a 2,048-state automaton (new per `tag`). */
function patternSchema(count: number, tag: string): Record<string, unknown> {
  const pattern = `^(a|b)*a(a|b){10}${tag}$`;
  return {
    type: "object",
    properties: Object.fromEntries(
      Array.from({ length: count }, (_, i) => [`p${i}`, { type: "string", pattern }]),
    ),
  };
}

/** GETs /health one request after another until `work` settles; the latencies, in ms. */
async function probeDuring(url: string, work: Promise<unknown>): Promise<number[]> {
  let settled = false;
  const done = work.finally(() => (settled = true));
  const out: number[] = [];
  while (!settled) {
    const t0 = performance.now();
    await (await fetch(`${url}/health`)).arrayBuffer();
    out.push(performance.now() - t0);
  }
  await done;
  return out;
}

/** An engine counter of the model, from /metrics. */
async function counter(b: ResponsivenessBench, name: string, model: string): Promise<number> {
  const text = await (await fetch(`${b.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`vserve_engine_${name}_total{model="${model}"}`));
  return Number(line?.split(" ").at(-1) ?? 0);
}

/** Both measurements, recorded as rows of the `server overhead` scenario. */
export async function responsiveness(b: ResponsivenessBench): Promise<void> {
  const p99: number[] = [];
  const max: number[] = [];
  for (let rep = 0; rep < b.reps; rep++) {
    // Two requests with schemas of 9 patterns each, not compiled before (the cache is by pattern).
    const tag = `x${crypto.randomUUID().slice(0, 8)}`;
    const work = Promise.all([0, 1].map((i) =>
      post(b, "/v1/chat/completions", {
        model: b.chatModel,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        response_format: {
          type: "json_schema",
          json_schema: { name: "x", schema: patternSchema(9, `${tag}${i}`) },
        },
      })
    ));
    const probes = (await probeDuring(b.url, work)).sort((x, y) => x - y);
    p99.push(percentile(probes, 99));
    max.push(probes.at(-1) ?? NaN);
  }
  b.record("GET /health while 2 requests' 9-pattern grammars compile, p99", "ms", p99);
  b.record("GET /health while 2 requests' 9-pattern grammars compile, slowest", "ms", max);

  const inputs = b.quick ? 200 : 1000;
  const waits: number[] = [];
  for (let rep = 0; rep < b.reps; rep++) {
    const before = await counter(b, "inputs_embedded", b.embedModel);
    const input = Array.from({ length: inputs }, (_, i) => `document number ${i} of rep ${rep} about things`);
    let bigDone = false;
    const big = post(b, "/v1/embeddings", { model: b.embedModel, input }).finally(() => (bigDone = true));
    while (!bigDone && (await counter(b, "inputs_embedded", b.embedModel)) === before) {
      await new Promise((r) => setTimeout(r, 5));
    }
    const t0 = performance.now();
    await post(b, "/v1/embeddings", { model: b.embedModel, input: "hello" });
    waits.push(performance.now() - t0);
    await big;
  }
  b.record(`one-word embedding while a ${inputs}-input request runs`, "ms", waits);
  b.log("responsiveness done");
}
