/** `GET /openapi.json`: a valid OpenAPI 3.1 document, generated from the zod schemas, covering every route. */
import assert from "node:assert/strict";
import { Ajv2020 } from "ajv/dist/2020";
import { Validator } from "@seriousme/openapi-schema-validator";
import { createServer } from "../src/server.ts";
import { Registry } from "../src/registry.ts";
import { KeyRing, RateLimiter } from "../src/http/auth.ts";
import { silentLogger } from "../src/log.ts";
import { Metrics } from "../src/metrics.ts";
import type { Json } from "./helpers/server.ts";

const handler = createServer({
  registry: new Registry([]),
  keys: new KeyRing([]),
  limiter: new RateLimiter(),
  opsNeedKey: false,
  log: silentLogger,
  metrics: new Metrics(),
  lifecycle: { draining: false, shutdown: new AbortController().signal, inFlight: 0, unread: 0 },
  bodyLimitBytes: 1 << 20,
  maxEmbeddingInputs: 16,
  maxQueue: 4,
  requestTimeoutMs: 10_000,
  corsOrigins: [],
});
const res = await handler(new Request("http://localhost/openapi.json"));
const doc: Json = await res.json();

/** Every `$ref` anywhere in `value`, with where it was found. */
function refs(value: unknown, at = "#"): [string, string][] {
  if (!value || typeof value !== "object") return [];
  if (Array.isArray(value)) return value.flatMap((v, i) => refs(v, `${at}/${i}`));
  return Object.entries(value).flatMap(([k, v]) =>
    k === "$ref" && typeof v === "string" ? [[v, at] as [string, string]] : refs(v, `${at}/${k}`)
  );
}

function resolve(ref: string): unknown {
  assert.ok(ref.startsWith("#/"), `local reference: ${ref}`);
  return ref.slice(2).split("/").reduce<Json>(
    (node, part) => node?.[part.replaceAll("~1", "/").replaceAll("~0", "~")],
    doc,
  );
}

/** Ajv with the document's components, so that their references resolve. */
function ajv() {
  const a = new Ajv2020({ strict: true, allErrors: true });
  // The references are `#/components/schemas/…`, as in the document: the same layout here.
  a.addKeyword({ keyword: "components" });
  a.addSchema({ $id: "doc", components: { schemas: doc.components.schemas } });
  return a;
}
const compile = (name: string) => ajv().compile({ $ref: `doc#/components/schemas/${name}` });

Deno.test("GET /openapi.json is an OpenAPI 3.1 document that needs no key", () => {
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /application\/json/);
  assert.match(doc.openapi, /^3\.1\.\d+$/);
  assert.equal(typeof doc.info.title, "string");
  assert.equal(typeof doc.info.version, "string");
  assert.equal(doc.jsonSchemaDialect, "https://json-schema.org/draft/2020-12/schema");
  assert.equal(doc.components.securitySchemes.bearerAuth.scheme, "bearer");
});

const openApiValidator = new Validator();
/** `document` checked against the official OpenAPI 3.1 schema, and its `$ref`s resolved. */
async function validateOpenApi(document: Json): Promise<{ valid: boolean; errors?: unknown }> {
  return await openApiValidator.validate(document);
}

Deno.test("the document validates against the OpenAPI 3.1 schema", async () => {
  const result = await validateOpenApi(doc);
  assert.ok(result.valid, JSON.stringify(result.errors, null, 1));
});

Deno.test("the OpenAPI 3.1 schema check rejects a broken copy of the document", async () => {
  const valid = await validateOpenApi(structuredClone(doc));
  assert.ok(valid.valid, "an untouched copy passes");
  const noDescription = structuredClone(doc);
  delete noDescription.paths["/health"].get.responses["200"].description;
  assert.ok(!(await validateOpenApi(noDescription)).valid, "a response without description");
  const unknownField = structuredClone(doc);
  unknownField.paths["/health"].fetch = unknownField.paths["/health"].get;
  assert.ok(!(await validateOpenApi(unknownField)).valid, "a path item with a field OpenAPI does not have");
  const badParameter = structuredClone(doc);
  badParameter.paths["/v1/models/{id}"].get.parameters[0].in = "body";
  assert.ok(!(await validateOpenApi(badParameter)).valid, "a parameter `in: body` (OpenAPI 2 only)");
  const danglingRef = structuredClone(doc);
  delete danglingRef.components.schemas.Health;
  assert.ok(!(await validateOpenApi(danglingRef)).valid, "a $ref to a missing component");
});

Deno.test("every route of the route table is documented, and nothing else", () => {
  assert.ok(handler.routes.length >= 10);
  const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
    Object.keys(ops as object).map((m) => `${m.toUpperCase()} ${path}`)
  );
  const table = handler.routes.map((r) => `${r.method} ${r.path}`);
  assert.deepEqual(documented.sort(), [...table].sort());
  for (const r of handler.routes) {
    const op = doc.paths[r.path][r.method.toLowerCase()];
    assert.ok(!op["x-undocumented"], `${r.method} ${r.path} has an entry in src/http/openapi.ts`);
    assert.ok(op.summary && op.responses["200"], `${r.method} ${r.path} has a summary and its answer`);
    if (r.method === "POST") assert.ok(op.requestBody, `${r.method} ${r.path} documents its body`);
    if (r.auth === "v1") {
      assert.deepEqual(op.security, [{ bearerAuth: [] }, { apiKeyAuth: [] }]);
      for (const s of ["400", "401", "429"]) {
        if (r.method === "POST") assert.ok(op.responses[s], `${r.method} ${r.path} documents ${s}`);
      }
    }
    for (const [status, answer] of Object.entries(op.responses as Record<string, Json>)) {
      if (status !== "200") assert.ok(answer.content["application/json"].schema.$ref, `${status} has a body`);
    }
    const ids = [...r.path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
    assert.deepEqual((op.parameters ?? []).map((p: Json) => p.name), ids);
  }
  const operationIds = Object.values(doc.paths).flatMap((ops) =>
    Object.values(ops as Json).map((o: Json) => o.operationId)
  );
  assert.equal(new Set(operationIds).size, operationIds.length, "operation ids are unique");
});

Deno.test("every $ref resolves", () => {
  const all = refs(doc);
  assert.ok(all.length > 20);
  for (const [ref, at] of all) assert.ok(resolve(ref) !== undefined, `${ref} (at ${at}) resolves`);
});

Deno.test("every component schema compiles with Ajv (JSON Schema 2020-12, strict)", () => {
  for (const name of Object.keys(doc.components.schemas)) {
    assert.doesNotThrow(() => compile(name), `${name} compiles`);
  }
});

Deno.test("the request schemas accept valid requests and reject invalid ones, as the server does", () => {
  const chat = compile("ChatCompletionRequest");
  assert.ok(
    chat({ model: "m", messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: null }),
  );
  assert.ok(!chat({ model: "m", messages: [{ role: "robot", content: "hi" }] }));
  assert.ok(!chat({ model: "m", messages: [] }));
  const embed = compile("EmbeddingsRequest");
  assert.ok(embed({ model: "m", input: ["a", "b"], dimensions: 64, encoding_format: "base64" }));
  assert.ok(embed({ model: "m", input: [[1, 2], [3]] }));
  assert.ok(!embed({ model: "m", input: 5 }));
  assert.ok(!embed({ model: "m", input: "a", encoding_format: "hex" }));
});

Deno.test("the response schemas describe what the server sends", async () => {
  const models = compile("ModelList");
  const list = await (await handler(new Request("http://localhost/v1/models"))).json();
  assert.ok(models(list), JSON.stringify(models.errors));
  const health = compile("Health");
  const body = await (await handler(new Request("http://localhost/health"))).json();
  assert.ok(health(body), JSON.stringify(health.errors));
  const error = compile("Error");
  const notFound = await (await handler(new Request("http://localhost/nope"))).json();
  assert.ok(error(notFound), JSON.stringify(error.errors));
  const anthropic = compile("AnthropicError");
  const badMessage = await (await handler(
    new Request("http://localhost/v1/messages", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    }),
  )).json();
  assert.ok(anthropic(badMessage), JSON.stringify(anthropic.errors));
  const chunk = compile("ChatCompletionChunk");
  assert.ok(chunk({
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1,
    model: "m",
    choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }],
  }));
});
