/** Unit tests of the chat output parser, JSON-schema checks and grammar adjustments. */
import assert from "node:assert/strict";
import { type ParsedPiece, QwenOutputParser } from "../src/engines/llama/output_parser.ts";
import { toGrammarSchema } from "../src/engines/llama/json_schema.ts";
import { tightenJsonGrammar } from "../src/engines/llama/chat.ts";
import { EngineInputError } from "../src/engines/types.ts";

function parseAll(chunks: string[], startInReasoning = false): ParsedPiece[] {
  const p = new QwenOutputParser(startInReasoning);
  const out = chunks.flatMap((c) => p.push(c));
  out.push(...p.end());
  // Merge neighbours of one type, as a client concatenating deltas would see them.
  return out.reduce<ParsedPiece[]>((acc, x) => {
    const last = acc.at(-1);
    if (last && last.type === x.type && (x.type === "content" || x.type === "reasoning")) {
      (last as { text: string }).text += (x as { text: string }).text;
    } else acc.push({ ...x });
    return acc;
  }, []);
}

Deno.test("parser: thinking goes to reasoning and never into content", () => {
  assert.deepEqual(parseAll(["<think>\nplan it\n</think>\n\nHello"]), [
    { type: "reasoning", text: "\nplan it\n" },
    { type: "content", text: "Hello" },
  ]);
});

Deno.test("parser: tags split across chunks are recognised", () => {
  assert.deepEqual(
    parseAll(["<thi", "nk>a</th", "ink>b<tool", '_call>{"name":"f","arguments":{"x":1}}</tool_', "call>"]),
    [
      { type: "reasoning", text: "a" },
      { type: "content", text: "b" },
      { type: "tool_call", name: "f", arguments: '{"x":1}' },
    ],
  );
});

Deno.test("parser: a prompt that opened <think> starts in reasoning", () => {
  assert.deepEqual(parseAll(["deep</think>answer"], true), [
    { type: "reasoning", text: "deep" },
    { type: "content", text: "answer" },
  ]);
});

Deno.test("parser: several tool calls keep the model's argument text (numbers untouched)", () => {
  const text = '<tool_call>\n{"name": "a", "arguments": {"n": 1.50, "s": "x y"}}\n</tool_call>\n' +
    '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>';
  assert.deepEqual(parseAll([text]), [
    { type: "tool_call", name: "a", arguments: '{"n":1.50,"s":"x y"}' },
    { type: "tool_call", name: "b", arguments: "{}" },
  ]);
});

Deno.test("parser: a broken or unterminated call is kept as text, not lost", () => {
  assert.deepEqual(parseAll(["<tool_call>{oops</tool_call>"]), [
    { type: "invalid_tool_call", raw: "<tool_call>{oops</tool_call>" },
  ]);
  assert.deepEqual(parseAll(['<tool_call>{"name":']), [{
    type: "invalid_tool_call",
    raw: '<tool_call>{"name":',
  }]);
});

Deno.test("parser: a lone '<' and unknown tags are content", () => {
  assert.deepEqual(parseAll(["a < b <b>bold</b>"]), [{ type: "content", text: "a < b <b>bold</b>" }]);
});

Deno.test("schema: anyOf and definitions are converted, annotations dropped", () => {
  const out = toGrammarSchema({
    title: "T",
    anyOf: [{ $ref: "#/definitions/a" }, { type: "null" }],
    definitions: { a: { type: "string", maxLength: 3 } },
  }, "p");
  assert.deepEqual(out, {
    oneOf: [{ $ref: "#/$defs/a" }, { type: "null" }],
    $defs: { a: { type: "string", maxLength: 3 } },
  });
});

Deno.test("schema: an unenforceable keyword is refused naming it and its place", () => {
  for (
    const [schema, keyword] of [
      [{ type: "string", pattern: "^a" }, "pattern"],
      [{ type: "object", properties: { n: { type: "integer", minimum: 1 } } }, "minimum"],
      [{ allOf: [{ type: "string" }] }, "allOf"],
      [{ type: "string", format: "email" }, "email"],
    ] as const
  ) {
    assert.throws(
      () => toGrammarSchema(schema, "response_format"),
      (e: Error) =>
        e instanceof EngineInputError && e.message.includes(keyword) && e.param === "response_format",
    );
  }
});

Deno.test("grammar: JSON ends at the closing brace; integers have no exponent", () => {
  const g = 'root ::= "{" x "}" "\\n\\n\\n\\n" [\\n]*\n' +
    'integer-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15}) ([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?\n' +
    'fractional-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?';
  assert.equal(
    tightenJsonGrammar(g),
    'root ::= "{" x "}"\n' +
      'integer-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15})\n' +
      'fractional-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?',
  );
});
