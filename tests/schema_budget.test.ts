/**
 * The schema budget (issue 26): expansion tricks ($ref chains that double per level, fan-out through
 * properties, anyOf, prefixItems, enums behind allOf) are refused by the work they would take, at
 * arrival or while compiling, with a 400 `schema_too_large` naming the budget, while the server goes
 * on answering; schemas llama.cpp cannot take (counts past its repetition limit, loops with no base
 * case, bounds no number it can write) are a 400 naming the keyword before generation.
 */
import assert from "node:assert/strict";
import { GrammarError, JsonGrammar, measureSchema, SCHEMA_BUDGET } from "../src/grammar/mod.ts";
import { type Json, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";

type Schema = Record<string, unknown>;

/** $defs l1..lN, each level built from the one below by `level`; the root refers to lN. */
function chain(levels: number, level: (below: string) => Schema, base: Schema): Schema {
  const defs: Schema = { l0: base };
  for (let i = 1; i <= levels; i++) defs[`l${i}`] = level(`#/$defs/l${i - 1}`);
  return { $defs: defs, $ref: `#/$defs/l${levels}` };
}

const object = { type: "object", properties: { a: { type: "integer" } } };

/** The schema: each level is the allOf of the level below, twice. */
const allOfChain = (n: number) =>
  chain(n, (below) => ({ allOf: [{ $ref: below }, { $ref: below }] }), object);

/** Tricks of our own: each doubles the compiler's work per level (a `$ref` beside a keyword is inlined). */
const TRICKS: Record<string, Schema> = {
  "properties fan-out": chain(20, (below) => ({
    type: "object",
    properties: { a: { $ref: below, minProperties: 0 }, b: { $ref: below, minProperties: 0 } },
  }), object),
  "anyOf fan-out": chain(20, (below) => ({
    anyOf: [{ $ref: below, type: "object" }, { $ref: below, type: "object", required: ["a"] }],
  }), object),
  "prefixItems fan-out": chain(20, (below) => ({
    type: "array",
    prefixItems: [{ $ref: below, minItems: 0 }, { $ref: below, minItems: 0 }],
    items: false,
  }), { type: "array", items: { type: "integer" } }),
  "an enum of 1,000 long values behind allOf, 100 times": {
    $defs: { E: { enum: Array.from({ length: 1000 }, (_, i) => `v${i}-${"x".repeat(180)}`) } },
    type: "object",
    properties: Object.fromEntries(
      Array.from({ length: 100 }, (_, i) => [`p${i}`, { allOf: [{ $ref: "#/$defs/E" }] }]),
    ),
  },
};

Deno.test("the allOf chain is refused by its work at any depth, N=39 included, before anything compiles", () => {
  for (const n of [16, 22, 39]) {
    // Measuring is linear: each level is measured once, while the work it predicts doubles.
    const measured = (() => {
      try {
        measureSchema(allOfChain(n), "response_format.json_schema.schema");
      } catch (e) {
        return e;
      }
    })();
    assert.ok(
      measured instanceof GrammarError && measured.code === "schema_too_large",
      `N=${n}: ${measured}`,
    );
    assert.match(measured.message, new RegExp(`schema budget of ${SCHEMA_BUDGET} work units`));
  }
  // Below that, compiling is what the budget stops: the work charged stays within it.
  for (const n of [13, 14, 15]) {
    const g = new JsonGrammar();
    assert.throws(
      () => g.schema(allOfChain(n), "response_format.json_schema.schema", "out"),
      (e: Error) => e instanceof GrammarError && e.code === "schema_too_large",
    );
    assert.ok(g.rules.budget.used <= SCHEMA_BUDGET + 10_000, `N=${n}: ${g.rules.budget.used} units`);
  }
  // A short chain is a fine schema.
  const g = new JsonGrammar();
  g.schema(allOfChain(6), "response_format.json_schema.schema", "out");
});

Deno.test("expansion tricks stop at the budget: the work charged never passes it by more than one step", () => {
  for (const [name, schema] of Object.entries(TRICKS)) {
    const g = new JsonGrammar();
    assert.throws(
      () => g.schema(schema, "response_format.json_schema.schema", "out"),
      (e: Error) =>
        e instanceof GrammarError && e.code === "schema_too_large" && /schema budget/.test(e.message),
      name,
    );
    // One step may pass it: at most one enum's or rule's text (the request's strings are at most 256 KB).
    assert.ok(g.rules.budget.used <= SCHEMA_BUDGET + 600_000, `${name}: ${g.rules.budget.used} units`);
  }
});

Deno.test("loops of $ref/allOf/anyOf/not with no property or item between are refused naming the keyword", () => {
  const cases: [Schema, string][] = [
    [{ $defs: { a: { $ref: "#/$defs/b" }, b: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" }, "$ref"],
    [{ $defs: { a: { allOf: [{ $ref: "#/$defs/a" }, { type: "object" }] } }, $ref: "#/$defs/a" }, "allOf"],
    [{ allOf: [{ $ref: "#" }] }, "allOf"],
    [{ anyOf: [{ type: "null" }, { $ref: "#" }] }, "anyOf"],
    [{ type: "string", not: { $ref: "#" } }, "not"],
  ];
  for (const [schema, keyword] of cases) {
    assert.throws(
      () => new JsonGrammar().schema(schema, "response_format.json_schema.schema", "out"),
      (e: Error) =>
        e instanceof GrammarError && e.code === "invalid_schema" && e.keyword === keyword &&
        e.message.includes(`'${keyword}'`) && /loop with no base case/.test(e.message),
      JSON.stringify(schema),
    );
  }
  // Recursion through properties and items is a value's own nesting: lists and trees compile.
  const list = {
    $defs: {
      node: { type: "object", properties: { next: { anyOf: [{ $ref: "#/$defs/node" }, { type: "null" }] } } },
    },
    $ref: "#/$defs/node",
  };
  const tree = {
    type: "object",
    properties: { v: { type: "integer" }, kids: { type: "array", items: { $ref: "#" } } },
  };
  for (const schema of [list, tree]) new JsonGrammar().schema(schema, "response_format", "out");
});

const KEY = "test-key";
const CHAT = "vserve/tiny-chat";
const server = await startServer(["--api-key", KEY], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = (path: string) => `${server.url}${path}`;

/** POSTs JSON; a safety net ends a request the server never answers (the old code held N=39 for hours). */
async function post(path: string, body: unknown): Promise<{ status: number; body: Json }> {
  const res = await fetch(url(path), {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(120_000),
  });
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) };
  } catch {
    return { status: res.status, body: text };
  }
}

/** Event-loop ticks that found the server's JavaScript thread busy over 50 ms (its own CPU time). */
async function stallsOver50ms(): Promise<number> {
  const text = await (await fetch(url("/metrics"))).text();
  const read = (series: string) => {
    const line = text.split("\n").find((l) => l.startsWith(series));
    assert.ok(line, `no ${series} in /metrics`);
    return Number(line.split(" ").at(-1));
  };
  return read("vserve_event_loop_stall_seconds_count") -
    read('vserve_event_loop_stall_seconds_bucket{le="0.05"}');
}

/** Asks /health again and again until stopped; each answer must be a 200. `stop` gives how many came. */
function healthProber(): { stop(): Promise<number> } {
  let healthy = 0;
  let stopped = false;
  const probing = (async () => {
    while (!stopped) {
      const res = await fetch(url("/health"));
      await res.body?.cancel();
      assert.equal(res.status, 200);
      healthy++;
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await probing;
      return healthy;
    },
  };
}

const chatWith = (schema: Schema) => ({
  model: CHAT,
  messages: [{ role: "user", content: "x" }],
  max_tokens: 8,
  response_format: { type: "json_schema", json_schema: { name: "x", schema } },
});

serverTest(
  "the allOf chain at N=39 and the fan-out tricks are 400s naming the budget, with /health answering meanwhile",
  async () => {
    // The first request of each kind compiles much of the server's code (its JIT): not what is measured.
    const small = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] };
    for (
      const [path, body] of [
        ["/v1/chat/completions", chatWith(small)],
        ["/v1/chat/completions", chatWith({ ...allOfChain(12), description: "warm" })],
        ["/v1/responses", {
          model: CHAT,
          input: "x",
          max_output_tokens: 2,
          text: { format: { type: "json_schema", name: "x", schema: small } },
        }],
        ["/v1/chat/completions", {
          model: CHAT,
          messages: [{ role: "user", content: "x" }],
          max_tokens: 2,
          tools: [{ type: "function", function: { name: "f", strict: true, parameters: small } }],
        }],
      ] as const
    ) await post(path, body);
    const stallsBefore = await stallsOver50ms();
    const requests: [string, string, unknown][] = [
      ["N=39 as response_format", "/v1/chat/completions", chatWith(allOfChain(39))],
      ["N=39 as tool parameters", "/v1/chat/completions", {
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        tools: [{ type: "function", function: { name: "f", parameters: allOfChain(39) } }],
      }],
      ["N=39 as a Responses text.format", "/v1/responses", {
        model: CHAT,
        input: "x",
        max_output_tokens: 8,
        text: { format: { type: "json_schema", name: "x", schema: allOfChain(39) } },
      }],
      ...Object.entries(TRICKS).map(([name, schema]): [string, string, unknown] => [
        name,
        "/v1/chat/completions",
        chatWith(schema),
      ]),
      ["a strict tool with the properties fan-out", "/v1/chat/completions", {
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        tools: [{
          type: "function",
          function: { name: "f", strict: true, parameters: TRICKS["properties fan-out"] },
        }],
      }],
    ];
    // /health is asked again and again while the requests are refused; each answer must come.
    const prober = healthProber();
    const results = await Promise.all(requests.map(([, path, body]) => post(path, body)));
    const healthy = await prober.stop();
    for (const [i, res] of results.entries()) {
      const [name, path] = requests[i];
      const param = path === "/v1/responses"
        ? "text.format.schema"
        : name.includes("tool")
        ? "tools[0].function.parameters"
        : "response_format.json_schema.schema";
      assertApiError(res, 400, { code: "schema_too_large", param });
      assert.match(res.body.error.message, /schema budget of 4000000 work units/, name);
    }
    assert.ok(healthy > 0, "no /health answer came");
    assert.equal(await stallsOver50ms() - stallsBefore, 0, "the event loop was held over 50 ms");
  },
);

serverTest("schemas llama.cpp cannot take are a 400 naming the keyword, before generation", async () => {
  const before = await (await fetch(url("/metrics"))).text();
  const generated = (text: string) =>
    Number(
      text.split("\n").find((l) => l.startsWith(`vserve_engine_tokens_generated_total{model="${CHAT}"}`))
        ?.split(" ").at(-1),
    );
  const cases: [Schema, string, string][] = [
    [{ type: "string", minLength: 100000 }, "minLength", "unsupported_schema"],
    [{ type: "string", minLength: 1e9 }, "minLength", "unsupported_schema"],
    [{ type: "array", minItems: 1e8 }, "minItems", "unsupported_schema"],
    [{ type: "array", contains: { type: "string" }, minContains: 1e9 }, "minContains", "unsupported_schema"],
    [{ not: {} }, "not", "invalid_schema"],
    [{ type: "object", properties: { a: { not: true } }, required: ["a"] }, "not", "invalid_schema"],
    [
      { type: "object", additionalProperties: { type: "integer" }, minProperties: 5000 },
      "minProperties",
      "unsupported_schema",
    ],
    [
      { $defs: { a: { $ref: "#/$defs/b" }, b: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" },
      "$ref",
      "invalid_schema",
    ],
    [{ $defs: { a: { allOf: [{ $ref: "#/$defs/a" }] } }, $ref: "#/$defs/a" }, "allOf", "invalid_schema"],
    [{ type: "number", minimum: 1e-300, maximum: 1.0000000000001e-300 }, "minimum", "unsupported_schema"],
    [
      { type: "object", additionalProperties: { type: "integer" }, minProperties: 12, maxProperties: 7 },
      "maxProperties",
      "invalid_schema",
    ],
  ];
  for (const [schema, keyword, code] of cases) {
    for (const via of ["response_format", "tool"] as const) {
      const body = via === "response_format" ? chatWith(schema) : {
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 8,
        tools: [{ type: "function", function: { name: "f", parameters: schema } }],
        tool_choice: "required",
      };
      const res = await post("/v1/chat/completions", body);
      assertApiError(res, 400, {
        code,
        param: via === "response_format"
          ? "response_format.json_schema.schema"
          : "tools[0].function.parameters",
      });
      assert.ok(res.body.error.message.includes(keyword), `${keyword}: ${res.body.error.message}`);
    }
  }
  const after = await (await fetch(url("/metrics"))).text();
  assert.equal(generated(after), generated(before), "no token was generated for a refused schema");
  // A range a grammar can write keeps working: 1e-300 < x with room for 16 fraction digits.
  const ok = await post("/v1/chat/completions", chatWith({ type: "number", minimum: 1e-300, maximum: 1 }));
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
});

serverTest(
  "alternatives that begin alike and nest (a oneOf chain of 30) are refused while generating, off the event loop, /health answering",
  async () => {
    // Small to compile, but every `{"b":` of the output can be read at any of the 30 levels: the ways
    // to read it multiply with each one (llama.cpp took minutes a token on the event loop).
    const oneOfChain = chain(30, (below) => ({
      oneOf: [{ $ref: below }, { type: "object", properties: { b: { $ref: below } } }],
    }), { type: "object", properties: { a: { type: "integer" } }, required: ["a"] });
    // The model is steered into the nesting, `{"b":` again and again: those tokens wherever the
    // grammar allows them (so few steps mask the vocabulary), never "a" nor a "}".
    const bias: Record<number, number> = {};
    const steer = [['{"', 100], ["b", 100], ['":', 100], ["a", -100], ['"a', -100], ["}", -100]] as const;
    for (const [text, value] of steer) {
      const tokenized = await post("/tokenize", { model: CHAT, content: text, add_special: false });
      assert.equal(tokenized.status, 200);
      const ids = tokenized.body.tokens as number[];
      if (ids.length === 1) bias[ids[0]] = value;
    }
    assert.ok(Object.keys(bias).length >= 4, JSON.stringify(bias));
    assert.ok(Object.values(bias).includes(100), JSON.stringify(bias));
    const stallsBefore = await stallsOver50ms();
    const prober = healthProber();
    const request = (stream: boolean) =>
      post("/v1/chat/completions", {
        ...chatWith(oneOfChain),
        max_tokens: 200,
        logit_bias: bias,
        chat_template_kwargs: { enable_thinking: false },
        seed: 7,
        stream,
      });
    const [plain, streamed] = await Promise.all([request(false), request(true)]);
    const healthy = await prober.stop();
    assertApiError(plain, 400, { code: "schema_too_large", param: "response_format.json_schema.schema" });
    assert.match(plain.body.error.message, /too ambiguous to follow.*at most 1024/);
    // A stream that already began ends with the same error as its last event before [DONE].
    assert.equal(streamed.status, 200);
    const events = String(streamed.body).split("\n").filter((l) => l.startsWith("data: "));
    assert.equal(events.at(-1), "data: [DONE]");
    const error = JSON.parse(events.at(-2)!.slice(6)).error;
    assert.equal(error?.code, "schema_too_large", String(streamed.body).slice(-400));
    assert.equal(error.param, "response_format.json_schema.schema");
    assert.ok(healthy > 0, "no /health answer came");
    assert.equal(await stallsOver50ms() - stallsBefore, 0, "the event loop was held over 50 ms");
  },
);

serverTest(
  "output that matches several overlapping oneOf alternatives is a 400 naming the field, not a 500",
  async () => {
    // Every boolean matches both alternatives: the grammar enforces one at least, never exactly one.
    const overlapping = { oneOf: [{ type: "boolean" }, { enum: [true, false] }] };
    const off = { chat_template_kwargs: { enable_thinking: false }, seed: 1 };
    const res = await post("/v1/chat/completions", { ...chatWith(overlapping), max_tokens: 16, ...off });
    assertApiError(res, 400, { code: "unsupported_schema", param: "response_format.json_schema.schema" });
    assert.match(res.body.error.message, /more than one of the oneOf alternatives at the top/);
    const tool = await post("/v1/chat/completions", {
      model: CHAT,
      messages: [{ role: "user", content: "x" }],
      max_tokens: 400,
      seed: 1,
      parallel_tool_calls: false,
      chat_template_kwargs: { enable_thinking: false },
      tools: [{
        type: "function",
        function: {
          name: "f",
          parameters: { type: "object", properties: { v: overlapping }, required: ["v"] },
        },
      }],
      tool_choice: "required",
    });
    assertApiError(tool, 400, { code: "unsupported_schema", param: "tools[0].function.parameters" });
    assert.match(tool.body.error.message, /oneOf alternatives at '\/v'/);
    // Alternatives that exclude each other keep working.
    const exclusive = await post("/v1/chat/completions", {
      ...chatWith({ oneOf: [{ type: "boolean" }, { type: "null" }] }),
      max_tokens: 16,
      ...off,
    });
    assert.equal(exclusive.status, 200, JSON.stringify(exclusive.body));
  },
);

serverTest(
  "output a backtracking regex engine takes 2^45 steps on is checked at once: 200s, /health answering",
  async () => {
    // A drill's attack: the model is steered into a run of `a`s, which V8's RegExp took 10 s (then a
    // 400) to test against `(a+)+b$` (2^n ways to split the run, tried from each of its starts).
    const bias: Record<number, number> = {};
    for (const text of ["a", "aa", "aaaa", "aaaaaaaa"]) {
      const tokenized = await post("/tokenize", { model: CHAT, content: text, add_special: false });
      const ids = tokenized.body.tokens as number[];
      if (ids.length === 1) bias[ids[0]] = 100;
    }
    assert.ok(Object.keys(bias).length >= 2, JSON.stringify(bias));
    const schemas: Schema[] = [
      { type: "string", minLength: 45, maxLength: 45, not: { pattern: "(a+)+b$" } },
      { type: "string", minLength: 45, maxLength: 45, not: { pattern: "(a|aa)+!$" } },
      {
        type: "object",
        properties: { k: { type: "string", minLength: 45, maxLength: 45 } },
        required: ["k"],
        additionalProperties: false,
        propertyNames: { not: { pattern: "(a*)*b" } },
        not: { properties: { k: { pattern: "(a|a)+b" } } },
      },
    ];
    const stallsBefore = await stallsOver50ms();
    const prober = healthProber();
    const answers = await Promise.all(schemas.map((schema) =>
      post("/v1/chat/completions", {
        ...chatWith(schema),
        max_tokens: 60,
        logit_bias: bias,
        chat_template_kwargs: { enable_thinking: false },
        seed: 3,
      })
    ));
    const healthy = await prober.stop();
    for (const res of answers) {
      assert.equal(res.status, 200, JSON.stringify(res.body).slice(0, 400));
      const content = res.body.choices[0].message.content as string;
      // The run the backtracking engine would have split every way.
      assert.ok(content.includes("a".repeat(40)), content);
    }
    assert.ok(healthy > 0, "no /health answer came");
    assert.equal(await stallsOver50ms() - stallsBefore, 0, "the event loop was held over 50 ms");
  },
);

serverTest(
  "SIGTERM while schemas compile: the requests in flight are answered 400, the server exits 0",
  async () => {
    // A server of its own: it is stopped here. The drain time is short so that on the old code (the
    // main thread held by N=39) the exit guard's forced exit (code 1) comes soon.
    const own = await startServer(["--api-key", KEY, "--drain-timeout-ms", "5000"], { waitReady: true });
    // N=39 is refused at arrival; the others pass that check and compile until the budget stops them.
    const kinds = [allOfChain(39), allOfChain(13), TRICKS["properties fan-out"], allOfChain(14)];
    const statuses: number[] = [];
    let signalled = false;
    let answeredAfterSignal = 0;
    // Six clients keep schema requests in flight until the server stops answering.
    const client = async (k: number) => {
      for (let i = k;; i++) {
        let res: Response;
        try {
          res = await fetch(`${own.url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
            // Each schema differs (its description): none is answered from the grammar cache.
            body: JSON.stringify(chatWith({ ...kinds[i % kinds.length], description: `c${k}-${i}` })),
          });
        } catch {
          return; // the server has closed its listener
        }
        const body = await res.json().catch(() => null);
        statuses.push(res.status);
        if (res.status === 503) return; // draining: new requests are refused
        assertApiError({ status: res.status, body }, 400, { code: "schema_too_large" });
        if (signalled) answeredAfterSignal++;
      }
    };
    const clients = Array.from({ length: 6 }, (_, k) => client(k));
    while (statuses.length < 12) await new Promise((r) => setTimeout(r, 5));
    signalled = true;
    const code = await own.stop("SIGTERM");
    await Promise.all(clients);
    assert.equal(code, 0, "the server drained and exited by itself");
    assert.ok(statuses.every((s) => s === 400 || s === 503), `statuses: ${statuses}`);
    // Requests in flight when the signal came were still compiled and answered (a 400, not a cut
    // connection). Counted by the clients: the server's log may write its drain line after them.
    assert.ok(answeredAfterSignal > 0, "no schema request was answered after the signal");
    assert.ok(own.logs.some((l) => /shutting down/.test(l)), "the server logged its drain");
  },
);
