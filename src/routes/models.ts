/** `GET /v1/models` and `GET /v1/models/{id}`: the models (and aliases) this key may use. */
import { ApiError, jsonResponse } from "../http/errors.ts";
import type { ModelList, ModelObject } from "../protocol/models.ts";
import type { Registry } from "../registry.ts";
import type { Handler, RouteKit } from "./context.ts";
import { modelStatus } from "./model_status.ts";

/** The model object of an id or alias. */
function modelObject(registry: Registry, name: string): ModelObject {
  const slot = registry.find(name);
  return {
    id: name,
    object: "model",
    created: slot.created,
    owned_by: slot.spec.owned_by,
    kind: slot.spec.kind,
    status: modelStatus(slot.state, slot.engine?.upstreams?.()),
    ...(name !== slot.spec.id ? { alias_of: slot.spec.id } : {}),
    ...(slot.engine?.upstreams
      ? { upstreams: slot.engine.upstreams().map((u) => ({ name: u.name, state: u.state })) }
      : {}),
  };
}

/**
 * The handler of `GET /v1/models`.
 *
 * @example
 * ```ts
 * import type { RouteKit } from "./context.ts";
 * function routeOf(kit: RouteKit) {
 *   return { method: "GET", path: "/v1/models", auth: "v1", handler: listModels(kit) };
 * }
 * ```
 */
export function listModels(kit: RouteKit): Handler {
  const { deps } = kit;
  return (_req, ctx) => {
    const names = deps.registry.slots.flatMap((s) => [s.spec.id, ...s.spec.aliases])
      .filter((n) => !ctx.key?.models || allowed(n));
    function allowed(n: string) {
      try {
        kit.allowedSlot(n, ctx.key);
        return true;
      } catch {
        return false;
      }
    }
    const list: ModelList = { object: "list", data: names.map((n) => modelObject(deps.registry, n)) };
    return jsonResponse(list);
  };
}

/** The handler of `GET /v1/models/{id}` (the id percent-encoded, as the SDKs send ids with a `/`). */
export function getModel(kit: RouteKit): Handler {
  return (_req, ctx, name) => {
    let id: string;
    try {
      id = decodeURIComponent(name);
    } catch {
      throw new ApiError(
        400,
        "invalid_request_error",
        "The model id in the path is not valid percent-encoding.",
        "model",
        "invalid_path",
      );
    }
    kit.allowedSlot(id, ctx.key);
    return jsonResponse(modelObject(kit.deps.registry, id));
  };
}
