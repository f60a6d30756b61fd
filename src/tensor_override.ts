/**
 * `--override-tensor` entries (`PATTERN=DEVICE`, llama-server's `-ot`): parsed and checked here,
 * where the settings and the model specs can use them; the memory plan places tensors by them.
 */
import type { z } from "zod";

/** One override rule: tensors whose name matches `pattern` go to `device` (a buffer type name). */
export interface OverrideRule {
  pattern: string;
  device: string;
  /** Which setting made it, for messages. */
  from: string;
}

/**
 * Parses one `--override-tensor` entry (`PATTERN=DEVICE`); throws a message naming the problem.
 * The pattern is a regular expression over tensor names (searched, not anchored), as llama.cpp's
 * `std::regex_search` applies it; the device is a buffer type name such as `CPU` or `CUDA0`.
 *
 * @example
 * ```ts
 * parseOverride("blk\\.(0|1)\\.ffn_.*_exps=CPU"); // { pattern: "blk\\.(0|1)\\.ffn_.*_exps", device: "CPU", … }
 * ```
 */
export function parseOverride(entry: string): OverrideRule {
  const at = entry.lastIndexOf("=");
  if (at <= 0 || at === entry.length - 1) {
    throw new Error(`'${entry}' is not PATTERN=DEVICE (for example 'ffn_.*_exps=CPU')`);
  }
  const pattern = entry.slice(0, at);
  const device = entry.slice(at + 1).trim();
  try {
    new RegExp(pattern);
  } catch (e) {
    throw new Error(`'${pattern}' is not a regular expression: ${(e as Error).message}`);
  }
  if (!/^[A-Za-z][\w.-]*$/.test(device)) {
    throw new Error(`'${device}' is not a device name (CPU, CUDA0, Vulkan0, …)`);
  }
  return { pattern, device, from: "--override-tensor" };
}

/** Zod refinement: each `--override-tensor` entry must be `PATTERN=DEVICE` with a valid regex. */
export function checkOverrides(entries: string[], ctx: z.RefinementCtx): void {
  entries.forEach((entry, i) => {
    try {
      parseOverride(entry);
    } catch (e) {
      ctx.addIssue({ code: "custom", path: [i], message: (e as Error).message });
    }
  });
}
