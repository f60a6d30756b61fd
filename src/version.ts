/** What `GET /version` reports: this server's version and the engines it runs on. */
import denoJson from "../deno.json" with { type: "json" };

const pinned = (name: string) =>
  denoJson.imports[name as keyof typeof denoJson.imports]?.split("@").pop() ?? "unknown";

/** The version document. */
export const VERSION_INFO = {
  name: "vserve",
  version: "0.2.0",
  deno: Deno.version.deno,
  engines: {
    "node-llama-cpp": pinned("node-llama-cpp"),
    "llama.cpp": "v0.4.0",
    "onnxruntime-node": pinned("onnxruntime-node"),
  },
} as const;
