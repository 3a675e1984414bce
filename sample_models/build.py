"""Build the sample ONNX models that lto's tests, docs and benchmarks run on.

    python sample_models/build.py            # rewrite the committed files in sample_models/
    python sample_models/build.py --out DIR  # write them somewhere else

The weights are seeded random numbers (numpy's PCG64), NOT trained: the models compute nothing
meaningful, but they have the graph structure, sizes and value ranges of real exports, so
fusion, layout, quantization and benchmarking behave as they would on a trained model.
Building twice gives byte-identical files (no timestamps, no library versions in the protobuf).

* bert_tiny.onnx   BERT encoder (2 layers, hidden 128, 4 heads, FFN 512, vocab 1000, 512 positions)
                   laid out like the TorchScript export of Hugging Face `BertModel` (eager attention),
                   so `onnxruntime.transformers.optimizer.optimize_model(model_type="bert")` fuses it
                   into EmbedLayerNormalization / Attention / SkipLayerNormalization / BiasGelu.
                   Inputs input_ids, attention_mask, token_type_ids: int64 [batch, sequence].
                   Outputs last_hidden_state [batch, sequence, 128], pooler_output [batch, 128].
* resnet_tiny.onnx ResNet-style CNN: Conv-BN-Relu stem, MaxPool, basic residual blocks at widths
                   32-64-128 (1x1 projection where stride or width changes), GlobalAveragePool,
                   Flatten, Gemm to 100 classes. BatchNormalization is kept unfolded.
                   Input pixel_values: float32 [batch, 3, 64, 64]. Output logits [batch, 100].
* mlp_small.onnx   Gemm+Relu, MatMul+Add+Relu, Gemm: float32 features [batch, 256] -> logits [batch, 10].

All use opset 17 and IR version 8 so that older onnxruntime releases (1.14+) load them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "lto sample_models/build.py"
# Fixed, so the files do not change when the onnx package is upgraded.
PRODUCER_VERSION = "1"
HERE = Path(__file__).resolve().parent


class GraphBuilder:
    """Collects nodes and initializers with deterministic names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def _name(self, op: str) -> str:
        n = self._counts.get(op, 0)
        self._counts[op] = n + 1
        return f"/{op}_{n}"

    def node(
        self, op: str, inputs: list[str], n_out: int = 1, name: str | None = None, **attrs: object
    ) -> str:
        name = name or self._name(op)
        outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def const(self, value: np.ndarray | float | int, dtype: type = np.float32) -> str:
        """A Constant node, as exporters emit for scalars and shapes (kept out of the initializers)."""
        arr = np.asarray(value, dtype=dtype)
        name = self._name("Constant")
        out = f"{name}_output_0"
        self.nodes.append(
            helper.make_node("Constant", [], [out], name=name, value=numpy_helper.from_array(arr, out))
        )
        return out

    def weight(self, name: str, arr: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.weight(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def uniform(self, name: str, shape: tuple[int, ...], low: float, high: float) -> str:
        return self.weight(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def model(
        self, graph_name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], doc: str
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version=PRODUCER_VERSION,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        helper.set_model_props(model, {"weights": "seeded random, not trained"})
        onnx.checker.check_model(model, full_check=True)
        return model


# ----------------------------------------------------------------------------------------------- BERT


def build_bert_tiny(
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    ffn: int = 512,
    vocab: int = 1000,
    max_positions: int = 512,
    type_vocab: int = 2,
    seed: int = 1,
) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    head_size = hidden // heads
    std = 0.02  # BERT's initializer_range

    def layer_norm(x: str, prefix: str) -> str:
        gamma = g.weight(f"{prefix}.weight", (1.0 + g.rng.standard_normal(hidden) * 0.05).astype(np.float32))
        beta = g.normal(f"{prefix}.bias", (hidden,), 0.02)
        return g.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)

    def linear(x: str, prefix: str, n_in: int, n_out: int) -> str:
        w = g.normal(f"{prefix}.weight", (n_in, n_out), std)
        b = g.normal(f"{prefix}.bias", (n_out,), std)
        # The TorchScript exporter puts the bias first: Add(bias, MatMul(x, W)).
        return g.node("Add", [b, g.node("MatMul", [x, w])])

    # Embeddings: word + token type + position (the position ids are a [1, max_positions] buffer
    # sliced to the sequence length, as in the export), then LayerNorm.
    word = g.node(
        "Gather", [g.normal("embeddings.word_embeddings.weight", (vocab, hidden), std), "input_ids"]
    )
    token_type = g.node(
        "Gather",
        [g.normal("embeddings.token_type_embeddings.weight", (type_vocab, hidden), std), "token_type_ids"],
    )
    embeddings = g.node("Add", [word, token_type])
    seq_len = g.node("Gather", [g.node("Shape", ["input_ids"]), g.const(1, np.int64)], axis=0)
    seq_end = g.node("Unsqueeze", [seq_len, g.const([0], np.int64)])
    position_ids = g.node(
        "Slice",
        [
            g.weight("embeddings.position_ids", np.arange(max_positions, dtype=np.int64)[None, :]),
            g.const([0], np.int64),
            seq_end,
            g.const([1], np.int64),
            g.const([1], np.int64),
        ],
    )
    positions = g.node(
        "Gather",
        [g.normal("embeddings.position_embeddings.weight", (max_positions, hidden), std), position_ids],
    )
    x = layer_norm(g.node("Add", [embeddings, positions]), "embeddings.LayerNorm")

    # Additive mask: (1 - mask[:, None, None, :]) * -10000.
    mask = g.node(
        "Unsqueeze", [g.node("Unsqueeze", ["attention_mask", g.const([1], np.int64)]), g.const([2], np.int64)]
    )
    mask = g.node("Cast", [mask], to=TensorProto.FLOAT)
    mask = g.node("Mul", [g.node("Sub", [g.const(1.0), mask]), g.const(-10000.0)])

    split_heads = g.const([0, 0, heads, head_size], np.int64)
    merge_heads = g.const([0, 0, hidden], np.int64)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = g.node("Reshape", [linear(x, f"{p}.attention.self.query", hidden, hidden), split_heads])
        q = g.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.node("Reshape", [linear(x, f"{p}.attention.self.key", hidden, hidden), split_heads])
        k = g.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.node("Reshape", [linear(x, f"{p}.attention.self.value", hidden, hidden), split_heads])
        v = g.node("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.node("Div", [g.node("MatMul", [q, k]), g.const(math.sqrt(head_size))])
        probs = g.node("Softmax", [g.node("Add", [scores, mask])], axis=-1)
        context = g.node("Transpose", [g.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.node("Reshape", [context, merge_heads])
        attn_out = linear(context, f"{p}.attention.output.dense", hidden, hidden)
        x = layer_norm(g.node("Add", [attn_out, x]), f"{p}.attention.output.LayerNorm")

        h = linear(x, f"{p}.intermediate.dense", hidden, ffn)
        # Exact GELU as torch exports it: (h * 0.5) * (1 + erf(h / sqrt(2))).
        erf = g.node("Erf", [g.node("Div", [h, g.const(1.4142135381698608)])])
        h = g.node("Mul", [g.node("Mul", [h, g.const(0.5)]), g.node("Add", [erf, g.const(1.0)])])
        ffn_out = linear(h, f"{p}.output.dense", ffn, hidden)
        x = layer_norm(g.node("Add", [ffn_out, x]), f"{p}.output.LayerNorm")

    g.nodes.append(
        helper.make_node("Identity", [x], ["last_hidden_state"], name="/Identity_last_hidden_state")
    )
    first_token = g.node("Gather", ["last_hidden_state", g.const(0, np.int64)], axis=1)
    pooled = g.node(
        "Gemm",
        [
            first_token,
            g.normal("pooler.dense.weight", (hidden, hidden), std),
            g.normal("pooler.dense.bias", (hidden,), std),
        ],
        transB=1,
    )
    g.nodes.append(helper.make_node("Tanh", [pooled], ["pooler_output"], name="/Tanh_pooler"))

    int_input = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]),
        helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", hidden]),
    ]
    doc = (
        f"BERT-style encoder ({layers} layers, hidden {hidden}, {heads} heads, ffn {ffn}, vocab {vocab}); "
        "seeded random weights, not trained."
    )
    return g.model("bert_tiny", int_input, outputs, doc)


# --------------------------------------------------------------------------------------------- ResNet


def build_resnet_tiny(
    *,
    widths: tuple[int, ...] = (32, 64, 128),
    blocks: tuple[int, ...] = (2, 1, 1),
    image: int = 64,
    classes: int = 100,
    seed: int = 2,
) -> onnx.ModelProto:
    g = GraphBuilder(seed)

    def conv_bn(
        x: str, prefix: str, c_in: int, c_out: int, k: int, stride: int, gamma_low: float = 0.8
    ) -> str:
        # He initialisation keeps activations at unit scale through the ReLUs.
        w = g.normal(f"{prefix}.conv.weight", (c_out, c_in, k, k), math.sqrt(2.0 / (c_in * k * k)))
        pad = k // 2
        y = g.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        bn = [
            g.uniform(f"{prefix}.bn.weight", (c_out,), gamma_low, 1.2),
            g.normal(f"{prefix}.bn.bias", (c_out,), 0.1),
            g.normal(f"{prefix}.bn.running_mean", (c_out,), 0.1),
            g.uniform(f"{prefix}.bn.running_var", (c_out,), 0.5, 1.5),
        ]
        return g.node("BatchNormalization", [y, *bn], epsilon=1e-5)

    x = g.node("Relu", [conv_bn("pixel_values", "stem", 3, widths[0], 3, 1)])
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = widths[0]
    for s, (width, n_blocks) in enumerate(zip(widths, blocks, strict=True)):
        for b in range(n_blocks):
            stride = 2 if (s > 0 and b == 0) else 1
            p = f"stage{s + 1}.block{b + 1}"
            y = g.node("Relu", [conv_bn(x, f"{p}.conv1", c_in, width, 3, stride)])
            # A smaller last-BN scale, as residual nets are usually trained to have.
            y = conv_bn(y, f"{p}.conv2", width, width, 3, 1, gamma_low=0.3)
            shortcut = (
                x
                if (stride == 1 and c_in == width)
                else conv_bn(x, f"{p}.downsample", c_in, width, 1, stride)
            )
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            c_in = width
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    g.nodes.append(
        helper.make_node(
            "Gemm",
            [
                x,
                g.normal("fc.weight", (classes, c_in), math.sqrt(1.0 / c_in)),
                g.normal("fc.bias", (classes,), 0.01),
            ],
            ["logits"],
            name="/Gemm_fc",
            transB=1,
        )
    )
    inputs = [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, image, image])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])]
    doc = (
        f"ResNet-style CNN (widths {'-'.join(map(str, widths))}, blocks {'-'.join(map(str, blocks))}, "
        f"{image}x{image} input, {classes} classes); seeded random weights, not trained."
    )
    return g.model("resnet_tiny", inputs, outputs, doc)


# ------------------------------------------------------------------------------------------------ MLP


def build_mlp_small(
    *, features: int = 256, hidden: tuple[int, int] = (512, 128), classes: int = 10, seed: int = 3
) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    h1, h2 = hidden
    x = g.node(
        "Gemm",
        [
            "features",
            g.normal("fc1.weight", (h1, features), math.sqrt(2.0 / features)),
            g.normal("fc1.bias", (h1,), 0.01),
        ],
        transB=1,
    )
    x = g.node("Relu", [x])
    x = g.node(
        "Add",
        [
            g.node("MatMul", [x, g.normal("fc2.weight", (h1, h2), math.sqrt(2.0 / h1))]),
            g.normal("fc2.bias", (h2,), 0.01),
        ],
    )
    x = g.node("Relu", [x])
    g.nodes.append(
        helper.make_node(
            "Gemm",
            [
                x,
                g.normal("fc3.weight", (classes, h2), math.sqrt(1.0 / h2)),
                g.normal("fc3.bias", (classes,), 0.01),
            ],
            ["logits"],
            name="/Gemm_fc3",
            transB=1,
        )
    )
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", features])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])]
    doc = f"MLP {features}-{h1}-{h2}-{classes}; seeded random weights, not trained."
    return g.model("mlp_small", inputs, outputs, doc)


BUILDERS = {
    "bert_tiny.onnx": build_bert_tiny,
    "resnet_tiny.onnx": build_resnet_tiny,
    "mlp_small.onnx": build_mlp_small,
}


def _write_atomic(path: Path, data: bytes) -> None:
    # This script runs without the package installed, so it cannot import optimize.files;
    # the same temp-file-then-rename keeps an interrupted build from leaving half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def build_all(out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for filename, builder in BUILDERS.items():
        path = out_dir / filename
        _write_atomic(path, builder().SerializeToString())
        written[filename] = path
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: sample_models/)")
    args = parser.parse_args(argv)
    for filename, path in build_all(args.out).items():
        print(f"{filename:18s} {path.stat().st_size / 1e6:6.2f} MB  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
