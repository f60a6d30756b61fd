/**
 * The layer check (`deno task layers`): every import in `src/` and `main.ts` points to the same
 * layer or one below it, and no set of modules imports itself round a circle. Prints each arrow
 * that runs upward and each circle, and exits 1 if there is any.
 *
 * The layers, lowest first (a module may import its own layer and those below):
 * foundation (logging, clocks, versions, generated models, the grammar compilers) → settings (the
 * config and the model-spec schema) → protocol (wire shapes, error bodies included) → plan → engines
 * (local and upstream; they never see HTTP) → http (auth, errors, SSE, bodies) → registry (model ids,
 * load state: its 404 and 503 are API errors) → services → routes → server → main.
 */
import { join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

/** Layer of each path, by the first rule whose prefix matches (most specific rules first). */
const RULES: [prefix: string, layer: string][] = [
  ["main.ts", "main"],
  ["src/cli.ts", "main"],
  ["src/server.ts", "server"],
  ["src/routes/", "routes"],
  ["src/services/", "services"],
  ["src/http/", "http"],
  ["src/registry.ts", "registry"],
  ["src/model_specs.ts", "registry"],
  ["src/engines/", "engines"],
  ["src/plan/", "plan"],
  ["src/protocol/", "protocol"],
  ["src/config.ts", "settings"],
  ["src/model_spec.ts", "settings"],
  ["src/", "foundation"],
];

const ORDER = [
  "foundation",
  "settings",
  "protocol",
  "plan",
  "engines",
  "http",
  "registry",
  "services",
  "routes",
  "server",
  "main",
];

/** The layer of a repository-relative path. */
export function layerOf(path: string): string {
  for (const [prefix, layer] of RULES) if (path === prefix || path.startsWith(prefix)) return layer;
  return "foundation";
}

/** Relative module specifiers a source text imports (static, re-exports, dynamic, worker URLs). */
export function importsOf(source: string): string[] {
  const found = new Set<string>();
  const patterns = [
    /(?:^|[\s;])(?:import|export)\s[^'";]*?\sfrom\s*["'](\.{1,2}\/[^"']+)["']/g,
    /(?:^|[\s;])import\s*["'](\.{1,2}\/[^"']+)["']/g,
    /\bimport\(\s*["'](\.{1,2}\/[^"']+)["']\s*\)/g,
    /\bnew URL\(\s*["'](\.{1,2}\/[^"']+\.ts)["']\s*,\s*import\.meta\.url\s*\)/g,
  ];
  // Comments (doc examples included) are not imports.
  const code = source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  for (const re of patterns) for (const m of code.matchAll(re)) found.add(m[1]);
  return [...found];
}

/** Every `.ts` file under `dir`, repository-relative. */
async function sources(root: string, dir: string): Promise<string[]> {
  const out: string[] = [];
  for await (const entry of Deno.readDir(join(root, dir))) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) out.push(...await sources(root, path));
    else if (entry.name.endsWith(".ts")) out.push(path);
  }
  return out;
}

/** Circles of the graph (strongly connected components of more than one module, or a self-import). */
export function circles(graph: Map<string, string[]>): string[][] {
  let index = 0;
  const seen = new Map<string, { index: number; low: number }>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string) => {
    const mine = { index, low: index };
    index++;
    seen.set(v, mine);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!seen.has(w)) {
        visit(w);
        mine.low = Math.min(mine.low, seen.get(w)!.low);
      } else if (onStack.has(w)) mine.low = Math.min(mine.low, seen.get(w)!.index);
    }
    if (mine.low === mine.index) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1 || (graph.get(v) ?? []).includes(v)) out.push(component.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) if (!seen.has(v)) visit(v);
  return out;
}

/** The repository's root (this script's parent folder). */
export const ROOT: string = normalize(join(fileURLToPath(new URL(".", import.meta.url)), ".."));

/**
 * Checks `main.ts` and every module under `src/` of the tree at `root`: the imports that run
 * upward (`from (layer) → to (layer)`) and the circles.
 *
 * @example
 * ```ts
 * const { upward, loops } = await checkLayers(ROOT); // both empty when the layers point down
 * ```
 */
export async function checkLayers(
  root: string,
): Promise<{ modules: number; upward: string[]; loops: string[][] }> {
  const files = ["main.ts", ...await sources(root, "src")];
  const graph = new Map<string, string[]>();
  const upward: string[] = [];
  for (const file of files) {
    const text = await Deno.readTextFile(join(root, file));
    const targets = importsOf(text)
      .map((s) => relative(root, normalize(join(root, file, "..", s))))
      .filter((t) => t.endsWith(".ts"));
    graph.set(file, targets);
    for (const target of targets) {
      const from = layerOf(file), to = layerOf(target);
      if (ORDER.indexOf(to) > ORDER.indexOf(from)) upward.push(`${file} (${from}) → ${target} (${to})`);
    }
  }
  return { modules: files.length, upward, loops: circles(graph) };
}

if (import.meta.main) {
  const { modules, upward, loops } = await checkLayers(ROOT);
  for (const line of upward) console.log(`upward: ${line}`);
  for (const loop of loops) console.log(`circle: ${loop.join(" ↔ ")}`);
  console.log(`${modules} modules: ${upward.length} upward imports, ${loops.length} circles`);
  if (upward.length || loops.length) Deno.exit(1);
}
