/**
 * releaseFreedMemory: memory native code freed goes back to the system (glibc), where a plain `free`
 * leaves it resident for reuse.
 */
import assert from "node:assert/strict";
import { releaseFreedMemory } from "../src/engines/native_memory.ts";

const rssMiB = () => Number(Deno.readTextFileSync("/proc/self/status").match(/VmRSS:\s+(\d+)/)![1]) / 1024;

Deno.test({
  name: "releaseFreedMemory returns freed native blocks to the system",
  ignore: Deno.build.os !== "linux",
  fn: async () => {
    const libc = Deno.dlopen("libc.so.6", {
      malloc: { parameters: ["usize"], result: "pointer" },
      free: { parameters: ["pointer"], result: "void" },
      memset: { parameters: ["pointer", "i32", "usize"], result: "pointer" },
    });
    try {
      // 64 MiB in 1 KiB blocks (as a vocabulary's strings are), written so that they are resident,
      // then all freed but the last one: it pins the arena's top, so free() cannot trim the rest.
      const blocks: Deno.PointerValue[] = [];
      for (let i = 0; i < 65_536; i++) {
        const p = libc.symbols.malloc(1024n);
        libc.symbols.memset(p, 1, 1024n);
        blocks.push(p);
      }
      const pin = blocks.pop()!;
      for (const p of blocks) libc.symbols.free(p);
      const freed = rssMiB();
      await releaseFreedMemory();
      const released = rssMiB();
      libc.symbols.free(pin);
      assert.ok(
        freed - released > 32,
        `resident ${freed.toFixed(1)} MiB before, ${released.toFixed(1)} after`,
      );
    } finally {
      libc.close();
    }
  },
});

Deno.test("releaseFreedMemory can be called any number of times", async () => {
  for (let i = 0; i < 3; i++) await releaseFreedMemory();
});
