/** Unit tests of output parsing (both tool-call dialects), stop sequences and sampling. */
import assert from "node:assert/strict";
import { OutputParser, type OutputPiece } from "../src/engines/llama/output_parser.ts";
import { jsonDialect } from "../src/engines/llama/dialects/json.ts";
import { xmlDialect } from "../src/engines/llama/dialects/xml.ts";
import { dialectOfTemplate } from "../src/engines/llama/dialects/index.ts";
import type { ToolDialect } from "../src/engines/llama/dialects/types.ts";
import { StopMatcher } from "../src/engines/llama/stop_strings.ts";
import {
  FILTER_TRIES,
  logprobsOf,
  type SamplingParams,
  TokenSampler,
  topTokens,
} from "../src/engines/llama/sampler.ts";
import type { EngineTool } from "../src/engines/types.ts";

const TOOLS: EngineTool[] = [
  {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, days: { type: "integer" }, units: { enum: ["c", "f"] } },
      required: ["city"],
    },
  },
  { name: "ping", parameters: { type: "object", properties: {} } },
];

interface Call {
  name: string;
  arguments: string;
  complete: boolean;
}

/** Runs the parser over chunks and folds the pieces as a client reading deltas would. */
function parse(dialect: ToolDialect, chunks: string[], startInReasoning = false, tools = TOOLS) {
  const p = new OutputParser(dialect, tools, startInReasoning);
  const pieces: OutputPiece[] = [...chunks.flatMap((c) => p.push(c)), ...p.end()];
  let content = "";
  let reasoning = "";
  const calls: Call[] = [];
  for (const x of pieces) {
    if (x.type === "content") content += x.text;
    else if (x.type === "reasoning") reasoning += x.text;
    else if (x.type === "call_start") calls[x.index] = { name: x.name, arguments: "", complete: false };
    else if (x.type === "call_arguments") calls[x.index].arguments += x.text;
    else if (x.type === "call_end") calls[x.index].complete = x.complete;
  }
  return { content, reasoning, calls };
}

/** Every way of cutting `text` into two chunks, plus one character at a time. */
function splits(text: string): string[][] {
  const out: string[][] = [[text], Array.from(text)];
  for (let i = 1; i < text.length; i += 3) out.push([text.slice(0, i), text.slice(i)]);
  return out;
}

Deno.test("parser: thinking goes to reasoning and never into content", () => {
  assert.deepEqual(parse(jsonDialect, ["<think>\nplan it\n</think>\n\nHello"]), {
    content: "Hello",
    reasoning: "\nplan it\n",
    calls: [],
  });
  assert.deepEqual(parse(xmlDialect, ["deep</think>\n\nanswer"], true), {
    content: "answer",
    reasoning: "deep",
    calls: [],
  });
});

Deno.test("json dialect: calls parse the same however the text is chunked", () => {
  const text =
    '<think>hm</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1.50}}' +
    '\n</tool_call>\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>';
  for (const chunks of splits(text)) {
    assert.deepEqual(parse(jsonDialect, chunks), {
      content: "",
      reasoning: "hm",
      calls: [
        { name: "get_weather", arguments: '{"city":"Paris","days":1.50}', complete: true },
        { name: "ping", arguments: "{}", complete: true },
      ],
    }, JSON.stringify(chunks));
  }
});

Deno.test("json dialect: a broken call is kept as text; an unfinished one never leaks markup", () => {
  assert.equal(parse(jsonDialect, ["<tool_call>{oops</tool_call>"]).content, "<tool_call>{oops</tool_call>");
  assert.deepEqual(parse(jsonDialect, ['<tool_call>\n{"name":']), { content: "", reasoning: "", calls: [] });
  assert.deepEqual(parse(jsonDialect, ['<tool_call>\n{"name": "ping", "arguments": {"a": [1']).calls, [
    { name: "ping", arguments: '{"a":[1', complete: false },
  ]);
});

Deno.test("json dialect: without tools, call tags are content", () => {
  assert.equal(
    parse(jsonDialect, ["a <tool_call>x</tool_call>"], false, []).content,
    "a <tool_call>x</tool_call>",
  );
});

Deno.test("xml dialect: string values are raw, others JSON; chunking does not matter", () => {
  const text = '<tool_call>\n<function=get_weather>\n<parameter=city>\nSan "Jose"\nCA\n</parameter>\n' +
    "<parameter=days>\n3\n</parameter>\n<parameter=units>\nc\n</parameter>\n</function>\n</tool_call>";
  for (const chunks of splits(text)) {
    const r = parse(xmlDialect, chunks);
    assert.deepEqual(r.calls, [{
      name: "get_weather",
      arguments: JSON.stringify({ city: 'San "Jose"\nCA', days: 3, units: "c" }),
      complete: true,
    }], JSON.stringify(chunks));
    assert.equal(r.content, "");
  }
});

Deno.test("xml dialect: parallel calls, no parameters, and a value that is not JSON", () => {
  const text =
    "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n" +
    "<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>";
  const r = parse(xmlDialect, [text]);
  assert.deepEqual(r.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [
    ["ping", {}],
    ["get_weather", { days: "three" }],
  ]);
});

Deno.test("xml dialect: output cut inside a value keeps a valid JSON prefix and no markup", () => {
  const r = parse(xmlDialect, ["<tool_call>\n<function=get_weather>\n<parameter=city>\nLis"]);
  assert.deepEqual(r.calls, [{ name: "get_weather", arguments: '{"city":"Lis"}', complete: false }]);
  assert.equal(r.content, "");
});

Deno.test("dialect: read from the chat template", () => {
  assert.equal(dialectOfTemplate("{{ '<tool_call>\\n<function=' }}{{ '<parameter=' }}").name, "xml");
  assert.equal(dialectOfTemplate('<tool_call>\\n{"name": {{ name }}}').name, "json");
});

Deno.test("stop sequences: cut at the first match across chunks (named); partial matches held back", () => {
  const s = new StopMatcher(["END", "\n\n"]);
  assert.deepEqual(s.push("abc E"), { text: "abc ", stopped: false });
  assert.deepEqual(s.push("x"), { text: "Ex", stopped: false });
  assert.deepEqual(s.push("y\n"), { text: "y", stopped: false });
  assert.deepEqual(s.push("\nrest"), { text: "", stopped: true, matched: "\n\n" });
  const t = new StopMatcher(["abc"]);
  assert.deepEqual(t.push("xxab"), { text: "xx", stopped: false });
  assert.equal(t.flush(), "ab");
  // The earliest match wins, whichever sequence it is.
  assert.deepEqual(new StopMatcher(["zz", "b"]).push("abzz"), { text: "a", stopped: true, matched: "b" });
});

const params = (over: Partial<SamplingParams> = {}): SamplingParams => ({
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  seed: 7,
  presencePenalty: 0,
  frequencyPenalty: 0,
  repeatPenalty: 1,
  logitBias: new Map(),
  ...over,
});

Deno.test("sampler: greedy picks the largest logit; logit bias -100 forbids a token", async () => {
  const x = new Float32Array([0.1, 3, 2, -1]);
  assert.equal((await new TokenSampler(params({ temperature: 0 }), 4).sample(x)).token, 1);
  const banned = new TokenSampler(params({ temperature: 0, logitBias: new Map([[1, -Infinity]]) }), 4);
  assert.equal((await banned.sample(x)).token, 2);
});

Deno.test("sampler: a filter's refused draws are taken out and drawn again; the full mask only after 8 refusals", async () => {
  // A pure-logic filter: allows the tokens of a set, counts its checks and masks.
  const filterOf = (allowed: Set<number>) => {
    const f = {
      checks: 0,
      masks: 0,
      allows: (t: number) => (f.checks++, allowed.has(t)),
      mask: (x: Float32Array) => {
        f.masks++;
        for (let t = 0; t < x.length; t++) if (!allowed.has(t)) x[t] = -Infinity;
        return Promise.resolve();
      },
      deadEnd: () => new Error("no token allowed"),
    };
    return f;
  };
  const x = Float32Array.from({ length: 64 }, (_, i) => i); // token 63 is the best, then 62, ...
  // Greedy: the best allowed token, found by taking refused ones out (no mask within 8 draws).
  const near = filterOf(new Set([58, 3]));
  const greedy = new TokenSampler(params({ temperature: 0 }), x.length);
  assert.equal((await greedy.sample(x, near)).token, 58);
  assert.deepEqual([near.checks, near.masks], [6, 0]);
  assert.deepEqual(Array.from(x.slice(58)), [58, 59, 60, 61, 62, 63], "the logits are left unchanged");
  // The best allowed token is past 8 draws: the mask, then the best of what it leaves.
  const far = filterOf(new Set([3, 40]));
  assert.equal((await greedy.sample(x, far)).token, 40);
  assert.deepEqual([far.checks, far.masks], [FILTER_TRIES, 1]);
  // Sampling: every draw is allowed, whatever the seed.
  const some = new Set([5, 20, 61]);
  for (let seed = 0; seed < 50; seed++) {
    const s = new TokenSampler(params({ temperature: 2, seed }), x.length);
    const { token } = await s.sample(x, filterOf(some));
    assert.ok(some.has(token), `seed ${seed}: ${token}`);
  } // A filter that allows nothing ends the draw with its error, greedy or not: a refused token never
  // reaches llama.cpp's grammar (it aborts the process on one).
  for (
    const p of [params({ temperature: 0 }), params({ temperature: 1, topK: 5 }), params({ temperature: 1 })]
  ) {
    const none = filterOf(new Set());
    await assert.rejects(Promise.resolve(new TokenSampler(p, x.length).sample(x, none)), /no token allowed/);
    assert.equal(none.masks, 1);
  }
});

Deno.test("sampler: top-k over logits that are all -Infinity still gives a token of the vocabulary", async () => {
  const x = new Float32Array(40).fill(-Infinity);
  for (const topK of [1, 5, 40]) {
    const { token } = await new TokenSampler(params({ temperature: 1, topK }), x.length).sample(x);
    assert.ok(Number.isInteger(token) && token >= 0 && token < x.length, `top-k ${topK}: ${token}`);
  }
});

Deno.test("sampler: the same seed gives the same draws; top-k keeps the k best", async () => {
  const x = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 3);
  const draw = async (seed: number, over: Partial<SamplingParams> = {}) => {
    const s = new TokenSampler(params({ seed, ...over }), x.length);
    const out: number[] = [];
    for (let i = 0; i < 20; i++) out.push((await s.sample(x)).token);
    return out;
  };
  assert.deepEqual(await draw(1), await draw(1));
  assert.notDeepEqual(await draw(1), await draw(2));
  const top3 = new Set(topTokens(x, 3));
  assert.ok((await draw(3, { topK: 3 })).every((t) => top3.has(t)));
});

Deno.test("sampler: log-probabilities sum to at most 1 and match the softmax", () => {
  const x = new Float32Array([1, 2, 3, 4]);
  const lp = logprobsOf(x, 3, 4);
  const z = Math.log([1, 2, 3, 4].reduce((s, v) => s + Math.exp(v), 0));
  assert.ok(Math.abs(lp.logprob - (4 - z)) < 1e-6);
  assert.deepEqual(lp.top.map((t) => t.token), [3, 2, 1, 0]);
  const total = lp.top.reduce((s, t) => s + Math.exp(t.logprob), 0);
  assert.ok(total <= 1 + 1e-6 && total > 0.999);
});

Deno.test("parser: output cut inside a call's opening tag shows none of it as content", () => {
  for (const dialect of [jsonDialect, xmlDialect]) {
    for (const cut of ["<", "<tool", "<tool_cal"]) {
      assert.deepEqual(parse(dialect, ["Sure. ", cut]), { content: "Sure. ", reasoning: "", calls: [] }, cut);
      assert.deepEqual(parse(dialect, [cut]), { content: "", reasoning: "", calls: [] }, cut);
    }
    // Without tools there are no call tags: the same text is content.
    assert.equal(parse(dialect, ["a <tool"], false, []).content, "a <tool");
    // A held piece of another tag is not a call tag: "</thi" stays text.
    assert.equal(parse(dialect, ["x </thi"]).content, "x </thi");
  }
});

Deno.test("sampler: top-k over a vocabulary is exact (ties, masked entries, sorted logits)", () => {
  const n = 151_936;
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
  const shapes: Record<string, (i: number) => number> = {
    spread: () => (random() - 0.5) * 20,
    ties: () => Math.round((random() - 0.5) * 6),
    masked: (i) => (i % 997 === 0 ? random() : -Infinity),
    ascending: (i) => i / n,
  };
  for (const [name, value] of Object.entries(shapes)) {
    const x = Float32Array.from({ length: n }, (_, i) => value(i));
    const expected = [...x.keys()].sort((a, b) => x[b] - x[a] || a - b).slice(0, 40)
      .filter((i) => x[i] > -Infinity);
    assert.deepEqual(topTokens(x, 40), expected, name);
  }
});
