/**
 * Grammars built from JSON schemas and tool dialects, parsed and run by llama.cpp's own grammar
 * engine (through FFI) over the real Qwen3 vocabulary: valid texts pass, invalid ones do not.
 */
import assert from "node:assert/strict";
import { acceptsText, acceptsTokens, loadGrammarModel } from "./helpers/grammar.ts";
import { GrammarConstraint, MAX_STACKS, SYNC_STACKS } from "../src/engines/llama/grammar.ts";
import { EngineInputError } from "../src/engines/types.ts";
import { gbnfLiteral, GbnfRules, GrammarError, JsonGrammar, textWithout } from "../src/grammar/mod.ts";
import { fc } from "./helpers/clients.ts";
import { jsonDialect } from "../src/engines/llama/dialects/json.ts";
import { xmlDialect } from "../src/engines/llama/dialects/xml.ts";
import { checkAgainstSchema, pickChecker, SchemaChecker, SPILL_MS } from "../src/services/schema_check.ts";
import { helpersBusy } from "../src/event_loop.ts";

const model = await loadGrammarModel();
const accepts = (gbnf: string, text: string) => acceptsText(model, gbnf, text);

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
        e instanceof GrammarError && e.message.includes(keyword) &&
        e.param === "response_format.json_schema.schema",
    );
  }
});

Deno.test("json schema: nesting beyond the depth limit is a 400-style error, not a stack overflow", () => {
  let schema: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < 5000; i++) schema = { type: "array", items: schema };
  assert.throws(
    () => new JsonGrammar().schema(schema, "response_format", "out"),
    (e: Error) => e instanceof GrammarError && e.code === "schema_too_large",
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

/** The call tags as text (these grammars are checked on text, with no vocabulary to name tokens). */
const TEXT_TAGS = { open: gbnfLiteral("<tool_call>"), close: gbnfLiteral("</tool_call>") };

function callGrammar(dialect: typeof jsonDialect): string {
  const g = new JsonGrammar();
  return g.rules.text(
    `root ::= ${dialect.callRule(g, tool, "tools[0].function.parameters", "t0", TEXT_TAGS)}`,
  );
}

Deno.test("call tags as tokens: only the vocabulary's <tool_call> token opens a call, not its text spelled in ordinary tokens", () => {
  const [open] = model.tokenize("<tool_call>", true);
  const [close] = model.tokenize("</tool_call>", true);
  assert.equal(model.tokenize("<tool_call>", true).length, 1, "one token in the Qwen vocabulary");
  const g = new JsonGrammar();
  const gbnf = g.rules.text(
    `root ::= ${
      jsonDialect.callRule(g, tool, "tools[0].function.parameters", "t0", {
        open: `<[${open}]>`,
        close: `<[${close}]>`,
      })
    }`,
  );
  const body = '\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n';
  const feed = (tokens: number[]) => acceptsTokens(model, gbnf, tokens);
  const inner = [...body].flatMap((ch) => model.tokenize(ch, false));
  assert.ok(feed([open, ...inner, close]), "the tokens open and close the call");
  const spelled = [..."<tool_call>"].flatMap((ch) => model.tokenize(ch, false));
  assert.ok(spelled.length > 1 && !spelled.includes(open));
  assert.equal(feed([...spelled, ...inner, close]), false, "the same text in ordinary tokens does not");
});

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
  // `^` inside a class: llama.cpp's grammar parser knows no `\^` escape (each of these was a 500).
  for (
    const [pattern, ok, bad] of [["^[a^]{2}$", '"^a"', '"ab"'], ["^\\W$", '"^"', '"a"'], [
      "^\\^$",
      '"^"',
      '"a"',
    ]]
  ) {
    const g = schemaGrammar({ type: "string", pattern });
    assert.ok(accepts(g, ok) && !accepts(g, bad), pattern);
  }
  // Each top-level alternative has its own anchors, as in ECMA-262: `^a|b$` is `(^a)|(b$)`.
  const either = schemaGrammar({ type: "string", pattern: "^a|b$" });
  for (const ok of ['"a"', '"ax"', '"xb"', '"b"']) assert.ok(accepts(either, ok), ok);
  for (const bad of ['"x"', '"xa"', '"bx"']) assert.ok(!accepts(either, bad), bad);
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

/** The keywords a schema leaves to the output check (none: the grammar enforces all of it). */
function leftToCheck(schema: unknown): string[] {
  const g = new JsonGrammar();
  g.schema(schema, "response_format", "out");
  return [...g.validated].sort();
}

Deno.test("json schema: date and time formats", () => {
  const date = schemaGrammar({ type: "string", format: "date" });
  for (const ok of ['"2026-02-28"', '"1999-12-31"', '"2000-01-01"']) assert.ok(accepts(date, ok), ok);
  for (
    const bad of ['"2026-13-01"', '"2026-00-10"', '"2026-02-32"', '"26-02-28"', '"2026-2-28"', '"today"']
  ) {
    assert.ok(!accepts(date, bad), bad);
  }
  const time = schemaGrammar({ type: "string", format: "time" });
  for (const ok of ['"23:59:59Z"', '"08:30:00+02:00"', '"00:00:00.123456-11:30"']) {
    assert.ok(accepts(time, ok), ok);
  }
  for (const bad of ['"24:00:00Z"', '"12:60:00Z"', '"12:00:00"', '"12:00Z"', '"12:00:00+2:00"', '"noon"']) {
    assert.ok(!accepts(time, bad), bad);
  }
  assert.deepEqual(leftToCheck({ type: "string", format: "date" }), []);
  assert.deepEqual(leftToCheck({ type: "string", format: "time" }), []);
});

// pydantic v2's discriminated union: the alternatives are $refs, told apart by a const tag.
const payment = {
  $defs: {
    Card: {
      type: "object",
      properties: {
        method: { const: "card", type: "string" },
        last4: { type: "string", pattern: "^\\d{4}$" },
      },
      required: ["method", "last4"],
    },
    PayPal: {
      type: "object",
      properties: { method: { const: "paypal", type: "string" }, account: { type: "string" } },
      required: ["method", "account"],
    },
  },
  oneOf: [{ $ref: "#/$defs/Card" }, { $ref: "#/$defs/PayPal" }],
  discriminator: { propertyName: "method", mapping: { card: "#/$defs/Card", paypal: "#/$defs/PayPal" } },
};

Deno.test("json schema: oneOf with const discriminators behind $refs is enforced by the grammar", () => {
  assert.deepEqual(leftToCheck(payment), [], "no output check needed: the tags keep the alternatives apart");
  const g = schemaGrammar(payment);
  assert.ok(accepts(g, '{"method": "card", "last4": "1234"}'));
  assert.ok(accepts(g, '{"method": "paypal", "account": "ann"}'));
  for (
    const bad of [
      '{"method": "card", "account": "ann"}',
      '{"method": "paypal", "last4": "1234"}',
      '{"method": "cash", "last4": "1234"}',
      '{"last4": "1234"}',
      '{"method": "card", "last4": "12345"}',
    ]
  ) assert.ok(!accepts(g, bad), bad);
  // Inline alternatives and enum tags are told apart the same way.
  const inline = {
    oneOf: [
      {
        type: "object",
        properties: { kind: { enum: ["a", "b"] }, x: { type: "integer" } },
        required: ["kind", "x"],
      },
      {
        type: "object",
        properties: { kind: { const: "c" }, y: { type: "string" } },
        required: ["kind", "y"],
      },
    ],
  };
  assert.deepEqual(leftToCheck(inline), []);
  const ig = schemaGrammar(inline);
  assert.ok(accepts(ig, '{"kind": "b", "x": 1}') && accepts(ig, '{"kind": "c", "y": "z"}'));
  assert.ok(!accepts(ig, '{"kind": "c", "x": 1}') && !accepts(ig, '{"kind": "a", "y": "z"}'));
});

Deno.test("json schema: a oneOf whose alternatives may overlap is left to the output check", () => {
  const untagged = { oneOf: [{ type: "integer" }, { type: "number", minimum: 0 }] };
  assert.deepEqual(leftToCheck(untagged), ["oneOf"]);
  // A tag that may be left out does not keep the alternatives apart: {} matches both.
  const optional = {
    oneOf: [
      { type: "object", properties: { kind: { const: "a" } } },
      { type: "object", properties: { kind: { const: "b" } } },
    ],
  };
  assert.deepEqual(leftToCheck(optional), ["oneOf"]);
  const shared = {
    oneOf: [
      { type: "object", properties: { kind: { enum: ["a", "b"] } }, required: ["kind"] },
      { type: "object", properties: { kind: { enum: ["b", "c"] } }, required: ["kind"] },
    ],
  };
  assert.deepEqual(leftToCheck(shared), ["oneOf"]);
});

Deno.test("json schema: multipleOf between bounds, for integers", () => {
  const s = { type: "integer", minimum: 0, maximum: 100, multipleOf: 5 };
  assert.deepEqual(leftToCheck(s), []);
  const g = schemaGrammar(s);
  for (const ok of ["0", "5", "35", "95", "100"]) assert.ok(accepts(g, ok), ok);
  for (const bad of ["-5", "3", "101", "105", "1000", "05"]) assert.ok(!accepts(g, bad), bad);
  const neg = schemaGrammar({ type: "integer", exclusiveMinimum: -21, maximum: -3, multipleOf: 4 });
  for (const ok of ["-4", "-8", "-20"]) assert.ok(accepts(neg, ok), ok);
  for (const bad of ["-24", "-3", "-2", "0", "4", "-0"]) assert.ok(!accepts(neg, bad), bad);
  // zod's z.number().int().multipleOf(3): the safe-integer bounds and the step at once.
  const zod = { type: "integer", minimum: -9007199254740991, maximum: 9007199254740991, multipleOf: 3 };
  assert.deepEqual(leftToCheck(zod), []);
  const z = schemaGrammar(zod);
  for (const ok of ["0", "-3", "9007199254740990", "123456"]) assert.ok(accepts(z, ok), ok);
  for (const bad of ["9007199254740991", "9007199254740993", "1", "-100"]) assert.ok(!accepts(z, bad), bad);
  assert.throws(
    () => schemaGrammar({ type: "integer", minimum: 11, maximum: 14, multipleOf: 5 }),
    (e: Error) => e instanceof GrammarError && /multiple of 5/.test(e.message),
  );
  // A fractional step is checked after.
  assert.deepEqual(leftToCheck({ type: "number", minimum: 0, maximum: 1, multipleOf: 0.25 }), ["multipleOf"]);
});

Deno.test("json schema: minLength/maxLength next to a pattern or a format, and format with pattern", () => {
  const s = { type: "string", pattern: "^[a-z]+$", minLength: 2, maxLength: 4 };
  assert.deepEqual(leftToCheck(s), []);
  const g = schemaGrammar(s);
  for (const ok of ['"ab"', '"abcd"']) assert.ok(accepts(g, ok), ok);
  for (const bad of ['"a"', '"abcde"', '"AB"']) assert.ok(!accepts(g, bad), bad);
  const email = { type: "string", format: "email", maxLength: 12 };
  assert.deepEqual(leftToCheck(email), []);
  const e = schemaGrammar(email);
  assert.ok(accepts(e, '"ann@ex.com"'));
  assert.ok(!accepts(e, '"annabel@example.com"') && !accepts(e, '"no-at-sign"'));
  // pydantic's constr(min_length=4, max_length=4, pattern=...) and zod's .length(4).
  const last4 = { type: "string", pattern: "^\\d+$", minLength: 4, maxLength: 4 };
  const l = schemaGrammar(last4);
  assert.ok(accepts(l, '"0042"') && !accepts(l, '"123"') && !accepts(l, '"12345"'));
  // A format beside a pattern: strings must satisfy both.
  const dated = { type: "string", format: "date", pattern: "^2026-" };
  assert.deepEqual(leftToCheck(dated), []);
  const d = schemaGrammar(dated);
  assert.ok(accepts(d, '"2026-03-01"'));
  for (const bad of ['"2025-03-01"', '"2026-13-01"', '"2026-"']) assert.ok(!accepts(d, bad), bad);
  // Lengths an automaton cannot hold beside a pattern are left to the output check.
  assert.deepEqual(leftToCheck({ type: "string", pattern: "^[a-z]+$", maxLength: 100_000 }), [
    "minLength/maxLength",
  ]);
});

Deno.test("json schema: minProperties/maxProperties over declared properties are counted by the grammar", () => {
  const s = {
    type: "object",
    properties: { a: { type: "integer" }, b: { type: "integer" }, c: { type: "integer" } },
    required: ["a"],
    minProperties: 2,
    maxProperties: 2,
  };
  assert.deepEqual(leftToCheck(s), []);
  const g = schemaGrammar(s);
  for (const ok of ['{"a": 1, "b": 2}', '{"a": 1, "c": 3}']) assert.ok(accepts(g, ok), ok);
  for (const bad of ['{"a": 1}', '{"a": 1, "b": 2, "c": 3}', '{"b": 2, "c": 3}', "{}"]) {
    assert.ok(!accepts(g, bad), bad);
  }
  const atMost = { type: "object", additionalProperties: { type: "integer" }, maxProperties: 2 };
  assert.deepEqual(leftToCheck(atMost), [], "repeated keys only lower the count");
  assert.deepEqual(
    leftToCheck({ ...atMost, minProperties: 2 }),
    ["minProperties"],
    "distinct keys are checked",
  );
  assert.throws(
    () => schemaGrammar({ type: "object", properties: { a: { type: "integer" } }, minProperties: 2 }),
    (e: Error) => e instanceof GrammarError && e.message.includes("minProperties"),
  );
});

Deno.test("json schema: what the output check could not compile is refused naming the keyword; the check fails closed", async () => {
  for (
    const [schema, keyword] of [
      [{ type: "string", pattern: "^a\\-b$" }, "pattern"],
      [{ type: "string", minLength: "x" }, "minLength"],
      [{ type: "object", required: "a" }, "required"],
      [{ type: "integer", minimum: "3" }, "minimum"],
      [{ type: "array", items: { type: "string" }, uniqueItems: "yes" }, "uniqueItems"],
      [{ not: { type: "strin" } }, "type"],
      [{ not: { pattern: "[" } }, "pattern"],
      [{ type: "object", patternProperties: { "[": {} } }, "patternProperties"],
      [{ type: "object", propertyNames: { pattern: "(" } }, "pattern"],
      [{ type: "object", dependentRequired: { a: "b" } }, "dependentRequired"],
      [{ if: { $ref: "#/$defs/nowhere" }, then: { type: "string" } }, "$ref"],
    ] as const
  ) {
    assert.throws(
      () => new JsonGrammar().schema(schema, "response_format.json_schema.schema", "out"),
      (e: Error) =>
        e instanceof GrammarError && e.message.includes(keyword) &&
        e.param === "response_format.json_schema.schema",
      JSON.stringify(schema),
    );
    const check = await checkAgainstSchema(schema, "x");
    assert.equal(
      check.ok,
      false,
      `the check vouches for nothing it cannot compile: ${JSON.stringify(schema)}`,
    );
  }
});

Deno.test("json schema: a format beside a pattern allows only what the output check's format test passes", async () => {
  const samples: Record<string, string[]> = {
    date: ["2026-02-28", "2026-02-30", "2026-13-01", "x"],
    time: ["10:00:00Z", "10:00:60z", "10:00:00.5+01:00", "25:00:00Z", "10:00"],
    "date-time": ["2026-01-01T10:00:00Z", "2026-01-01 10:00:00z", "2026-01-01T10:00:00"],
    uuid: ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"],
    email: ["a@b.c", "a b@c.d", "a@b", "@b.c"],
    hostname: ["example.com", "-bad.com", "a..b"],
    ipv4: ["10.0.0.1", "256.0.0.1", "1.2.3"],
    uri: ["https://x.y/z", "mailto:a@b", "no scheme", "1http://x"],
  };
  for (const [format, strings] of Object.entries(samples)) {
    // An unanchored pattern any non-empty string matches: the grammar is the format's test alone.
    const g = schemaGrammar({ type: "string", format, pattern: "." });
    for (const text of strings) {
      const valid = (await checkAgainstSchema({ type: "string", format }, text)).ok;
      assert.equal(accepts(g, JSON.stringify(text)), valid, `${format}: ${text}`);
    }
  }
});

Deno.test("xml dialect grammar: string parameters keep their pattern, format, lengths and alternatives", () => {
  const g = new JsonGrammar();
  const gbnf = g.rules.text(`root ::= ${
    xmlDialect.callRule(
      g,
      {
        name: "f",
        parameters: {
          type: "object",
          properties: {
            code: { type: "string", pattern: "^[A-Z]+$", maxLength: 3 },
            when: { anyOf: [{ type: "string", format: "date" }, { type: "string", const: "never" }] },
          },
          required: ["code", "when"],
        },
      },
      "tools[0].function.parameters",
      "t0",
      TEXT_TAGS,
    )
  }`);
  const call = (code: string, when: string) =>
    `<tool_call>\n<function=f>\n<parameter=code>\n${code}\n</parameter>\n<parameter=when>\n${when}\n</parameter>\n</function>\n</tool_call>`;
  assert.ok(accepts(gbnf, call("ABC", "2026-05-01")) && accepts(gbnf, call("A", "never")));
  assert.ok(!accepts(gbnf, call("ABCD", "never")), "maxLength beside a pattern");
  assert.ok(!accepts(gbnf, call("AB", "tomorrow")), "each alternative keeps its format");
  assert.deepEqual([...g.validated], []);
});

Deno.test("xml dialect grammar: parameters that $ref the tool's $defs (pydantic) resolve; string enums stay raw", () => {
  const g = new JsonGrammar();
  const parameters = {
    type: "object",
    $defs: {
      Unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      Place: {
        type: "object",
        properties: { city: { type: "string" }, country: { $ref: "#/$defs/Country" } },
        required: ["city", "country"],
      },
      Country: { type: "string", pattern: "^[A-Z]{2}$" },
    },
    properties: {
      place: { $ref: "#/$defs/Place" },
      unit: { allOf: [{ $ref: "#/$defs/Unit" }], description: "pydantic's wrapped reference" },
    },
    required: ["place", "unit"],
  };
  const gbnf = g.rules.text(
    `root ::= ${
      xmlDialect.callRule(g, { name: "f", parameters }, "tools[0].function.parameters", "t0", TEXT_TAGS)
    }`,
  );
  const call = (place: string, unit: string) =>
    `<tool_call>\n<function=f>\n<parameter=place>\n${place}\n</parameter>\n<parameter=unit>\n${unit}\n</parameter>\n</function>\n</tool_call>`;
  assert.ok(accepts(gbnf, call('{"city": "Rome", "country": "IT"}', "celsius")));
  assert.ok(
    !accepts(gbnf, call('{"city": "Rome", "country": "Italy"}', "celsius")),
    "nested $ref keeps its pattern",
  );
  assert.ok(
    !accepts(gbnf, call('{"city": "Rome", "country": "IT"}', '"celsius"')),
    "a string enum is raw text",
  );
  assert.ok(!accepts(gbnf, call('{"city": "Rome", "country": "IT"}', "kelvin")));
});

Deno.test("the output check reads decimal multipleOf in decimal (0.07 is a multiple of 0.01)", async () => {
  assert.ok((await checkAgainstSchema({ type: "number", multipleOf: 0.01 }, 0.07)).ok);
  assert.ok((await checkAgainstSchema({ type: "number", multipleOf: 0.1 }, 0.3)).ok);
  assert.ok(!(await checkAgainstSchema({ type: "number", multipleOf: 0.01 }, 0.075)).ok);
});

Deno.test("counts up to llama.cpp's repetition limit parse and hold; past it a minimum is refused, a maximum checked after", () => {
  // llama.cpp refuses a repetition of 2,000 or more, and counts the rules of a repeated group:
  // `( x ( "," x ){0,1998} )?` failed to parse.
  for (
    const schema of [
      { type: "array", items: { type: "integer" }, maxItems: 1999 },
      { type: "array", items: { type: "integer" }, minItems: 1999 },
      { type: "array", prefixItems: [{ type: "string" }], items: { type: "integer" }, maxItems: 1999 },
      { type: "object", additionalProperties: { type: "integer" }, maxProperties: 1999 },
      { type: "object", additionalProperties: { type: "integer" }, minProperties: 1999 },
      { type: "string", minLength: 1999 },
      { type: "string", maxLength: 2000 },
    ]
  ) {
    const parsed = GrammarConstraint.create(model, schemaGrammar(schema));
    assert.ok(parsed, `llama.cpp parses the grammar of ${JSON.stringify(schema)}`);
    parsed.free();
  }
  const g = schemaGrammar({ type: "string", maxLength: 1999 });
  assert.ok(accepts(g, JSON.stringify("a".repeat(1999))));
  assert.ok(!accepts(g, JSON.stringify("a".repeat(2000))));
  // A maximum llama.cpp would silently drop is the output check's.
  assert.deepEqual(leftToCheck({ type: "string", maxLength: 5000 }), ["maxLength"]);
  assert.deepEqual(leftToCheck({ type: "array", maxItems: 5000 }), ["maxItems"]);
  for (
    const [schema, keyword] of [
      [{ type: "string", minLength: 2000 }, "minLength"],
      [{ type: "string", pattern: "^a+$", minLength: 100_000 }, "minLength"],
      [{ type: "array", minItems: 1e8 }, "minItems"],
      [{ type: "object", additionalProperties: true, minProperties: 2000 }, "minProperties"],
    ] as const
  ) {
    assert.throws(
      () => schemaGrammar(schema),
      (e: Error) => e instanceof GrammarError && e.keyword === keyword && e.message.includes(`'${keyword}'`),
      JSON.stringify(schema),
    );
  }
});

Deno.test("number bounds are read exactly: a range a grammar can write works, one it cannot is refused naming the bound", () => {
  // 1e-300 was read as 0: the grammar allowed 0, which the output check refused three times over.
  const tiny = schemaGrammar({ type: "number", minimum: 1e-300 });
  for (const ok of ["0.0000000000000001", "1", "0.5"]) assert.ok(accepts(tiny, ok), ok);
  for (const bad of ["0", "0.0", "-1"]) assert.ok(!accepts(tiny, bad), bad);
  const ex = schemaGrammar({ type: "number", exclusiveMinimum: 1e-17, maximum: 1e300 });
  assert.ok(accepts(ex, "0.0000000000000001") && accepts(ex, "123") && !accepts(ex, "0"));
  assert.throws(
    () => schemaGrammar({ type: "number", minimum: 1e-300, maximum: 1.0000000000001e-300 }),
    (e: Error) =>
      e instanceof GrammarError && e.code === "unsupported_schema" && e.keyword === "minimum" &&
      /no number a grammar can write/.test(e.message),
  );
  assert.throws(
    () => schemaGrammar({ type: "integer", minimum: 0.2, maximum: 0.8 }),
    (e: Error) =>
      e instanceof GrammarError && e.code === "invalid_schema" && /no integer lies within/.test(e.message),
  );
});

/**
 * A schema whose check doubles with each level: each level's first alternative checks the level
 * below and then fails, the second checks it again (2^levels steps for Ajv). Request validation
 * refuses it (the schema budget counts the expansion); these tests hand it to the checker directly.
 */
function doubling(levels: number): Record<string, unknown> {
  const $defs: Record<string, unknown> = { l0: { type: "integer" } };
  for (let i = 1; i <= levels; i++) {
    $defs[`l${i}`] = {
      anyOf: [{ allOf: [{ $ref: `#/$defs/l${i - 1}` }, false] }, { $ref: `#/$defs/l${i - 1}` }],
    };
  }
  return { $defs, $ref: `#/$defs/l${levels}` };
}

Deno.test("the output check runs off the event loop: an exponential check is cut off by the worker, which goes on", async () => {
  const checker = new SchemaChecker({ timeoutMs: 500 });
  try {
    let ticks = 0;
    const timer = setInterval(() => ticks++, 5);
    const stuck = checker.check(doubling(40), 3);
    // The same schema queued meanwhile is answered as cut off with it, not checked for its own limit.
    const twin = checker.check(doubling(40), 4);
    const next = checker.check({ type: "string", maxLength: 3 }, "abcd");
    const [r, t, n] = await Promise.all([stuck, twin, next]);
    assert.ok(!t.ok && t.timedOut, JSON.stringify(t));
    clearInterval(timer);
    assert.ok(!r.ok && r.timedOut, JSON.stringify(r));
    assert.ok(ticks > 0, "the event loop ran while the check was stuck");
    assert.ok(!n.ok && !n.timedOut, "the check after it ran");
    assert.equal(checker.timedOut, 2);
    // The worker stopped the check itself and answered the next one: not replaced. (Ended from outside,
    // its thread would go on backtracking: Deno's terminate() does not stop running JavaScript.)
    assert.equal(checker.started, 1, "one worker");
    // The same schema again is answered as cut off at once, before any timer: no worker time.
    const again = checker.check(doubling(40), 5);
    const first = await Promise.race([again, new Promise((r) => setTimeout(() => r("late"), 0))]);
    assert.ok(typeof first === "object" && first !== null && "timedOut" in first && first.timedOut);
    assert.equal(checker.timedOut, 3);
  } finally {
    checker.close();
  }
});

Deno.test("a check behind one that has run long goes to a second worker, answered before it", async () => {
  const checkers = [new SchemaChecker({ timeoutMs: 4000 }), new SchemaChecker({ timeoutMs: 4000 })];
  try {
    const order: string[] = [];
    const costly = pickChecker(checkers).check(
      doubling(44),
      3,
    )
      .then((r) => (order.push("costly"), r));
    while (checkers[0].busyMs() <= SPILL_MS) await new Promise((r) => setTimeout(r, 20));
    const plain = pickChecker(checkers).check({ type: "integer" }, 3).then((r) => (order.push("plain"), r));
    const [c, p] = await Promise.all([costly, plain]);
    assert.ok(!c.ok && c.timedOut);
    assert.deepEqual(p, { ok: true });
    assert.deepEqual(order, ["plain", "costly"]);
    assert.deepEqual(checkers.map((c) => c.started), [1, 1]);
  } finally {
    for (const c of checkers) c.close();
  }
});

Deno.test("a check still queued when its request ends is dropped, ahead of the costly one before it", async () => {
  const checker = new SchemaChecker({ timeoutMs: 500 });
  try {
    const order: string[] = [];
    const gone = new AbortController();
    const stuck = checker.check(doubling(40), 3)
      .then((r) => (order.push("costly"), r));
    const queued = checker.check({ type: "integer" }, 3, gone.signal).then((r) => (order.push("dropped"), r));
    gone.abort();
    const [r, q] = await Promise.all([stuck, queued]);
    assert.ok(!r.ok && r.timedOut);
    assert.deepEqual(q, { ok: false, reason: "the request ended before the check" });
    assert.deepEqual(order, ["dropped", "costly"]);
  } finally {
    checker.close();
  }
});

Deno.test("warming the output check starts its worker in a turn of its own, not in the request's", async () => {
  // `new Worker` holds the thread (9-11 ms, more on a busy host): not in the work of the turn that asked.
  const checker = new SchemaChecker();
  try {
    checker.warm();
    checker.warm();
    assert.equal(helpersBusy(), false, "nothing started in the calling turn");
    await new Promise((r) => setTimeout(r, 0));
    assert.equal(helpersBusy(), true, "the worker is loading (a helper at work)");
    assert.deepEqual(await checker.check({ type: "integer" }, 3), { ok: true });
    assert.equal(helpersBusy(), false);
  } finally {
    checker.close();
  }
});

Deno.test("the output check compiles a schema of 3,000 properties (Ajv's nested code overflowed the stack)", async () => {
  const names = Array.from({ length: 3000 }, (_, i) => `p${i}`);
  const schema = {
    type: "object",
    properties: Object.fromEntries(names.map((n) => [n, { type: "integer" }])),
    required: names,
  };
  const value = Object.fromEntries(names.map((n, i) => [n, i]));
  const checker = new SchemaChecker();
  try {
    assert.deepEqual(await checker.check(schema, value), { ok: true });
    assert.equal((await checker.check(schema, { ...value, p7: "x" })).ok, false);
  } finally {
    checker.close();
  }
});

Deno.test("a grammar whose alternatives multiply goes off the event loop, then is refused past its bound, naming the field", async () => {
  // Each level is a oneOf of the level below and an object holding it: both begin with `{`, so every
  // `{"b":` can be read at any level, and the ways to read the output multiply (30 levels held one
  // token for minutes in llama.cpp, on the event loop).
  const defs: Record<string, unknown> = { l0: { type: "object", properties: { a: { type: "integer" } } } };
  for (let i = 1; i <= 30; i++) {
    defs[`l${i}`] = {
      oneOf: [{ $ref: `#/$defs/l${i - 1}` }, {
        type: "object",
        properties: { b: { $ref: `#/$defs/l${i - 1}` } },
      }],
    };
  }
  const g = await GrammarConstraint.parse(
    model,
    schemaGrammar({ $ref: "#/$defs/l30", $defs: defs }),
    undefined,
    "response_format.json_schema.schema",
  );
  assert.ok(g);
  try {
    assert.ok(g.stacks > 0 && g.stacks <= SYNC_STACKS, `open alternatives at the start: ${g.stacks}`);
    let offLoop = 0;
    let refused: unknown;
    let tokens = 0;
    outer: for (const piece of '{"b":'.repeat(40)) {
      for (const token of model.tokenize(piece, false)) {
        const heavy: boolean = g.stacks > SYNC_STACKS;
        // One token's check stays on the event loop (cheap up to the bound).
        assert.ok(g.allows(token));
        try {
          const step = g.accept(token);
          assert.equal(step instanceof Promise, heavy, `token ${tokens}: ${g.stacks} open alternatives`);
          if (step) {
            offLoop++;
            await step;
          }
        } catch (e) {
          refused = e;
          break outer;
        }
        tokens++;
      }
    }
    assert.ok(offLoop > 0, "no step went off the event loop");
    assert.ok(refused instanceof EngineInputError, `refused: ${refused}`);
    assert.equal(refused.code, "schema_too_large");
    assert.equal(refused.param, "response_format.json_schema.schema");
    assert.match(refused.message, new RegExp(`at most ${MAX_STACKS}`));
    assert.ok(g.stacks > MAX_STACKS);
  } finally {
    g.free();
  }
  // A plain schema stays on the event loop: few alternatives, every step synchronous.
  const plain = await GrammarConstraint.parse(model, schemaGrammar(person));
  assert.ok(plain);
  try {
    for (const piece of '{"name": "Ann", "age": 3}') {
      for (const token of model.tokenize(piece, false)) {
        assert.ok(plain.allows(token));
        assert.equal(plain.accept(token), undefined);
        assert.ok(plain.stacks <= SYNC_STACKS);
      }
    }
  } finally {
    plain.free();
  }
});

Deno.test("json schema: an enum is a tree of its values' beginnings: 1,000 values sharing 240 characters keep one open alternative through them", () => {
  const shared = "x".repeat(240);
  const values = Array.from({ length: 1000 }, (_, i) => `${shared}${i}`);
  const gbnf = schemaGrammar({ enum: values });
  const g = GrammarConstraint.create(model, gbnf);
  assert.ok(g);
  try {
    // As one alternative per value, llama.cpp held 1,000 open through the shared beginning.
    const open: number[] = [];
    for (const ch of `"${shared}`) {
      for (const token of model.tokenize(ch, false)) {
        assert.ok(g.allows(token));
        g.accept(token);
        open.push(g.stacks);
      }
    }
    assert.equal(Math.max(...open.slice(0, -1)), 1, "open alternatives through the shared beginning");
    assert.equal(open.at(-1), 10, "at its end, one a next digit");
    for (const ch of '7"') for (const token of model.tokenize(ch, false)) g.accept(token);
    assert.ok(g.allows(model.eos), "a value ended");
  } finally {
    g.free();
  }
  for (const ok of [0, 1, 7, 10, 99, 100, 999]) {
    assert.ok(accepts(gbnf, JSON.stringify(`${shared}${ok}`)), `${ok}`);
  }
  for (const bad of [`${shared}`, `${shared}1000`, `${shared}01`, `${shared}9999`, `${shared.slice(1)}1`]) {
    assert.ok(!accepts(gbnf, JSON.stringify(bad)), bad);
  }
});

Deno.test("GbnfRules.alternatives takes exactly its strings (random sets over quotes, escapes, emoji, the empty string)", () => {
  const alphabet = ["a", "b", '"', "\\", "\n", "😀", "😁", "é"];
  const word = fc.array(fc.constantFrom(...alphabet), { maxLength: 6 }).map((cs) => cs.join(""));
  fc.assert(
    fc.property(
      fc.array(word, { minLength: 1, maxLength: 12 }),
      fc.array(word, { maxLength: 12 }),
      (set, probes) => {
        const rules = new GbnfRules();
        const gbnf = rules.text(`root ::= ${rules.alternatives("w", set)}`);
        const members = new Set(set);
        for (const text of [...set, ...probes]) {
          assert.equal(
            accepts(gbnf, text),
            members.has(text),
            `${JSON.stringify(text)} under ${JSON.stringify(set)}`,
          );
        }
      },
    ),
    { numRuns: 60, seed: 26 },
  );
});

Deno.test("xml dialect grammar: an empty string enum is a 400 naming it, not a crash", () => {
  const g = new JsonGrammar();
  const parameters = {
    type: "object",
    properties: { unit: { type: "string", enum: [] } },
    required: ["unit"],
  };
  assert.throws(
    () => xmlDialect.callRule(g, { name: "f", parameters }, "tools[0].function.parameters", "t0", TEXT_TAGS),
    (e: unknown) =>
      e instanceof GrammarError && e.code === "invalid_schema" &&
      /enum must be a non-empty array/.test(e.message),
  );
});

Deno.test("json schema: one enum used by many properties is one set of rules", () => {
  const codes = Array.from({ length: 1000 }, (_, i) => `c${String(i).padStart(3, "0")}`);
  const schema = (n: number) => ({
    type: "object",
    $defs: { C: { enum: codes } },
    properties: Object.fromEntries(
      Array.from({ length: n }, (_, i) => [`p${i}`, { $ref: "#/$defs/C", type: "string" }]),
    ),
  });
  const size = (n: number) => {
    const g = new JsonGrammar();
    g.schema(schema(n), "response_format", "out");
    return g.rules.size;
  };
  // The enum's tree is hundreds of rules; each further property adds a few of its own.
  assert.ok(size(1) > 100, `${size(1)}`);
  assert.ok(size(30) - size(1) < 29 * 10, `${size(1)} rules for 1 property, ${size(30)} for 30`);
});

Deno.test("tool constants never spell </tool_call>: JSON writes <\\/ (the same value), the XML format's raw text refuses it and free raw text cannot hold it", () => {
  const json = schemaGrammar({ enum: ["x</tool_call>", "y"] });
  assert.ok(accepts(json, '"x<\\/tool_call>"'));
  assert.equal(JSON.parse('"x<\\/tool_call>"'), "x</tool_call>");
  assert.ok(!accepts(json, '"x</tool_call>"'));
  const call = (parameters: Record<string, unknown>) => {
    const g = new JsonGrammar();
    return g.rules.text(
      `root ::= ${
        xmlDialect.callRule(g, { name: "f", parameters }, "tools[0].function.parameters", "t0", TEXT_TAGS)
      }`,
    );
  };
  for (const bad of ["x</tool_call>", "a\n</parameter>b"]) {
    assert.throws(
      () => call({ type: "object", properties: { s: { type: "string", enum: ["ok", bad] } } }),
      (e: unknown) => e instanceof GrammarError && e.code === "invalid_schema" && e.keyword === "enum",
    );
  }
  const free = call({ type: "object", properties: { s: { type: "string" } }, required: ["s"] });
  const text = (v: string) =>
    `<tool_call>\n<function=f>\n<parameter=s>\n${v}\n</parameter>\n</function>\n</tool_call>`;
  assert.ok(accepts(free, text("a</function>b")));
  assert.ok(!accepts(free, text("a</tool_call>b")));
});
