/**
 * Measures a JSON schema before anything compiles or validates with it: the work of checking one
 * value against each of its subschemas with the in-place applicators (`$ref`, `allOf`, `anyOf`,
 * `oneOf`, `not`, `if`/`then`/`else`, `dependentSchemas`) expanded, which is what a validator does
 * and what grows exponentially when each level refers twice to the level below. Loops made of
 * in-place applicators alone (a `$ref` to itself, `a → b → a`, an `allOf` containing its own
 * schema) never reach a value's parts: they are refused. Recursion through `properties`, `items`
 * and the like (lists, trees) is fine: each level is a level of the value.
 *
 * Iterative and linear in the schema's size (each subschema is measured once), so it is safe on
 * any input.
 */
import { Budget, COSTS } from "./budget.ts";
import { GrammarError } from "./errors.ts";

/** Keywords whose subschemas apply to the same value (a loop through them alone never ends). */
const IN_PLACE_LISTS = ["allOf", "anyOf", "oneOf"];
const IN_PLACE_ONE = ["not", "if", "then", "else"];
const IN_PLACE_MAPS = ["dependentSchemas", "dependencies"];
/** Keywords whose subschemas apply to parts of the value (properties, items, keys). */
const PART_LISTS = ["prefixItems"];
const PART_ONE = [
  "additionalProperties",
  "additionalItems",
  "contains",
  "propertyNames",
  "unevaluatedProperties",
  "unevaluatedItems",
];
const PART_MAPS = ["properties", "patternProperties"];

type Schema = Record<string, unknown>;

/** One edge from a schema to a subschema: the keyword and the subschema's JSON pointer. */
interface Edge {
  keyword: string;
  target: unknown;
  path: string;
}

/** What {@link measureSchema} found. */
export interface SchemaMeasure {
  /** Distinct subschemas reachable from the root (through every keyword and `$ref`). */
  nodes: number;
  /** The largest work of checking one value against one subschema, in-place applicators expanded. */
  maxExpanded: number;
  /** That work summed over every subschema (what `budget` was charged, over {@link COSTS.expandedNode}). */
  totalExpanded: number;
}

/**
 * Measures `schema` against `budget` (charging {@link COSTS.expandedNode} per subschema visit with
 * in-place applicators expanded). Throws a `GrammarError`: `invalid_schema` for a loop of in-place
 * applicators, `schema_too_large` past the budget; `param` names the schema in errors. Only local
 * references are followed (`#`, `#/…`): the grammar refuses others, and `$dynamicRef`.
 *
 * @example
 * ```ts
 * try {
 *   measureSchema({ $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" }, "response_format");
 * } catch (e) {
 *   (e as { code: string }).code; // "invalid_schema": a loop of $ref with nothing in between
 * }
 * ```
 */
export function measureSchema(schema: unknown, param: string | null, budget = new Budget()): SchemaMeasure {
  const fail = (message: string, code: GrammarError["code"], keyword: string, path: string): never => {
    throw new GrammarError(message, { code, param, keyword, path });
  };
  /** The in-place and part edges of one schema. */
  const edgesOf = (s: Schema, path: string): { inPlace: Edge[]; parts: Edge[] } => {
    const inPlace: Edge[] = [];
    const parts: Edge[] = [];
    // A `$ref` that is not local or points nowhere is not followed: compiling refuses it, and the
    // output check cannot compile it (it vouches for nothing then).
    if (typeof s.$ref === "string") {
      const target = resolvePointer(schema, s.$ref);
      if (target !== undefined) inPlace.push({ keyword: "$ref", target, path: s.$ref });
    }
    for (const key of IN_PLACE_LISTS) {
      const v = s[key];
      if (Array.isArray(v)) {
        v.forEach((x, i) => inPlace.push({ keyword: key, target: x, path: `${path}/${key}/${i}` }));
      }
    }
    for (const key of IN_PLACE_ONE) {
      if (s[key] !== undefined) inPlace.push({ keyword: key, target: s[key], path: `${path}/${key}` });
    }
    for (const key of IN_PLACE_MAPS) {
      const v = s[key];
      if (!isObject(v)) continue;
      for (const [name, x] of Object.entries(v as Schema)) {
        if (!Array.isArray(x)) inPlace.push({ keyword: key, target: x, path: `${path}/${key}/${name}` });
      }
    }
    const items = s.items;
    if (Array.isArray(items)) {
      items.forEach((x, i) => parts.push({ keyword: "items", target: x, path: `${path}/items/${i}` }));
    } else if (items !== undefined) parts.push({ keyword: "items", target: items, path: `${path}/items` });
    for (const key of PART_LISTS) {
      const v = s[key];
      if (Array.isArray(v)) {
        v.forEach((x, i) => parts.push({ keyword: key, target: x, path: `${path}/${key}/${i}` }));
      }
    }
    for (const key of PART_ONE) {
      if (s[key] !== undefined) parts.push({ keyword: key, target: s[key], path: `${path}/${key}` });
    }
    for (const key of PART_MAPS) {
      const v = s[key];
      if (!isObject(v)) continue;
      for (const [name, x] of Object.entries(v as Schema)) {
        parts.push({ keyword: key, target: x, path: `${path}/${key}/${name}` });
      }
    }
    return { inPlace, parts };
  };

  // The expanded size of each subschema: 1 + that of its in-place subschemas (memoized: a DAG of
  // $refs is measured once per node, while the sizes add up as a validator's work does).
  const expanded = new Map<object, number>();
  const edges = new Map<object, { inPlace: Edge[]; parts: Edge[] }>();
  const pathOf = new Map<object, string>();
  const edgesFor = (node: object): { inPlace: Edge[]; parts: Edge[] } => {
    let e = edges.get(node);
    if (!e) {
      e = edgesOf(node as Schema, pathOf.get(node) ?? "#");
      edges.set(node, e);
    }
    return e;
  };
  /** Post-order over in-place edges from `start`; refuses a loop. */
  const expand = (start: object): number => {
    const known = expanded.get(start);
    if (known !== undefined) return known;
    // The stack holds each node being expanded, the edge it was entered by, and its next edge.
    const onStack = new Set<object>([start]);
    const stack: { node: object; via?: Edge; next: number }[] = [{ node: start, next: 0 }];
    while (stack.length > 0) {
      const top = stack[stack.length - 1];
      const { inPlace } = edgesFor(top.node);
      if (top.next < inPlace.length) {
        const edge = inPlace[top.next++];
        if (!isObject(edge.target)) continue;
        const child = edge.target as object;
        if (expanded.has(child)) continue;
        if (onStack.has(child)) {
          // The loop: from where `child` is on the stack to here, then back to it by `edge`.
          const from = stack.findIndex((f) => f.node === child);
          const steps = [...stack.slice(from + 1).map((f) => f.via!), edge];
          const route = steps.map((e) => `${e.keyword} → ${e.path}`).join(", ");
          const first = steps[0];
          fail(
            `The JSON schema at ${pathOf.get(child) ?? "#"} refers to itself through ${route} with no ` +
              `property or item in between: a loop with no base case (the keyword '${first.keyword}' ` +
              "at its start). Recursion must go through properties or items.",
            "invalid_schema",
            first.keyword,
            pathOf.get(child) ?? "#",
          );
        }
        if (!pathOf.has(child)) pathOf.set(child, edge.path);
        onStack.add(child);
        stack.push({ node: child, via: edge, next: 0 });
        continue;
      }
      stack.pop();
      onStack.delete(top.node);
      let size = 1;
      for (const edge of inPlace) size += isObject(edge.target) ? expanded.get(edge.target as object)! : 1;
      expanded.set(top.node, size);
    }
    return expanded.get(start)!;
  };

  let nodes = 0;
  let maxExpanded = 0;
  let totalExpanded = 0;
  if (!isObject(schema)) return { nodes: 0, maxExpanded: 0, totalExpanded: 0 };
  pathOf.set(schema as object, "#");
  const seen = new Set<object>([schema as object]);
  const queue: object[] = [schema as object];
  for (let i = 0; i < queue.length; i++) {
    const node = queue[i];
    nodes++;
    const size = expand(node);
    maxExpanded = Math.max(maxExpanded, size);
    totalExpanded += size;
    // A predicted cost: past the budget, charged only up to it (the work is not done).
    budget.charge(Math.min(size * COSTS.expandedNode, budget.left + 1), "checking values against it");
    const { inPlace, parts } = edgesFor(node);
    for (const edge of [...inPlace, ...parts]) {
      if (!isObject(edge.target)) continue;
      const child = edge.target as object;
      if (seen.has(child)) continue;
      seen.add(child);
      if (!pathOf.has(child)) pathOf.set(child, edge.path);
      queue.push(child);
    }
  }
  return { nodes, maxExpanded, totalExpanded };
}

/**
 * The value a local reference (`#`, or `#/` and a JSON pointer, percent-encoded as in a URI
 * fragment) points to in `root`; undefined when there is none.
 *
 * @example
 * ```ts
 * resolvePointer({ $defs: { a: { type: "string" } } }, "#/$defs/a"); // { type: "string" }
 * ```
 */
export function resolvePointer(root: unknown, ref: string): unknown {
  if (ref === "#") return root;
  if (!ref.startsWith("#/")) return undefined;
  let node = root;
  for (const raw of ref.slice(2).split("/")) {
    let key = raw;
    try {
      key = decodeURIComponent(raw);
    } catch { /* kept as written */ }
    key = key.replaceAll("~1", "/").replaceAll("~0", "~");
    if (typeof node !== "object" || node === null || !Object.hasOwn(node, key)) return undefined;
    node = (node as Schema)[key];
  }
  return node;
}

function isObject(v: unknown): boolean {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
