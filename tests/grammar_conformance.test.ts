/**
 * llama.cpp's JSON-schema-to-grammar conformance cases (tests/test-json-schema-to-grammar.cpp in
 * llama.cpp, the release node-llama-cpp 3.21.1 ships) run through our compiler. Our grammar text
 * differs from theirs, so each case checks what the text means: llama.cpp's own grammar engine
 * (through FFI, on the Qwen3 vocabulary) accepts sample JSON the schema allows and rejects sample
 * JSON it forbids, every accepted sample passes the output check (Ajv), and the cases llama.cpp
 * expects to fail are refused. Where JSON Schema and llama.cpp's converter disagree, JSON Schema
 * wins, and the case says so.
 */
import assert from "node:assert/strict";
import { acceptsText, loadGrammarModel } from "./helpers/grammar.ts";
import { GrammarError, JsonGrammar } from "../src/grammar/mod.ts";
import { SchemaChecker } from "../src/services/schema_check.ts";

const model = await loadGrammarModel();
const accepts = (gbnf: string, text: string) => acceptsText(model, gbnf, text);

/** A case: the schema, and JSON texts it allows and forbids; or the refusal expected. */
interface Case {
  name: string;
  schema: unknown;
  valid?: string[];
  invalid?: string[];
  /** llama.cpp expects a failure, or JSON Schema forbids what its converter accepts: refused. */
  refused?: RegExp;
}

const CASES: Case[] = [
  // Integer bounds ("min 0" … "min -10 max 10").
  {
    name: "min 0",
    schema: { type: "integer", minimum: 0 },
    valid: ["0", "7", "1234567"],
    invalid: ["-1", "01", "1.5"],
  },
  { name: "min 1", schema: { type: "integer", minimum: 1 }, valid: ["1", "10"], invalid: ["0", "-1"] },
  {
    name: "min 3",
    schema: { type: "integer", minimum: 3 },
    valid: ["3", "9", "10", "29"],
    invalid: ["2", "0"],
  },
  { name: "min 9", schema: { type: "integer", minimum: 9 }, valid: ["9", "10", "18"], invalid: ["8", "1"] },
  {
    name: "min 10",
    schema: { type: "integer", minimum: 10 },
    valid: ["10", "11", "100"],
    invalid: ["9", "1"],
  },
  {
    name: "min 25",
    schema: { type: "integer", minimum: 25 },
    valid: ["25", "30", "100"],
    invalid: ["24", "20", "3"],
  },
  {
    name: "max 30",
    schema: { type: "integer", maximum: 30 },
    valid: ["30", "0", "-100"],
    invalid: ["31", "40", "300"],
  },
  {
    name: "min -5",
    schema: { type: "integer", minimum: -5 },
    valid: ["-5", "-1", "0", "9"],
    invalid: ["-6", "-10"],
  },
  {
    name: "min -123",
    schema: { type: "integer", minimum: -123 },
    valid: ["-123", "-99", "0"],
    invalid: ["-124", "-200"],
  },
  {
    name: "max -5",
    schema: { type: "integer", maximum: -5 },
    valid: ["-5", "-6", "-100"],
    invalid: ["-4", "0", "5"],
  },
  { name: "max 1", schema: { type: "integer", maximum: 1 }, valid: ["1", "0", "-7"], invalid: ["2", "10"] },
  {
    name: "max 100",
    schema: { type: "integer", maximum: 100 },
    valid: ["100", "99", "-1"],
    invalid: ["101", "200"],
  },
  {
    name: "min 0 max 23",
    schema: { type: "integer", minimum: 0, maximum: 23 },
    valid: ["0", "9", "23"],
    invalid: ["-1", "24", "30"],
  },
  {
    name: "min 15 max 300",
    schema: { type: "integer", minimum: 15, maximum: 300 },
    valid: ["15", "99", "300"],
    invalid: ["14", "301", "3"],
  },
  {
    name: "min 5 max 30",
    schema: { type: "integer", minimum: 5, maximum: 30 },
    valid: ["5", "30"],
    invalid: ["4", "31"],
  },
  {
    name: "min -123 max 42",
    schema: { type: "integer", minimum: -123, maximum: 42 },
    valid: ["-123", "0", "42"],
    invalid: ["-124", "43"],
  },
  {
    name: "min -10 max 10",
    schema: { type: "integer", minimum: -10, maximum: 10 },
    valid: ["-10", "0", "10"],
    invalid: ["-11", "11"],
  },
  // Failures llama.cpp expects.
  { name: "unknown type", schema: { type: "kaboom" }, refused: /type/ },
  { name: "invalid type", schema: { type: 123 }, refused: /type/ },
  {
    name: "empty schema (object)",
    schema: {},
    valid: ['{"a": [1, "x", null]}', "[]", '"s"', "1.5e3", "true", "null"],
    invalid: ["{", "nul"],
  },
  {
    name: "exotic formats",
    schema: { items: [{ format: "date" }, { format: "uuid" }, { format: "time" }, { format: "date-time" }] },
    valid: ['["2012-04-23", "123e4567-e89b-12d3-a456-426614174000", "18:25:43Z", "2012-04-23T18:25:43Z"]'],
    invalid: ['["2012-13-23", "123e4567-e89b-12d3-a456-426614174000", "18:25:43Z", "2012-04-23T18:25:43Z"]'],
  },
  { name: "string", schema: { type: "string" }, valid: ['""', '"a b"', '"\\"q\\""'], invalid: ["1", '"'] },
  {
    name: "string w/ min length 1",
    schema: { type: "string", minLength: 1 },
    valid: ['"a"'],
    invalid: ['""'],
  },
  {
    name: "string w/ min length 3",
    schema: { type: "string", minLength: 3 },
    valid: ['"abc"'],
    invalid: ['"ab"'],
  },
  {
    name: "string w/ max length",
    schema: { type: "string", maxLength: 3 },
    valid: ['""', '"abc"'],
    invalid: ['"abcd"'],
  },
  {
    name: "string w/ min & max length",
    schema: { type: "string", minLength: 1, maxLength: 4 },
    valid: ['"a"', '"abcd"'],
    invalid: ['""', '"abcde"'],
  },
  { name: "boolean", schema: { type: "boolean" }, valid: ["true", "false"], invalid: ["1", '"true"'] },
  { name: "integer", schema: { type: "integer" }, valid: ["0", "-12"], invalid: ["1.5", '"1"'] },
  { name: "string const", schema: { const: "foo" }, valid: ['"foo"'], invalid: ['"bar"', "foo"] },
  { name: "non-string const", schema: { const: 123 }, valid: ["123"], invalid: ["124", '"123"'] },
  {
    name: "non-string enum",
    schema: { enum: ["red", "amber", "green", null, 42, ["foo"]] },
    valid: ['"red"', "null", "42", '["foo"]'],
    invalid: ['"blue"', "43", '["bar"]'],
  },
  // llama.cpp's converter reads `prefixItems` given as one schema as `items`; JSON Schema requires an array.
  {
    name: "string array",
    schema: { type: "array", prefixItems: { type: "string" } },
    refused: /prefixItems/,
  },
  {
    name: "nullable string array",
    schema: { type: ["array", "null"], prefixItems: { type: "string" } },
    refused: /prefixItems/,
  },
  // JSON Schema: `prefixItems` constrains the first items only, and none is required (llama.cpp: exactly them).
  {
    name: "tuple1",
    schema: { prefixItems: [{ type: "string" }] },
    valid: ['["a"]', "[]", '["a", 1]'],
    invalid: ["[1]"],
  },
  {
    name: "tuple2",
    schema: { prefixItems: [{ type: "string" }, { type: "number" }] },
    valid: ['["a", 1.5]', '["a"]'],
    invalid: ['[1, "a"]', '["a", "b"]'],
  },
  {
    name: "array with empty items",
    schema: { type: "array", items: {} },
    valid: ["[]", '[1, "a", null]'],
    invalid: ["{}"],
  },
  {
    name: "array with empty items and prefixItems",
    schema: { type: "array", items: {}, prefixItems: { type: "string" } },
    refused: /prefixItems/,
  },
  {
    name: "number",
    schema: { type: "number" },
    valid: ["1", "-0.5", "1e10", "2.5E-3"],
    invalid: ['"1"', ".5", "1."],
  },
  {
    name: "minItems",
    schema: { items: { type: "boolean" }, minItems: 2 },
    valid: ["[true, false]", "[true, true, false]"],
    invalid: ["[true]", "[]"],
  },
  {
    name: "maxItems 0",
    schema: { items: { type: "boolean" }, maxItems: 0 },
    valid: ["[]"],
    invalid: ["[true]"],
  },
  {
    name: "maxItems 1",
    schema: { items: { type: "boolean" }, maxItems: 1 },
    valid: ["[]", "[true]"],
    invalid: ["[true, false]"],
  },
  {
    name: "maxItems 2",
    schema: { items: { type: "boolean" }, maxItems: 2 },
    valid: ["[]", "[true, false]"],
    invalid: ["[true, false, true]"],
  },
  {
    name: "min + maxItems",
    schema: { items: { type: ["number", "integer"] }, minItems: 3, maxItems: 5 },
    valid: ["[1, 2.5, 3]", "[1, 2, 3, 4, 5]"],
    invalid: ["[1, 2]", "[1, 2, 3, 4, 5, 6]"],
  },
  {
    name: "min + max items with min + max values across zero",
    schema: { items: { type: "integer", minimum: -12, maximum: 207 }, minItems: 3, maxItems: 5 },
    valid: ["[-12, 0, 207]"],
    invalid: ["[-13, 0, 1]", "[0, 1, 208]"],
  },
  {
    name: "min + max items with min + max values",
    schema: { items: { type: "integer", minimum: 12, maximum: 207 }, minItems: 3, maxItems: 5 },
    valid: ["[12, 100, 207]"],
    invalid: ["[11, 100, 207]", "[12, 100, 208]"],
  },
  {
    name: "simple regexp",
    schema: { type: "string", pattern: "^abc?d*efg+(hij)?kl$" },
    valid: ['"abefgkl"', '"abcdddefgggkl"', '"abefghijkl"'],
    invalid: ['"abcefkl"', '"abefgkl!"'],
  },
  {
    name: "regexp escapes",
    schema: { type: "string", pattern: "^\\[\\]\\{\\}\\(\\)\\|\\+\\*\\?$" },
    valid: ['"[]{}()|+*?"'],
    invalid: ['"[]{}()|+*"'],
  },
  { name: "regexp quote", schema: { type: "string", pattern: '^"$' }, valid: ['"\\""'], invalid: ['"x"'] },
  // ECMA-262 reads `^A|B|C|D$` as `(^A)|B|C|(D$)`; our grammar writes the subset `^(A|B|C|D)$` of it.
  {
    name: "regexp with top-level alternation",
    schema: { type: "string", pattern: "^A|B|C|D$" },
    valid: ['"A"', '"B"', '"D"'],
    invalid: ['"E"', '""'],
  },
  {
    name: "regexp",
    schema: { type: "string", pattern: "^(\\([0-9]{1,3}\\))?[0-9]{3}-[0-9]{4} a{3,5}nd...$" },
    valid: ['"(12)123-4567 aaaand..."', '"123-4567 aaaaand!!!"'],
    invalid: ['"(1234)123-4567 aaand..."', '"123-4567 aand..."'],
  },
  {
    name: "required props in original order",
    schema: {
      type: "object",
      properties: { b: { type: "string" }, c: { type: "string" }, a: { type: "string" } },
      required: ["a", "b", "c"],
      additionalProperties: false,
      definitions: {},
    },
    valid: ['{"b": "x", "c": "y", "a": "z"}'],
    invalid: ['{"b": "x", "c": "y"}', '{"b": "x", "c": "y", "a": "z", "d": "w"}'],
  },
  {
    name: "1 optional prop",
    schema: { properties: { a: { type: "string" } }, additionalProperties: false },
    valid: ["{}", '{"a": "x"}'],
    invalid: ['{"b": "x"}', '{"a": 1}'],
  },
  {
    name: "N optional props",
    schema: {
      properties: { a: { type: "string" }, b: { type: "string" }, c: { type: "string" } },
      additionalProperties: false,
    },
    valid: ["{}", '{"a": "x", "c": "z"}', '{"b": "y"}'],
    invalid: ['{"d": "x"}'],
  },
  {
    name: "required + optional props each in original order",
    schema: {
      properties: {
        b: { type: "string" },
        a: { type: "string" },
        d: { type: "string" },
        c: { type: "string" },
      },
      required: ["a", "b"],
      additionalProperties: false,
    },
    valid: ['{"b": "x", "a": "y"}', '{"b": "x", "a": "y", "c": "z"}'],
    invalid: ['{"a": "y"}', '{"b": "x"}'],
  },
  {
    name: "additional props",
    schema: { type: "object", additionalProperties: { type: "array", items: { type: "number" } } },
    valid: ["{}", '{"x": [1, 2.5]}'],
    invalid: ['{"x": 1}', '{"x": ["a"]}'],
  },
  {
    name: "additional props (true)",
    schema: { type: "object", additionalProperties: true },
    valid: ["{}", '{"x": {"y": [null]}}'],
    invalid: ["[]"],
  },
  { name: "additional props (implicit)", schema: { type: "object" }, valid: ['{"x": 1}'], invalid: ["1"] },
  {
    name: "empty w/o additional props",
    schema: { type: "object", additionalProperties: false },
    valid: ["{}"],
    invalid: ['{"a": 1}'],
  },
  // Beside declared properties our grammar writes only those (in their order), never extra ones.
  {
    name: "required + additional props",
    schema: {
      type: "object",
      properties: { a: { type: "number" } },
      required: ["a"],
      additionalProperties: { type: "string" },
    },
    valid: ['{"a": 1}'],
    invalid: ["{}", '{"a": "x"}'],
  },
  {
    name: "optional + additional props",
    schema: {
      type: "object",
      properties: { a: { type: "number" } },
      additionalProperties: { type: "number" },
    },
    valid: ["{}", '{"a": 1}'],
    invalid: ['{"a": "x"}'],
  },
  {
    name: "required + optional + additional props",
    schema: {
      type: "object",
      properties: { and: { type: "number" }, also: { type: "number" } },
      required: ["and"],
      additionalProperties: { type: "number" },
    },
    valid: ['{"and": 1}', '{"and": 1, "also": 2}'],
    invalid: ["{}", '{"also": 2}'],
  },
  {
    name: "optional props with empty name",
    schema: {
      properties: { "": { type: "integer" }, a: { type: "integer" } },
      additionalProperties: { type: "integer" },
    },
    valid: ["{}", '{"": 1, "a": 2}'],
    invalid: ['{"": "x"}'],
  },
  {
    name: "optional props with nested names",
    schema: {
      properties: { a: { type: "integer" }, aa: { type: "integer" } },
      additionalProperties: { type: "integer" },
    },
    valid: ['{"a": 1, "aa": 2}', '{"aa": 2}'],
    invalid: ['{"aa": "x"}'],
  },
  {
    name: "optional props with common prefix",
    schema: {
      properties: { ab: { type: "integer" }, ac: { type: "integer" } },
      additionalProperties: { type: "integer" },
    },
    valid: ['{"ab": 1, "ac": 2}', '{"ac": 2}'],
    invalid: ['{"ab": "x"}'],
  },
  {
    name: "top-level $ref",
    schema: {
      $ref: "#/definitions/foo",
      definitions: {
        foo: {
          type: "object",
          properties: { a: { type: "string" } },
          required: ["a"],
          additionalProperties: false,
        },
      },
    },
    valid: ['{"a": "x"}'],
    invalid: ["{}", '{"a": 1}'],
  },
  {
    name: "anyOf",
    schema: {
      anyOf: [{ $ref: "#/definitions/foo" }, { $ref: "#/definitions/bar" }],
      definitions: {
        foo: { properties: { a: { type: "number" } } },
        bar: { properties: { b: { type: "number" } } },
      },
      type: "object",
    },
    valid: ['{"a": 1}', '{"b": 2}', "{}"],
    invalid: ['{"a": "x", "b": "y"}', "[]"],
  },
  {
    name: "anyOf $ref",
    schema: {
      properties: {
        a: { anyOf: [{ type: "string" }, { type: "number" }] },
        b: { anyOf: [{ $ref: "#/properties/a/anyOf/0" }, { type: "boolean" }] },
      },
      type: "object",
    },
    valid: ['{"a": "x", "b": true}', '{"a": 1, "b": "y"}', "{}"],
    invalid: ['{"b": 1}', '{"a": null}'],
  },
  {
    name: "mix of allOf, anyOf and $ref (similar to https://json.schemastore.org/tsconfig.json)",
    schema: {
      allOf: [
        { $ref: "#/definitions/foo" },
        { $ref: "#/definitions/bar" },
        { anyOf: [{ $ref: "#/definitions/baz" }, { $ref: "#/definitions/bam" }] },
      ],
      definitions: {
        foo: { properties: { a: { type: "number" } } },
        bar: { properties: { b: { type: "number" } } },
        bam: { properties: { c: { type: "number" } } },
        baz: { properties: { d: { type: "number" } } },
      },
      type: "object",
    },
    // allOf merges into one object; each anyOf alternative then takes its properties (written first).
    valid: ['{"d": 3, "a": 1, "b": 2}', '{"c": 4}', "{}"],
    invalid: ['{"a": "x"}', '{"c": "z", "d": "w"}'],
  },
  {
    name: "allOf with enum schema",
    schema: {
      allOf: [{ $ref: "#/definitions/foo" }],
      definitions: { foo: { type: "string", enum: ["a", "b"] } },
    },
    valid: ['"a"', '"b"'],
    invalid: ['"c"'],
  },
  {
    name: "allOf with multiple enum schemas",
    schema: {
      allOf: [{ $ref: "#/definitions/foo" }, { $ref: "#/definitions/bar" }],
      definitions: {
        foo: { type: "string", enum: ["a", "b", "c"] },
        bar: { type: "string", enum: ["b", "c", "d"] },
      },
    },
    valid: ['"b"', '"c"'],
    invalid: ['"a"', '"d"'],
  },
  {
    name: "conflicting names",
    schema: {
      type: "object",
      properties: {
        number: {
          type: "object",
          properties: {
            number: {
              type: "object",
              properties: { root: { type: "number" } },
              required: ["root"],
              additionalProperties: false,
            },
          },
          required: ["number"],
          additionalProperties: false,
        },
      },
      required: ["number"],
      additionalProperties: false,
      definitions: {},
    },
    valid: ['{"number": {"number": {"root": 1.5}}}'],
    invalid: ['{"number": {"number": {}}}'],
  },
  {
    name: "description only (no type) treated as unconstrained",
    schema: {
      description:
        "The 0-based index of the last line to be retrieved (inclusive). If None, read until the end of the file.",
    },
    valid: ["12", '"x"', "null"],
    invalid: ["nul"],
  },
  {
    name: "literal string with escapes",
    schema: {
      properties: {
        code: { const: ' \r \n " \\ ', description: "Generated code", title: "Code", type: "string" },
      },
      required: ["code"],
      title: "DecoderResponse",
      type: "object",
    },
    valid: ['{"code": " \\r \\n \\" \\\\ "}'],
    invalid: ['{"code": " "}'],
  },
  // llama.cpp's C++-only cases.
  {
    name: "regexp with non-capturing group",
    schema: { type: "string", pattern: "^(?:foo|bar)baz$" },
    valid: ['"foobaz"', '"barbaz"'],
    invalid: ['"baz"', '"foobarbaz"'],
  },
  {
    name: "regexp with nested non-capturing groups",
    schema: { type: "string", pattern: "^(?:(?:ab)+c)?d$" },
    valid: ['"d"', '"abcd"', '"ababcd"'],
    invalid: ['"abd"', '"cd"'],
  },
  // Unanchored: llama.cpp's converter gives up and allows any string; ours is exact.
  {
    name: "unanchored regexp",
    schema: { type: "string", pattern: "[0-9]+" },
    valid: ['"a1b"', '"7"'],
    invalid: ['"abc"'],
  },
  // `\w`: llama.cpp's converter gives up and allows any string; ours is exact.
  {
    name: "regexp with unsupported shorthand",
    schema: { type: "string", pattern: "^[0-9]{3}\\w$" },
    valid: ['"123a"', '"123_"'],
    invalid: ['"123-"', '"12a"'],
  },
  {
    name: "regexp with unbalanced parentheses",
    schema: { type: "string", pattern: "^(a$" },
    refused: /pattern/,
  },
  {
    name: "unsupported regexp in a property",
    schema: {
      type: "object",
      properties: { a: { type: "string", pattern: "^[a-z\\-]+$" } },
      required: ["a"],
      additionalProperties: false,
    },
    valid: ['{"a": "a-b"}'],
    invalid: ['{"a": "A"}', '{"a": ""}'],
  },
];

const checker = new SchemaChecker();

for (const c of CASES) {
  Deno.test(`llama.cpp conformance: ${c.name}`, async () => {
    const g = new JsonGrammar();
    if (c.refused) {
      assert.throws(
        () => g.schema(c.schema, "response_format", "out"),
        (e: Error) => e instanceof GrammarError && c.refused!.test(e.message),
      );
      return;
    }
    const gbnf = g.rules.text(`root ::= ${g.schema(c.schema, "response_format", "out")}`);
    for (const text of c.valid ?? []) {
      assert.ok(accepts(gbnf, text), `accepts ${text}`);
      const check = await checker.check(c.schema, JSON.parse(text));
      assert.ok(check.ok, `the output check passes ${text}: ${JSON.stringify(check)}`);
    }
    for (const text of c.invalid ?? []) assert.ok(!accepts(gbnf, text), `rejects ${text}`);
  });
}

Deno.test("llama.cpp conformance: the output check agrees that the invalid samples are invalid", async () => {
  try {
    for (const c of CASES) {
      for (const text of c.invalid ?? []) {
        let value: unknown;
        try {
          value = JSON.parse(text);
        } catch {
          continue; // not JSON at all
        }
        const check = await checker.check(c.schema, value);
        assert.ok(!check.ok, `${c.name}: ${text} is invalid`);
      }
    }
  } finally {
    checker.close();
  }
});
