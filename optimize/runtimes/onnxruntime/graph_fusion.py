"""Transformer fusions (Attention, SkipLayerNormalization, BiasGelu ...) for ONNX Runtime.

Two fusers, because neither matches every exporter (docs/trained-models.md#fusion-on-modern-exports):
* onnxruntime.transformers: the model type, head count and hidden size are read from the graph
  (the Q projection's Reshape target holds [.., num_heads, head_size], its MatMul weight the
  hidden size). Only the Python fusions run (opt_level=0): no CPU-specific kernels are written.
  It does not fuse attention in torch dynamo exports.
* onnxscript's ORT rewriter (optimize_for_ort), which matches the SDPA pattern those exports
  hold and fuses it to MultiHeadAttention, plus SkipLayerNormalization. Tried when the first
  leaves attention unfused; its output is checked by the pipeline like any candidate.

No graph simplifier runs here: measured (docs/onnxruntime.md#simplifiers), onnxsim and
onnxslim gained nothing on BERT exports and, run before fusion, they stop Attention from fusing.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from optimize.model.onnx_file import (
    constant_values,
    file_has_external_data,
    op_counts,
    read_model,
    save_model,
)
from optimize.stage import Candidate, OnnxRuntimeStage, StageContext, StageSkipped

if TYPE_CHECKING:
    import numpy as np
    import onnx

# Ops between an attention Softmax and its Q·Kᵀ MatMul (scale, mask, casts).
_SCORE_OPS = frozenset({"Add", "Div", "Mul", "Where", "Cast", "Sub"})
# Ops between the Q projection and the Q·Kᵀ MatMul besides Reshape/Transpose.
_Q_PATH_OPS = frozenset({"Transpose", "Div", "Mul", "Add"})
_FUSED_ATTENTION = frozenset({"Attention", "MultiHeadAttention", "QAttention", "PackedAttention"})


@dataclass(frozen=True)
class TransformerShape:
    model_type: str
    num_heads: int
    hidden_size: int
    attention_blocks: int


class _Graph:
    """Producer lookups over the main graph."""

    def __init__(self, model: onnx.ModelProto) -> None:

        self.nodes = list(model.graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.consts = constant_values(model, max_elements=64)
        self.init_dims = {init.name: tuple(int(d) for d in init.dims) for init in model.graph.initializer}

    def parent(self, node: onnx.NodeProto, index: int) -> onnx.NodeProto | None:
        if index >= len(node.input):
            return None
        return self.producer.get(node.input[index])

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name)


def _heads_from_reshape(graph: _Graph, reshape: onnx.NodeProto) -> tuple[int, int] | None:
    """(num_heads, head_size) from a Reshape to [batch, seq, heads, head_size]; -1 stays -1."""
    shape = graph.const(reshape.input[1]) if len(reshape.input) > 1 else None
    if shape is not None and shape.size == 4:
        return int(shape.reshape(-1)[2]), int(shape.reshape(-1)[3])
    concat = graph.parent(reshape, 1)
    if concat is not None and concat.op_type == "Concat" and len(concat.input) == 4:
        # Dynamic-shape exports: Concat(batch, seq, const heads, const head_size).
        heads, size = graph.const(concat.input[2]), graph.const(concat.input[3])
        if heads is not None and size is not None and heads.size == 1 and size.size == 1:
            return int(heads.reshape(-1)[0]), int(size.reshape(-1)[0])
    return None


def _projection_width(graph: _Graph, reshape: onnx.NodeProto) -> int | None:
    """Output width of the MatMul (+bias Add) feeding the Q Reshape."""
    node = graph.parent(reshape, 0)
    for _ in range(2):
        if node is None:
            return None
        if node.op_type in ("MatMul", "Gemm"):
            dims = graph.init_dims.get(node.input[1]) if len(node.input) > 1 else None
            if dims is not None and len(dims) == 2:
                trans_b = any(a.name == "transB" and a.i for a in node.attribute)
                return dims[0] if trans_b else dims[1]
            return None
        if node.op_type != "Add":
            return None
        node = next((p for i in range(2) if (p := graph.parent(node, i)) is not None), None)
    return None


def _attention_shape(graph: _Graph, softmax: onnx.NodeProto) -> tuple[int, int] | None:
    """(num_heads, hidden_size) of the attention block around one Softmax, or None."""
    node: onnx.NodeProto | None = graph.parent(softmax, 0)
    for _ in range(5):  # Softmax <- Add(mask) <- Div(scale) <- MatMul, with a few variations
        if node is None or node.op_type == "MatMul":
            break
        if node.op_type not in _SCORE_OPS:
            return None
        # Follow the activation branch: the one that is not a constant.
        node = next(
            (graph.parent(node, i) for i in range(len(node.input)) if graph.const(node.input[i]) is None),
            None,
        )
    if node is None or node.op_type != "MatMul":
        return None
    query: onnx.NodeProto | None = graph.parent(node, 0)
    for _ in range(4):
        if query is None or query.op_type == "Reshape":
            break
        query = graph.parent(query, 0) if query.op_type in _Q_PATH_OPS else None
    if query is None or query.op_type != "Reshape":
        return None
    heads_size = _heads_from_reshape(graph, query)
    width = _projection_width(graph, query)
    if heads_size is None:
        return None
    heads, head_size = heads_size
    if heads <= 0 and head_size > 0 and width:
        heads = width // head_size
    if head_size <= 0 and heads > 0 and width:
        head_size = width // heads
    if heads <= 0 or head_size <= 0:
        return None
    hidden = heads * head_size
    if width is not None and width != hidden:
        return None
    return heads, hidden


def detect_transformer(model: onnx.ModelProto) -> TransformerShape | None:
    """Find BERT-style self-attention blocks and read their head count and hidden size."""
    graph = _Graph(model)
    shapes = Counter(
        shape
        for node in graph.nodes
        if node.op_type == "Softmax" and (shape := _attention_shape(graph, node)) is not None
    )
    if not shapes:
        return None
    (heads, hidden), _ = shapes.most_common(1)[0]
    return TransformerShape("bert", heads, hidden, sum(shapes.values()))


def _option(options: dict[str, Any], key: str) -> Any:
    """A recipe value, with "auto" (and 0 / empty) meaning: read it from the graph."""
    value = options.get(key)
    return None if value in (None, "", "auto", 0) else value


def fuse_transformer(src: Path, dst: Path, options: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """Run onnxruntime.transformers' Python fusions on `src`, write `dst`; returns (details, side files).

    Raises StageSkipped when no transformer is found or nothing fuses.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    external = file_has_external_data(src)
    model = read_model(src)
    detected = detect_transformer(model)
    model_type = str(_option(options, "model_type") or (detected.model_type if detected else ""))
    num_heads = int(_option(options, "num_heads") or (detected.num_heads if detected else 0))
    hidden_size = int(_option(options, "hidden_size") or (detected.hidden_size if detected else 0))
    if not model_type:
        raise StageSkipped("no transformer structure found")
    fusion = FusionOptions(model_type)
    fusion.enable_gelu_approximation = bool(options.get("gelu_approximation", False))
    if "embed_layer_norm" in options:
        fusion.enable_embed_layer_norm = bool(options["embed_layer_norm"])
    nodes_before = len(model.graph.node)

    log_text = io.StringIO()
    handler = logging.StreamHandler(log_text)
    handler.setLevel(logging.WARNING)
    ort_logger = logging.getLogger("onnxruntime.transformers")
    ort_logger.addHandler(handler)
    try:
        # The fusion code prints and logs freely; keep it off the progress display.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            fused = optimize_model(
                model,
                model_type=model_type,
                num_heads=num_heads,
                hidden_size=hidden_size,
                optimization_options=fusion,
                opt_level=0,
                use_gpu=False,
            )
    finally:
        ort_logger.removeHandler(handler)
    stats = {op: int(n) for op, n in fused.get_fused_operator_statistics().items() if n}
    if not stats:
        raise StageSkipped(f"onnxruntime.transformers found nothing to fuse for model type {model_type!r}")
    out_model = fused.model
    # Keep weights in a side file when the input had them there (big models).
    extra = save_model(out_model, dst, external=external or None)
    warnings = sorted({line.strip() for line in log_text.getvalue().splitlines() if line.strip()})
    from_options = bool(_option(options, "num_heads") or _option(options, "hidden_size"))
    details: dict[str, Any] = {
        "model_type": model_type,
        "num_heads": num_heads,
        "hidden_size": hidden_size,
        "shape_source": "options" if from_options else "graph",
        "attention_blocks_found": detected.attention_blocks if detected else None,
        "fused_ops": stats,
        "attention_fused": any(stats.get(op, 0) for op in _FUSED_ATTENTION),
        "fully_optimized": bool(fused.is_fully_optimized()),
        "nodes_before": nodes_before,
        "nodes_after": len(out_model.graph.node),
        "ops_after": dict(op_counts(out_model)),
        "warnings": warnings[:10],
    }
    return details, extra


class GraphFusionStage(OnnxRuntimeStage):
    name: ClassVar[str] = "graph-fusion"
    description: ClassVar[str] = (
        "transformer fusions (Attention, SkipLayerNorm, Gelu) from onnxruntime.transformers"
    )

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        if reason := super().skip_reason(candidate, ctx):
            return reason

        model = read_model(candidate.model_path, load_external_data=False)
        ops = op_counts(model)
        if any(ops.get(f"com.microsoft:{op}", 0) for op in _FUSED_ATTENTION):
            return "attention is already fused"
        if _option(ctx.options, "model_type") is None and detect_transformer(model) is None:
            return "no transformer structure found (no self-attention Softmax fed by a Q·Kᵀ MatMul)"
        return None

    def run(self, candidate: Candidate, ctx: StageContext) -> Iterator[Candidate]:
        path = ctx.workdir / "fused.onnx"
        attention_fused = False
        nothing: list[str] = []
        try:
            details, extra = fuse_transformer(candidate.model_path, path, ctx.options)
        except StageSkipped as exc:
            nothing.append(f"onnxruntime.transformers: {exc}")
        else:
            attention_fused = details["attention_fused"]
            if not attention_fused:
                ctx.log("onnxruntime.transformers left attention unfused (dynamo exports do not match)")
            yield self._candidate(candidate, self.name, path, details, extra)
        if attention_fused:
            return
        path = ctx.workdir / "fused-onnxscript.onnx"
        try:
            details, extra = fuse_with_onnxscript(candidate.model_path, path)
        except StageSkipped as exc:
            if nothing:  # neither fuser found anything
                raise StageSkipped(f"{nothing[0]}; onnxscript: {exc}") from exc
            ctx.log(f"onnxscript: {exc}")
            return
        yield self._candidate(candidate, f"{self.name}:onnxscript", path, details, extra)

    @staticmethod
    def _candidate(
        base: Candidate, label: str, path: Path, details: dict[str, Any], extra: list[Path]
    ) -> Candidate:
        return Candidate(
            label=label,
            model_path=path,
            backend=base.backend,
            runtime_config=dict(base.runtime_config),
            standard_ops=False,  # com.microsoft fused ops: ORT only
            precision=base.precision,
            details=details,
            extra_files=extra,
        )


def fuse_with_onnxscript(src: Path, dst: Path) -> tuple[dict[str, Any], list[Path]]:
    """onnxscript's ORT fusions; StageSkipped when it is missing or fuses nothing."""
    try:
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    except ImportError as exc:
        raise StageSkipped(f"needs onnxscript ({exc.name} is not installed)") from exc

    model = ir.serde.deserialize_model(read_model(src))
    nodes_before = sum(1 for _ in model.graph)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        fused, counts = optimize_for_ort(model)
    stats = {name: int(n) for name, n in counts.items() if n}
    out_model = ir.serde.serialize_model(fused)
    ops = op_counts(out_model)
    attention = any(ops.get(f"com.microsoft:{op}", 0) for op in _FUSED_ATTENTION)
    if not stats:
        raise StageSkipped("found nothing to fuse")
    extra = save_model(out_model, dst, external=file_has_external_data(src) or None)
    details: dict[str, Any] = {
        "fuser": "onnxscript.rewriter.ort_fusions.optimize_for_ort",
        "fused_ops": stats,
        "attention_fused": attention,
        "nodes_before": nodes_before,
        "nodes_after": len(out_model.graph.node),
        "ops_after": dict(ops),
    }
    return details, extra
