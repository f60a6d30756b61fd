/**
 * The output check's pattern matcher (`PatternMatcher`): it must say what V8's own unicode-mode
 * RegExp says on every pattern the grammar takes (random patterns and texts, fast-check), while
 * taking time linear in the text where V8 backtracks exponentially. Patterns it cannot take are a
 * 400 naming the keyword wherever they are in a schema, not only where the grammar enforces one.
 */
import assert from "node:assert/strict";
import { fc } from "./helpers/clients.ts";
import {
  GrammarError,
  JsonGrammar,
  LruCache,
  PatternError,
  PatternMatcher,
  PatternTooLargeError,
  PatternWorkError,
} from "../src/grammar/mod.ts";
import { CHECK_WORK, validateJson } from "../src/services/schema_ajv.ts";

/** Characters the patterns and texts are made of: ASCII, a line break, a non-ASCII letter, an astral one, a Unicode space. */
const CHARS = ["a", "b", "c", "1", "_", " ", "\n", "é", "😀", "😃", "\u2003", "-", ".", "A", "]", "{", "\b"];

const literal = fc.constantFrom(
  "a",
  "b",
  "c",
  "1",
  "é",
  "😀",
  "\\.",
  "-",
  " ",
  "\\x61",
  "\\x41BC",
  "\\u00e9",
  "\\u{1F600}",
  "\\ud83d\\ude00",
  "\\cJ",
  "\\n",
  "\\{",
  "\\}",
  "\\]",
);
const klass = fc.constantFrom(
  ".",
  "\\d",
  "\\D",
  "\\w",
  "\\W",
  "\\s",
  "\\S",
  "[ab]",
  "[^ab]",
  "[a-c1]",
  "[^\\s]",
  "[\\d_]",
  "[é😀]",
  "[^😀]",
  "[]",
  "[^]",
  "[\\b]",
  "[-a]",
  "[a-]",
  "[\\]\\-]",
  "[\\x61-\\x63]",
  "[\\u{1F600}-\\u{1F64F}]",
  "[\\ud83d\\ude00]",
  "[^\\n\\cJ]",
);
const quantifier = fc.constantFrom("", "", "", "*", "+", "?", "{2}", "{0,2}", "{1,}", "*?", "+?");

/** Random regular expressions in the grammar's subset: groups, alternation, quantifiers, anchors, start lookaheads. */
const { pattern } = fc.letrec((tie) => ({
  atom: fc.oneof(
    { weight: 3, arbitrary: literal },
    { weight: 2, arbitrary: klass },
    { weight: 1, arbitrary: tie("alt").map((a) => `(${a})`) },
    { weight: 1, arbitrary: tie("alt").map((a) => `(?:${a})`) },
  ),
  piece: fc.tuple(tie("atom"), quantifier).map(([a, q]) => `${a}${q}`),
  seq: fc.array(tie("piece"), { minLength: 0, maxLength: 4 }).map((p) => p.join("")),
  alt: fc.array(tie("seq"), { minLength: 1, maxLength: 3 }).map((s) => s.join("|")),
  pattern: fc.tuple(
    fc.boolean(),
    fc.array(fc.tuple(fc.boolean(), tie("alt"), fc.boolean()), { maxLength: 2 }),
    tie("alt"),
    fc.boolean(),
  ).map(([start, looks, body, end]) =>
    (start || looks.length > 0 ? "^" : "") +
    looks.map(([neg, a, anchored]) => `(?${neg ? "!" : "="}${a}${anchored ? "$" : ""})`).join("") +
    // Lookaheads among several top-level alternatives are refused: the body is one group then.
    (looks.length > 0 ? `(?:${body})` : body) + (end ? "$" : "")
  ),
}));
const text = fc.array(fc.constantFrom(...CHARS), { maxLength: 10 }).map((c) => c.join(""));

Deno.test("the pattern matcher says what V8's unicode RegExp says, on random patterns and texts", () => {
  let compared = 0;
  let refused = 0;
  fc.assert(
    fc.property(pattern, fc.array(text, { minLength: 1, maxLength: 8 }), (source, texts) => {
      let matcher: PatternMatcher;
      try {
        matcher = PatternMatcher.compile(source);
      } catch (e) {
        // The generator stays in the subset: no refusal is expected (counted below).
        assert.ok(e instanceof PatternError, `${source}: ${e}`);
        refused++;
        return;
      }
      const re = new RegExp(source, "u");
      for (const t of texts) {
        assert.equal(matcher.test(t), re.test(t), `${JSON.stringify(source)} on ${JSON.stringify(t)}`);
        compared++;
      }
    }),
    { numRuns: 1500, seed: 26 },
  );
  assert.ok(compared > 5000 && refused === 0, `compared ${compared}, refused ${refused}`);
});

Deno.test("the pattern matcher takes one step a character where V8 backtracks exponentially", () => {
  // Each pattern on its worst text: V8 would take 2^n steps (n = 40: minutes).
  const cases: [string, string, boolean][] = [
    ["^(a+)+b$", `${"a".repeat(40)}!`, false],
    ["^(a|aa)+$", `${"a".repeat(40)}!`, false],
    ["^(a*)*b$", "a".repeat(40), false],
    ["^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$", `a@${"a.".repeat(20_000)} `, false],
    ["(a|b)*a(a|b){11}", "ab".repeat(5000), true],
  ];
  for (const [source, t, expected] of cases) {
    const matcher = PatternMatcher.compile(source);
    // Counted, not timed: the automaton states built stay within the text's length and the
    // pattern's, where backtracking visits exponentially many.
    assert.equal(matcher.test(t), expected, source);
    assert.ok(matcher.built <= [...t].length + 1, `${source}: ${matcher.built} states built`);
  }
});

Deno.test("the output check tests patterns and formats with the linear matcher", () => {
  // Under `not`, in patternProperties, and a format: each would backtrack for minutes in V8.
  const slow = `${"a".repeat(40)}!`;
  assert.deepEqual(validateJson(JSON.stringify({ type: "string", not: { pattern: "^(a+)+b$" } }), slow), {
    ok: true,
  });
  const keys = validateJson(
    JSON.stringify({ type: "object", patternProperties: { "^(a|aa)+$": { type: "integer" } } }),
    { [slow]: "x", aa: 1 },
  );
  assert.deepEqual(keys, { ok: true });
  const email = validateJson(
    JSON.stringify({ type: "string", format: "email" }),
    `a@${"a.".repeat(20_000)} `,
  );
  assert.ok(!email.ok && /format "email"/.test(email.reason), JSON.stringify(email));
  assert.deepEqual(validateJson(JSON.stringify({ type: "string", format: "email" }), "a@b.co"), { ok: true });
  // uniqueItems by canonical JSON: key order and 1 / 1.0 do not make items distinct; deep nesting is fine.
  const unique = JSON.stringify({ type: "array", uniqueItems: true });
  assert.ok(!validateJson(unique, [{ a: 1, b: [1, { c: 2 }] }, { b: [1, { c: 2 }], a: 1.0 }]).ok);
  assert.deepEqual(validateJson(unique, [1, "1", [1], { "1": 1 }, null, "null", 0, false]), { ok: true });
  let deep: unknown = 1;
  for (let i = 0; i < 20_000; i++) deep = [deep];
  assert.deepEqual(validateJson(unique, [deep, 1]), { ok: true });
  const objects = Array.from({ length: 20_000 }, (_, i) => ({ i, tag: "x" }));
  assert.deepEqual(validateJson(unique, objects), { ok: true });
  // A pattern matches anywhere unless anchored, as JSON Schema says.
  assert.deepEqual(validateJson(JSON.stringify({ type: "string", pattern: "\\d+" }), "x12"), { ok: true });
  assert.ok(!validateJson(JSON.stringify({ type: "string", pattern: "^\\d+$" }), "x12").ok);
});

Deno.test("a pattern the matcher cannot take is a 400 naming the keyword wherever it is in the schema", () => {
  const refused = (schema: unknown, keyword: string, why: RegExp) =>
    assert.throws(
      () => new JsonGrammar().schema(schema, "response_format", "out"),
      (e: Error) =>
        e instanceof GrammarError && e.keyword === keyword && why.test(e.message) &&
        e.param === "response_format",
      JSON.stringify(schema),
    );
  refused(
    { type: "string", not: { pattern: "^(a)\\1$" } },
    "pattern",
    /#\/not cannot be enforced: backreferences/,
  );
  refused({ type: "object", patternProperties: { "\\bx": {} } }, "patternProperties", /word boundaries/);
  refused({ type: "string", not: { pattern: "(?<=a)b" } }, "pattern", /lookaround/);
  refused({ type: "string", not: { pattern: "^\\p{L}+$" } }, "pattern", /the escape .\\p. is not supported/);
  refused(
    { type: "string", not: { pattern: "((a|b){200}){200}" } },
    "pattern",
    /over 20000 automaton states/,
  );
  assert.throws(() => PatternMatcher.compile("((a|b){200}){200}"), PatternTooLargeError);
  // What it takes passes, under `not` too.
  assert.ok(
    new JsonGrammar().schema({ type: "string", not: { pattern: "^(a+)+b$" } }, "response_format", "out"),
  );
});

Deno.test("a test stopped part-way (a time limit) leaves the matcher sound for the next", async () => {
  const vm = await import("node:vm");
  const source = "(a|b)*a(a|b){14}$";
  const matcher = PatternMatcher.compile(source);
  // Random letters (a fixed sequence): each window of 15 is a state of its own, 2^15 of them.
  let text = "";
  for (let i = 0, x = 7; i < 400_000; i++) {
    text += (x = (x * 1103515245 + 12345) % 2147483648) & 1024 ? "b" : "a";
  }
  const sandbox = vm.createContext({ run: () => matcher.test(text) });
  // Stopped by V8 wherever it is, between any two updates of the states it keeps.
  for (let i = 0; i < 5; i++) {
    assert.throws(() => new vm.Script("run()").runInContext(sandbox, { timeout: 1 + i }), /timed out/);
    for (const t of ["ab".repeat(20), `a${"b".repeat(14)}`, "b".repeat(20), `${"a".repeat(30)}b`]) {
      assert.equal(matcher.test(t), new RegExp(source, "u").test(t), t);
    }
  }
});

Deno.test("a test's work is bounded by its allowance: a costly pattern on a long text stops at once", () => {
  // 19,105 automaton states: each character builds a state of thousands of them (195 s on 100,000).
  const matcher = PatternMatcher.compile("a(?:.{190}){100}$");
  let text = "";
  for (let i = 0; i < 100_000; i++) text += i % 50 === 7 ? "b" : "a";
  const work = { left: 1_000_000 };
  assert.throws(() => matcher.test(text, work), PatternWorkError);
  assert.ok(work.left < 0 && work.left > -200_000, `${work.left}`);
  // Through the output check: cut off as a check over its time limit is, naming the allowance.
  const r = validateJson(JSON.stringify({ type: "string", not: { pattern: "a(?:.{190}){100}$" } }), text);
  assert.deepEqual(r, {
    ok: false,
    reason: `its patterns took more than ${CHECK_WORK} steps`,
    timedOut: true,
  });
  // The same matcher answers the next test.
  assert.equal(matcher.test(`a${"x".repeat(19_000)}`), true);
  assert.equal(matcher.test(`a${"x".repeat(18_000)}`), false);
});

Deno.test("patterns are charged to the schema budget by their automata: many large ones are a 400", () => {
  const big = "(?:a{200}){99}0"; // 19,802 states, within the limit of one pattern
  const patternProperties = Object.fromEntries(Array.from({ length: 5 }, (_, i) => [`${big}${i}`, {}]));
  assert.throws(
    () => new JsonGrammar().schema({ type: "object", patternProperties }, "response_format", "out"),
    (e: Error) =>
      e instanceof GrammarError && e.code === "schema_too_large" &&
      /building the automata of its patterns takes more than the schema budget/.test(e.message),
  );
  const few = Object.fromEntries(Object.entries(patternProperties).slice(0, 2));
  assert.ok(new JsonGrammar().schema({ type: "object", patternProperties: few }, "response_format", "out"));
});

Deno.test("the LRU cache tells of every value it lets go of: pushed out, replaced, too large", () => {
  const dropped: string[] = [];
  const cache = new LruCache<string>(2, 10, (key, value) => dropped.push(`${key}=${value}`));
  cache.set("a", "1", 4);
  cache.set("b", "2", 4);
  cache.get("a"); // now the most recent: "b" goes first
  cache.set("c", "3", 4); // over 10 in size: "b" out
  cache.set("a", "4", 4); // replaced
  cache.set("d", "5", 11); // too large to keep
  assert.deepEqual(dropped, ["b=2", "a=1", "d=5"]);
  assert.deepEqual([cache.get("a"), cache.get("c"), cache.get("d")], ["4", "3", undefined]);
});

Deno.test("uniqueItems says which items repeat as Ajv does", () => {
  const r = validateJson(JSON.stringify({ type: "array", uniqueItems: true }), [1, 2, { a: 1 }, 3, {
    a: 1.0,
  }]);
  assert.deepEqual(r, {
    ok: false,
    reason: "data must NOT have duplicate items (items ## 2 and 4 are identical)",
  });
});
