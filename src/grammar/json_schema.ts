/**
 * JSON Schema → GBNF: a grammar whose every output is JSON that validates against the schema.
 * Each keyword takes one of two ways, and no keyword is ever silently ignored:
 * - **grammar**: enforced while generating (see {@link GRAMMAR_KEYWORDS});
 * - **validated**: no grammar can express it (e.g. `uniqueItems`, `not`), so the grammar enforces the
 *   rest and the finished output is checked against the whole schema ({@link VALIDATED_KEYWORDS}).
 *   A few grammar keywords fall back to this in cases a grammar cannot (or could only at great size)
 *   hold: `multipleOf` with a fractional step, an integer step × digits over 4,000 rules, or a step
 *   over 1,000 without bounds; `minLength`/`maxLength` whose automaton beside a `pattern` or `format`
 *   would pass 4,000 states; `minProperties` over 1 on a free-form map (keys could repeat); property
 *   counts over declared properties past 4,000 rules; `oneOf` whose alternatives no required
 *   `const`/`enum` tag keeps apart. {@link JsonGrammar.validated} names each one met.
 * Anything else is refused (a {@link GrammarError} naming the keyword and where it is), as is
 * any schema the output check could not compile (a keyword value of the wrong kind, a pattern that is
 * not an ECMA-262 regular expression or that the grammar's automata cannot take, wherever it is, a
 * $ref that points nowhere).
 */
import { type Budget, COSTS } from "./budget.ts";
import { GrammarError, type GrammarErrorCode } from "./errors.ts";
import { gbnfLiteral, GbnfRules, MAX_REPETITION, textWithout } from "./gbnf.ts";
import { measureSchema, resolvePointer } from "./measure.ts";
import { EmptyRangeError, multipleOfInteger, numberRange } from "./ranges.ts";
import { PatternError, PatternMatcher, patternRules, PatternTooLargeError } from "./regex.ts";

/** Keywords that only describe: skipped. */
const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$anchor",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
  "strict",
  "discriminator",
  "contentEncoding",
  "contentMediaType",
]);

/** Keywords enforced by the grammar. */
export const GRAMMAR_KEYWORDS: readonly string[] = [
  "type",
  "nullable",
  "const",
  "enum",
  "oneOf",
  "anyOf",
  "allOf",
  "$defs",
  "definitions",
  "$ref",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "additionalItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "multipleOf",
  "minProperties",
  "maxProperties",
];

/** Keywords checked on the finished output (the grammar enforces everything else). */
export const VALIDATED_KEYWORDS: readonly string[] = [
  "uniqueItems",
  "not",
  "contains",
  "minContains",
  "maxContains",
  "dependentRequired",
  "dependentSchemas",
  "dependencies",
  "if",
  "then",
  "else",
  "propertyNames",
  "patternProperties",
  "unevaluatedProperties",
  "unevaluatedItems",
];

/** String formats enforced by the grammar (each a subset of the valid strings, never a superset). */
const FORMATS: Record<string, string> = {
  date: "date",
  time: "time",
  "date-time": 'date "T" time',
  uuid: 'hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}',
  email: '[a-zA-Z0-9._%+-]{1,64} "@" label ( "." label ){0,4} "." [a-zA-Z]{2,24}',
  hostname: 'label ( "." label ){0,8}',
  ipv4: 'octet "." octet "." octet "." octet',
  uri:
    '[a-zA-Z] [a-zA-Z0-9+.-]{0,15} "://" label ( "." label ){0,8} ( ":" [0-9]{1,5} )? ( "/" [a-zA-Z0-9._~%!$&\'()*+,;=:@-]{0,64} ){0,8}',
};

/**
 * The output check's test of each format (services/schema_ajv.ts runs them), as patterns: a pattern
 * or length bounds next to a format are intersected with it, so what the grammar allows passes both.
 */
export const FORMAT_CHECKS: Readonly<Record<string, string>> = {
  date: "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$",
  time: "^([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  "date-time":
    "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])[tT ]([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  uuid: "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
  email: "^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$",
  hostname: "^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$",
  ipv4: "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$",
  uri: "^[a-zA-Z][a-zA-Z0-9+.-]*:[^\\s]*$",
};

/** Limits that keep grammar building cheap whatever the client sends. */
export interface SchemaLimits {
  maxDepth: number;
  maxRules: number;
}

const DEFAULT_LIMITS: SchemaLimits = { maxDepth: 64, maxRules: 20_000 };
/** Most rules for an object whose property count is enforced (beyond: the count is checked after). */
const MAX_COUNTED_OBJECT_RULES = 4000;

type Schema = Record<string, unknown>;

const JSON_TYPES = ["string", "number", "integer", "boolean", "object", "array", "null"];

/** What the value of each keyword must be for the output check to compile the schema. */
const KEYWORD_KINDS: Record<
  string,
  | "number"
  | "bound"
  | "count"
  | "boolean"
  | "string"
  | "strings"
  | "array"
  | "pattern"
  | "type"
  | "ref"
  | "schema"
  | "schemas"
  | "schemaOrSchemas"
  | "schemaMap"
  | "dependencies"
> = {
  minimum: "number",
  maximum: "number",
  multipleOf: "number",
  exclusiveMinimum: "bound",
  exclusiveMaximum: "bound",
  minLength: "count",
  maxLength: "count",
  minItems: "count",
  maxItems: "count",
  minProperties: "count",
  maxProperties: "count",
  minContains: "count",
  maxContains: "count",
  uniqueItems: "boolean",
  nullable: "boolean",
  format: "string",
  required: "strings",
  enum: "array",
  pattern: "pattern",
  type: "type",
  $ref: "ref",
  not: "schema",
  if: "schema",
  then: "schema",
  else: "schema",
  contains: "schema",
  propertyNames: "schema",
  additionalProperties: "schema",
  additionalItems: "schema",
  unevaluatedProperties: "schema",
  unevaluatedItems: "schema",
  allOf: "schemas",
  anyOf: "schemas",
  oneOf: "schemas",
  prefixItems: "schemas",
  items: "schemaOrSchemas",
  properties: "schemaMap",
  patternProperties: "schemaMap",
  $defs: "schemaMap",
  definitions: "schemaMap",
  dependentSchemas: "schemaMap",
  dependentRequired: "dependencies",
  dependencies: "dependencies",
};

/**
 * Compiles JSON schemas into rules of one grammar (several schemas may share it: each call gets
 * its own rule names). `validated` collects the keywords left to the output check.
 *
 * @example
 * ```ts
 * const g = new JsonGrammar();
 * const root = g.schema({ type: "object", properties: { a: { type: "integer" } } }, "response_format", "out");
 * g.rules.text(`root ::= ${root}`);
 * ```
 */
export class JsonGrammar {
  readonly rules: GbnfRules;
  /** Keywords found that the grammar does not enforce: the output must be validated. */
  readonly validated = new Set<string>();
  readonly #limits: SchemaLimits;
  #primitives = false;

  /** `rules`: where the rules go, and the budget their work is charged to ({@link GbnfRules.budget}). */
  constructor(rules = new GbnfRules(), limits: SchemaLimits = DEFAULT_LIMITS) {
    this.rules = rules;
    this.#limits = limits;
  }

  get #budget(): Budget {
    return this.rules.budget;
  }

  /** Optional whitespace between JSON tokens (bounded, so a model cannot pad forever). */
  get ws(): string {
    this.#ensurePrimitives();
    return "ws";
  }

  /** The rule name for any JSON value. */
  anyValue(): string {
    this.#ensurePrimitives();
    return "value";
  }

  /**
   * The rule for values valid under `schema`; `param` names the request field for errors,
   * `hint` prefixes rule names.
   */
  schema(schema: unknown, param: string, hint: string): string {
    this.#ensurePrimitives();
    const ctx: Context = { root: schema, param, refs: new Map(), hint };
    return named(param, () => {
      this.#checkCompilable(schema, ctx);
      measureSchema(schema, param, this.#budget);
      return this.#rule(schema, ctx, "#", 0, hint);
    });
  }

  /**
   * Refuses, naming the keyword, what the output check (Ajv) could not compile: keyword values of
   * the wrong kind, patterns that are not ECMA-262 (unicode) regular expressions, $refs that point
   * nowhere, anywhere in the schema, also under keywords the grammar leaves to the check.
   */
  #checkCompilable(schema: unknown, ctx: Context): void {
    const stack: [unknown, string, number][] = [[schema, "#", 0]];
    const bad = (path: string, key: string, what: string): never =>
      this.#fail(ctx, `The JSON schema keyword '${key}' at ${path} ${what}.`, "invalid_schema");
    const regex = (path: string, key: string, source: unknown) => {
      if (typeof source !== "string") bad(path, key, "must be a string");
      try {
        new RegExp(source as string, "u");
      } catch (e) {
        // V8 quotes the whole pattern in its message: only the reason is kept.
        const reason = (e as Error).message.replace(/^Invalid regular expression: \/.*\/[a-z]*: /s, "");
        bad(path, key, `is not a valid regular expression (ECMA-262, unicode mode): ${reason.slice(0, 200)}`);
      }
      // The output check tests every pattern with the grammar's automaton (linear in the text, where
      // V8's backtracking can take exponential time): what it cannot take is refused here, wherever
      // the pattern is, as the grammar refuses it where it enforces one.
      this.#budget.charge((source as string).length * COSTS.char, "parsing its patterns");
      let states: number;
      try {
        states = PatternMatcher.measure(source as string);
      } catch (e) {
        // `key` is `patternProperties/<the pattern>` for a property pattern.
        const at = { keyword: key.split("/")[0], path };
        if (e instanceof PatternTooLargeError) this.#fail(ctx, e.message, "schema_too_large", at);
        if (!(e instanceof PatternError)) throw e;
        const what = key === "pattern" ? "pattern" : `keyword '${key}'`;
        this.#fail(
          ctx,
          `The JSON schema ${what} at ${path} cannot be enforced: ${e.message}.`,
          undefined,
          at,
        );
      }
      this.#budget.charge(states * COSTS.patternState, "building the automata of its patterns");
    };
    while (stack.length > 0) {
      const [node, path, depth] = stack.pop()!;
      this.#budget.charge(COSTS.checkedNode);
      if (typeof node === "boolean") continue;
      if (depth > this.#limits.maxDepth) {
        this.#fail(
          ctx,
          `The JSON schema is nested deeper than ${this.#limits.maxDepth} levels (at ${path}).`,
          "schema_too_large",
        );
      }
      if (!isObject(node)) this.#fail(ctx, `The JSON schema at ${path} must be an object.`, "invalid_schema");
      const push = (v: unknown, at: string) => stack.push([v, at, depth + 1]);
      for (const [key, v] of Object.entries(node as Schema)) {
        const at = `${path}/${key}`;
        const kind = KEYWORD_KINDS[key];
        if (kind === undefined) continue;
        switch (kind) {
          case "number":
            if (typeof v !== "number" || !Number.isFinite(v)) bad(path, key, "must be a number");
            break;
          case "bound":
            if (typeof v !== "boolean" && (typeof v !== "number" || !Number.isFinite(v))) {
              bad(path, key, "must be a number");
            }
            break;
          case "count":
            if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
              bad(path, key, "must be a non-negative integer");
            }
            break;
          case "boolean":
            if (typeof v !== "boolean") bad(path, key, "must be true or false");
            break;
          case "string":
            if (typeof v !== "string") bad(path, key, "must be a string");
            break;
          case "strings":
            if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) {
              bad(path, key, "must be an array of strings");
            }
            break;
          case "array":
            if (!Array.isArray(v)) bad(path, key, "must be an array");
            break;
          case "pattern":
            regex(path, key, v);
            break;
          case "type": {
            const types = Array.isArray(v) ? v : [v];
            if (types.length === 0 || !types.every((t) => JSON_TYPES.includes(t as string))) {
              bad(path, key, `must be one of ${JSON_TYPES.join(", ")} (or an array of them)`);
            }
            break;
          }
          case "ref":
            if (typeof v !== "string") bad(path, key, "must be a string");
            this.#resolve(v as string, ctx, path);
            break;
          case "schema":
            push(v, at);
            break;
          case "schemas":
            if (!Array.isArray(v) || (v.length === 0 && key !== "prefixItems")) {
              bad(path, key, "must be a non-empty array of schemas");
            }
            (v as unknown[]).forEach((x, i) => push(x, `${at}/${i}`));
            break;
          case "schemaOrSchemas":
            if (Array.isArray(v)) v.forEach((x, i) => push(x, `${at}/${i}`));
            else push(v, at);
            break;
          case "schemaMap":
            if (!isObject(v)) bad(path, key, "must be an object of schemas");
            for (const [name, x] of Object.entries(v as Schema)) {
              if (key === "patternProperties") regex(path, `${key}/${name}`, name);
              push(x, `${at}/${name}`);
            }
            break;
          case "dependencies":
            if (!isObject(v)) bad(path, key, "must be an object");
            for (const [name, x] of Object.entries(v as Schema)) {
              const names = Array.isArray(x) && x.every((y) => typeof y === "string");
              if (key === "dependentRequired" && !names) {
                bad(path, `${key}/${name}`, "must be an array of strings");
              }
              if (key === "dependencies" && !names) push(x, `${at}/${name}`);
            }
            break;
        }
      }
    }
  }

  #ensurePrimitives() {
    if (this.#primitives) return;
    this.#primitives = true;
    const r = this.rules;
    r.define("ws", "[ \\t\\n]{0,8}");
    r.define("char", '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})');
    r.define("string", '"\\"" char* "\\""');
    r.define("integer", '"-"? ("0" | [1-9] [0-9]{0,15})');
    r.define("number", 'integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?');
    r.define("boolean", '"true" | "false"');
    r.define("null", '"null"');
    r.define("value", "object | array | string | number | boolean | null");
    r.define("object", '"{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"');
    r.define("array", '"[" ws ( value ws ( "," ws value ws )* )? "]"');
    r.define("hex", "[0-9a-fA-F]");
    r.define("label", "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,61} [a-zA-Z0-9] )?");
    r.define("octet", '"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]');
    r.define("date", '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )');
    r.define(
      "time",
      '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    );
  }

  #fail(
    ctx: Context,
    message: string,
    code: GrammarErrorCode = "unsupported_schema",
    at?: { keyword: string; path: string },
  ): never {
    throw new GrammarError(message, { code, param: ctx.param, ...at });
  }

  /**
   * A minimum count the grammar must enforce (`minLength`, `minItems`, `minProperties`): beyond
   * llama.cpp's repetition limit no grammar can, and leaving it to the output check would only fail
   * after generating: refused, naming the keyword.
   */
  #minimum(ctx: Context, path: string, keyword: string, n: number): number {
    if (n > MAX_REPETITION) {
      this.#fail(
        ctx,
        `The JSON schema keyword '${keyword}' at ${path} is ${n}; a grammar can require at most ${MAX_REPETITION} ` +
          "(llama.cpp's repetition limit), so no output could be guaranteed to meet it.",
        "unsupported_schema",
        { keyword, path },
      );
    }
    return n;
  }

  #rule(schema: unknown, ctx: Context, path: string, depth: number, hint: string): string {
    // Paths and rule names grow with nesting: their text is work too.
    this.#budget.charge(COSTS.node + (path.length + hint.length) * COSTS.char);
    if (depth > this.#limits.maxDepth) {
      this.#fail(
        ctx,
        `The JSON schema is nested deeper than ${this.#limits.maxDepth} levels (at ${path}).`,
        "schema_too_large",
      );
    }
    if (this.rules.size > this.#limits.maxRules) {
      this.#fail(
        ctx,
        `The JSON schema is too large to enforce (over ${this.#limits.maxRules} grammar rules).`,
        "schema_too_large",
      );
    }
    if (schema === true || schema === undefined) return "value";
    if (schema === false) {
      this.#fail(ctx, `The JSON schema at ${path} is 'false': no value can satisfy it.`, "invalid_schema");
    }
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      this.#fail(ctx, `The JSON schema at ${path} must be an object.`, "invalid_schema");
    }
    const s = schema as Schema;
    for (const key of Object.keys(s)) {
      if (ANNOTATIONS.has(key) || GRAMMAR_KEYWORDS.includes(key)) continue;
      if (VALIDATED_KEYWORDS.includes(key)) {
        this.validated.add(key);
        continue;
      }
      this.#fail(
        ctx,
        `The JSON schema keyword '${key}' at ${path} can neither be enforced by the grammar nor checked; ` +
          `remove it (supported: ${[...GRAMMAR_KEYWORDS, ...VALIDATED_KEYWORDS].join(", ")}).`,
      );
    }
    // Checked on the output, but refused here when no output could pass: `not` of a schema every value
    // meets, or a count beyond what a grammar can make the model write.
    if (s.not !== undefined && acceptsEverything(s.not)) {
      this.#fail(
        ctx,
        `The JSON schema at ${path} is 'not' of a schema every value meets: no value can satisfy it.`,
        "invalid_schema",
        { keyword: "not", path },
      );
    }
    if (typeof s.minContains === "number") this.#minimum(ctx, path, "minContains", s.minContains);
    // allOf, and $ref beside other keywords, become one merged schema, checked like any other.
    if (s.allOf !== undefined) return this.#rule(this.#mergeAllOf(s, ctx, path), ctx, path, depth + 1, hint);
    if (s.$ref !== undefined) {
      const rest = Object.keys(s).filter((k) =>
        k !== "$ref" && !ANNOTATIONS.has(k) && k !== "$defs" && k !== "definitions"
      );
      if (rest.length === 0) return this.#ref(String(s.$ref), ctx, path, depth);
      const merged = this.#mergeAllOf(
        { allOf: [this.#resolve(String(s.$ref), ctx, path), omit(s, ["$ref"])] },
        ctx,
        path,
      );
      return this.#rule(merged, ctx, path, depth + 1, hint);
    }
    if (s.const !== undefined) return this.rules.add(`${hint}-const`, gbnfLiteral(jsonText(s.const)));
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        this.#fail(ctx, `${path}/enum must be a non-empty array.`, "invalid_schema");
      }
      if (s.enum.length > 5000) {
        this.#fail(
          ctx,
          `${path}/enum has ${s.enum.length} entries; at most 5000 are allowed.`,
          "schema_too_large",
        );
      }
      // Values the rest of the schema rejects are left out.
      const values = s.enum.filter((v) => typeAllows(s, v));
      if (values.length === 0) {
        this.#fail(ctx, `${path}/enum has no value of the allowed type.`, "invalid_schema");
      }
      return this.rules.alternatives(`${hint}-enum`, values.map(jsonText));
    }
    const alternatives = s.oneOf ?? s.anyOf;
    if (alternatives !== undefined) {
      const key = s.oneOf !== undefined ? "oneOf" : "anyOf";
      if (!Array.isArray(alternatives) || alternatives.length === 0) {
        this.#fail(ctx, `${path}/${key} must be a non-empty array.`, "invalid_schema");
      }
      // oneOf is enforced as anyOf: exact when a `const` (or enum) tag keeps the alternatives apart,
      // looked up through their $refs (pydantic's discriminated unions); otherwise checked after.
      if (key === "oneOf") {
        const resolved = alternatives.map((a, i) => this.#resolved(a, ctx, `${path}/oneOf/${i}`));
        if (!disjoint(resolved, (p, at) => this.#resolved(p, ctx, at))) this.validated.add("oneOf");
      }
      // Sibling keywords (e.g. a shared `type`) apply to every alternative.
      const rest = omit(s, [key, "$defs", "definitions", ...ANNOTATIONS]);
      const alts = alternatives.map((a, i) => {
        let alt = a;
        if (Object.keys(rest).length > 0 && isObject(a)) {
          const merged = mergeSchemas(rest, a as Schema, this.#budget);
          // Siblings that do not merge into this alternative are left to the output check.
          if (merged) alt = merged;
          else Object.keys(rest).forEach((k) => this.validated.add(k));
        }
        return this.#rule(alt, ctx, `${path}/${key}/${i}`, depth + 1, `${hint}-${i}`);
      });
      return this.rules.add(`${hint}-alt`, alts.join(" | "));
    }
    let types = s.type === undefined
      ? inferTypes(s)
      : Array.isArray(s.type)
      ? s.type.map(String)
      : [String(s.type)];
    if (s.nullable === true && !types.includes("null") && !types.includes("any")) types = [...types, "null"];
    const alts = types.map((t) => this.#typed(t, s, ctx, path, depth, hint));
    return alts.length === 1 ? alts[0] : this.rules.add(`${hint}-types`, alts.join(" | "));
  }

  #typed(type: string, s: Schema, ctx: Context, path: string, depth: number, hint: string): string {
    switch (type) {
      case "string":
        return this.#string(s, ctx, path, hint);
      case "integer":
      case "number":
        return this.#number(type, s, ctx, path, hint);
      case "boolean":
      case "null":
        return type;
      case "object":
        return this.#object(s, ctx, path, depth, hint);
      case "array":
        return this.#array(s, ctx, path, depth, hint);
      case "any":
        return "value";
    }
    this.#fail(ctx, `The JSON schema type '${type}' at ${path} is not a JSON type.`, "invalid_schema");
  }

  /**
   * A rule for a string's raw text (no quotes, no escapes) under a string schema: enum, const,
   * format, pattern, length bounds. `markers` are what the text may never hold (the format's closing
   * tags): free text is kept clear of them, and a constant holding one is refused. For the XML dialect.
   */
  rawString(schema: Schema, param: string, hint: string, markers: readonly string[]): string {
    return named(param, () => this.#rawString(schema, param, hint, markers));
  }

  #rawString(schema: Schema, param: string, hint: string, markers: readonly string[]): string {
    this.#ensurePrimitives();
    const ctx: Context = { root: schema, param, refs: new Map(), hint };
    this.#checkCompilable(schema, ctx);
    const strings = (schema.enum ?? (schema.const !== undefined ? [schema.const] : undefined)) as
      | unknown[]
      | undefined;
    if (strings) {
      const keyword = schema.enum !== undefined ? "enum" : "const";
      if (!Array.isArray(strings) || strings.length === 0) {
        this.#fail(ctx, "#/enum must be a non-empty array.", "invalid_schema", { keyword, path: "#/enum" });
      }
      const texts = strings.map((v) => String(v));
      if (texts.some((t) => UNWRITABLE.test(t) || markers.some((m) => t.includes(m)))) {
        this.#fail(
          ctx,
          `#/${keyword} holds a string that a parameter's raw text cannot carry in this model's tool-call format ` +
            `(it has no escapes): a U+0000 character, a lone surrogate or ${
              markers.map((m) => JSON.stringify(m)).join(" or ")
            }.`,
          "invalid_schema",
          { keyword, path: `#/${keyword}` },
        );
      }
      return this.rules.alternatives(`${hint}-raw`, texts);
    }
    const alternatives = schema.anyOf ?? schema.oneOf;
    if (Array.isArray(alternatives)) {
      const key = schema.anyOf !== undefined ? "anyOf" : "oneOf";
      // Exact as a oneOf only when the alternatives are distinct constants.
      const tags = alternatives.map((a) => {
        const s = isObject(a) ? a as Schema : {};
        return s.const !== undefined ? [s.const] : Array.isArray(s.enum) ? s.enum : undefined;
      });
      const values = tags.flatMap((t) => t ?? []).map((v) => JSON.stringify(v));
      if (key === "oneOf" && (tags.includes(undefined) || new Set(values).size !== values.length)) {
        this.validated.add("oneOf");
      }
      const rest = omit(schema, [key, ...ANNOTATIONS]);
      const alts = alternatives.map((a, i) => {
        const merged = isObject(a) ? mergeSchemas(rest, a as Schema, this.#budget) : undefined;
        if (!merged) Object.keys(rest).forEach((k) => this.validated.add(k));
        return this.rawString(merged ?? a as Schema, param, `${hint}-${i}`, markers);
      });
      return this.rules.add(`${hint}-alt`, alts.join(" | "));
    }
    const text = this.#stringText(schema, ctx, "#", `${hint}-raw`, false);
    if (text !== undefined) return text;
    const min = bound(schema.minLength, 0);
    const max = schema.maxLength === undefined ? undefined : bound(schema.maxLength, 0);
    if (min === 0 && max === undefined) return textWithout(this.rules, `${hint}-raw`, markers);
    // Bounded raw text: characters other than '<' keep it clear of the closing tag.
    const chars = this.rules.repeat("[^<]", min, max, "minLength");
    if (!chars.bounded) this.validated.add("maxLength");
    return this.rules.add(`${hint}-raw`, chars.text);
  }

  #number(type: "integer" | "number", s: Schema, ctx: Context, path: string, hint: string): string {
    const num = (k: string) => typeof s[k] === "number" ? s[k] as number : undefined;
    // Draft 4 wrote exclusive bounds as booleans beside minimum / maximum.
    let min = num("minimum");
    let max = num("maximum");
    let exMin = false;
    let exMax = false;
    if (typeof s.exclusiveMinimum === "number" && (min === undefined || s.exclusiveMinimum >= min)) {
      min = s.exclusiveMinimum;
      exMin = true;
    } else if (s.exclusiveMinimum === true) exMin = true;
    if (typeof s.exclusiveMaximum === "number" && (max === undefined || s.exclusiveMaximum <= max)) {
      max = s.exclusiveMaximum;
      exMax = true;
    } else if (s.exclusiveMaximum === true) exMax = true;
    const multiple = num("multipleOf");
    const integer = type === "integer" || (multiple !== undefined && Number.isInteger(multiple));
    if (multiple !== undefined && multiple <= 0) {
      this.#fail(ctx, `${path}/multipleOf must be positive.`, "invalid_schema");
    }
    if (multiple !== undefined && Number.isInteger(multiple)) {
      if (min === undefined && max === undefined && multiple <= 1000) {
        return multipleOfInteger(this.rules, `${hint}-mul`, multiple);
      }
      // Integer bounds (inclusive), then the multiples between them digit by digit.
      const lo = min === undefined ? undefined : exMin ? Math.floor(min) + 1 : Math.ceil(min);
      const hi = max === undefined ? undefined : exMax ? Math.ceil(max) - 1 : Math.floor(max);
      const rule = multiplesBetween(this.rules, `${hint}-mul`, multiple, lo, hi);
      if (rule === null) {
        this.#fail(
          ctx,
          `${path}: no multiple of ${multiple} lies within its minimum and maximum.`,
          "invalid_schema",
        );
      }
      if (rule !== undefined) return rule;
    }
    // A fractional step, or too many rules for an integer one: the range (or type) in the grammar,
    // the step checked after.
    if (multiple !== undefined) this.validated.add("multipleOf");
    if (min === undefined && max === undefined) return integer ? "integer" : "number";
    try {
      return numberRange(this.rules, hint, { min, max, exclusiveMin: exMin, exclusiveMax: exMax, integer });
    } catch (e) {
      if (!(e instanceof EmptyRangeError)) throw e;
      const lowKey = exMin ? "exclusiveMinimum" : "minimum";
      const highKey = exMax ? "exclusiveMaximum" : "maximum";
      const bounds = [
        ...(min === undefined ? [] : [`${lowKey} ${min}`]),
        ...(max === undefined ? [] : [`${highKey} ${max}`]),
      ].join(" and ");
      // No value at all, or none a grammar writes (digits are bounded, exponents are not written).
      const lo = min === undefined
        ? -Infinity
        : integer
        ? (exMin ? Math.floor(min) + 1 : Math.ceil(min))
        : min;
      const hi = max === undefined
        ? Infinity
        : integer
        ? (exMax ? Math.ceil(max) - 1 : Math.floor(max))
        : max;
      const none = lo > hi || (!integer && lo === hi && (exMin || exMax));
      this.#fail(
        ctx,
        none
          ? `The JSON schema at ${path}: no ${type} lies within ${bounds}.`
          : `The JSON schema at ${path}: no ${type} a grammar can write lies within ${bounds} ` +
            "(numbers are written with at most 16 digits before the point and 16 after it, without exponent).",
        none ? "invalid_schema" : "unsupported_schema",
        { keyword: min === undefined ? highKey : lowKey, path },
      );
    }
  }

  #string(s: Schema, ctx: Context, path: string, hint: string): string {
    const text = this.#stringText(s, ctx, path, hint, true);
    if (text !== undefined) return this.rules.add(`${hint}-${s.format ?? "pattern"}`, `"\\"" ${text} "\\""`);
    const min = bound(s.minLength, 0);
    const max = s.maxLength === undefined ? undefined : bound(s.maxLength, 0);
    if (min === 0 && max === undefined) return "string";
    // A maximum beyond what llama.cpp can count is left to the output check.
    const chars = this.rules.repeat("char", min, max, "minLength");
    if (!chars.bounded) this.validated.add("maxLength");
    return this.rules.add(`${hint}-str`, `"\\"" ${chars.text} "\\""`);
  }

  /**
   * The inside of a string under `format` and `pattern` (with any length bounds), or undefined when
   * it has neither. Pattern, format and lengths become one automaton; when that would be too large,
   * the lengths and then the format are left to the output check (and recorded as validated).
   */
  #stringText(s: Schema, ctx: Context, path: string, hint: string, json: boolean): string | undefined {
    const min = this.#minimum(ctx, path, "minLength", bound(s.minLength, 0));
    const max = s.maxLength === undefined ? undefined : bound(s.maxLength, 0);
    if (max !== undefined && max < min) {
      this.#fail(ctx, `${path}: maxLength is below minLength.`, "invalid_schema");
    }
    const format = s.format === undefined ? undefined : String(s.format);
    if (format !== undefined && FORMATS[format] === undefined) {
      this.#fail(
        ctx,
        `The JSON schema format '${format}' at ${path} cannot be enforced (supported: ${
          Object.keys(FORMATS).join(", ")
        }).`,
      );
    }
    const pattern = s.pattern === undefined ? undefined : String(s.pattern);
    if (format === undefined && pattern === undefined) return undefined;
    const hasLengths = min > 0 || max !== undefined;
    const check = format === undefined ? [] : [FORMAT_CHECKS[format]];
    const what = pattern === undefined ? `format '${format}' with minLength/maxLength` : "pattern";
    const automaton = (patterns: string[], withLengths: boolean): string | undefined => {
      const lengths = withLengths ? { minLength: min, maxLength: max } : {};
      try {
        return patternRules(this.rules, `${hint}-re`, { patterns, ...lengths }, json);
      } catch (e) {
        if (!(e instanceof PatternError)) throw e;
        if (e.tooLarge) return undefined;
        this.#fail(ctx, `The JSON schema ${what} at ${path} cannot be enforced: ${e.message}.`);
      }
    };
    if (pattern === undefined) {
      // A format alone is its own grammar; with lengths, the check's test of it and the lengths as one automaton.
      const both = hasLengths ? automaton(check, true) : undefined;
      if (both) return both;
      if (hasLengths) this.validated.add("minLength/maxLength");
      return this.rules.add(`${hint}-${format}`, FORMATS[format!]);
    }
    const all = automaton([pattern, ...check], hasLengths);
    if (all) return all;
    // Too large an automaton: the lengths, then the format, are left to the output check.
    if (hasLengths) this.validated.add("minLength/maxLength");
    const withFormat = hasLengths && format !== undefined ? automaton([pattern, ...check], false) : undefined;
    if (withFormat) return withFormat;
    if (format !== undefined) this.validated.add("format");
    return automaton([pattern], false) ??
      this.#fail(
        ctx,
        `The JSON schema pattern at ${path} cannot be enforced: it needs too large an automaton.`,
      );
  }

  #object(s: Schema, ctx: Context, path: string, depth: number, hint: string): string {
    const props = (s.properties ?? {}) as Record<string, unknown>;
    if (typeof props !== "object" || Array.isArray(props)) {
      this.#fail(ctx, `${path}/properties must be an object.`, "invalid_schema");
    }
    const required = new Set(Array.isArray(s.required) ? s.required.map(String) : []);
    const names = Object.keys(props);
    for (const r of required) {
      if (!(r in props) && s.additionalProperties === false) {
        this.#fail(ctx, `${path}: required property '${r}' is not in properties.`, "invalid_schema");
      }
    }
    const extra = s.additionalProperties;
    const minProps = bound(s.minProperties, 0);
    const maxProps = s.maxProperties === undefined ? undefined : bound(s.maxProperties, 0);
    if (names.length === 0 && required.size === 0) {
      if (extra === false || maxProps === 0) {
        if (minProps > 0) {
          this.#fail(
            ctx,
            `${path}: no property is allowed, yet minProperties is ${minProps}.`,
            "invalid_schema",
          );
        }
        return this.rules.add(`${hint}-empty`, '"{" ws "}"');
      }
      const value = extra === undefined || extra === true
        ? "value"
        : this.#rule(extra, ctx, `${path}/additionalProperties`, depth + 1, `${hint}-extra`);
      if (value === "value" && minProps === 0 && maxProps === undefined) return "object";
      this.#minimum(ctx, path, "minProperties", minProps);
      if (maxProps !== undefined && maxProps < minProps) {
        this.#fail(ctx, `${path}: maxProperties is below minProperties.`, "invalid_schema", {
          keyword: "maxProperties",
          path,
        });
      }
      const kv = this.rules.add(`${hint}-kv`, `string ws ":" ws ${value} ws`);
      // Keys may repeat in the grammar (JSON.parse keeps the last), so maxProperties holds, while
      // minProperties over 1 needs distinct keys: that is left to the output check.
      if (minProps > 1) this.validated.add("minProperties");
      // The entries after the first, as one rule repeated (llama.cpp counts a repeated group's rules).
      const more = this.rules.repeat(
        this.rules.add(`${hint}-kvs`, `"," ws ${kv}`),
        Math.max(0, minProps - 1),
        maxProps === undefined ? undefined : maxProps - 1,
        "minProperties",
      );
      if (!more.bounded) this.validated.add("maxProperties");
      const entries = `${kv} ${more.text}`;
      const first = minProps > 0 ? entries : `${this.rules.add(`${hint}-entries`, entries)}?`;
      return this.rules.add(`${hint}-map`, `"{" ws ${first} "}"`);
    }
    // Properties in declared order: required ones always, optional ones possibly.
    const kvs = names.map((n) => {
      const value = this.#rule(props[n], ctx, `${path}/properties/${n}`, depth + 1, `${hint}-${n}`);
      return `${gbnfLiteral(jsonText(n))} ws ":" ws ${value} ws`;
    });
    for (const r of required) {
      if (!(r in props)) {
        names.push(r);
        kvs.push(`${gbnfLiteral(jsonText(r))} ws ":" ws value ws`);
      }
    }
    if (maxProps !== undefined && maxProps < required.size) {
      this.#fail(ctx, `${path}: maxProperties is below the number of required properties.`, "invalid_schema");
    }
    if (minProps > names.length) {
      // The grammar writes declared properties only: it cannot reach the count.
      this.#fail(
        ctx,
        `The JSON schema minProperties at ${path} (${minProps}) exceeds the properties it declares (${names.length}); ` +
          "declare the properties it must have.",
      );
    }
    // With min/maxProperties the rules also count the properties written so far (up to `cap`).
    const counted = minProps > required.size || (maxProps !== undefined && maxProps < names.length);
    const cap = counted ? Math.min(maxProps ?? minProps, names.length) : 0;
    if (2 * names.length * (cap + 1) > MAX_COUNTED_OBJECT_RULES) {
      this.validated.add("minProperties/maxProperties");
      return this.#declared(names, kvs, required, { min: 0, max: undefined, cap: 0 }, hint);
    }
    return this.#declared(names, kvs, required, { min: minProps, max: maxProps, cap }, hint);
  }

  /**
   * An object of the declared properties `names` (key-value rules `kvs`) in order, the required ones
   * always; `count` bounds how many appear (`cap` 0: not counted).
   */
  #declared(
    names: string[],
    kvs: string[],
    required: Set<string>,
    count: { min: number; max: number | undefined; cap: number },
    hint: string,
  ): string {
    // after[c][comma]: the rule for the properties from i on, c written so far (saturating at cap),
    // comma: whether a comma is due; "" is nothing left, undefined no way to finish.
    const counts = Array.from({ length: count.cap + 1 }, (_, c) => c);
    const done = (c: number) => count.cap === 0 || c >= count.min ? "" : undefined;
    let after: (string | undefined)[][] = counts.map((c) => [done(c), done(c)]);
    for (let i = names.length - 1; i >= 0; i--) {
      const next = after;
      after = counts.map((c) =>
        [0, 1].map((comma) => {
          const alts: string[] = [];
          const canTake = count.cap === 0 || count.max === undefined || c + 1 <= count.max;
          const rest = canTake ? next[Math.min(c + 1, count.cap)][1] : undefined;
          if (rest !== undefined) alts.push(`${comma ? '"," ws ' : ""}${kvs[i]}${rest ? ` ${rest}` : ""}`);
          const skip = required.has(names[i]) ? undefined : next[c][comma];
          if (skip !== undefined) alts.push(skip || '""');
          if (alts.length === 0) return undefined;
          return this.rules.add(`${hint}-p${i}${comma ? "c" : ""}`, alts.join(" | "));
        })
      );
    }
    const first = after[0][0];
    if (first === undefined) {
      throw new Error("unreachable: the property counts were checked against the declared properties");
    }
    return this.rules.add(`${hint}-obj`, `"{" ws ${first ? `${first} ` : ""}"}"`);
  }

  #array(s: Schema, ctx: Context, path: string, depth: number, hint: string): string {
    // The legacy tuple form (draft 4–2019): `items` as an array, `additionalItems` for the rest.
    const legacy = Array.isArray(s.items);
    const tuple = legacy ? s.items as unknown[] : Array.isArray(s.prefixItems) ? s.prefixItems : [];
    const restSchema = legacy ? (s.additionalItems ?? true) : s.items;
    const fixed = tuple.map((p, i) =>
      this.#rule(p, ctx, `${path}/prefixItems/${i}`, depth + 1, `${hint}-t${i}`)
    );
    const item = restSchema === false
      ? undefined
      : this.#rule(restSchema ?? true, ctx, `${path}/items`, depth + 1, `${hint}-item`);
    const min = this.#minimum(ctx, path, "minItems", bound(s.minItems, 0));
    let max = s.maxItems === undefined ? undefined : bound(s.maxItems, 0);
    if (!item) max = Math.min(max ?? fixed.length, fixed.length);
    if (max !== undefined && max < min) {
      this.#fail(
        ctx,
        `${path}: the array cannot have at least ${min} and at most ${max} items.`,
        "invalid_schema",
      );
    }
    // Elements after the first, `lo` to `hi` of them: one rule repeated (llama.cpp counts the rules
    // of a repeated group); a maximum beyond what llama.cpp can count is left to the output check.
    const more = (lo: number, hi: number | undefined) => {
      const r = this.rules.repeat(this.rules.add(`${hint}-more`, `"," ws ${item} ws`), lo, hi, "minItems");
      if (!r.bounded) this.validated.add("maxItems");
      return r.text;
    };
    // Elements from position i on (a comma precedes every element but the first).
    const from = (i: number): string => {
      if (max !== undefined && i >= max) return "";
      if (i >= fixed.length) {
        const lo = Math.max(0, min - i);
        const hi = max === undefined ? undefined : max - i;
        if (i > 0) return more(lo, hi);
        const list = `${item} ws ${more(Math.max(0, lo - 1), hi === undefined ? undefined : hi - 1)}`;
        return lo === 0 ? `${this.rules.add(`${hint}-list`, list)}?` : list;
      }
      const rest = from(i + 1);
      const body = `${i === 0 ? "" : '"," ws '}${fixed[i]} ws${
        rest ? ` ${this.rules.add(`${hint}-at${i + 1}`, rest)}` : ""
      }`;
      return i < min ? body : `( ${body} )?`;
    };
    const body = from(0);
    return this.rules.add(`${hint}-arr`, `"[" ws ${body ? `${body} ` : ""}"]"`);
  }

  /** `allOf` merged into one schema (a conjunction of objects, types, bounds); refused when it cannot be. */
  #mergeAllOf(s: Schema, ctx: Context, path: string): Schema {
    if (!Array.isArray(s.allOf) || s.allOf.length === 0) {
      this.#fail(ctx, `${path}/allOf must be a non-empty array.`, "invalid_schema");
    }
    let merged: Schema | undefined = omit(s, ["allOf"]);
    for (const [i, part] of s.allOf.entries()) {
      let p = part;
      if (isObject(p) && typeof (p as Schema).$ref === "string") {
        p = {
          ...this.#resolve(String((p as Schema).$ref), ctx, `${path}/allOf/${i}`),
          ...omit(p as Schema, ["$ref"]),
        };
      }
      if (isObject(p) && (p as Schema).allOf !== undefined) {
        p = this.#mergeAllOf(p as Schema, ctx, `${path}/allOf/${i}`);
      }
      merged = isObject(p) ? mergeSchemas(merged, p as Schema, this.#budget) : undefined;
      if (!merged) {
        this.#fail(
          ctx,
          `The JSON schema allOf at ${path} cannot be merged into one schema (part ${i} conflicts).`,
        );
      }
    }
    return merged;
  }

  /** `schema` with its $refs (a chain of them) and allOf merged in: what its keywords say at its top. */
  #resolved(schema: unknown, ctx: Context, path: string): unknown {
    let s = schema;
    for (let hops = 0; isObject(s) && typeof (s as Schema).$ref === "string" && hops < 32; hops++) {
      s = { ...this.#resolve(String((s as Schema).$ref), ctx, path), ...omit(s as Schema, ["$ref"]) };
    }
    if (isObject(s) && (s as Schema).allOf !== undefined) return this.#mergeAllOf(s as Schema, ctx, path);
    return s;
  }

  #resolve(ref: string, ctx: Context, path: string): Schema {
    this.#budget.charge(COSTS.ref);
    if (ref !== "#" && !ref.startsWith("#/")) {
      this.#fail(
        ctx,
        `The JSON schema $ref '${
          ref.slice(0, 200)
        }' at ${path} is not a local reference ('#' or '#/…', e.g. '#/$defs/Name').`,
      );
    }
    const target = resolvePointer(ctx.root, ref);
    if (!isObject(target)) {
      this.#fail(
        ctx,
        `The JSON schema $ref '${ref.slice(0, 200)}' at ${path} points nowhere.`,
        "invalid_schema",
      );
    }
    return target as Schema;
  }

  #ref(ref: string, ctx: Context, path: string, depth: number): string {
    const known = ctx.refs.get(ref);
    if (known) return known;
    const target = this.#resolve(ref, ctx, path);
    const rule = this.rules.reserve(`${ctx.hint}-ref-${ref.split("/").pop()}`);
    ctx.refs.set(ref, rule);
    this.rules.define(rule, this.#rule(target, ctx, ref, depth + 1, `${ctx.hint}-${ref.split("/").pop()}`));
    return rule;
  }
}

/** Most rules for the multiples of an integer step between bounds (digits × step). */
const MAX_MULTIPLE_RULES = 4000;
/** Integers the `integer` rule can write: at most 16 digits. */
const INTEGER_LIMIT = 10n ** 16n - 1n;

/**
 * A rule for the integers within [lo, hi] (either side open: as many digits as `integer` allows)
 * that are multiples of `k`, digit by digit: a state is the position, whether the digits so far
 * equal a bound's, and the remainder mod k. Undefined when it would need over MAX_MULTIPLE_RULES
 * rules; null when no such integer exists.
 *
 * @example
 * ```ts
 * import { GbnfRules } from "./gbnf.ts";
 * const rules = new GbnfRules("");
 * multiplesBetween(rules, "qty", 5, 0, 100); // 0, 5, …, 100
 * ```
 */
export function multiplesBetween(
  rules: GbnfRules,
  hint: string,
  k: number,
  lo: number | undefined,
  hi: number | undefined,
): string | null | undefined {
  const clamp = (x: bigint) => x > INTEGER_LIMIT ? INTEGER_LIMIT : x < -INTEGER_LIMIT ? -INTEGER_LIMIT : x;
  const low = lo === undefined ? -INTEGER_LIMIT : clamp(BigInt(lo));
  const high = hi === undefined ? INTEGER_LIMIT : clamp(BigInt(hi));
  if (low > high) return null;
  // Magnitude ranges: the negative part (written after "-") and the rest.
  const parts: { sign: string; from: bigint; to: bigint }[] = [];
  if (low < 0n) parts.push({ sign: '"-" ', from: high < 0n ? -high : 1n, to: -low });
  if (high >= 0n) parts.push({ sign: "", from: low > 0n ? low : 0n, to: high });
  const digits = Math.max(...parts.map((p) => p.to.toString().length));
  if (digits * k > MAX_MULTIPLE_RULES) return undefined;
  const cls = (ds: number[]) =>
    ds.length === 1
      ? `"${ds[0]}"`
      : ds.every((d, i) => i === 0 || d === ds[i - 1] + 1)
      ? `[${ds[0]}-${ds.at(-1)}]`
      : `[${ds.join("")}]`;
  /** Alternatives "digits then rest", grouped by rest ("" = the end); undefined when there are none. */
  const alternatives = (choices: [number, string | undefined][]): string | undefined => {
    const byNext = new Map<string, number[]>();
    for (const [d, next] of choices) {
      if (next !== undefined) byNext.set(next, [...(byNext.get(next) ?? []), d]);
    }
    if (byNext.size === 0) return undefined;
    return rules.add(
      `${hint}-d`,
      [...byNext].map(([next, ds]) => `${cls(ds)}${next ? ` ${next}` : ""}`).join(" | "),
    );
  };
  // free(d, r): any d digits after a prefix of remainder r that end on a multiple.
  const freeMemo = new Map<string, string | undefined>();
  const free = (d: number, r: number): string | undefined => {
    if (d === 0) return r === 0 ? "" : undefined;
    const key = `${d},${r}`;
    if (!freeMemo.has(key)) {
      freeMemo.set(
        key,
        alternatives(Array.from({ length: 10 }, (_, dg) => [dg, free(d - 1, (10 * r + dg) % k)])),
      );
    }
    return freeMemo.get(key);
  };
  // Digits i.. of an n-digit magnitude between loS and hiS (n digits each), tight to either bound.
  const tight = (
    loS: string,
    hiS: string,
    i: number,
    tl: boolean,
    th: boolean,
    r: number,
  ): string | undefined => {
    if (i === loS.length) return r === 0 ? "" : undefined;
    if (!tl && !th) return free(loS.length - i, r);
    const from = tl ? Number(loS[i]) : 0;
    const to = th ? Number(hiS[i]) : 9;
    const choices: [number, string | undefined][] = [];
    for (let d = from; d <= to; d++) {
      choices.push([
        d,
        tight(loS, hiS, i + 1, tl && d === Number(loS[i]), th && d === Number(hiS[i]), (10 * r + d) % k),
      ]);
    }
    return alternatives(choices);
  };
  const alts: string[] = [];
  for (const p of parts) {
    const bodies: string[] = [];
    const minLen = p.from.toString().length;
    const maxLen = p.to.toString().length;
    for (let n = minLen; n <= maxLen; n++) {
      const loS = n === minLen ? p.from.toString() : `1${"0".repeat(n - 1)}`;
      const hiS = n === maxLen ? p.to.toString() : "9".repeat(n);
      const body = tight(loS, hiS, 0, true, true, 0);
      if (body !== undefined) bodies.push(body || '""');
    }
    if (bodies.length > 0) {
      alts.push(`${p.sign}${bodies.length === 1 ? bodies[0] : `( ${bodies.join(" | ")} )`}`);
    }
  }
  return alts.length === 0 ? null : rules.add(`${hint}-range`, alts.join(" | "));
}

/** Runs `build`; a {@link GrammarError} it throws without a param gets `param`. */
function named<T>(param: string, build: () => T): T {
  try {
    return build();
  } catch (e) {
    throw e instanceof GrammarError ? e.withParam(param) : e;
  }
}

interface Context {
  root: unknown;
  param: string;
  refs: Map<string, string>;
  hint: string;
}

function isObject(v: unknown): boolean {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function omit(s: Schema, keys: Iterable<string>): Schema {
  const drop = new Set(keys);
  return Object.fromEntries(Object.entries(s).filter(([k]) => !drop.has(k)));
}

function bound(v: unknown, fallback: number): number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : fallback;
}

/** Types implied by the keywords of a schema without `type`. */
function inferTypes(s: Schema): string[] {
  if (s.properties !== undefined || s.additionalProperties !== undefined || s.required !== undefined) {
    return ["object"];
  }
  if (
    s.items !== undefined || s.prefixItems !== undefined || s.minItems !== undefined ||
    s.maxItems !== undefined
  ) {
    return ["array"];
  }
  if (
    s.minLength !== undefined || s.maxLength !== undefined || s.format !== undefined ||
    s.pattern !== undefined
  ) {
    return ["string"];
  }
  if (
    ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"].some((k) =>
      s[k] !== undefined
    )
  ) {
    return ["number"];
  }
  return ["any"];
}

/**
 * Schemas compiled once when the server starts ({@link warmUpGrammar}): a compile's first run is V8's
 * unoptimised code, 2-3 times slower, and a fresh server's first request of an `allOf` of 1,000
 * objects (refused by the budget) held `/health` 40-61 ms where a warm one holds it 20-36; after a
 * compile of these, 40-43.
 */
const WARM_UP: readonly unknown[] = [
  {
    allOf: Array.from(
      { length: 150 },
      (_, i) => ({ type: "object", properties: { [`w${i}`]: { type: "integer" } } }),
    ),
  },
  {
    type: "object",
    properties: {
      e: { enum: Array.from({ length: 200 }, (_, i) => `value-${i}`) },
      s: { type: "string", maxLength: 20 },
      a: {
        type: "array",
        items: { anyOf: [{ type: "number", minimum: 0 }, { $ref: "#/$defs/b" }] },
        maxItems: 5,
      },
    },
    required: ["e", "a"],
    $defs: { b: { type: ["boolean", "null"] } },
  },
];

/**
 * Compiles {@link WARM_UP} twice, a schema a turn of the event loop, so that the first request with a
 * schema runs code V8 has already seen.
 *
 * @example
 * ```ts
 * await warmUpGrammar();
 * ```
 */
export async function warmUpGrammar(): Promise<void> {
  for (let round = 0; round < 2; round++) {
    for (const schema of WARM_UP) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      new JsonGrammar().schema(schema, "warm_up", "w");
    }
  }
}

/**
 * A constant's JSON text as the grammar writes it: `JSON.stringify`'s, with every `</` written `<\\/`
 * (the same value), so that a constant never spells a closing tag (`</tool_call>`) that the output's
 * parser would take for the end of a tool call.
 */
function jsonText(v: unknown): string {
  return JSON.stringify(v).replaceAll("</", "<\\/");
}

/**
 * Text that raw (unescaped) output cannot hold: U+0000, which llama.cpp reads as the end of a token's
 * text, and a lone surrogate, which UTF-8 cannot encode.
 */
// deno-lint-ignore no-control-regex
const UNWRITABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Whether `v` fits the schema's `type` (enum entries of other types can never be valid). */
function typeAllows(s: Schema, v: unknown): boolean {
  if (s.type === undefined) return true;
  const types = Array.isArray(s.type) ? s.type : [s.type];
  const t = v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
  return types.some((x) =>
    x === t || (x === "integer" && typeof v === "number" && Number.isInteger(v)) ||
    (x === "number" && typeof v === "number")
  );
}

/**
 * Whether no value the grammar writes for one alternative of a oneOf can satisfy another: every
 * alternative is an object that requires one property (the same in all) whose `const` (or `enum`)
 * values are disjoint from the others'. `resolve` looks through a property schema's $refs.
 */
function disjoint(alternatives: unknown[], resolve: (s: unknown, path: string) => unknown): boolean {
  if (alternatives.length === 1) return true;
  const tags = alternatives.map((a, i) => {
    if (!isObject(a)) return undefined;
    const s = a as Schema;
    const objectOnly = (s.type === undefined ? inferTypes(s) : [s.type].flat()).join() === "object" &&
      s.nullable !== true && s.const === undefined && s.enum === undefined;
    if (!objectOnly || !isObject(s.properties) || !Array.isArray(s.required)) return undefined;
    const required = s.required.map(String);
    const values = new Map<string, Set<string>>();
    for (const [k, p] of Object.entries(s.properties as Schema)) {
      if (!required.includes(k)) continue;
      const r = resolve(p, `#/oneOf/${i}/properties/${k}`);
      if (!isObject(r)) continue;
      const ps = r as Schema;
      const vs = ps.const !== undefined ? [ps.const] : Array.isArray(ps.enum) ? ps.enum : undefined;
      if (vs) values.set(k, new Set(vs.map((v) => JSON.stringify(v))));
    }
    return values;
  });
  if (tags.some((t) => t === undefined)) return false;
  const all = tags as Map<string, Set<string>>[];
  return [...all[0].keys()].some((k) => {
    if (!all.every((t) => t.has(k))) return false;
    const seen = new Set<string>();
    for (const t of all) {
      for (const v of t.get(k)!) {
        if (seen.has(v)) return false;
        seen.add(v);
      }
    }
    return true;
  });
}

/**
 * Two schemas as one whose instances satisfy both, or undefined when that is not expressible here
 * (e.g. two different `const` values, or keywords with different values this merge cannot combine).
 */
export function mergeSchemas(a: Schema, b: Schema, budget?: Budget): Schema | undefined {
  budget?.charge((Object.keys(a).length + Object.keys(b).length) * COSTS.mergeKey);
  const out: Schema = { ...a };
  for (const [k, v] of Object.entries(b)) {
    if (!(k in out) || ANNOTATIONS.has(k)) {
      out[k] = v;
      continue;
    }
    const w = out[k];
    const [tw, tv] = [JSON.stringify(w), JSON.stringify(v)];
    budget?.charge(((tw?.length ?? 0) + (tv?.length ?? 0)) * COSTS.char);
    if (tw === tv) continue;
    switch (k) {
      case "properties": {
        const props = { ...(w as Schema) };
        for (const [name, ps] of Object.entries(v as Schema)) {
          if (!(name in props)) props[name] = ps;
          else {
            const m = isObject(props[name]) && isObject(ps)
              ? mergeSchemas(props[name] as Schema, ps as Schema, budget)
              : undefined;
            if (!m) return undefined;
            props[name] = m;
          }
        }
        out.properties = props;
        break;
      }
      case "required":
        out.required = [...new Set([...(w as string[]), ...(v as string[])])];
        break;
      case "type": {
        const ta = Array.isArray(w) ? w : [w];
        const tb = Array.isArray(v) ? v : [v];
        const both = ta.filter((t) => tb.includes(t) || (t === "integer" && tb.includes("number")))
          .concat(tb.filter((t) => t === "integer" && ta.includes("number")));
        if (both.length === 0) return undefined;
        out.type = both.length === 1 ? both[0] : [...new Set(both)];
        break;
      }
      case "minimum":
      case "exclusiveMinimum":
      case "minLength":
      case "minItems":
      case "minProperties":
        out[k] = Math.max(w as number, v as number);
        break;
      case "maximum":
      case "exclusiveMaximum":
      case "maxLength":
      case "maxItems":
      case "maxProperties":
        out[k] = Math.min(w as number, v as number);
        break;
      case "additionalProperties":
        if (w === false || v === false) out.additionalProperties = false;
        else return undefined;
        break;
      case "enum": {
        const vs = (v as unknown[]).map((x) => JSON.stringify(x));
        const common = (w as unknown[]).filter((x) => vs.includes(JSON.stringify(x)));
        if (common.length === 0) return undefined;
        out.enum = common;
        break;
      }
      default:
        return undefined;
    }
  }
  return out;
}

/** Whether every JSON value meets `schema` (`true`, or an object of annotations only, such as `{}`). */
function acceptsEverything(schema: unknown): boolean {
  if (schema === true) return true;
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return false;
  return Object.keys(schema).every((k) => ANNOTATIONS.has(k));
}
