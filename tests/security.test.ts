/** HTTPS, key handling and hardened defaults, through real server processes. */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import OpenAI from "openai";
import { type Json, postJson, runMain, startServer } from "./helpers/server.ts";
import { poll } from "./helpers/poll.ts";
import { assertApiError, serverTest } from "./helpers/assert.ts";

const CHAT = "Vendor/Vendor3.6-35B-A3B";
const EMBED = "Vendor/Vendor3-Embedding-8B";
const dir = await Deno.makeTempDir();
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

async function sh(cmd: string): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: ["-c", cmd],
    cwd: dir,
    stderr: "piped",
    stdout: "piped",
  }).output();
  if (out.code !== 0) throw new Error(`${cmd}: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

/** A test CA, and server certificates for 127.0.0.1 signed by it. */
await sh(
  "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem " +
    "-days 2 -subj '/CN=vserve test CA' 2>/dev/null",
);
async function serverCert(name: string, cn: string) {
  await sh(
    `openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ${name}.key -out ${name}.csr ` +
      `-subj '/CN=${cn}' 2>/dev/null && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > ${name}.ext && ` +
      `openssl x509 -req -in ${name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out ${name}.pem -days 2 ` +
      `-extfile ${name}.ext 2>/dev/null`,
  );
}
await serverCert("one", "vserve-one");
await serverCert("two", "vserve-two");
await Deno.copyFile(`${dir}/one.pem`, `${dir}/live.pem`);
await Deno.copyFile(`${dir}/one.key`, `${dir}/live.key`);
const client = Deno.createHttpClient({ caCerts: [await Deno.readTextFile(`${dir}/ca.pem`)] });
const tlsFetch = (input: string | URL | Request, init: RequestInit = {}) => fetch(input, { ...init, client });
/** POSTs JSON to the TLS server with `key`. */
const post = (path: string, body: unknown, key: string | null) =>
  postJson(`${server.url}${path}`, body, key, {}, client);

const hashed = createHash("sha256").update("hashed-secret-value").digest("hex");
const keyFile = `${dir}/keys`;
await Deno.writeTextFile(
  keyFile,
  [
    "# test keys",
    `sha256:${hashed} name=hashed-user`,
    "embed-only-secret name=embedder models=Vendor/Vendor3-Embedding-8B",
    "limited-secret name=limited rpm=2",
  ].join("\n"),
);

const server = await startServer(
  [
    "--api-key-file",
    keyFile,
    "--tls-cert",
    `${dir}/live.pem`,
    "--tls-key",
    `${dir}/live.key`,
    "--ops-auth",
    "on",
    "--cors-origin",
    "https://app.example",
  ],
  { waitReady: true, client },
);
globalThis.addEventListener("unload", () => void server.stop());
const port = new URL(server.url).port;

async function peerCommonName(): Promise<string> {
  const text = await sh(
    `openssl s_client -connect 127.0.0.1:${port} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -subject`,
  );
  return text.match(/CN\s*=\s*([\w-]+)/)![1];
}

serverTest("HTTPS: the official openai SDK connects with the test CA", async () => {
  assert.match(server.url, /^https:/);
  const sdk = new OpenAI({
    baseURL: `${server.url}/v1`,
    apiKey: "hashed-secret-value",
    fetch: tlsFetch,
    maxRetries: 0,
  });
  const emb = await sdk.embeddings.create({ model: EMBED, input: "over TLS" });
  assert.equal(emb.data[0].embedding.length, 4096);
  const chat = await sdk.chat.completions.create({
    model: CHAT,
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 2,
  });
  assert.equal(chat.usage?.completion_tokens, 2);
});

serverTest("HTTPS: plain HTTP to the TLS port fails cleanly and the server keeps serving", async () => {
  await assert.rejects(fetch(`http://127.0.0.1:${port}/health`).then((r) => r.text()));
  const res = await tlsFetch(`${server.url}/health`);
  assert.equal(res.status, 200);
  await res.body?.cancel();
});

serverTest("hashed keys are accepted and logged by name, never by value", async () => {
  const res = await tlsFetch(`${server.url}/v1/models`, {
    headers: { authorization: "Bearer hashed-secret-value" },
  });
  assert.equal(res.status, 200);
  await res.body?.cancel();
  const wrong = await tlsFetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${hashed}` } });
  assert.equal(wrong.status, 401, "the hash itself is not a key");
  await wrong.body?.cancel();
  assert.ok(server.logs.some((l) => l.includes('"key":"hashed-user"')));
});

serverTest("a key restricted to some models gets 404 for the others and sees only its own", async () => {
  const key = "embed-only-secret";
  const chat = await post(
    "/v1/chat/completions",
    { model: CHAT, messages: [{ role: "user", content: "x" }] },
    key,
  );
  assertApiError(chat, 404, { code: "model_not_found" });
  const list =
    await (await tlsFetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } }))
      .json();
  assert.deepEqual(list.data.map((m: Json) => m.id).sort(), [EMBED, "spec-embed"]);
  assert.equal((await post("/v1/embeddings", { model: EMBED, input: "allowed" }, key)).status, 200);
});

serverTest("a per-key request rate limit answers 429 with Retry-After and x-ratelimit headers", async () => {
  const call = () =>
    tlsFetch(`${server.url}/v1/models`, { headers: { authorization: "Bearer limited-secret" } });
  const first = await call();
  assert.equal(first.headers.get("x-ratelimit-limit-requests"), "2");
  await first.body?.cancel();
  await (await call()).body?.cancel();
  const third = await call();
  assertApiError({ status: third.status, body: await third.json() }, 429, {
    type: "rate_limit_error",
    code: "rate_limit_exceeded",
  });
  assert.ok(Number(third.headers.get("retry-after")) >= 1);
  assert.equal(third.headers.get("x-ratelimit-remaining-requests"), "0");
});

serverTest("with --ops-auth on, /metrics and /health/ready need a key; /health does not", async () => {
  const open = await tlsFetch(`${server.url}/metrics`);
  assert.equal(open.status, 401);
  await open.body?.cancel();
  const keyed = await tlsFetch(`${server.url}/metrics`, {
    headers: { authorization: "Bearer hashed-secret-value" },
  });
  assert.equal(keyed.status, 200);
  await keyed.body?.cancel();
  const ready = await tlsFetch(`${server.url}/health/ready`);
  assert.equal(ready.status, 401);
  await ready.body?.cancel();
  const live = await tlsFetch(`${server.url}/health`);
  assert.equal(live.status, 200);
  await live.body?.cancel();
});

serverTest("CORS answers configured origins only, preflight included", async () => {
  const pre = await tlsFetch(`${server.url}/v1/chat/completions`, {
    method: "OPTIONS",
    headers: { origin: "https://app.example", "access-control-request-method": "POST" },
  });
  await pre.body?.cancel();
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), "https://app.example");
  assert.match(pre.headers.get("access-control-allow-headers") ?? "", /authorization/);
  const other = await tlsFetch(`${server.url}/health`, { headers: { origin: "https://evil.example" } });
  await other.body?.cancel();
  assert.equal(other.headers.get("access-control-allow-origin"), null);
});

serverTest("responses carry nosniff and no server banner", async () => {
  const res = await tlsFetch(`${server.url}/health`);
  await res.body?.cancel();
  assert.equal(res.headers.get("x-content-type-options"), "nosniff");
  assert.equal(res.headers.get("server"), null);
});

serverTest(
  "SIGHUP reloads the certificate without dropping a running stream, and reloads the keys",
  async () => {
    assert.equal(await peerCommonName(), "vserve-one");
    const stream = await tlsFetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer hashed-secret-value", "content-type": "application/json" },
      body: JSON.stringify({
        model: CHAT,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 200,
        stream: true,
      }),
    });
    const text = stream.text();
    await Deno.copyFile(`${dir}/two.pem`, `${dir}/live.pem`);
    await Deno.copyFile(`${dir}/two.key`, `${dir}/live.key`);
    await Deno.writeTextFile(keyFile, "\nnew-secret name=newcomer\n", { append: true });
    server.signal("SIGHUP");
    await poll(
      "the certificate was reloaded",
      () => server.logs.some((l) => l.includes("reloaded TLS certificate")),
    );
    assert.equal(await peerCommonName(), "vserve-two");
    assert.ok((await text).endsWith("data: [DONE]\n\n"), "the stream started before the reload completed");
    const res = await tlsFetch(`${server.url}/v1/models`, {
      headers: { authorization: "Bearer new-secret" },
    });
    assert.equal(res.status, 200);
    await res.body?.cancel();
    assert.ok(server.logs.some((l) => l.includes("reloaded API keys")));
  },
);

serverTest("no key and no message text ever appear in the logs", async () => {
  assert.equal((await post("/v1/chat/completions", { model: CHAT, messages: [] }, null)).status, 401);
  const ok = await post("/v1/chat/completions", {
    model: CHAT,
    messages: [{ role: "user", content: "PURPLE-ELEPHANT-42" }],
    max_tokens: 2,
  }, "hashed-secret-value");
  assert.equal(ok.status, 200);
  assert.equal((await post("/v1/chat/completions", {}, "WRONG-SECRET-9")).status, 401);
  const logs = server.logs.join("\n");
  for (
    const secret of [
      "hashed-secret-value",
      "embed-only-secret",
      "limited-secret",
      "new-secret",
      "WRONG-SECRET-9",
    ]
  ) {
    assert.ok(!logs.includes(secret), `the log holds ${secret}`);
  }
  assert.ok(!logs.includes("PURPLE-ELEPHANT-42"), "the log holds message content");
});

Deno.test("a missing certificate file is a start-up error naming it", async () => {
  const out = await runMain(["--port", "0", "--tls-cert", `${dir}/nope.pem`, "--tls-key", `${dir}/one.key`]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /nope\.pem/);
});

Deno.test("a key that does not match the certificate is a start-up error naming it", async () => {
  const out = await runMain(["--port", "0", "--tls-cert", `${dir}/one.pem`, "--tls-key", `${dir}/two.key`]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /two\.key' does not match/);
});

Deno.test("--tls-cert without --tls-key is refused", async () => {
  const out = await runMain(["--port", "0", "--tls-cert", `${dir}/one.pem`]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /--tls-cert and --tls-key go together/);
});
