/** The layer check's parts (scripts/layers.ts): what counts as an import, a layer, a circle. */
import assert from "node:assert/strict";
import { checkLayers, circles, importsOf, layerOf, ROOT } from "../scripts/layers.ts";

Deno.test("layer check: static, re-exported, dynamic and worker imports count; comments and packages do not", () => {
  const source = [
    `import { a } from "./a.ts";`,
    `import type { B } from "../b.ts";`,
    `export { c } from "./c.ts";`,
    `import "./side.ts";`,
    `const d = await import("./d.ts");`,
    `new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });`,
    `import { z } from "zod";`,
    `// import { x } from "./commented.ts";`,
    `/** @example\n * import { y } from "./example.ts";\n */`,
  ].join("\n");
  assert.deepEqual(importsOf(source).sort(), [
    "../b.ts",
    "./a.ts",
    "./c.ts",
    "./d.ts",
    "./side.ts",
    "./worker.ts",
  ]);
});

Deno.test("layer check: paths map to layers, the most specific rule first", () => {
  assert.equal(layerOf("main.ts"), "main");
  assert.equal(layerOf("src/server.ts"), "server");
  assert.equal(layerOf("src/engines/llama/chat.ts"), "engines");
  assert.equal(layerOf("src/http/errors.ts"), "http");
  assert.equal(layerOf("src/protocol/chat.ts"), "protocol");
  assert.equal(layerOf("src/log.ts"), "foundation");
});

Deno.test("layer check: circles are found, a chain is not one", () => {
  const graph = new Map([
    ["a", ["b"]],
    ["b", ["c"]],
    ["c", ["a"]],
    ["d", ["a", "e"]],
    ["e", []],
    ["f", ["f"]],
  ]);
  assert.deepEqual(circles(graph), [["a", "b", "c"], ["f"]]);
  assert.deepEqual(circles(new Map([["a", ["b"]], ["b", []]])), []);
});

Deno.test("layer check: the tree's imports all point down, and no modules import each other round a circle", async () => {
  const { modules, upward, loops } = await checkLayers(ROOT);
  assert.ok(modules > 90, `${modules} modules read`);
  assert.deepEqual(upward, []);
  assert.deepEqual(loops, []);
});
