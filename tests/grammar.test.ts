/**
 * Grammars built from JSON schemas and tool dialects, parsed and run by llama.cpp's own grammar
 * engine (through FFI) over the real Qwen3 vocabulary: valid texts pass, invalid ones do not.
 */
import assert from "node:assert/strict";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { NativeModel } from "../src/engines/llama/native.ts";
import { GrammarConstraint } from "../src/engines/llama/grammar.ts";
import { JsonGrammar } from "../src/engines/llama/json_gbnf.ts";
import { textWithout } from "../src/engines/llama/gbnf.ts";
import { jsonDialect } from "../src/engines/llama/dialects/json.ts";
import { xmlDialect } from "../src/engines/llama/dialects/xml.ts";
import { EngineInputError } from "../src/engines/types.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";

await llamaRuntime("cpu", silentLogger);
const lib = openLlamaLibrary();
const path = await resolveSource("builtin:tiny-chat", {
  cacheDir: "models/cache",
  hubUrl: "",
  log: silentLogger,
});
const model = await NativeModel.load(lib, path, 0);
globalThis.addEventListener("unload", () => model.free());

/** Whether the grammar accepts exactly `text` (then end of generation). */
function accepts(gbnf: string, text: string): boolean {
  const g = GrammarConstraint.create(model, gbnf);
  assert.ok(g, `llama.cpp parses the grammar:\n${gbnf}`);
  try {
    // Character by character: the grammar must accept every prefix, whatever the tokenization.
    for (const ch of text) {
      for (const t of model.tokenize(ch, false)) {
        if (!g.allows(t)) return false;
        g.accept(t);
      }
    }
    return g.allows(model.eos);
  } finally {
    g.free();
  }
}

function schemaGrammar(schema: unknown): string {
  const g = new JsonGrammar();
  return g.rules.text(`root ::= ${g.schema(schema, "response_format", "out")}`);
}

const person = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 5 },
    age: { type: "integer" },
    tags: { type: "array", items: { enum: ["a", "b"] }, minItems: 1, maxItems: 2 },
    nick: { type: ["string", "null"] },
  },
  required: ["name", "age"],
  additionalProperties: false,
};

Deno.test("json schema: valid objects pass, optional properties may be left out", () => {
  const g = schemaGrammar(person);
  for (
    const ok of [
      '{"name": "Ann", "age": 3}',
      '{"name":"Ann","age":-3,"tags":["a","b"]}',
      '{"name": "Ann", "age": 30, "nick": null}',
      '{"name": "Ann", "age": 30, "tags": ["b"], "nick": "x"}',
    ]
  ) assert.ok(accepts(g, ok), ok);
});

Deno.test("json schema: missing, extra, too long and wrongly typed values are impossible", () => {
  const g = schemaGrammar(person);
  for (
    const bad of [
      '{"age": 3}',
      '{"name": "Ann"}',
      '{"name": "Annabel", "age": 3}',
      '{"name": "Ann", "age": 3.5}',
      '{"name": "Ann", "age": 3, "tags": []}',
      '{"name": "Ann", "age": 3, "tags": ["a", "b", "a"]}',
      '{"name": "Ann", "age": 3, "tags": ["c"]}',
      '{"name": "Ann", "age": 3, "extra": 1}',
      '{"name": "Ann", "age": 1e5}',
    ]
  ) assert.ok(!accepts(g, bad), bad);
});

Deno.test("json schema: $ref, anyOf, const, tuples and formats", () => {
  const g = schemaGrammar({
    $defs: {
      node: { type: "object", properties: { next: { anyOf: [{ $ref: "#/$defs/node" }, { type: "null" }] } } },
    },
    type: "object",
    properties: {
      kind: { const: "list" },
      head: { $ref: "#/$defs/node" },
      pair: { type: "array", prefixItems: [{ type: "string" }, { type: "number" }], items: false },
      when: { type: "string", format: "date-time" },
    },
    required: ["kind", "head", "pair", "when"],
  });
  assert.ok(
    accepts(
      g,
      '{"kind": "list", "head": {"next": {"next": null}}, "pair": ["x", 2.5], "when": "2026-11-22T10:00:00Z"}',
    ),
  );
  assert.ok(!accepts(g, '{"kind": "tree", "head": {}, "pair": ["x", 2], "when": "2026-11-22T10:00:00Z"}'));
  assert.ok(!accepts(g, '{"kind": "list", "head": {}, "pair": ["x", 2, 3], "when": "2026-11-22T10:00:00Z"}'));
  assert.ok(!accepts(g, '{"kind": "list", "head": {}, "pair": ["x", 2], "when": "yesterday"}'));
});

Deno.test("json schema: an unenforceable keyword is refused naming it, its place and the field", () => {
  for (
    const [schema, keyword] of [
      [{ type: "string", pattern: "^a" }, "pattern"],
      [{ type: "object", properties: { n: { type: "integer", minimum: 1 } } }, "#/properties/n"],
      [{ type: "string", format: "email" }, "email"],
      [{ type: "array", uniqueItems: true }, "uniqueItems"],
    ] as const
  ) {
    assert.throws(
      () => new JsonGrammar().schema(schema, "response_format.json_schema.schema", "out"),
      (e: Error) =>
        e instanceof EngineInputError && e.message.includes(keyword) &&
        e.param === "response_format.json_schema.schema",
    );
  }
});

Deno.test("json schema: nesting beyond the depth limit is a 400-style error, not a stack overflow", () => {
  let schema: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < 5000; i++) schema = { type: "array", items: schema };
  assert.throws(
    () => new JsonGrammar().schema(schema, "response_format", "out"),
    (e: Error) => e instanceof EngineInputError && e.code === "schema_too_large",
  );
});

Deno.test("text without a marker: anything but the marker, even after a partial match", () => {
  const g = new JsonGrammar();
  const body = textWithout(g.rules, "reasoning", "</think>");
  const gbnf = g.rules.text(`root ::= ${body} "</think>" "ok"`);
  assert.ok(accepts(gbnf, "a <b> </thin </</think>ok"));
  assert.ok(accepts(gbnf, "</think>ok"));
  assert.ok(!accepts(gbnf, "a </think> b </think>ok"));
});

const tool = {
  name: "get_weather",
  parameters: {
    type: "object",
    properties: { city: { type: "string" }, days: { type: "integer" }, unit: { enum: ["c", "f"] } },
    required: ["city", "days"],
  },
};

function callGrammar(dialect: typeof jsonDialect): string {
  const g = new JsonGrammar();
  return g.rules.text(`root ::= ${dialect.callRule(g, tool, "tools[0].function.parameters", "t0")}`);
}

Deno.test("json dialect grammar: the Qwen3 call format with arguments under the schema", () => {
  const g = callGrammar(jsonDialect);
  assert.ok(
    accepts(
      g,
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>',
    ),
  );
  assert.ok(!accepts(g, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'));
  assert.ok(
    !accepts(g, '<tool_call>\n{"name": "other", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'),
  );
});

Deno.test("xml dialect grammar: raw strings, JSON values, required present, no unknown names", () => {
  const g = callGrammar(xmlDialect);
  const call = (params: string) => `<tool_call>\n<function=get_weather>\n${params}</function>\n</tool_call>`;
  const p = (k: string, v: string) => `<parameter=${k}>\n${v}\n</parameter>\n`;
  assert.ok(accepts(g, call(p("city", "New <York>\nNY") + p("days", "3"))));
  assert.ok(accepts(g, call(p("city", "Rome") + p("days", "3") + p("unit", "f"))));
  assert.ok(!accepts(g, call(p("city", "Rome"))), "a required parameter is missing");
  assert.ok(!accepts(g, call(p("city", "Rome") + p("days", "three"))), "days must be an integer");
  assert.ok(!accepts(g, call(p("city", "Rome") + p("days", "3") + p("unit", "kelvin"))));
  assert.ok(!accepts(g, call(p("city", "Rome") + p("days", "3") + p("color", "red"))), "unknown parameter");
});

Deno.test("text without markers: several markers, overlapping prefixes", () => {
  const g = new JsonGrammar();
  const body = textWithout(g.rules, "reasoning", ["</think>", "<think>"]);
  const gbnf = g.rules.text(`root ::= ${body} "</think>"`);
  assert.ok(accepts(gbnf, "a <thin <t </t <</think>"));
  assert.ok(!accepts(gbnf, "a <think> b </think>"));
  assert.ok(!accepts(gbnf, "<<think></think>"));
});
