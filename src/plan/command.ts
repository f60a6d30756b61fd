/**
 * The two uses of the memory plan: `--plan` (print it, exit 0 when it fits, 2 when it does not)
 * and the check the server makes before it loads anything (refuse a configuration that cannot fit,
 * with the plan's message, instead of failing inside llama.cpp).
 */
import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import type { ModelSpec } from "../model_spec.ts";
import { formatBytes, type ModelPlan, type PlanDevice, refusalMessage } from "./memory.ts";
import { formatPlan, modelHeaders, planJson, planSpecs } from "./run.ts";

/** Finds the devices to plan on (GPUs here or `--vram` ones, and host memory). */
export type DeviceFinder = (config: Config) => Promise<PlanDevice[]>;

/**
 * `--plan`: prints the plan of `specs` (a table, or JSON with `--json`) to stdout; returns the exit
 * status: 0 fits, 2 does not fit.
 *
 * @example
 * ```ts
 * import type { Config } from "../config.ts";
 * import type { ModelSpec } from "../model_spec.ts";
 * async function plan(specs: readonly ModelSpec[], config: Config, devices: DeviceFinder) {
 *   Deno.exit(await planCommand(specs, config, devices));
 * }
 * ```
 */
export async function planCommand(
  specs: readonly ModelSpec[],
  config: Config,
  findDevices: DeviceFinder,
): Promise<number> {
  const headers = await modelHeaders(specs, config);
  const { plan, pending } = planSpecs(specs, config, headers, await findDevices(config));
  console.log(config.json ? JSON.stringify(planJson(plan, pending), null, 2) : formatPlan(plan, pending));
  return plan.fits ? 0 : 2;
}

/**
 * The start-up check: plans every local model; returns the per-model plans the loaders use, or the
 * refusal message when the configuration cannot fit.
 */
export async function startPlan(
  specs: readonly ModelSpec[],
  config: Config,
  findDevices: DeviceFinder,
  log: Logger,
): Promise<{ plans: Map<string, ModelPlan> } | { refusal: string }> {
  const shape = specs.find((s) => s.source?.startsWith("shape:"));
  if (shape) {
    return {
      refusal:
        `model '${shape.id}': '${shape.source}' is a shape (header only, no weights): use it with --plan`,
    };
  }
  if (!specs.some((s) => s.backend === "llama")) return { plans: new Map() };
  const headers = await modelHeaders(specs, config, false);
  for (const h of headers.values()) {
    if (h.kind === "pending" && h.reason) log.warn(`not planned: ${h.reason} (the model fails at its load)`);
  }
  const { plan, pending } = planSpecs(specs, config, headers, await findDevices(config));
  if (!plan.fits) return { refusal: refusalMessage(plan) };
  log.info("memory plan: fits", {
    devices: Object.fromEntries(
      plan.devices.map((
        d,
      ) => [d.name, `${formatBytes(d.used + d.runtime)} of ${formatBytes(d.capacity)} (${d.source})`]),
    ),
    ...(pending.length ? { planned_at_load: pending } : {}),
  });
  return { plans: new Map(plan.models.map((m) => [m.id, m])) };
}
