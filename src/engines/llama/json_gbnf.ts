/**
 * JSON Schema → GBNF: a grammar whose every output is JSON that validates against the schema.
 * Keywords the grammar cannot enforce are refused (an {@link EngineInputError} naming the keyword
 * and where it is), never silently ignored; annotations are skipped.
 */
import { EngineInputError } from "../types.ts";
import { gbnfClass, gbnfLiteral, GbnfRules } from "./gbnf.ts";

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
  "strict",
  "discriminator",
  "nullable",
]);

/** Keywords enforced by the grammar. */
export const SUPPORTED_KEYWORDS: readonly string[] = [
  "type",
  "const",
  "enum",
  "oneOf",
  "anyOf",
  "$defs",
  "definitions",
  "$ref",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "format",
];

const FORMATS: Record<string, string> = {
  date: `"\\"" date "\\""`,
  time: `"\\"" time "\\""`,
  "date-time": `"\\"" date "T" time "\\""`,
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
 * its own rule names).
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
      if (!ANNOTATIONS.has(key) && !SUPPORTED_KEYWORDS.includes(key)) {
        this.#fail(
          ctx,
          `The JSON schema keyword '${key}' at ${path} cannot be enforced by the grammar; remove it ` +
            `(supported: ${SUPPORTED_KEYWORDS.join(", ")}).`,
        );
      }
    }
    if (s.$ref !== undefined) return this.#ref(String(s.$ref), ctx, path, depth);
    if (s.const !== undefined) return this.rules.add(`${hint}-const`, gbnfLiteral(JSON.stringify(s.const)));
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        this.#fail(ctx, `${path}/enum must be a non-empty array.`, "invalid_schema");
      }
      return this.rules.add(`${hint}-enum`, s.enum.map((v) => gbnfLiteral(JSON.stringify(v))).join(" | "));
    }
    const alternatives = s.oneOf ?? s.anyOf;
    if (alternatives !== undefined) {
      const key = s.oneOf !== undefined ? "oneOf" : "anyOf";
      if (!Array.isArray(alternatives) || alternatives.length === 0) {
        this.#fail(ctx, `${path}/${key} must be a non-empty array.`, "invalid_schema");
      }
      // Sibling keywords (e.g. a shared `type`) apply to every alternative.
      const rest = Object.fromEntries(
        Object.entries(s).filter(([k]) => k !== key && k !== "$defs" && k !== "definitions"),
      );
      const alts = alternatives.map((a, i) =>
        this.#rule(
          Object.keys(rest).length > 0 && typeof a === "object" && a !== null ? { ...rest, ...a } : a,
          ctx,
          `${path}/${key}/${i}`,
          depth + 1,
          `${hint}-${i}`,
        )
      );
      return this.rules.add(`${hint}-alt`, alts.join(" | "));
    }
    const types = s.type === undefined
      ? inferTypes(s)
      : Array.isArray(s.type)
      ? s.type.map(String)
      : [String(s.type)];
    const alts = types.map((t) => this.#typed(t, s, ctx, path, depth, hint));
    return alts.length === 1 ? alts[0] : this.rules.add(`${hint}-types`, alts.join(" | "));
  }

  #typed(type: string, s: Schema, ctx: Context, path: string, depth: number, hint: string): string {
    switch (type) {
      case "string":
        return this.#string(s, ctx, path, hint);
      case "integer":
      case "number":
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

  #string(s: Schema, ctx: Context, path: string, hint: string): string {
    if (s.format !== undefined) {
      const f = FORMATS[String(s.format)];
      if (!f) {
        this.#fail(
          ctx,
          `The JSON schema format '${s.format}' at ${path} cannot be enforced (supported: ${
            Object.keys(FORMATS).join(", ")
          }).`,
        );
      }
      return this.rules.add(`${hint}-${s.format}`, f);
    }
    const min = bound(s.minLength, 0);
    const max = s.maxLength === undefined ? undefined : bound(s.maxLength, 0);
    if (min === 0 && max === undefined) return "string";
    if (max !== undefined && max < min) {
      this.#fail(ctx, `${path}: maxLength is below minLength.`, "invalid_schema");
    }
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
    if (names.length === 0 && required.size === 0) {
      if (extra === false) return this.rules.add(`${hint}-empty`, '"{" ws "}"');
      const value = extra === undefined || extra === true
        ? "value"
        : this.#rule(extra, ctx, `${path}/additionalProperties`, depth + 1, `${hint}-extra`);
      if (value === "value") return "object";
      const kv = `string ws ":" ws ${value} ws`;
      return this.rules.add(`${hint}-map`, `"{" ws ( ${kv} ( "," ws ${kv} )* )? "}"`);
    }
    // Properties in declared order: required ones always, optional ones possibly. Rule i.c covers
    // properties i.. where c says whether a comma must precede the next one.
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
    const fixed = (Array.isArray(s.prefixItems) ? s.prefixItems : [])
      .map((p, i) => this.#rule(p, ctx, `${path}/prefixItems/${i}`, depth + 1, `${hint}-t${i}`));
    const item = s.items === false
      ? undefined
      : this.#rule(s.items ?? true, ctx, `${path}/items`, depth + 1, `${hint}-item`);
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

  #ref(ref: string, ctx: Context, path: string, depth: number): string {
    const known = ctx.refs.get(ref);
    if (known) return known;
    const m = ref.match(/^#\/(\$defs|definitions)\/(.+)$/);
    if (!m) this.#fail(ctx, `The JSON schema $ref '${ref}' at ${path} is not a local '#/$defs/…' reference.`);
    const defs = (ctx.root as Schema)?.[m[1]] as Record<string, unknown> | undefined;
    const name = decodeURIComponent(m[2].replaceAll("~1", "/").replaceAll("~0", "~"));
    if (!defs || !(name in defs)) {
      this.#fail(ctx, `The JSON schema $ref '${ref}' at ${path} points nowhere.`, "invalid_schema");
    }
    const rule = this.rules.reserve(`${ctx.hint}-ref-${name}`);
    ctx.refs.set(ref, rule);
    this.rules.define(rule, this.#rule(defs[name], ctx, ref, depth + 1, `${ctx.hint}-${name}`));
    return rule;
  }
}

interface Context {
  root: unknown;
  param: string;
  refs: Map<string, string>;
  hint: string;
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
  if (s.minLength !== undefined || s.maxLength !== undefined || s.format !== undefined) return ["string"];
  return ["any"];
}

/** Re-exported for callers that quote plain literals next to JSON rules. */
export { gbnfClass, gbnfLiteral };
