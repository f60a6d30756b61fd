/**
 * Random nested schemas ($defs, $ref, allOf/anyOf/oneOf, items, properties, enum, lengths, bounds,
 * patterns), generated with fast-check: each one compiles within the schema budget to a grammar
 * llama.cpp parses, or is refused with a GrammarError (a 400) — never another error, never work
 * past the budget; a sample of them through a real server is a 200 or a 400, never a 5xx.
 */
import assert from "node:assert/strict";
import { fc } from "./helpers/clients.ts";
import { Budget, GrammarError, JsonGrammar, measureSchema, SCHEMA_BUDGET } from "../src/grammar/mod.ts";
import { checkSchemaLimits } from "../src/services/schema_check.ts";
import { ApiError } from "../src/http/errors.ts";
import { llamaRuntime } from "../src/engines/llama/runtime.ts";
import { openLlamaLibrary } from "../src/engines/llama/ffi.ts";
import { NativeModel } from "../src/engines/llama/native.ts";
import { GrammarConstraint } from "../src/engines/llama/grammar.ts";
import { resolveSource } from "../src/models/sources.ts";
import { silentLogger } from "../src/log.ts";
import { postJson, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

type Schema = Record<string, unknown>;

/** Counts at the edges: small ones, and llama.cpp's repetition limit and beyond. */
const count = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: 0, max: 12 }) },
  { weight: 1, arbitrary: fc.constantFrom(1998, 1999, 2000, 5000, 100_000, 1e9) },
);
/** Numbers at the edges: integers, fractions, tiny and huge magnitudes. */
const bound = fc.oneof(
  fc.integer({ min: -1000, max: 1000 }),
  fc.double({ min: -1e6, max: 1e6, noNaN: true, noDefaultInfinity: true }),
  fc.constantFrom(0, 1e-300, 1.0000000000001e-300, -1e-300, 1e16, -1e16, 1e300, 9007199254740991, 0.1, 1e-17),
);
const jsonValue = fc.oneof(
  fc.string({ maxLength: 6 }),
  fc.integer({ min: -50, max: 50 }),
  fc.boolean(),
  fc.constant(null),
  fc.constant({ a: 1 }),
  fc.constant([1, "x"]),
);
const pattern = fc.constantFrom(
  "^[a-z]+$",
  "^\\d{3}-\\d{4}$",
  "a+b",
  "^(a|b)*c$",
  "^[A-Z]{2,4}$",
  "(x)\\1",
  "^.{3}$",
  "[",
);
const defNames = ["a", "b", "c"];
const ref = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom("#", "#/$defs/a", "#/$defs/b", "#/$defs/c") },
  { weight: 1, arbitrary: fc.constantFrom("#/$defs/missing", "#/properties/p0", "https://example.com/s") },
);

/** Keys of `rec` whose value is not undefined (fast-check's optional keys are undefined, not absent). */
function defined(rec: Schema): Schema {
  return Object.fromEntries(Object.entries(rec).filter(([, v]) => v !== undefined));
}
const opt = <T>(a: fc.Arbitrary<T>) => fc.option(a, { nil: undefined, freq: 2 });

const { schema } = fc.letrec<{
  schema: Schema;
  leaf: Schema;
  object: Schema;
  array: Schema;
  combo: Schema;
  refs: Schema;
}>((tie) => ({
  schema: fc.oneof(
    { depthSize: "small", maxDepth: 5 },
    { weight: 4, arbitrary: tie("leaf") },
    { weight: 2, arbitrary: tie("object") },
    { weight: 2, arbitrary: tie("array") },
    { weight: 2, arbitrary: tie("combo") },
    { weight: 2, arbitrary: tie("refs") },
  ),
  leaf: fc.oneof(
    fc.record({
      type: fc.constant("string"),
      minLength: opt(count),
      maxLength: opt(count),
      pattern: opt(pattern),
      format: opt(fc.constantFrom("date", "email", "uuid", "ipv4", "uri", "ipv6")),
    }).map(defined),
    fc.record({
      type: fc.constantFrom("number", "integer"),
      minimum: opt(bound),
      maximum: opt(bound),
      exclusiveMinimum: opt(bound),
      exclusiveMaximum: opt(bound),
      multipleOf: opt(fc.constantFrom(1, 2, 5, 0.25, 1000, 3001)),
    }).map(defined),
    fc.record({ enum: fc.array(jsonValue, { minLength: 1, maxLength: 5 }) }),
    fc.record({ const: jsonValue }),
    fc.constantFrom<Schema>({ type: "boolean" }, { type: "null" }, {}, { type: ["string", "null"] }),
  ),
  object: fc.record({
    type: fc.constant("object"),
    properties: opt(fc.dictionary(fc.constantFrom("p0", "p1", "p2", "p3"), tie("schema"), { maxKeys: 4 })),
    required: opt(fc.subarray(["p0", "p1", "p2", "p3"])),
    additionalProperties: opt(fc.oneof(fc.boolean(), tie("schema"))),
    minProperties: opt(count),
    maxProperties: opt(count),
  }).map(defined),
  array: fc.record({
    type: fc.constant("array"),
    items: opt(fc.oneof(fc.constant(false), tie("schema"))),
    prefixItems: opt(fc.array(tie("schema"), { maxLength: 3 })),
    minItems: opt(count),
    maxItems: opt(count),
    uniqueItems: opt(fc.boolean()),
  }).map(defined),
  combo: fc.tuple(
    fc.constantFrom("allOf", "anyOf", "oneOf", "not"),
    fc.array(tie("schema"), { minLength: 1, maxLength: 3 }),
    opt(fc.constantFrom("object", "string", "integer")),
  ).map(([key, parts, type]) => defined({ [key]: key === "not" ? parts[0] : parts, type }) as Schema),
  refs: fc.tuple(ref, opt(fc.constantFrom<Schema>({ type: "object" }, { minItems: 1 }, { description: "x" })))
    .map(([$ref, extra]) => ({ $ref, ...extra })),
}));

/** A schema with $defs a, b, c (which may refer to each other and to the root). */
const withDefs = fc.tuple(schema, fc.tuple(schema, schema, schema)).map(([root, defs]) => ({
  ...root,
  $defs: Object.fromEntries(defNames.map((n, i) => [n, defs[i]])),
}));

/**
 * An expansion trick: $defs l1..lN, each referring `fan` times to the level below through one
 * keyword (allOf, anyOf, oneOf, properties, prefixItems, items), with or without keywords beside
 * the $ref (which make the compiler inline it); the root refers to lN.
 */
const chain = fc.record({
  levels: fc.integer({ min: 2, max: 40 }),
  fan: fc.integer({ min: 1, max: 4 }),
  via: fc.constantFrom("allOf", "anyOf", "oneOf", "properties", "prefixItems", "items"),
  beside: fc.constantFrom<Schema>({}, { minItems: 0 }, { description: "x" }, { type: "object" }),
  base: schema,
}).map(({ levels, fan, via, beside, base }) => {
  const defs: Schema = { l0: base };
  for (let i = 1; i <= levels; i++) {
    const refs = Array.from({ length: fan }, () => ({ $ref: `#/$defs/l${i - 1}`, ...beside }));
    defs[`l${i}`] = via === "properties"
      ? { type: "object", properties: Object.fromEntries(refs.map((r, j) => [`k${j}`, r])) }
      : via === "prefixItems"
      ? { type: "array", prefixItems: refs, items: false }
      : via === "items"
      ? { type: "array", items: refs[0], maxItems: fan }
      : { [via]: refs };
  }
  return { $defs: defs, $ref: `#/$defs/l${levels}` } as Schema;
});

const rootSchema = fc.oneof({ weight: 3, arbitrary: withDefs }, { weight: 1, arbitrary: chain });

await llamaRuntime("cpu", silentLogger);
const lib = openLlamaLibrary();
const modelPath = await resolveSource("builtin:tiny-chat", {
  cacheDir: "models/cache",
  hubUrl: "",
  log: silentLogger,
});
const model = await NativeModel.load(lib, modelPath, 0);
globalThis.addEventListener("unload", () => model.free());

/** The most one charge adds (a schema node's path and name text, an enum body): the budget's overshoot. */
const SLACK = 1_000_000;

Deno.test("random schemas compile within the budget to grammars llama.cpp parses, or are refused with a GrammarError", () => {
  let compiled = 0;
  let refused = 0;
  fc.assert(
    fc.property(rootSchema, (s) => {
      const g = new JsonGrammar();
      let root: string;
      try {
        root = g.schema(s, "response_format.json_schema.schema", "out");
      } catch (e) {
        assert.ok(e instanceof GrammarError, `not a GrammarError: ${(e as Error).stack}`);
        assert.equal(e.param, "response_format.json_schema.schema");
        assert.ok(
          g.rules.budget.used <= SCHEMA_BUDGET + SLACK,
          `work past the budget: ${g.rules.budget.used}`,
        );
        refused++;
        return;
      }
      assert.ok(g.rules.budget.used <= SCHEMA_BUDGET, `compiled past the budget: ${g.rules.budget.used}`);
      const text = g.rules.text(`root ::= ${root}`);
      const grammar = GrammarConstraint.create(model, text);
      assert.ok(grammar, `llama.cpp refused the grammar of ${JSON.stringify(s)}:\n${text.slice(0, 3000)}`);
      grammar.free();
      compiled++;
    }),
    { numRuns: 1000, seed: 26 },
  );
  // The generator reaches both outcomes (else it tests little).
  assert.ok(compiled > 40 && refused > 40, `${compiled} compiled, ${refused} refused`);
});

Deno.test("random schemas pass the request check or are a 400, and its work stays within the budget", () => {
  fc.assert(
    fc.property(rootSchema, (s) => {
      const budget = new Budget();
      try {
        checkSchemaLimits(s, "response_format.json_schema.schema", budget);
      } catch (e) {
        assert.ok(e instanceof ApiError && e.status === 400, `not a 400: ${(e as Error).stack}`);
      }
      assert.ok(budget.used <= SCHEMA_BUDGET + SLACK, `${budget.used}`);
      // The measure alone: a GrammarError or a result, nothing else.
      try {
        measureSchema(s, null);
      } catch (e) {
        assert.ok(e instanceof GrammarError, `${(e as Error).stack}`);
      }
    }),
    { numRuns: 400, seed: 31 },
  );
});

const KEY = "test-key";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());

serverTest("a sample of random schemas through the server: each a 200 or a 400, never a 5xx", async () => {
  const samples = fc.sample(rootSchema, { numRuns: 24, seed: 2026 });
  const statuses = new Map<number, number>();
  for (const [i, s] of samples.entries()) {
    const body = i % 2 === 0
      ? { response_format: { type: "json_schema", json_schema: { name: "x", schema: s } } }
      : {
        tools: [{ type: "function", function: { name: "f", parameters: s } }],
        tool_choice: "required",
      };
    const res = await postJson(`${server.url}/v1/chat/completions`, {
      model: "vserve/tiny-chat",
      messages: [{ role: "user", content: "x" }],
      max_tokens: 4,
      ...body,
    }, KEY);
    assert.ok(
      res.status === 200 || res.status === 400,
      `${res.status} for ${JSON.stringify(s)}: ${JSON.stringify(res.body)}`,
    );
    statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
  }
  assert.ok((statuses.get(200) ?? 0) > 0 && (statuses.get(400) ?? 0) > 0, JSON.stringify([...statuses]));
});
