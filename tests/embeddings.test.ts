/** POST /v1/embeddings through a real server process on the generated models, both backends. */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Tokenizer } from "@huggingface/tokenizers";
import { type Json, postJson, startServer } from "./helpers/server.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";
import { EmbeddingsResponseSchema } from "../src/protocol/embeddings.ts";
import { base64ToFloat32, cosine, truncateAndNormalize } from "../src/vectors.ts";
import { qwen3TokenizerJsonPath } from "../src/models/qwen3_vocab.ts";

const KEY = "test-key";
const server = await startServer(["--api-key", KEY, "--max-embedding-inputs", "16"], { waitReady: true });
globalThis.addEventListener("unload", () => void server.stop());
const url = `${server.url}/v1/embeddings`;

const tokenizerPath = qwen3TokenizerJsonPath();
const tokenizer = new Tokenizer(
  JSON.parse(await Deno.readTextFile(tokenizerPath)),
  JSON.parse(await Deno.readTextFile(tokenizerPath.replace("tokenizer.json", "tokenizer_config.json"))),
);

/** The two backends, with how many tokens each adds to the text's own tokens. */
const BACKENDS = [
  { name: "llama", model: "Vendor/Vendor3-Embedding-8B", added: 1, native: 4096 },
  { name: "onnx", model: "vserve/tiny-embed-onnx", added: 0, native: 128 },
];

async function embed(body: Record<string, unknown>): Promise<Json> {
  const res = await postJson(url, body, KEY);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

function norm(v: number[]): number {
  return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
}

for (const b of BACKENDS) {
  const model = b.model;

  serverTest(`${b.name}: a string input returns one unit vector of native size, OpenAI-shaped`, async () => {
    const res = await embed({ model, input: "The quick brown fox" });
    EmbeddingsResponseSchema.strict().parse(res);
    assert.equal(res.object, "list");
    assert.equal(res.model, model);
    assert.equal(res.data.length, 1);
    assert.deepEqual([res.data[0].object, res.data[0].index], ["embedding", 0]);
    assert.equal(res.data[0].embedding.length, b.native);
    assert.ok(Math.abs(norm(res.data[0].embedding) - 1) < 1e-5);
  });

  for (const dims of b.native === 4096 ? [32, 512, 768, 1024, 1536, 2048, 4096] : [32, 64, 100, 128]) {
    serverTest(`${b.name}: dimensions=${dims} returns ${dims} unit-norm floats for every entry`, async () => {
      const res = await embed({ model, input: ["alpha", "beta gamma", "δέλτα 你好 🙂"], dimensions: dims });
      for (const d of res.data) {
        assert.equal(d.embedding.length, dims);
        assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, `norm ${norm(d.embedding)}`);
      }
    });
  }

  serverTest(`${b.name}: dimensions=N equals the first N native components renormalised`, async () => {
    const input = "Matryoshka representations nest";
    const native = (await embed({ model, input })).data[0].embedding;
    for (const dims of [32, 100]) {
      const cut = (await embed({ model, input, dimensions: dims })).data[0].embedding;
      const expected = truncateAndNormalize(Float32Array.from(native), dims);
      cut.forEach((x: number, i: number) => assert.ok(Math.abs(x - expected[i]) < 1e-5));
    }
  });

  serverTest(`${b.name}: base64 decodes to the same floats as float`, async () => {
    const input = ["one", "two three"];
    const floats = await embed({ model, input, dimensions: 64 });
    const b64 = await embed({ model, input, dimensions: 64, encoding_format: "base64" });
    b64.data.forEach((d: Json, i: number) => {
      assert.equal(typeof d.embedding, "string");
      const decoded = base64ToFloat32(d.embedding);
      assert.equal(decoded.length, 64);
      decoded.forEach((x, j) => assert.ok(Math.abs(x - floats.data[i].embedding[j]) < 1e-7));
    });
  });

  serverTest(`${b.name}: a batch gives the same vectors as single requests`, async () => {
    const texts = ["short", "a somewhat longer sentence about embeddings", "Hola, ¿qué tal?"];
    const batch = await embed({ model, input: texts });
    assert.deepEqual(batch.data.map((d: Json) => d.index), [0, 1, 2]);
    for (let i = 0; i < texts.length; i++) {
      const single = (await embed({ model, input: texts[i] })).data[0].embedding;
      single.forEach((x: number, j: number) => assert.ok(Math.abs(x - batch.data[i].embedding[j]) < 1e-5));
    }
  });

  serverTest(`${b.name}: usage counts equal the tokenizer's counts`, async () => {
    const texts = ["Hello world", "Bonjour le monde, ça va ?", "Grüß Gott — 你好，世界 🙂"];
    const res = await embed({ model, input: texts });
    const expected = texts.reduce((n, t) => n + tokenizer.encode(t).ids.length + b.added, 0);
    assert.equal(res.usage.prompt_tokens, expected);
    assert.equal(res.usage.total_tokens, expected);
  });

  serverTest(`${b.name}: token-id inputs embed like the text they encode`, async () => {
    const ids = tokenizer.encode("token ids work").ids;
    const fromText = (await embed({ model, input: "token ids work" })).data[0].embedding;
    const fromIds = await embed({ model, input: ids });
    const fromIdArrays = await embed({ model, input: [ids, ids] });
    assert.equal(fromIdArrays.data.length, 2);
    for (const v of [fromIds.data[0].embedding, fromIdArrays.data[1].embedding]) {
      v.forEach((x: number, j: number) => assert.ok(Math.abs(x - fromText[j]) < 1e-5));
    }
    assert.equal(fromIds.usage.prompt_tokens, ids.length + b.added);
  });

  serverTest(`${b.name}: a similar pair is closer than an unrelated pair`, async () => {
    const res = await embed({
      model,
      input: [
        "the cat sat on the warm mat by the door",
        "the cat sat on the warm rug by the door",
        "quarterly revenue grew in emerging markets",
      ],
    });
    const [a, s, u] = res.data.map((d: Json) => d.embedding);
    assert.ok(cosine(a, s) > cosine(a, u) + 0.1, `similar ${cosine(a, s)} vs unrelated ${cosine(a, u)}`);
    assert.ok(cosine(a, s) < 0.99999, "vectors are not degenerate");
  });

  for (const [what, dims] of [["below 32", 31], ["above native", b.native + 1], ["zero", 0]] as const) {
    serverTest(`${b.name}: dimensions ${what} is 400 param dimensions stating the range`, async () => {
      const res = await postJson(url, { model, input: "x", dimensions: dims }, KEY);
      assertApiError(res, 400, { param: "dimensions", type: "invalid_request_error" });
      assert.match(res.body.error.message, new RegExp(`32 to ${b.native}`));
    });
  }

  serverTest(
    `${b.name}: an entry over the token limit is 400 context_length_exceeded naming it`,
    async () => {
      const long = "hello ".repeat(9000);
      const res = await postJson(url, { model, input: ["fine", long] }, KEY);
      assertApiError(res, 400, { param: "input", code: "context_length_exceeded" });
      assert.match(res.body.error.message, /Entry 1 .* more than 8192 tokens.* at most 8192/);
    },
  );

  serverTest(`${b.name}: truncate: true cuts an entry to the limit instead`, async () => {
    const res = await embed({ model, input: "hello ".repeat(9000), truncate: true, dimensions: 32 });
    assert.equal(res.usage.prompt_tokens, 8192);
    assert.ok(Math.abs(norm(res.data[0].embedding) - 1) < 1e-5);
  });
}

const model = BACKENDS[0].model;
const badInputs: [string, unknown, string][] = [
  ["an empty string", "", "input"],
  ["an empty string inside an array", ["ok", ""], "input[1]"],
  ["an empty array", [], "input"],
  ["an empty token array", [[1, 2], []], "input[1]"],
  ["a token id outside the vocabulary", [[1, 999999]], "input[0]"],
];
for (const [what, input, param] of badInputs) {
  serverTest(`${what} is 400 with param ${param}`, async () => {
    assertApiError(await postJson(url, { model, input }, KEY), 400, { param });
  });
}

serverTest("more entries than allowed is 400 naming the limit", async () => {
  const res = await postJson(url, { model, input: Array(17).fill("x") }, KEY);
  assertApiError(res, 400, { param: "input", code: "too_many_inputs" });
  assert.match(res.body.error.message, /at most 16/);
});

serverTest("an unknown encoding_format is 400 naming the allowed values", async () => {
  const res = await postJson(url, { model, input: "x", encoding_format: "binary" }, KEY);
  assertApiError(res, 400, { param: "encoding_format" });
  assert.match(res.body.error.message, /'float' or 'base64'/);
});

serverTest("a chat model in /v1/embeddings is 400 wrong_model_kind", async () => {
  const res = await postJson(url, { model: "Vendor/Vendor3.6-35B-A3B", input: "x" }, KEY);
  assertApiError(res, 400, { param: "model", code: "wrong_model_kind" });
  assert.match(res.body.error.message, /chat model/);
});

serverTest("an alias serves the same model", async () => {
  const a = await embed({ model: "spec-embed", input: "alias" });
  const b = await embed({ model, input: "alias" });
  assert.equal(a.model, "spec-embed");
  assert.deepEqual(a.data[0].embedding, b.data[0].embedding);
});

serverTest("the official openai SDK's embeddings.create works unchanged (base64 on the wire)", async () => {
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY });
  const res = await client.embeddings.create({ model, input: ["sdk one", "sdk two"], dimensions: 64 });
  assert.equal(res.data.length, 2);
  assert.equal(res.data[0].embedding.length, 64);
  assert.ok(Math.abs(norm(res.data[1].embedding) - 1) < 1e-5);
  assert.ok(res.usage.prompt_tokens > 0);
  await assert.rejects(
    client.embeddings.create({ model, input: "x", dimensions: 8 }),
    (e: Error & { status?: number }) => e.status === 400,
  );
});

serverTest("the server keeps serving after every error above", async () => {
  const res = await embed({ model, input: "still here" });
  assert.equal(res.data.length, 1);
});

serverTest("GET /v1/models lists the spec ids and aliases with their load state", async () => {
  const res = await fetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } });
  const list = await res.json();
  const ids = list.data.map((m: Json) => m.id);
  for (
    const id of [
      "Vendor/Vendor3.6-35B-A3B",
      "Vendor/Vendor3-Embedding-8B",
      "tiny-moe",
      "tiny-chat",
      "spec-embed",
    ]
  ) {
    assert.ok(ids.includes(id), id);
  }
  for (const m of list.data) {
    assert.equal(m.object, "model");
    assert.equal(m.status, "loaded");
    assert.equal(typeof m.created, "number");
    assert.equal(typeof m.owned_by, "string");
  }
  const one = await fetch(`${server.url}/v1/models/Vendor/Vendor3-Embedding-8B`, {
    headers: { authorization: `Bearer ${KEY}` },
  });
  assert.equal((await one.json()).id, "Vendor/Vendor3-Embedding-8B");
  const health = await (await fetch(`${server.url}/health`)).json();
  assert.deepEqual(health.models.map((m: Json) => m.status), ["loaded", "loaded", "loaded", "loaded"]);
});

serverTest("onnx: a long entry and many short ones arriving together all get their own vectors", async () => {
  const model = "vserve/tiny-embed-onnx";
  const long = "word ".repeat(4000);
  const solo = (await embed({ model, input: long })).data[0].embedding;
  const shorts = Array.from({ length: 12 }, (_, i) => `short ${i}`);
  const [longRes, ...shortRes] = await Promise.all([
    embed({ model, input: long }),
    ...shorts.map((s) => embed({ model, input: s })),
  ]);
  longRes.data[0].embedding.forEach((x: number, i: number) => assert.ok(Math.abs(x - solo[i]) < 1e-5));
  const single = (await embed({ model, input: shorts[5] })).data[0].embedding;
  shortRes[5].data[0].embedding.forEach((x: number, i: number) => assert.ok(Math.abs(x - single[i]) < 1e-5));
});

// Query instructions (Qwen3-Embedding: `Instruct: {task}\nQuery:{text}`), formatted server-side.
const SPEC = "Vendor/Vendor3-Embedding-8B";
const TASK = "Given a web search query, retrieve relevant passages that answer the query";

serverTest(
  "input_type query gives exactly the vector of the hand-formatted string, with its tokens",
  async () => {
    const query = "what is the capital of France?";
    const server_ = await embed({ model: SPEC, input: query, input_type: "query" });
    const hand = await embed({ model: SPEC, input: `Instruct: ${TASK}\nQuery:${query}` });
    assert.deepEqual(server_.data[0].embedding, hand.data[0].embedding);
    assert.deepEqual(server_.usage, hand.usage);
    const plain = await embed({ model: SPEC, input: query });
    assert.notDeepEqual(plain.data[0].embedding, server_.data[0].embedding);
    // usage counts the tokens embedded: the instruction's too.
    const ids = tokenizer.encode(`Instruct: ${TASK}\nQuery:${query}`, { add_special_tokens: false }).ids;
    assert.equal(server_.usage.prompt_tokens, ids.length + 1);
    assert.ok(server_.usage.prompt_tokens > plain.usage.prompt_tokens + 10);
  },
);

serverTest("a request's instruction overrides the default, for every entry of a list", async () => {
  const task = "Given a question, retrieve {code} that answers it";
  const res = await embed({
    model: SPEC,
    input: ["sort a list", "read a file"],
    input_type: "query",
    instruction: task,
  });
  const hand = await embed({
    model: SPEC,
    input: [`Instruct: ${task}\nQuery:sort a list`, `Instruct: ${task}\nQuery:read a file`],
  });
  assert.deepEqual(res.data.map((d: Json) => d.embedding), hand.data.map((d: Json) => d.embedding));
});

serverTest("documents are embedded as sent, with input_type document or none", async () => {
  const doc = "Paris is the capital of France.";
  const a = await embed({ model: SPEC, input: doc, input_type: "document" });
  const b = await embed({ model: SPEC, input: doc });
  assert.deepEqual(a.data[0].embedding, b.data[0].embedding);
  assert.equal(a.usage.prompt_tokens, tokenizer.encode(doc, { add_special_tokens: false }).ids.length + 1);
});

serverTest(
  "a model without a query instruction embeds queries as sent unless the request names one",
  async () => {
    const onnx = "vserve/tiny-embed-onnx";
    const q = await embed({ model: onnx, input: "hello world", input_type: "query" });
    const plain = await embed({ model: onnx, input: "hello world" });
    assert.deepEqual(q.data[0].embedding, plain.data[0].embedding);
    const named = await embed({
      model: onnx,
      input: "hello world",
      input_type: "query",
      instruction: "Find",
    });
    const hand = await embed({ model: onnx, input: "Instruct: Find\nQuery:hello world" });
    assert.deepEqual(named.data[0].embedding, hand.data[0].embedding);
  },
);

serverTest(
  "a wrong input_type, a stray instruction and token-id queries are 400s naming the field",
  async () => {
    for (const input_type of ["search_query", 1, "QUERY"]) {
      const res = await postJson(url, { model: SPEC, input: "x", input_type }, KEY);
      assertApiError(res, 400, { param: "input_type", code: "invalid_value" });
      assert.match(res.body.error.message, /'query' or 'document'/);
    }
    assertApiError(
      await postJson(url, { model: SPEC, input: "x", instruction: "Find" }, KEY),
      400,
      { param: "instruction", code: "invalid_value" },
    );
    assertApiError(
      await postJson(url, { model: SPEC, input: "x", input_type: "query", instruction: "" }, KEY),
      400,
      { param: "instruction", code: "invalid_value" },
    );
    assertApiError(
      await postJson(url, { model: SPEC, input: [1, 2, 3], input_type: "query" }, KEY),
      400,
      { param: "input_type", code: "invalid_value" },
    );
    // The server keeps serving.
    assert.equal((await embed({ model: SPEC, input: "x", input_type: "query" })).data.length, 1);
  },
);
