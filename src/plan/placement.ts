/**
 * Expert placement and tensor overrides as llama.cpp's tensor buffer-type overrides: an ordered
 * list of (regex over tensor names, device) rules; the first rule that matches a tensor decides.
 * The patterns are llama-server's (`common/arg.cpp`, `--cpu-moe`, `--n-cpu-moe`), so a model
 * placed here is placed as llama-server would place it.
 */
import { type OverrideRule, parseOverride } from "../tensor_override.ts";

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
