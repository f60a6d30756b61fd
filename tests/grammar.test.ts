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

Deno.test("json schema: a keyword neither enforced nor checked is refused naming it, its place and the field", () => {
  for (
    const [schema, keyword] of [
      [{ type: "string", pattern: "(a)\\1" }, "pattern"],
      [{ type: "object", properties: { n: { type: "integer", $dynamicRef: "#x" } } }, "#/properties/n"],
      [{ type: "string", format: "ipv6" }, "ipv6"],
      [{ type: "array", customKeyword: true }, "customKeyword"],
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

Deno.test("json schema: integer bounds, including the ±2^53−1 safe range zod writes", () => {
  const g = schemaGrammar({ type: "integer", minimum: -12, maximum: 305 });
  for (const ok of ["-12", "-1", "0", "7", "99", "300", "305"]) assert.ok(accepts(g, ok), ok);
  for (const bad of ["-13", "306", "1000", "-0", "07", "3.5", "1e2"]) assert.ok(!accepts(g, bad), bad);
  const safe = schemaGrammar({ type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 });
  for (const ok of ["0", "-9007199254740991", "9007199254740991", "42"]) assert.ok(accepts(safe, ok), ok);
  for (const bad of ["9007199254740992", "-9007199254740992", "10000000000000000"]) {
    assert.ok(!accepts(safe, bad), bad);
  }
  const ex = schemaGrammar({ type: "integer", exclusiveMinimum: 0, exclusiveMaximum: 10 });
  assert.ok(accepts(ex, "1") && accepts(ex, "9"));
  assert.ok(!accepts(ex, "0") && !accepts(ex, "10"));
});

Deno.test("json schema: number bounds, inclusive and exclusive, with fractions", () => {
  const g = schemaGrammar({ type: "number", exclusiveMinimum: 0, maximum: 5 });
  for (const ok of ["0.001", "1", "4.999", "5", "5.0", "2.5"]) assert.ok(accepts(g, ok), ok);
  for (const bad of ["0", "0.0", "-1", "5.01", "6", "1e1"]) assert.ok(!accepts(g, bad), bad);
  const neg = schemaGrammar({ type: "number", minimum: -1.5, exclusiveMaximum: -0.25 });
  for (const ok of ["-1.5", "-1", "-0.3", "-0.26"]) assert.ok(accepts(neg, ok), ok);
  for (const bad of ["-1.51", "-0.25", "0", "-0.2"]) assert.ok(!accepts(neg, bad), bad);
  const unit = schemaGrammar({ type: "number", minimum: 0, maximum: 1 });
  for (const ok of ["0", "0.5", "1", "1.000"]) assert.ok(accepts(unit, ok), ok);
  assert.ok(!accepts(unit, "1.001") && !accepts(unit, "-0.1"));
});

Deno.test("json schema: multipleOf for integers", () => {
  const g = schemaGrammar({ type: "integer", multipleOf: 5 });
  for (const ok of ["0", "5", "-15", "1000"]) assert.ok(accepts(g, ok), ok);
  for (const bad of ["3", "-7", "12"]) assert.ok(!accepts(g, bad), bad);
});

Deno.test("json schema: pattern is a regular expression, unanchored unless it says so", () => {
  const sku = schemaGrammar({ type: "string", pattern: "^[A-Z]{3}-\\d{4}$" });
  assert.ok(accepts(sku, '"ABC-1234"'));
  for (const bad of ['"AB-1234"', '"abc-1234"', '"ABC-12345"', '"xABC-1234"']) {
    assert.ok(!accepts(sku, bad), bad);
  }
  const contains = schemaGrammar({ type: "string", pattern: "a+b" });
  assert.ok(accepts(contains, '"xxaab!"') && accepts(contains, '"ab"'));
  assert.ok(!accepts(contains, '"ba"'));
  const quote = schemaGrammar({ type: "string", pattern: '^"[a-c]*\\\\$' });
  assert.ok(accepts(quote, '"\\"ab\\\\"'), "quote and backslash are written as JSON escapes");
  // pydantic's Decimal: a negative lookahead at the start.
  const decimal = schemaGrammar({ type: "string", pattern: "^(?!^[-+.]*$)[+-]?0*\\d*\\.?\\d*$" });
  for (const ok of ['"12.50"', '"-3"', '".5"', '"+0.1"']) assert.ok(accepts(decimal, ok), ok);
  for (const bad of ['""', '"."', '"-"', '"+."', '"1.2.3"', '"a"']) assert.ok(!accepts(decimal, bad), bad);
  assert.throws(() => schemaGrammar({ type: "string", pattern: "(a)\\1" }), /pattern/);
});

Deno.test("json schema: uuid, email, uri and ipv4 formats", () => {
  const uuid = schemaGrammar({ type: "string", format: "uuid" });
  assert.ok(accepts(uuid, '"123e4567-e89b-12d3-a456-426614174000"'));
  assert.ok(!accepts(uuid, '"123e4567e89b12d3a456426614174000"'));
  const email = schemaGrammar({ type: "string", format: "email" });
  assert.ok(accepts(email, '"ann.lee+x@mail.example.com"'));
  assert.ok(!accepts(email, '"ann@"') && !accepts(email, '"no at sign"'));
  const uri = schemaGrammar({ type: "string", format: "uri" });
  assert.ok(accepts(uri, '"https://example.com/a/b"'));
  assert.ok(!accepts(uri, '"not a uri"'));
  const ip = schemaGrammar({ type: "string", format: "ipv4" });
  assert.ok(accepts(ip, '"192.168.0.255"'));
  assert.ok(!accepts(ip, '"256.1.1.1"') && !accepts(ip, '"1.2.3"'));
});

Deno.test("json schema: allOf merges, legacy tuple items, nullable, free-form property counts", () => {
  const merged = schemaGrammar({
    allOf: [
      { type: "object", properties: { a: { type: "integer" } }, required: ["a"] },
      { properties: { b: { type: "string" } }, required: ["b"] },
    ],
  });
  assert.ok(accepts(merged, '{"a": 1, "b": "x"}'));
  assert.ok(!accepts(merged, '{"a": 1}'));
  const tuple = schemaGrammar({
    type: "array",
    items: [{ type: "integer" }, { type: "string" }],
    additionalItems: false,
  });
  assert.ok(accepts(tuple, '[1, "a"]'));
  assert.ok(!accepts(tuple, '[1, "a", 2]') && !accepts(tuple, '["a", 1]'));
  const nullable = schemaGrammar({ type: "integer", nullable: true });
  assert.ok(accepts(nullable, "null") && accepts(nullable, "3"));
  const counted = schemaGrammar({
    type: "object",
    additionalProperties: { type: "integer" },
    minProperties: 1,
    maxProperties: 2,
  });
  assert.ok(accepts(counted, '{"a": 1}') && accepts(counted, '{"a": 1, "b": 2}'));
  assert.ok(!accepts(counted, "{}") && !accepts(counted, '{"a": 1, "b": 2, "c": 3}'));
});

Deno.test("json schema: keywords left to the output check are collected, not refused", () => {
  const g = new JsonGrammar();
  g.schema({ type: "array", items: { type: "string" }, uniqueItems: true }, "response_format", "out");
  g.schema({ not: { type: "null" } }, "response_format", "out2");
  assert.deepEqual([...g.validated].sort(), ["not", "uniqueItems"]);
});
