/**
 * `GET /openapi.json`: an OpenAPI 3.1 document generated from the zod schemas of `protocol/` (the
 * same ones that parse requests) and the server's route table. A route without an entry here
 * still appears, marked `x-undocumented` (the test of this document fails on it).
 */
import { z } from "zod";
import { ChatChunkSchema, ChatCompletionSchema, ChatRequestSchema } from "../protocol/chat.ts";
import { EmbeddingsRequestSchema, EmbeddingsResponseSchema } from "../protocol/embeddings.ts";
import {
  CompletionRequestSchema,
  CompletionSchema,
  DetokenizeRequestSchema,
  DetokenizeResponseSchema,
  TokenizeRequestSchema,
  TokenizeResponseSchema,
} from "../protocol/completions.ts";
import {
  ResponseObjectSchema,
  ResponsesRequestSchema,
  ResponseStreamEventSchema,
} from "../protocol/responses.ts";
import { ModelListSchema, ModelObjectSchema } from "../protocol/models.ts";
import {
  AnthropicErrorSchema,
  CountTokensRequestSchema,
  MessageSchema,
  MessagesRequestSchema,
  MessageStreamEventSchema,
  MessageTokensCountSchema,
} from "../protocol/anthropic.ts";
import { ErrorBodySchema, HealthSchema, VersionSchema } from "../protocol/ops.ts";
import { VERSION_INFO } from "../version.ts";

/** A route as the server's table lists it. */
export interface RouteInfo {
  method: string;
  /** The path; a path parameter is written `{name}`. */
  path: string;
  /** `v1`: a key always; `ops`: per --ops-auth; `open`: never. */
  auth: "v1" | "ops" | "open";
}

/** Request bodies (read as clients send them: defaults and `null` allowed). */
const REQUESTS = {
  EmbeddingsRequest: EmbeddingsRequestSchema,
  ChatCompletionRequest: ChatRequestSchema,
  CompletionRequest: CompletionRequestSchema,
  ResponsesRequest: ResponsesRequestSchema,
  TokenizeRequest: TokenizeRequestSchema,
  DetokenizeRequest: DetokenizeRequestSchema,
  MessagesRequest: MessagesRequestSchema,
  CountTokensRequest: CountTokensRequestSchema,
};

/** Response bodies (as the server writes them). */
const RESPONSES = {
  EmbeddingsResponse: EmbeddingsResponseSchema,
  ChatCompletion: ChatCompletionSchema,
  ChatCompletionChunk: ChatChunkSchema,
  Completion: CompletionSchema,
  Response: ResponseObjectSchema,
  ResponseStreamEvent: ResponseStreamEventSchema,
  TokenizeResponse: TokenizeResponseSchema,
  DetokenizeResponse: DetokenizeResponseSchema,
  Model: ModelObjectSchema,
  ModelList: ModelListSchema,
  Health: HealthSchema,
  Version: VersionSchema,
  Error: ErrorBodySchema,
  Message: MessageSchema,
  MessageStreamEvent: MessageStreamEventSchema,
  MessageTokensCount: MessageTokensCountSchema,
  AnthropicError: AnthropicErrorSchema,
};
type Component = keyof typeof REQUESTS | keyof typeof RESPONSES;

interface OperationDoc {
  summary: string;
  description?: string;
  tag: "OpenAI" | "Anthropic" | "Extensions" | "Operations";
  request?: keyof typeof REQUESTS;
  /** JSON answer, `text` for a plain-text one, `none` for no body. */
  response: Component | "text" | "none";
  /** With `stream: true` the answer is server-sent events of this schema, then `data: [DONE]`. */
  stream?: Component;
  /** Error statuses beyond the ones every route of its auth class can answer. */
  errors?: number[];
}

const MODEL_ERRORS = [400, 404, 413, 415, 429, 502, 503, 504];
/** Routes with structured output: 422 when the output failed a keyword only checked after generating. */
const SCHEMA_ERRORS = [400, 404, 413, 415, 422, 429, 502, 503, 504];
/** The Anthropic routes answer 529 where the others answer 503 or a full queue's 429. */
const ANTHROPIC_ERRORS = [400, 404, 413, 415, 429, 502, 504, 529];
const ANTHROPIC_SCHEMA_ERRORS = [400, 404, 413, 415, 422, 429, 502, 504, 529];

/** What each route does; keyed `METHOD path` as in the route table. */
const OPERATIONS: Record<string, OperationDoc> = {
  "POST /v1/embeddings": {
    summary: "Create embeddings",
    description: "Vectors for a string, strings or token ids; `dimensions` truncates (Matryoshka) and " +
      "renormalises; every vector has unit L2 length.",
    tag: "OpenAI",
    request: "EmbeddingsRequest",
    response: "EmbeddingsResponse",
    errors: MODEL_ERRORS,
  },
  "POST /v1/chat/completions": {
    summary: "Create a chat completion",
    description: "A completion for the conversation; with `stream: true` a stream of " +
      "`chat.completion.chunk` events ending with `data: [DONE]` (an error after the first byte " +
      'arrives as an `{"error": …}` event, then `[DONE]`).',
    tag: "OpenAI",
    request: "ChatCompletionRequest",
    response: "ChatCompletion",
    stream: "ChatCompletionChunk",
    errors: SCHEMA_ERRORS,
  },
  "POST /v1/responses": {
    summary: "Create a response (Responses API, stateless)",
    description: "The Responses API subset agent clients use, on the chat engine path: input items " +
      "(message, function_call, function_call_output, reasoning), function tools, text.format, " +
      "reasoning.effort as the thinking switch. With `stream: true` typed events (`event:` lines, " +
      "`sequence_number` from 0) from `response.created` to `response.completed` / " +
      "`response.incomplete`, or `response.failed` then `error`; no `[DONE]`. `store: true`, " +
      "`previous_response_id`, `conversation` and `background` are 400: nothing is kept.",
    tag: "OpenAI",
    request: "ResponsesRequest",
    response: "Response",
    stream: "ResponseStreamEvent",
    errors: SCHEMA_ERRORS,
  },
  "POST /v1/messages": {
    summary: "Create a message (Anthropic Messages API)",
    description: "The Anthropic Messages API on the chat engine path (Claude Code, the Anthropic SDKs): " +
      "system, text / tool_use / tool_result / thinking blocks, custom tools, tool_choice, thinking " +
      "(enabled, disabled, adaptive), output_config.format (or the beta's output_format) as structured output. With `stream: true` " +
      "`event: <type>` + `data:` events from `message_start` to `message_stop` (an error after the first " +
      "byte is an `error` event); no `[DONE]`. Keys by `x-api-key` or `Authorization: Bearer`; " +
      "`?beta=true`, `anthropic-version` and `anthropic-beta` are accepted. Errors are Anthropic-shaped.",
    tag: "Anthropic",
    request: "MessagesRequest",
    response: "Message",
    stream: "MessageStreamEvent",
    errors: ANTHROPIC_SCHEMA_ERRORS,
  },
  "POST /v1/messages/count_tokens": {
    summary: "Count a message request's prompt tokens (Anthropic Messages API)",
    description: "The prompt tokens `/v1/messages` would read for the same request (input_tokens + " +
      "cache_read_input_tokens of its usage). Not available for models served by upstreams.",
    tag: "Anthropic",
    request: "CountTokensRequest",
    response: "MessageTokensCount",
    errors: ANTHROPIC_ERRORS.filter((s) => s !== 529),
  },
  "GET /v1/responses/{id}": {
    summary: "Retrieve a response: always 404 (nothing is stored)",
    tag: "OpenAI",
    response: "Error",
    errors: [404],
  },
  "DELETE /v1/responses/{id}": {
    summary: "Delete a response: always 404 (nothing is stored)",
    tag: "OpenAI",
    response: "Error",
    errors: [404],
  },
  "POST /v1/completions": {
    summary: "Create a text completion (legacy)",
    tag: "OpenAI",
    request: "CompletionRequest",
    response: "Completion",
    stream: "Completion",
    errors: MODEL_ERRORS,
  },
  "POST /tokenize": {
    summary: "Tokenize text or messages",
    tag: "Extensions",
    request: "TokenizeRequest",
    response: "TokenizeResponse",
    errors: [400, 404, 413, 415, 503],
  },
  "POST /v1/tokenize": {
    summary: "Tokenize text or messages",
    tag: "Extensions",
    request: "TokenizeRequest",
    response: "TokenizeResponse",
    errors: [400, 404, 413, 415, 503],
  },
  "POST /detokenize": {
    summary: "Turn token ids into text",
    tag: "Extensions",
    request: "DetokenizeRequest",
    response: "DetokenizeResponse",
    errors: [400, 404, 413, 415, 503],
  },
  "POST /v1/detokenize": {
    summary: "Turn token ids into text",
    tag: "Extensions",
    request: "DetokenizeRequest",
    response: "DetokenizeResponse",
    errors: [400, 404, 413, 415, 503],
  },
  "GET /v1/models": { summary: "List the models", tag: "OpenAI", response: "ModelList" },
  "GET /v1/models/{id}": {
    summary: "One model",
    description: "The id percent-encoded (`Vendor%2FVendor3.6-35B-A3B`), since ids contain `/`.",
    tag: "OpenAI",
    response: "Model",
    errors: [400, 404],
  },
  "GET /version": { summary: "Server and engine versions", tag: "Operations", response: "Version" },
  "GET /": {
    summary: "The server's name and version (clients probe the base URL)",
    tag: "Operations",
    response: "text",
  },
  "HEAD /": {
    summary: "200: the server is up (Claude Code probes it first)",
    tag: "Operations",
    response: "none",
  },
  "GET /health": {
    summary: "Liveness, with each model's state",
    tag: "Operations",
    response: "Health",
  },
  "GET /health/ready": {
    summary: "Readiness: 200 when every model can serve, else 503 with the same body",
    tag: "Operations",
    response: "Health",
    errors: [503],
  },
  "GET /metrics": { summary: "Prometheus metrics (text format 0.0.4)", tag: "Operations", response: "text" },
  "GET /openapi.json": {
    summary: "This document",
    tag: "Operations",
    response: "text",
  },
};

const STATUS_TEXT: Record<number, string> = {
  400: "Invalid request (the `param` field names the offending field)",
  401: "Missing or unknown API key",
  404: "Unknown model (or not allowed for this key)",
  408: "The request body did not arrive in time",
  413: "Request body too large",
  415: "Not JSON",
  422: "The output failed a schema keyword checked after generating, each time (code `invalid_output`)",
  429: "Busy (queue full, or the key's rate limit); see Retry-After",
  500: "Internal error (the log has the request id)",
  502: "An upstream engine failed (models served by upstreams)",
  503: "Model loading or failed, no upstream available, or server draining; see Retry-After",
  504: "The request took longer than the time limit",
  529: "Overloaded: the queue is full, the model is loading or the server is draining; see Retry-After",
};

/**
 * The OpenAPI 3.1 document for `routes`.
 *
 * @example
 * ```ts
 * const doc = openApiDocument([{ method: "GET", path: "/health", auth: "open" }]);
 * ```
 */
export function openApiDocument(routes: readonly RouteInfo[]): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const r of routes) {
    const doc = OPERATIONS[`${r.method} ${r.path}`];
    const op: Record<string, unknown> = doc ? operation(doc, r) : {
      summary: `${r.method} ${r.path}`,
      "x-undocumented": true,
      responses: { default: errorRef("Error") },
    };
    const params = [...r.path.matchAll(/\{(\w+)\}/g)].map((m) => ({
      name: m[1],
      in: "path",
      required: true,
      schema: { type: "string" },
    }));
    if (params.length > 0) op.parameters = params;
    (paths[r.path] ??= {})[r.method.toLowerCase()] = op;
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "vserve",
      version: VERSION_INFO.version,
      description: "OpenAI-compatible embeddings and chat completions. Unknown request fields are ignored; " +
        "`null` for an optional field means not given.",
    },
    jsonSchemaDialect: "https://json-schema.org/draft/2020-12/schema",
    tags: [
      { name: "OpenAI", description: "The OpenAI v1 API family" },
      { name: "Anthropic", description: "The Anthropic Messages API (its own error shape)" },
      { name: "Extensions", description: "llama-server / vLLM extensions" },
      { name: "Operations", description: "Health, metrics, versions" },
    ],
    paths,
    components: {
      schemas: componentSchemas(),
      securitySchemes: {
        bearerAuth: { type: "http", scheme: "bearer" },
        apiKeyAuth: { type: "apiKey", in: "header", name: "x-api-key" },
      },
    },
  };
}

function operation(doc: OperationDoc, r: RouteInfo): Record<string, unknown> {
  const op: Record<string, unknown> = {
    summary: doc.summary,
    ...(doc.description ? { description: doc.description } : {}),
    tags: [doc.tag],
    operationId: `${r.method.toLowerCase()}${
      r.path.replace(/\{(\w+)\}/g, "By_$1").replace(/[^\w]+(\w)?/g, (_, c) => (c ?? "").toUpperCase())
    }`,
  };
  if (r.auth === "v1") op.security = [{ bearerAuth: [] }, { apiKeyAuth: [] }];
  // keyed unless --ops-auth leaves it open
  if (r.auth === "ops") op.security = [{ bearerAuth: [] }, { apiKeyAuth: [] }, {}];
  if (doc.request) {
    op.requestBody = {
      required: true,
      content: { "application/json": { schema: ref(doc.request) } },
    };
  }
  const ok: Record<string, unknown> = { description: "OK" };
  const json = r.path === "/openapi.json" || r.path === "/";
  if (doc.response === "text") {
    ok.content = {
      [json ? "application/json" : "text/plain"]: {
        schema: { type: json ? "object" : "string" },
      },
    };
  } else if (doc.response !== "none") {
    ok.content = {
      "application/json": { schema: ref(doc.response) },
      ...(doc.stream
        ? {
          "text/event-stream": {
            schema: {
              type: "string",
              description: doc.stream === "ResponseStreamEvent" || doc.stream === "MessageStreamEvent"
                ? `\`event: <type>\` + \`data: <${doc.stream} JSON>\` events (no \`[DONE]\`)`
                : `\`data: <${doc.stream} JSON>\` events, then \`data: [DONE]\``,
            },
            "x-event-schema": ref(doc.stream),
          },
        }
        : {}),
    };
  }
  const responses: Record<string, unknown> = { "200": ok };
  const statuses = new Set<number>([
    ...(r.auth !== "open" ? [401] : []),
    ...(r.auth === "v1" ? [429, 500] : [500]),
    ...(doc.errors ?? []),
  ]);
  for (const s of [...statuses].sort((a, b) => a - b)) {
    responses[String(s)] = {
      description: STATUS_TEXT[s] ?? "Error",
      content: {
        "application/json": {
          schema: ref(
            s === 503 && doc.response === "Health"
              ? "Health"
              : doc.tag === "Anthropic"
              ? "AnthropicError"
              : "Error",
          ),
        },
      },
    };
  }
  op.responses = responses;
  return op;
}

function ref(name: Component): { $ref: string } {
  return { $ref: `#/components/schemas/${name}` };
}

function errorRef(name: Component) {
  return { description: "Error", content: { "application/json": { schema: ref(name) } } };
}

/** Every component, converted by zod (requests as input, responses as output). */
function componentSchemas(): Record<string, unknown> {
  const convert = (set: Record<string, z.ZodType>, io: "input" | "output") => {
    const registry = z.registry<{ id: string }>();
    for (const [id, schema] of Object.entries(set)) registry.add(schema, { id });
    return z.toJSONSchema(registry, {
      target: "draft-2020-12",
      io,
      unrepresentable: "any",
      uri: (id) => `#/components/schemas/${id}`,
    }).schemas;
  };
  const all = { ...convert(REQUESTS, "input"), ...convert(RESPONSES, "output") };
  // Component schemas live inside the document: no `$schema` / `$id` of their own (the dialect is
  // the document's), and no zod-only formats.
  return JSON.parse(JSON.stringify(all, (_key, value) => {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      const { $schema: _s, $id: _i, ...rest } = value;
      if (typeof rest.format === "string" && !KNOWN_FORMATS.has(rest.format)) delete rest.format;
      return rest;
    }
    return value;
  }));
}

const KNOWN_FORMATS = new Set([
  "date-time",
  "date",
  "time",
  "email",
  "uri",
  "uuid",
  "regex",
  "int32",
  "int64",
]);
