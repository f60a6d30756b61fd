/**
 * The onnxruntime session, in a worker of its own: onnxruntime-node's `session.run` computes on the
 * thread that calls it, so on the server's thread one run of a large batch held every route (a
 * `/health` probe waited 4.2 s during a 2,000-input request of 200-word texts). Here the server's
 * event loop goes on while a batch runs. Messages: see {@link SessionRequest} and {@link SessionReply}.
 */
import * as ort from "onnxruntime-node";

/** What the engine asks of the worker. */
export type SessionRequest =
  | { type: "load"; modelPath: string; threads: number; cuda: boolean }
  | {
    type: "run";
    id: number;
    /** Token ids, one row per sequence padded to `width`. */
    ids: BigInt64Array;
    /** Each sequence's length. */
    lengths: Int32Array;
    width: number;
    pooling: "mean" | "cls" | "last";
  }
  | { type: "release" };

/** What the worker answers. */
export type SessionReply =
  | { type: "loaded"; provider: string; cudaError?: string }
  | { type: "result"; id: number; vectors: Float32Array; dims: number }
  | { type: "error"; id: number; message: string }
  | { type: "released" };

/** This worker's side of the channel. */
const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<SessionRequest>) => void) | null;
  postMessage(reply: SessionReply, transfer: Transferable[]): void;
};
const post = (reply: SessionReply, transfer: Transferable[] = []) => scope.postMessage(reply, transfer);
let session: ort.InferenceSession | undefined;

async function load(req: Extract<SessionRequest, { type: "load" }>): Promise<SessionReply> {
  const base = {
    intraOpNumThreads: req.threads,
    interOpNumThreads: 1,
    graphOptimizationLevel: "all" as const,
  };
  let cudaError: string | undefined;
  if (req.cuda) {
    try {
      session = await ort.InferenceSession.create(req.modelPath, {
        ...base,
        executionProviders: ["cuda", "cpu"],
      });
      return { type: "loaded", provider: "cuda" };
    } catch (e) {
      cudaError = (e as Error).message.split("\n")[0];
    }
  }
  session = await ort.InferenceSession.create(req.modelPath, { ...base, executionProviders: ["cpu"] });
  return { type: "loaded", provider: "cpu", cudaError };
}

/** Runs one padded batch and pools each sequence's hidden states into `n × dims` floats. */
async function run(
  req: Extract<SessionRequest, { type: "run" }>,
): Promise<{ vectors: Float32Array; dims: number }> {
  const n = req.lengths.length;
  const { width } = req;
  const mask = new BigInt64Array(n * width);
  for (let b = 0; b < n; b++) mask.fill(1n, b * width, b * width + req.lengths[b]);
  const shape = [n, width];
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor("int64", req.ids, shape),
    attention_mask: new ort.Tensor("int64", mask, shape),
  };
  if (session!.inputNames.includes("token_type_ids")) {
    feeds.token_type_ids = new ort.Tensor("int64", new BigInt64Array(n * width), shape);
  }
  const out = await session!.run(feeds, ["last_hidden_state"]);
  const hidden = out.last_hidden_state;
  const dims = hidden.dims[2];
  const data = hidden.data as Float32Array;
  const vectors = new Float32Array(n * dims);
  for (let b = 0; b < n; b++) {
    const vec = vectors.subarray(b * dims, (b + 1) * dims);
    const length = req.lengths[b];
    const row = (t: number) => data.subarray((b * width + t) * dims, (b * width + t + 1) * dims);
    if (req.pooling === "cls") vec.set(row(0));
    else if (req.pooling === "last") vec.set(row(length - 1));
    else {
      for (let t = 0; t < length; t++) {
        const r = row(t);
        for (let d = 0; d < dims; d++) vec[d] += r[d];
      }
      for (let d = 0; d < dims; d++) vec[d] /= length;
    }
  }
  hidden.dispose();
  return { vectors, dims };
}

scope.onmessage = async (event: MessageEvent<SessionRequest>) => {
  const req = event.data;
  if (req.type === "load") {
    try {
      post(await load(req));
    } catch (e) {
      post({ type: "error", id: -1, message: (e as Error).message });
    }
  } else if (req.type === "run") {
    try {
      const { vectors, dims } = await run(req);
      post({ type: "result", id: req.id, vectors, dims }, [vectors.buffer as ArrayBuffer]);
    } catch (e) {
      post({ type: "error", id: req.id, message: (e as Error).message });
    }
  } else {
    try {
      await session?.release();
    } catch {
      // Freed with the worker, which ends next.
    }
    session = undefined;
    post({ type: "released" });
  }
};
