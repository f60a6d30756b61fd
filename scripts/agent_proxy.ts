/**
 * A small local proxy for trying coding agents (Codex, Qwen Code, …) against a server that serves a
 * model which never chooses a tool or ends a turn by itself (the built-in random-weight stand-ins).
 * It rewrites each `/v1/responses` and `/v1/chat/completions` request, then forwards it:
 *
 * - a turn that has no tool result yet is forced to call `--tool` (tool_choice names it), once
 *   (parallel_tool_calls false), with `--args` pinned (the tool's parameters become a `const`
 *   schema, so the call is harmless and the same every time);
 * - a turn that answers a tool result gets tool_choice `none` and a JSON format whose only value
 *   is `{"answer": <--answer>}`, which ends the turn;
 * - thinking stays on but is closed within a few tokens (a logit bias on `</think>`), and every
 *   request's output is capped at `--max-tokens`.
 *
 * Requests that bring their own response format keep it. With `--log-dir`, every request body and
 * response status is written there (what the agent really sends). Not for production: it exists
 * to show that an agent completes a tool-calling turn end to end.
 *
 * @example
 * ```sh
 * deno run -A scripts/agent_proxy.ts --upstream http://127.0.0.1:8080 --port 8081 \
 *   --tool exec_command --args '{"cmd":"echo hello"}'
 * ```
 */

interface Options {
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
function answered(body: Json, chat: boolean): boolean {
  if (chat) return body.messages?.at(-1)?.role === "tool";
  if (!Array.isArray(body.input)) return false;
  const last = [...body.input].reverse().find((item: Json) =>
    item.role === "user" || /_call_output$/.test(item.type ?? "")
  );
  return /_call_output$/.test(last?.type ?? "");
}

/** Rewrites one request as the module doc says; `thinkToken` is the id of `</think>`, if one token. */
export function rewrite(body: Json, chat: boolean, opts: Options, thinkToken?: number): Json {
  const out = structuredClone(body);
  const tools: Json[] = chat
    ? out.tools ?? []
    : (out.tools ?? []).flatMap((t: Json) => (t.type === "namespace" ? t.tools : [t]));
  const tool = tools.find((t: Json) => (chat ? t.function?.name : t.name) === opts.tool);
  const format = chat ? out.response_format : out.text?.format;
  if (!answered(out, chat) && tool) {
    if (opts.args) {
      if (chat) tool.function.parameters = pinned(opts.args);
      else tool.parameters = pinned(opts.args);
    }
    out.tool_choice = chat
      ? { type: "function", function: { name: opts.tool } }
      : { type: "function", name: opts.tool };
    out.parallel_tool_calls = false;
  } else {
    if (tools.length > 0) out.tool_choice = "none";
    if (!format || format.type === "text") {
      const schema = pinned({ answer: opts.answer });
      if (chat) out.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
      else out.text = { ...out.text, format: { type: "json_schema", name: "answer", schema, strict: true } };
    }
  }
  const key = chat
    ? (out.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens")
    : "max_output_tokens";
  out[key] = Math.min(out[key] ?? opts.maxTokens, opts.maxTokens);
  if (thinkToken !== undefined) out.logit_bias = { ...out.logit_bias, [thinkToken]: opts.thinkBias };
  return out;
}

if (import.meta.main) {
  const opts = parseArgs(Deno.args);
  const thinkTokens = new Map<string, number | undefined>();
  const thinkToken = async (model: string, auth: string | null) => {
    if (!thinkTokens.has(model)) {
      const res = await fetch(`${opts.upstream}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(auth ? { authorization: auth } : {}) },
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
    const chat = url.pathname.endsWith("/chat/completions");
    if (body && req.method === "POST" && (chat || url.pathname.endsWith("/responses"))) {
      const json = JSON.parse(body);
      const token = await thinkToken(json.model, req.headers.get("authorization"));
      const rewritten = rewrite(json, chat, opts, token);
      const seq = ++n;
      if (opts.logDir) {
        await Deno.writeTextFile(`${opts.logDir}/${seq}.request.json`, body);
        await Deno.writeTextFile(`${opts.logDir}/${seq}.rewritten.json`, JSON.stringify(rewritten, null, 1));
      }
      body = JSON.stringify(rewritten);
      console.log(`${seq} ${url.pathname} ${answered(json, chat) ? "answer" : "call"}`);
    }
    const res = await fetch(`${opts.upstream}${url.pathname}${url.search}`, {
      method: req.method,
      headers,
      body,
    });
    return new Response(res.body, { status: res.status, headers: res.headers });
  });
}
