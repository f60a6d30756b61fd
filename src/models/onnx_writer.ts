/**
 * A small ONNX embedding model over the real Qwen3 vocabulary: token table (fp16) → linear →
 * tanh gives `last_hidden_state`; a masked mean gives `sentence_embedding`. Inputs `input_ids`
 * and `attention_mask` (int64 [batch, tokens]), as Hugging Face exports name them.
 */
import onnxProto from "onnx-proto";
import type { onnx as Onnx } from "onnx-proto";

const { onnx } = onnxProto;
import { loadQwen3Vocab } from "./qwen3_vocab.ts";
import { mulberry32 } from "../random.ts";

/** The shape of a generated ONNX model. */
export interface OnnxPreset {
  dim: number;
  seed: number;
}

/** The built-in ONNX presets. */
export const ONNX_PRESETS: Record<string, OnnxPreset> = {
  "tiny-embed-onnx": { dim: 128, seed: 5 },
};

const FLOAT = onnx.TensorProto.DataType.FLOAT;
const FLOAT16 = onnx.TensorProto.DataType.FLOAT16;
const INT64 = onnx.TensorProto.DataType.INT64;

function tensor(name: string, dataType: number, dims: number[], rawData: Uint8Array): Onnx.ITensorProto {
  return { name, dataType, dims, rawData };
}

function int64s(values: number[]): Uint8Array {
  const out = new Uint8Array(values.length * 8);
  const view = new DataView(out.buffer);
  values.forEach((v, i) => view.setBigInt64(i * 8, BigInt(v), true));
  return out;
}

function node(
  opType: string,
  input: string[],
  output: string[],
  attrs: Record<string, number> = {},
): Onnx.INodeProto {
  return {
    opType,
    input,
    output,
    name: `${opType}_${output[0]}`,
    attribute: Object.entries(attrs).map(([name, i]) => ({
      name,
      i,
      type: onnx.AttributeProto.AttributeType.INT,
    })),
  };
}

function valueInfo(name: string, elemType: number, dims: (number | string)[]): Onnx.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType,
        shape: { dim: dims.map((d) => typeof d === "number" ? { dimValue: d } : { dimParam: d }) },
      },
    },
  };
}

/** The serialized model for a preset (deterministic bytes). */
export async function buildOnnxModel(preset: OnnxPreset): Promise<Uint8Array> {
  const vocab = await loadQwen3Vocab();
  const vocabSize = vocab.tokens.length;
  const rand = mulberry32(preset.seed);
  const table = new Uint8Array(vocabSize * preset.dim * 2);
  const tview = new DataView(table.buffer);
  for (let i = 0; i < vocabSize * preset.dim; i++) tview.setFloat16(i * 2, rand() * 2 - 1, true);
  const w = new Float32Array(preset.dim * preset.dim);
  const scale = Math.sqrt(3 / preset.dim);
  for (let i = 0; i < w.length; i++) w[i] = (rand() * 2 - 1) * scale;
  const graph: Onnx.IGraphProto = {
    name: "vserve_tiny_embed",
    initializer: [
      tensor("token_table", FLOAT16, [vocabSize, preset.dim], table),
      tensor("proj", FLOAT, [preset.dim, preset.dim], new Uint8Array(w.buffer)),
      tensor("axis1", INT64, [1], int64s([1])),
      tensor("axis2", INT64, [1], int64s([2])),
      tensor("eps", FLOAT, [], new Uint8Array(new Float32Array([1e-9]).buffer)),
    ],
    node: [
      node("Gather", ["token_table", "input_ids"], ["x16"], { axis: 0 }),
      node("Cast", ["x16"], ["x"], { to: FLOAT }),
      node("MatMul", ["x", "proj"], ["y"]),
      node("Tanh", ["y"], ["last_hidden_state"]),
      node("Cast", ["attention_mask"], ["mask"], { to: FLOAT }),
      node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
      node("Mul", ["last_hidden_state", "mask3"], ["masked"]),
      node("ReduceSum", ["masked", "axis1"], ["summed"], { keepdims: 0 }),
      node("ReduceSum", ["mask3", "axis1"], ["count"], { keepdims: 0 }),
      node("Max", ["count", "eps"], ["safe_count"]),
      node("Div", ["summed", "safe_count"], ["sentence_embedding"]),
    ],
    input: [
      valueInfo("input_ids", INT64, ["batch", "tokens"]),
      valueInfo("attention_mask", INT64, ["batch", "tokens"]),
    ],
    output: [
      valueInfo("last_hidden_state", FLOAT, ["batch", "tokens", preset.dim]),
      valueInfo("sentence_embedding", FLOAT, ["batch", preset.dim]),
    ],
  };
  return onnx.ModelProto.encode({
    irVersion: 8,
    producerName: "vserve",
    producerVersion: "1",
    opsetImport: [{ domain: "", version: 17 }],
    graph,
  }).finish();
}

/** Writes ONNX preset `name` to `path`. */
export async function writePresetOnnx(name: string, path: string): Promise<void> {
  const preset = ONNX_PRESETS[name];
  if (!preset) throw new Error(`unknown ONNX preset '${name}'`);
  await Deno.writeFile(path, await buildOnnxModel(preset));
}
