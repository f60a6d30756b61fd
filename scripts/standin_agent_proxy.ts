/**
 * A local proxy for trying a coding agent (Claude Code) against the built-in random-weight
 * stand-in model, which never chooses a tool or ends a turn by itself. It rewrites each
 * `POST /v1/messages` so that one agent turn completes end to end:
 *
 * - a request whose conversation does not yet hold a tool result: the call of one tool is forced
 *   (`tool_choice: {type: "tool"}`), and that tool's schema is narrowed to fixed arguments, so the
 *   agent runs a harmless, known call (by default `Read` of one file);
 * - a request after the tool result: no tools (`tool_choice: none`) and a structured output that
 *   admits one string, so the model's grammar ends the answer (`stop_reason: end_turn`);
 * - thinking off and `max_tokens` at most 256 throughout.
 *
 * Everything else passes through unchanged. Never put it in front of a real model.
 *
 * ```sh
 * deno task start                                   # vserve on :8080 (the built-in default)
 * deno run --allow-net --allow-env scripts/standin_agent_proxy.ts --port 8090 \
 *   --upstream http://127.0.0.1:8080 --tool Read --args '{"file_path":"/abs/path/README.md"}'
 * ANTHROPIC_BASE_URL=http://127.0.0.1:8090 ANTHROPIC_API_KEY=… claude -p "…" --model Vendor/Vendor3.6-35B-A3B
 * ```
 */
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "8090" },
    upstream: { type: "string", default: "http://127.0.0.1:8080" },
    tool: { type: "string", default: "Read" },
    args: { type: "string", default: "{}" },
    answer: { type: "string", default: "Done." },
  },
});
const forcedArgs: Record<string, unknown> = JSON.parse(opts.args);

// deno-lint-ignore no-explicit-any
type Json = any;

/** Whether the conversation already holds a tool result (the forced call has been made). */
function hasToolResult(messages: Json[]): boolean {
  return messages.some((m) =>
    m.role === "user" && Array.isArray(m.content) && m.content.some((b: Json) => b.type === "tool_result")
  );
}

/** The request as the stand-in needs it to complete a turn. */
export function rewrite(body: Json): Json {
  const out = { ...body, thinking: { type: "disabled" }, max_tokens: Math.min(body.max_tokens ?? 256, 256) };
  const tools: Json[] = body.tools ?? [];
  if (!tools.some((t) => t.name === opts.tool)) return out;
  if (hasToolResult(body.messages ?? [])) {
    // The last turn: text only, and a grammar that ends after one fixed string.
    return {
      ...out,
      tool_choice: { type: "none" },
      output_config: { format: { type: "json_schema", schema: { type: "string", enum: [opts.answer] } } },
    };
  }
  const properties = Object.fromEntries(Object.entries(forcedArgs).map(([k, v]) => [k, { enum: [v] }]));
  return {
    ...out,
    tools: tools.map((t) =>
      t.name === opts.tool
        ? {
          ...t,
          input_schema: {
            type: "object",
            properties,
            required: Object.keys(properties),
            additionalProperties: false,
          },
        }
        : t
    ),
    tool_choice: { type: "tool", name: opts.tool },
  };
}

if (import.meta.main) {
  Deno.serve({ hostname: "127.0.0.1", port: Number(opts.port) }, async (req) => {
    const url = new URL(req.url);
    const headers = new Headers(req.headers);
    headers.delete("host");
    headers.delete("content-length");
    let body: BodyInit | null = req.body;
    if (req.method === "POST" && url.pathname === "/v1/messages") {
      const rewritten = rewrite(await req.json());
      console.error(
        `[proxy] ${url.pathname} tool_choice=${
          JSON.stringify(rewritten.tool_choice ?? null)
        } max_tokens=${rewritten.max_tokens}`,
      );
      body = JSON.stringify(rewritten);
    }
    const res = await fetch(`${opts.upstream}${url.pathname}${url.search}`, {
      method: req.method,
      headers,
      body: req.method === "GET" || req.method === "HEAD" ? null : body,
      signal: req.signal,
    });
    return new Response(res.body, { status: res.status, headers: res.headers });
  });
}
