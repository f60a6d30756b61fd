/**
 * A small local proxy for trying coding agents (Codex, Claude Code, Qwen Code, …) against a server that
 * serves a model which never chooses a tool or ends a turn by itself (the built-in random-weight
 * stand-ins). It rewrites each request of the three chat-shaped APIs (`/v1/chat/completions`,
 * `/v1/responses`, `/v1/messages`) the same way, then forwards it; everything else passes through:
 *
 * - the tool `--tool` has its parameters pinned to `--args` (a schema whose only value they are, so
 *   the call is harmless and the same every time; in every request, so that prompts keep one prefix);
 * - a turn whose last user-side item is not a tool result is forced to call it (the tool choice
 *   names it), once (parallel calls off);
 * - a turn that answers a tool result gets tool choice `none` and a JSON format whose only value
 *   is `{"answer": <--answer>}`, which ends the turn;
 * - thinking stays on but is closed within a few tokens (a logit bias of `--think-bias` on
 *   `</think>`), and every request's output is capped at `--max-tokens`.
 *
 * Requests that bring their own format keep it (Claude Code's title request). With `--log-dir`,
 * every request body as the agent sent it and as rewritten is written there. Not for production:
 * it exists to show that an agent completes a tool-calling turn end to end.
 *
 * @example
 * ```sh
 * deno run -A scripts/agent_proxy.ts --upstream http://127.0.0.1:8080 --port 8081 \
 *   --tool exec_command --args '{"cmd":"echo hello"}'
 * ```
 */

/** The proxy's settings (from the command line). */
export interface Options {
  upstream: string;
  port: number;
  tool: string;
  args?: Record<string, unknown>;
  answer: string;
  maxTokens: number;
  thinkBias: number;
  logDir?: string;
}

function parseArgs(argv: string[]): Options {
  const get = (name: string) => {
    const i = argv.indexOf(`--${name}`);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const tool = get("tool");
  if (!tool) throw new Error("--tool NAME is required (the function the first leg of a turn must call)");
  const args = get("args");
  return {
    upstream: (get("upstream") ?? "http://127.0.0.1:8080").replace(/\/$/, ""),
    port: Number(get("port") ?? 8081),
    tool,
    args: args ? JSON.parse(args) : undefined,
    answer: get("answer") ?? "Done.",
    maxTokens: Number(get("max-tokens") ?? 512),
    thinkBias: Number(get("think-bias") ?? 10),
    logDir: get("log-dir"),
  };
}

// deno-lint-ignore no-explicit-any
type Json = any;

/** The three request shapes the proxy rewrites, by the path's end. */
export type Api = "chat" | "responses" | "messages";

const API_PATHS: [string, Api][] = [
  ["/chat/completions", "chat"],
  ["/responses", "responses"],
  ["/messages", "messages"],
];

/** The API a request path speaks, if the proxy rewrites it. */
export function apiOf(path: string): Api | undefined {
  return API_PATHS.find(([end]) => path.endsWith(end))?.[1];
}

/** A JSON schema whose only value is `value`. */
function pinned(value: Record<string, unknown>): Record<string, unknown> {
  return {
    type: "object",
    properties: Object.fromEntries(Object.entries(value).map(([k, v]) => [k, { const: v }])),
    required: Object.keys(value),
    additionalProperties: false,
  };
}

/** Whether the conversation's last user-side item is a tool result (the call was made). */
function answered(body: Json, api: Api): boolean {
  if (api === "chat") {
    return body.messages?.findLast((m: Json) => m.role !== "system" && m.role !== "developer")?.role ===
      "tool";
  }
  if (api === "messages") {
    const last = body.messages?.findLast((m: Json) => m.role === "user");
    return Array.isArray(last?.content) && last.content.some((b: Json) => b.type === "tool_result");
  }
  if (!Array.isArray(body.input)) return false;
  const last = body.input.findLast((item: Json) =>
    item.role === "user" || /_call_output$/.test(item.type ?? "")
  );
  return /_call_output$/.test(last?.type ?? "");
}

/** How each API names the parts the proxy changes. */
const SHAPES = {
  chat: {
    tools: (body: Json): Json[] => body.tools ?? [],
    name: (t: Json) => t.function?.name,
    pin: (t: Json, schema: Json) => (t.function.parameters = schema),
    force: (name: string) => ({
      tool_choice: { type: "function", function: { name } },
      parallel_tool_calls: false,
    }),
    none: () => ({ tool_choice: "none" }),
    format: (body: Json) => body.response_format,
    answer: (_body: Json, schema: Json) => ({
      response_format: { type: "json_schema", json_schema: { name: "answer", schema } },
    }),
    maxKey: (body: Json) => (body.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens"),
  },
  responses: {
    tools: (body: Json): Json[] =>
      (body.tools ?? []).flatMap((t: Json) => (t.type === "namespace" ? t.tools : [t])),
    name: (t: Json) => t.name,
    pin: (t: Json, schema: Json) => (t.parameters = schema),
    force: (name: string) => ({ tool_choice: { type: "function", name }, parallel_tool_calls: false }),
    none: () => ({ tool_choice: "none" }),
    format: (body: Json) => body.text?.format,
    answer: (body: Json, schema: Json) => ({
      text: { ...body.text, format: { type: "json_schema", name: "answer", schema, strict: true } },
    }),
    maxKey: () => "max_output_tokens",
  },
  messages: {
    tools: (body: Json): Json[] => body.tools ?? [],
    name: (t: Json) => t.name,
    pin: (t: Json, schema: Json) => (t.input_schema = schema),
    force: (name: string) => ({ tool_choice: { type: "tool", name, disable_parallel_tool_use: true } }),
    none: () => ({ tool_choice: { type: "none" } }),
    format: (body: Json) => body.output_config?.format ?? body.output_format,
    answer: (body: Json, schema: Json) => ({
      output_config: { ...body.output_config, format: { type: "json_schema", schema } },
    }),
    maxKey: () => "max_tokens",
  },
} as const;

/**
 * Rewrites one request of `api` as the module doc says; `thinkToken` is the id of `</think>` (when
 * it is one token).
 *
 * @example
 * ```ts
 * const body = {
 *   model: "m",
 *   max_tokens: 4096,
 *   tools: [{ name: "Read", input_schema: { type: "object" } }],
 *   messages: [{ role: "user", content: "Read README.md" }],
 * };
 * const opts: Options = {
 *   upstream: "http://127.0.0.1:8080",
 *   port: 8081,
 *   tool: "Read",
 *   args: { file_path: "README.md" },
 *   answer: "Done.",
 *   maxTokens: 512,
 *   thinkBias: 10,
 * };
 * rewrite(body, "messages", opts, 151668); // tool_choice {type: "tool", name: "Read", …}, max_tokens 512
 * ```
 */
export function rewrite(body: Json, api: Api, opts: Options, thinkToken?: number): Json {
  const out = structuredClone(body);
  const shape = SHAPES[api];
  const tools = shape.tools(out);
  const tool = tools.find((t) => shape.name(t) === opts.tool);
  // Pinned on both legs: the tools are in the prompt of both, so the answer reuses the call's prompt.
  if (tool && opts.args) shape.pin(tool, pinned(opts.args));
  if (!answered(out, api) && tool) Object.assign(out, shape.force(opts.tool));
  else {
    if (tools.length > 0) Object.assign(out, shape.none());
    const format = shape.format(out);
    if (!format || format.type === "text") {
      Object.assign(out, shape.answer(out, pinned({ answer: opts.answer })));
    }
  }
  const key = shape.maxKey(out);
  out[key] = Math.min(out[key] ?? opts.maxTokens, opts.maxTokens);
  if (thinkToken !== undefined) out.logit_bias = { ...out.logit_bias, [thinkToken]: opts.thinkBias };
  return out;
}

if (import.meta.main) {
  const opts = parseArgs(Deno.args);
  const thinkTokens = new Map<string, number | undefined>();
  const thinkToken = async (model: string, headers: Headers) => {
    if (!thinkTokens.has(model)) {
      const auth: Record<string, string> = {};
      for (const h of ["authorization", "x-api-key"]) if (headers.has(h)) auth[h] = headers.get(h)!;
      const res = await fetch(`${opts.upstream}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ model, content: "</think>" }),
      });
      const ids = res.ok ? (await res.json()).tokens : [];
      thinkTokens.set(model, ids.length === 1 ? ids[0] : undefined);
    }
    return thinkTokens.get(model);
  };
  let n = 0;
  if (opts.logDir) await Deno.mkdir(opts.logDir, { recursive: true });
  Deno.serve({ port: opts.port, hostname: "127.0.0.1" }, async (req) => {
    const url = new URL(req.url);
    const headers = new Headers(req.headers);
    headers.delete("host");
    headers.delete("content-length");
    let body: string | undefined = req.method === "GET" || req.method === "HEAD"
      ? undefined
      : await req.text();
    const api = apiOf(url.pathname);
    if (body && req.method === "POST" && api) {
      const json = JSON.parse(body);
      const rewritten = rewrite(json, api, opts, await thinkToken(json.model, req.headers));
      const seq = ++n;
      if (opts.logDir) {
        await Deno.writeTextFile(`${opts.logDir}/${seq}.request.json`, body);
        await Deno.writeTextFile(`${opts.logDir}/${seq}.rewritten.json`, JSON.stringify(rewritten, null, 1));
      }
      body = JSON.stringify(rewritten);
      console.log(`${seq} ${url.pathname} ${answered(json, api) ? "answer" : "call"}`);
    }
    const res = await fetch(`${opts.upstream}${url.pathname}${url.search}`, {
      method: req.method,
      headers,
      body,
      signal: req.signal,
    });
    return new Response(res.body, { status: res.status, headers: res.headers });
  });
}
