/**
 * JSON Schema → GBNF: a grammar whose every output is JSON that validates against the schema.
 * Each keyword takes one of two ways, and no keyword is ever silently ignored:
 * - **grammar**: enforced while generating (see {@link GRAMMAR_KEYWORDS});
 * - **validated**: no grammar can express it (e.g. `uniqueItems`, `not`), so the grammar enforces the
 *   rest and the finished output is checked against the whole schema ({@link VALIDATED_KEYWORDS}).
 * Anything else is refused (an {@link EngineInputError} naming the keyword and where it is).
 */
import { EngineInputError } from "../types.ts";
import { gbnfClass, gbnfLiteral, GbnfRules } from "./gbnf.ts";
import { multipleOfInteger, numberRange } from "./json_ranges.ts";
import { PatternError, patternRules } from "./regex_gbnf.ts";

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

/** Limits that keep grammar building cheap whatever the client sends. */
export interface SchemaLimits {
  maxDepth: number;
  maxRules: number;
}

const DEFAULT_LIMITS: SchemaLimits = { maxDepth: 64, maxRules: 20_000 };

type Schema = Record<string, unknown>;

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

  constructor(rules = new GbnfRules(), limits: SchemaLimits = DEFAULT_LIMITS) {
    this.rules = rules;
    this.#limits = limits;
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
    return this.#rule(schema, ctx, "#", 0, hint);
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

  #fail(ctx: Context, message: string, code = "unsupported_schema"): never {
    throw new EngineInputError(message, ctx.param, code);
  }

  #rule(schema: unknown, ctx: Context, path: string, depth: number, hint: string): string {
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
    if (s.const !== undefined) return this.rules.add(`${hint}-const`, gbnfLiteral(JSON.stringify(s.const)));
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
      return this.rules.add(`${hint}-enum`, values.map((v) => gbnfLiteral(JSON.stringify(v))).join(" | "));
    }
    const alternatives = s.oneOf ?? s.anyOf;
    if (alternatives !== undefined) {
      const key = s.oneOf !== undefined ? "oneOf" : "anyOf";
      if (!Array.isArray(alternatives) || alternatives.length === 0) {
        this.#fail(ctx, `${path}/${key} must be a non-empty array.`, "invalid_schema");
      }
      // oneOf is enforced as anyOf; overlapping alternatives then need the output check.
      if (key === "oneOf" && !disjoint(alternatives)) this.validated.add("oneOf");
      // Sibling keywords (e.g. a shared `type`) apply to every alternative.
      const rest = omit(s, [key, "$defs", "definitions", ...ANNOTATIONS]);
      const alts = alternatives.map((a, i) =>
        this.#rule(
          Object.keys(rest).length > 0 && isObject(a) ? mergeSchemas(rest, a as Schema) ?? a : a,
          ctx,
          `${path}/${key}/${i}`,
          depth + 1,
          `${hint}-${i}`,
        )
      );
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
   * A rule for a string's raw text (no quotes, no JSON escapes) under a string schema: enum,
   * const, format, pattern, length bounds; `other` is the rule for free text. For the XML dialect.
   */
  rawString(schema: Schema, param: string, hint: string, other: () => string): string {
    this.#ensurePrimitives();
    const ctx: Context = { root: schema, param, refs: new Map(), hint };
    const strings = (schema.enum ?? (schema.const !== undefined ? [schema.const] : undefined)) as
      | unknown[]
      | undefined;
    if (strings) return this.rules.add(`${hint}-raw`, strings.map((v) => gbnfLiteral(String(v))).join(" | "));
    if (schema.format !== undefined && FORMATS[String(schema.format)] === undefined) {
      this.#fail(ctx, `The JSON schema format '${schema.format}' cannot be enforced.`);
    }
    if (schema.format !== undefined && schema.pattern === undefined) {
      return this.rules.add(`${hint}-rawfmt`, FORMATS[String(schema.format)]);
    }
    if (schema.pattern !== undefined) {
      if (schema.format !== undefined) this.validated.add("format");
      try {
        return patternRules(this.rules, `${hint}-rawre`, String(schema.pattern), false);
      } catch (e) {
        if (!(e instanceof PatternError)) throw e;
        this.#fail(ctx, `The JSON schema pattern cannot be enforced: ${e.message}.`);
      }
    }
    const min = bound(schema.minLength, 0);
    const max = schema.maxLength === undefined ? undefined : bound(schema.maxLength, 0);
    if (min === 0 && max === undefined) return other();
    // Bounded raw text: characters other than '<' keep it clear of the closing tag.
    return this.rules.add(`${hint}-raw`, `[^<]{${min},${max ?? ""}}`);
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
    if (multiple !== undefined) {
      const exact = Number.isInteger(multiple) && multiple <= 1000 && min === undefined && max === undefined;
      if (exact) return multipleOfInteger(this.rules, `${hint}-mul`, multiple);
      // With bounds, or a fractional step: the range (or type) in the grammar, the rest checked.
      this.validated.add("multipleOf");
    }
    if (min === undefined && max === undefined) return integer ? "integer" : "number";
    try {
      return numberRange(this.rules, hint, { min, max, exclusiveMin: exMin, exclusiveMax: exMax, integer });
    } catch {
      this.#fail(ctx, `${path}: no ${type} lies within its minimum and maximum.`, "invalid_schema");
    }
  }

  #string(s: Schema, ctx: Context, path: string, hint: string): string {
    const min = bound(s.minLength, 0);
    const max = s.maxLength === undefined ? undefined : bound(s.maxLength, 0);
    if (max !== undefined && max < min) {
      this.#fail(ctx, `${path}: maxLength is below minLength.`, "invalid_schema");
    }
    const lengthBound = min > 0 || max !== undefined;
    if (s.format !== undefined && FORMATS[String(s.format)] === undefined) {
      this.#fail(
        ctx,
        `The JSON schema format '${s.format}' at ${path} cannot be enforced (supported: ${
          Object.keys(FORMATS).join(", ")
        }).`,
      );
    }
    if (s.format !== undefined || s.pattern !== undefined) {
      // With both, the grammar takes the pattern (schema libraries write it as the stricter form,
      // e.g. zod's UUID versions) and the output check the format.
      let body: string;
      if (s.pattern === undefined) body = FORMATS[String(s.format)];
      else {
        try {
          body = patternRules(this.rules, `${hint}-re`, String(s.pattern));
        } catch (e) {
          if (!(e instanceof PatternError)) throw e;
          this.#fail(ctx, `The JSON schema pattern at ${path} cannot be enforced: ${e.message}.`);
        }
        if (s.format !== undefined) this.validated.add("format");
      }
      if (lengthBound) this.validated.add("minLength/maxLength");
      return this.rules.add(`${hint}-${s.format ?? "pattern"}`, `"\\"" ${body} "\\""`);
    }
    if (!lengthBound) return "string";
    return this.rules.add(`${hint}-str`, `"\\"" char{${min},${max ?? ""}} "\\""`);
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
      const kv = `string ws ":" ws ${value} ws`;
      // Keys may repeat in the grammar; distinct keys are left to the output check when counted.
      if (minProps > 0 || maxProps !== undefined) this.validated.add("minProperties/maxProperties");
      const first = minProps > 0
        ? `${kv} ( "," ws ${kv} ){${minProps - 1},${maxProps === undefined ? "" : maxProps - 1}}`
        : `( ${kv} ( "," ws ${kv} ){0,${maxProps === undefined ? "" : maxProps - 1}} )?`;
      return this.rules.add(`${hint}-map`, `"{" ws ${first} "}"`);
    }
    if (minProps > required.size || (maxProps !== undefined && maxProps < names.length)) {
      // With declared properties the grammar decides which ones appear; counts are checked after.
      this.validated.add("minProperties/maxProperties");
    }
    // Properties in declared order: required ones always, optional ones possibly.
    const kvs = names.map((n) => {
      const value = this.#rule(props[n], ctx, `${path}/properties/${n}`, depth + 1, `${hint}-${n}`);
      return `${gbnfLiteral(JSON.stringify(n))} ws ":" ws ${value} ws`;
    });
    for (const r of required) {
      if (!(r in props)) {
        names.push(r);
        kvs.push(`${gbnfLiteral(JSON.stringify(r))} ws ":" ws value ws`);
      }
    }
    // next[0]: the rest when no comma is due yet; next[1]: when one is ("" = nothing left).
    let next: [string, string] = ["", ""];
    for (let i = names.length - 1; i >= 0; i--) {
      const kv = kvs[i];
      const either = (take: string, skip: string) => skip ? `( ${take} | ${skip} )` : `( ${take} )?`;
      const first = required.has(names[i]) ? `${kv} ${next[1]}` : either(`${kv} ${next[1]}`, next[0]);
      const later = required.has(names[i])
        ? `"," ws ${kv} ${next[1]}`
        : either(`"," ws ${kv} ${next[1]}`, next[1]);
      next = [this.rules.add(`${hint}-p${i}`, first.trim()), this.rules.add(`${hint}-p${i}c`, later.trim())];
    }
    return this.rules.add(`${hint}-obj`, `"{" ws ${next[0]} "}"`);
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
    const min = bound(s.minItems, 0);
    let max = s.maxItems === undefined ? undefined : bound(s.maxItems, 0);
    if (!item) max = Math.min(max ?? fixed.length, fixed.length);
    if (max !== undefined && max < min) {
      this.#fail(
        ctx,
        `${path}: the array cannot have at least ${min} and at most ${max} items.`,
        "invalid_schema",
      );
    }
    const range = (lo: number, hi: number | undefined) => `{${lo},${hi === undefined ? "" : hi}}`;
    // Elements from position i on (a comma precedes every element but the first).
    const from = (i: number): string => {
      if (max !== undefined && i >= max) return "";
      if (i >= fixed.length) {
        const lo = Math.max(0, min - i);
        const hi = max === undefined ? undefined : max - i;
        if (i === 0) {
          return lo === 0
            ? `( ${item} ws ( "," ws ${item} ws )${range(0, hi === undefined ? undefined : hi - 1)} )?`
            : `${item} ws ( "," ws ${item} ws )${range(lo - 1, hi === undefined ? undefined : hi - 1)}`;
        }
        return `( "," ws ${item} ws )${range(lo, hi)}`;
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
      merged = isObject(p) ? mergeSchemas(merged, p as Schema) : undefined;
      if (!merged) {
        this.#fail(
          ctx,
          `The JSON schema allOf at ${path} cannot be merged into one schema (part ${i} conflicts).`,
        );
      }
    }
    return merged;
  }

  #resolve(ref: string, ctx: Context, path: string): Schema {
    const m = ref.match(/^#\/(\$defs|definitions)\/(.+)$/);
    if (!m) this.#fail(ctx, `The JSON schema $ref '${ref}' at ${path} is not a local '#/$defs/…' reference.`);
    const defs = (ctx.root as Schema)?.[m[1]] as Record<string, unknown> | undefined;
    const name = decodeURIComponent(m[2].replaceAll("~1", "/").replaceAll("~0", "~"));
    if (!defs || !(name in defs) || !isObject(defs[name])) {
      this.#fail(ctx, `The JSON schema $ref '${ref}' at ${path} points nowhere.`, "invalid_schema");
    }
    return defs[name] as Schema;
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

/** Whether the alternatives of a oneOf cannot overlap: each fixes one property to a different const. */
function disjoint(alternatives: unknown[]): boolean {
  const keys = alternatives.map((a) => {
    const props = isObject(a) ? (a as Schema).properties as Record<string, Schema> | undefined : undefined;
    return Object.entries(props ?? {}).filter(([, p]) =>
      isObject(p) && (p.const !== undefined ||
        (Array.isArray(p.enum) && p.enum.length === 1))
    )
      .map(([k, p]) => [k, JSON.stringify(p.const ?? (p.enum as unknown[])[0])] as const);
  });
  const common = keys[0]?.map(([k]) => k).filter((k) => keys.every((ks) => ks.some(([x]) => x === k))) ?? [];
  return common.some((k) => {
    const values = keys.map((ks) => ks.find(([x]) => x === k)![1]);
    return new Set(values).size === values.length;
  });
}

/**
 * Two schemas as one whose instances satisfy both, or undefined when that is not expressible here
 * (e.g. two different `const` values, or keywords with different values this merge cannot combine).
 */
export function mergeSchemas(a: Schema, b: Schema): Schema | undefined {
  const out: Schema = { ...a };
  for (const [k, v] of Object.entries(b)) {
    if (!(k in out) || ANNOTATIONS.has(k)) {
      out[k] = v;
      continue;
    }
    const w = out[k];
    if (JSON.stringify(w) === JSON.stringify(v)) continue;
    switch (k) {
      case "properties": {
        const props = { ...(w as Schema) };
        for (const [name, ps] of Object.entries(v as Schema)) {
          if (!(name in props)) props[name] = ps;
          else {
            const m = isObject(props[name]) && isObject(ps)
              ? mergeSchemas(props[name] as Schema, ps as Schema)
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

/** Re-exported for callers that quote plain literals next to JSON rules. */
export { gbnfClass, gbnfLiteral };
