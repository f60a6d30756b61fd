/**
 * The documentation holds together: every relative link in README.md, docs/ and bench/ points to a
 * file that exists (and, with `#anchor`, to a heading of that file, as GitHub names it), and the
 * README's configuration table names every setting (its flag and its config-file key).
 */
import assert from "node:assert/strict";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { SETTINGS } from "../src/config.ts";

const ROOT = normalize(join(dirname(fileURLToPath(import.meta.url)), ".."));

function markdownFiles(): string[] {
  const files = [join(ROOT, "README.md")];
  for (const dir of ["docs", "bench", "bench/results"]) {
    for (const e of Deno.readDirSync(join(ROOT, dir))) {
      if (e.isFile && e.name.endsWith(".md")) files.push(join(ROOT, dir, e.name));
    }
  }
  return files.sort();
}

/** The text outside fenced code blocks and inline code spans (links there are not links). */
function prose(text: string): string {
  return text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").replace(/`[^`\n]*`/g, "");
}

/** GitHub's anchor of each heading: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const line of text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").split("\n")) {
    const m = line.match(/^#{1,6}\s+(.*?)\s*#*\s*$/);
    if (!m) continue;
    const base = m[1].replace(/\[([^\]]*)\]\([^)]*\)/g, "$1").toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/ /g, "-");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

Deno.test("every relative link in README.md, docs/ and bench/ resolves, anchors included", () => {
  const broken: string[] = [];
  let checked = 0;
  for (const file of markdownFiles()) {
    const text = Deno.readTextFileSync(file);
    for (const m of prose(text).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      checked++;
      const [path, anchor] = target.split("#", 2);
      const resolved = path === "" ? file : normalize(join(dirname(file), decodeURI(path)));
      const where = `${relative(ROOT, file)}: ${target}`;
      let stat: Deno.FileInfo;
      try {
        stat = Deno.statSync(resolved);
      } catch {
        broken.push(`${where} (no such file)`);
        continue;
      }
      if (anchor !== undefined && stat.isFile && resolved.endsWith(".md")) {
        if (!anchors(Deno.readTextFileSync(resolved)).has(anchor)) broken.push(`${where} (no such heading)`);
      }
    }
  }
  assert.deepEqual(broken, []);
  assert.ok(checked > 50, `only ${checked} links found: the link pattern is broken`);
});

Deno.test("the README's configuration table names every flag and its config-file key", () => {
  const readme = Deno.readTextFileSync(join(ROOT, "README.md"));
  const start = readme.indexOf("## Configuration");
  const table = readme.slice(start, readme.indexOf("\n\n**", start)).split("\n").filter((l) =>
    l.startsWith("|")
  );
  const flagCell = (row: string) => row.split(/(?<!\\)\|/)[1];
  const rowOf = (flag: string) => table.find((row) => new RegExp(`--${flag}(?![a-z-])`).test(flagCell(row)));
  const missing: string[] = [];
  for (const s of SETTINGS) {
    const row = rowOf(s.flag);
    if (!row) missing.push(`--${s.flag}`);
    else if (!row.includes(`\`${s.key}\``)) missing.push(`${s.key} (the config-file key of --${s.flag})`);
  }
  assert.deepEqual(missing, []);
});
