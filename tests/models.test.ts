/**
 * The self-made models and the registry: GGUF and ONNX writers read back by the real runtimes,
 * tokenisation parity, determinism, strict start-up, and hub downloads against a local stand-in.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { getLlama, type LlamaModel } from "node-llama-cpp";
import * as ort from "onnxruntime-node";
import { Tokenizer } from "@huggingface/tokenizers";
import { resolveSource } from "../src/models/sources.ts";
import { writePresetGguf } from "../src/models/presets.ts";
import { qwen3TokenizerJsonPath } from "../src/models/qwen3_vocab.ts";
import { fetchFromHub, hubCachePath, parseHubRef } from "../src/models/hub.ts";
import { silentLogger } from "../src/log.ts";
import { runMain, startServer } from "./helpers/server.ts";
import { serverTest } from "./helpers/assert.ts";

const CACHE = new URL("../models/cache", import.meta.url).pathname;
const source = (s: string) =>
  resolveSource(s, { cacheDir: CACHE, hubUrl: "http://127.0.0.1:9", log: silentLogger });
const tokenizerPath = qwen3TokenizerJsonPath();
const tokenizerConfig = JSON.parse(
  await Deno.readTextFile(tokenizerPath.replace("tokenizer.json", "tokenizer_config.json")),
);
const tokenizer = new Tokenizer(JSON.parse(await Deno.readTextFile(tokenizerPath)), tokenizerConfig);
const llama = await getLlama({ build: "never", gpu: false, logLevel: "error" as never });
/** A test that loads a builtin preset in node-llama-cpp and disposes it afterwards. */
function modelTest(name: string, preset: string, fn: (model: LlamaModel) => void | Promise<void>) {
  Deno.test({
    name,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async () => {
      const model = await llama.loadModel({ modelPath: await source(`builtin:${preset}`) });
      try {
        await fn(model);
      } finally {
        await model.dispose();
      }
    },
  });
}
const sha256 = async (path: string) => createHash("sha256").update(await Deno.readFile(path)).digest("hex");

const MULTILINGUAL = [
  "¿Dónde está la biblioteca? Está cerca del parque.",
  "The quick brown fox jumps over the lazy dog.",
  "A ação está em promoção até sexta-feira.",
  "L'àvia va anar al mercat a comprar peix.",
  "Perché non andiamo al cinema stasera?",
  "Où se trouve la gare, s'il vous plaît ?",
  "Schöne Grüße aus München — Straße, Übung.",
  "我们明天在北京见面吧，好吗？",
  "Emoji: 🙂🎉👩‍💻🇪🇸 and symbols ∑∫≈",
];

modelTest(
  "tiny-chat GGUF loads in node-llama-cpp as qwen3 with the Qwen3 vocabulary and chat template",
  "tiny-chat",
  (model) => {
    const meta = model.fileInfo.metadata;
    assert.equal(meta.general.architecture, "qwen3");
    assert.equal(meta.tokenizer.ggml.tokens.length, 151669);
    assert.equal(model.tokens.eos, 151645);
    assert.equal(model.tokens.eosString, "<|im_end|>");
    assert.equal(meta.tokenizer.chat_template, tokenizerConfig.chat_template);
    assert.deepEqual(model.tokenize("<|im_start|>user", true).slice(0, 1), [151644]);
    assert.deepEqual(model.tokenize("<think>", true), [151667]);
  },
);

modelTest("tiny-embed GGUF declares last-token pooling and end-of-text as EOS", "tiny-embed", (model) => {
  const meta = model.fileInfo.metadata as { qwen3: { pooling_type: number } };
  assert.equal(meta.qwen3.pooling_type, 3);
  assert.equal(model.tokens.eos, 151643);
  assert.equal(model.embeddingVectorSize, 128);
});

modelTest(
  "multilingual text tokenises to identical ids in llama.cpp and in tokenizer.json",
  "tiny-embed",
  (model) => {
    for (const text of MULTILINGUAL) {
      assert.deepEqual(Array.from(model.tokenize(text, false)), tokenizer.encode(text).ids, text);
    }
  },
);

Deno.test("the ONNX model loads in onnxruntime-node with HF input and output names", async () => {
  const session = await ort.InferenceSession.create(await source("builtin:tiny-embed-onnx"));
  try {
    assert.deepEqual([...session.inputNames].sort(), ["attention_mask", "input_ids"]);
    assert.deepEqual([...session.outputNames].sort(), ["last_hidden_state", "sentence_embedding"]);
    const ids = tokenizer.encode("hola").ids;
    const shape = [1, ids.length];
    const out = await session.run({
      input_ids: new ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)), shape),
      attention_mask: new ort.Tensor("int64", new BigInt64Array(ids.length).fill(1n), shape),
    });
    assert.deepEqual(out.sentence_embedding.dims, [1, 128]);
    assert.deepEqual(out.last_hidden_state.dims, [1, ids.length, 128]);
  } finally {
    await session.release();
  }
});

Deno.test("the same preset generates byte-identical files", async () => {
  const dir = await Deno.makeTempDir();
  await writePresetGguf("tiny-chat", `${dir}/a.gguf`);
  await writePresetGguf("tiny-chat", `${dir}/b.gguf`);
  assert.equal(await sha256(`${dir}/a.gguf`), await sha256(`${dir}/b.gguf`));
  await Deno.remove(dir, { recursive: true });
});

Deno.test("an unknown builtin preset is an error listing the known ones", async () => {
  await assert.rejects(source("builtin:huge-chat"), /unknown builtin preset 'huge-chat' \(known: tiny-chat/);
});

Deno.test("--chat-model naming a missing file refuses to start, naming the file", async () => {
  const out = await runMain(["--port", "0", "--chat-model", "/nonexistent/model.gguf"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /\/nonexistent\/model\.gguf/);
});

Deno.test("a registry file with a bad entry refuses to start, naming the entry and field", async () => {
  const file = await Deno.makeTempFile({ suffix: ".json" });
  await Deno.writeTextFile(
    file,
    JSON.stringify({ models: [{ id: "x", kind: "vision", source: "builtin:tiny-chat" }] }),
  );
  const out = await runMain(["--port", "0", "--models", file]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /models\[0\]\.kind/);
  await Deno.remove(file);
});

// ---- hub downloads, against a stand-in hub on 127.0.0.1 ----

const payload = new Uint8Array(300_000).map((_, i) => (i * 7919) % 251);
const payloadSha = createHash("sha256").update(payload).digest("hex");
let cutNextDownload = false;
let corrupt = false;
const hubRequests: string[] = [];
const hub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
  const path = new URL(req.url).pathname;
  const range = req.headers.get("range");
  hubRequests.push(`${path} ${range ?? ""}`);
  if (path.startsWith("/org/embed/resolve/main/tiny-embed.gguf")) {
    return new Response(Deno.readFileSync(tinyEmbedPath));
  }
  if (!path.startsWith("/org/repo/resolve/main/weights.bin")) return new Response("no", { status: 404 });
  const body = corrupt ? payload.map((b) => b ^ 1) : payload;
  const start = range ? Number(range.match(/bytes=(\d+)-/)![1]) : 0;
  const rest = body.subarray(start);
  if (cutNextDownload) {
    cutNextDownload = false;
    // Send half, then break the connection.
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(rest.subarray(0, rest.length / 2));
        setTimeout(() => c.error(new Error("cut")), 50);
      },
    });
    return new Response(stream, {
      status: range ? 206 : 200,
      headers: { "content-length": String(rest.length) },
    });
  }
  return new Response(rest, {
    status: range ? 206 : 200,
    headers: range ? { "content-range": `bytes ${start}-${body.length - 1}/${body.length}` } : {},
  });
});
const hubUrl = `http://127.0.0.1:${hub.addr.port}`;
const tinyEmbedPath = await source("builtin:tiny-embed");
globalThis.addEventListener("unload", () => void hub.shutdown());

serverTest("hf: a cut download resumes with a Range request and verifies its SHA-256", async () => {
  const cacheDir = await Deno.makeTempDir();
  const src = "hf:org/repo/weights.bin";
  cutNextDownload = true;
  hubRequests.length = 0;
  await assert.rejects(fetchFromHub(src, { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha }));
  const part = `${hubCachePath(cacheDir, parseHubRef(src))}.part`;
  const partial = (await Deno.stat(part)).size;
  assert.ok(partial > 0 && partial < payload.length, `partial file of ${partial} bytes`);
  const path = await fetchFromHub(src, {
    hubUrl,
    cacheDir,
    log: silentLogger,
    sha256: payloadSha,
    size: payload.length,
  });
  assert.deepEqual(await Deno.readFile(path), payload);
  assert.equal(hubRequests.at(-1), `/org/repo/resolve/main/weights.bin bytes=${partial}-`);
  // A complete file is reused without asking the hub again.
  const before = hubRequests.length;
  await fetchFromHub(src, { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha });
  assert.equal(hubRequests.length, before);
  await Deno.remove(cacheDir, { recursive: true });
});

serverTest("hf: a corrupted download is rejected and removed", async () => {
  const cacheDir = await Deno.makeTempDir();
  corrupt = true;
  try {
    await assert.rejects(
      fetchFromHub("hf:org/repo/weights.bin", { hubUrl, cacheDir, log: silentLogger, sha256: payloadSha }),
      /SHA-256 .* expected/,
    );
    const target = hubCachePath(cacheDir, parseHubRef("hf:org/repo/weights.bin"));
    assert.equal(await Deno.stat(`${target}.part`).catch(() => null), null);
    assert.equal(await Deno.stat(target).catch(() => null), null);
  } finally {
    corrupt = false;
    await Deno.remove(cacheDir, { recursive: true });
  }
});

serverTest("hf: references with path tricks are refused", () => {
  assert.throws(() => parseHubRef("hf:org/repo/../../etc/passwd"), /not a valid hf: source/);
  assert.deepEqual(parseHubRef("hf:org/repo/dir/f.gguf@v1.0"), {
    repo: "org/repo",
    file: "dir/f.gguf",
    revision: "v1.0",
  });
  return Promise.resolve();
});

serverTest(
  "a server configured with an hf: model downloads it from the configured hub and serves it",
  async () => {
    const cacheDir = await Deno.makeTempDir();
    const registry = await Deno.makeTempFile({ suffix: ".json" });
    await Deno.writeTextFile(
      registry,
      JSON.stringify({
        models: [{
          id: "org/embed",
          kind: "embedding",
          source: "hf:org/embed/tiny-embed.gguf",
          sha256: await sha256(tinyEmbedPath),
          maxInputTokens: 512,
          parallel: 1,
        }],
      }),
    );
    const server = await startServer(
      ["--api-key", "k", "--models", registry, "--model-cache", cacheDir, "--hub-url", hubUrl],
      { waitReady: true },
    );
    try {
      const list = await (await fetch(`${server.url}/v1/models`, { headers: { authorization: "Bearer k" } }))
        .json();
      assert.deepEqual(list.data.map((m: { id: string; status: string }) => [m.id, m.status]), [[
        "org/embed",
        "loaded",
      ]]);
      const res = await fetch(`${server.url}/v1/embeddings`, {
        method: "POST",
        headers: { authorization: "Bearer k", "content-type": "application/json" },
        body: JSON.stringify({ model: "org/embed", input: "downloaded" }),
      });
      assert.equal(res.status, 200);
      assert.equal((await res.json()).data[0].embedding.length, 128);
    } finally {
      await server.stop();
      await Deno.remove(cacheDir, { recursive: true });
      await Deno.remove(registry);
    }
  },
);
