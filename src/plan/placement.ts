/**
 * Expert placement and tensor overrides as llama.cpp's tensor buffer-type overrides: an ordered
 * list of (regex over tensor names, device) rules; the first rule that matches a tensor decides.
 * The patterns are llama-server's (`common/arg.cpp`, `--cpu-moe`, `--n-cpu-moe`), so a model
 * placed here is placed as llama-server would place it.
 */
import type { z } from "zod";

/** llama-server's pattern of expert tensors (`LLM_FFN_EXPS_REGEX`). */
export const EXPERTS_PATTERN = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/** Where tensors go, as a model's settings say. */
export interface PlacementSettings {
  /** Every layer's expert tensors in host memory. */
  cpuMoe?: boolean;
  /** The expert tensors of layers 0 … N-1 in host memory. */
  nCpuMoe?: number;
  /** `PATTERN=DEVICE` rules, in order, before the expert rules. */
  overrideTensor?: readonly string[];
}

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

/**
 * The override rules of `settings`, in the order llama.cpp applies them.
 *
 * @example
 * ```ts
 * overrideRules({ nCpuMoe: 2 }); // blk\.0\.… and blk\.1\.… expert patterns → CPU
 * ```
 */
export function overrideRules(settings: PlacementSettings): OverrideRule[] {
  const rules = (settings.overrideTensor ?? []).map(parseOverride);
  if (settings.cpuMoe) rules.push({ pattern: EXPERTS_PATTERN, device: "CPU", from: "--cpu-moe" });
  else {
    for (let i = 0; i < (settings.nCpuMoe ?? 0); i++) {
      rules.push({ pattern: `blk\\.${i}${EXPERTS_PATTERN}`, device: "CPU", from: "--n-cpu-moe" });
    }
  }
  return rules;
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

/** The rule that places tensor `name`, if any (first match wins, as in llama.cpp). */
export function ruleFor(
  rules: readonly OverrideRule[],
  compiled: readonly RegExp[],
  name: string,
): OverrideRule | undefined {
  const i = compiled.findIndex((re) => re.test(name));
  return i >= 0 ? rules[i] : undefined;
}

/** A short description of the expert placement, for logs and `/health`. */
export function describeExperts(settings: PlacementSettings): string | undefined {
  if (settings.cpuMoe) return "all layers' experts in host memory (--cpu-moe)";
  if (settings.nCpuMoe) {
    return `experts of layers 0-${settings.nCpuMoe - 1} in host memory (--n-cpu-moe ${settings.nCpuMoe})`;
  }
  return undefined;
}
