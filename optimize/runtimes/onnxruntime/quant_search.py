"""The points the quantize stage searches, in the order they are worth trying, and what can be
skipped once earlier points are known.

What the order rests on (measured on pretrained models: docs/trained-models.md and
docs/onnxruntime.md#quantization):
* MatMul-heavy graphs (transformers): dynamic int8 with per-channel weights is the usual winner
  (per-tensor costs a trained BERT cosine 0.89 for no speed); static QDQ on MatMul is slower
  and less accurate there but is a different kernel family, so it is measured too.
* Conv nets: static QDQ, U8 activations / S8 per-channel weights, on Conv+MatMul+Gemm (the
  all-op scope breaks one-hot paths and detection heads); on depthwise mobile nets every int8
  variant can lose to fp32, which the pipeline's timing then says. Conv nets holding MatMul or
  LSTM weights (CNN+RNN recognizers) also get dynamic int8 on those.
* Points that differ only in activation ranges (calibration method, symmetric activations) run
  the same kernels: they are tried only when every earlier point on those kernels was inaccurate.
* Per-tensor weights run the same kernels as per-channel and are less accurate: tried only when
  the per-channel twin failed inside ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from optimize.stage import Outcome

if TYPE_CHECKING:
    import onnx

# Op scopes: which op types get quantized.
SCOPES: dict[str, tuple[str, ...] | None] = {
    "matmul": ("MatMul", "Gemm"),
    "conv-matmul": ("Conv", "MatMul", "Gemm"),
    "all": None,  # every op ONNX Runtime's static quantizer knows
}
# The dynamic (integer-op) quantizer's ops, minus convolutions (ConvInteger is 4-12x slower).
DYNAMIC_EXTRA_OPS = ("Attention", "LSTM", "GRU")


@dataclass(frozen=True)
class QuantPoint:
    """One configuration of onnxruntime.quantization."""

    mode: str  # "dynamic" | "static"
    scope: str  # a SCOPES key
    per_channel: bool = True
    calibration: str = ""  # minmax | percentile | entropy (static only)
    symmetric_activations: bool = False
    fuse_after: bool = False  # attention fused (onnxscript) into the quantized graph

    @property
    def label(self) -> str:
        parts = [
            "dynamic" if self.mode == "dynamic" else "qdq",
            "pc" if self.per_channel else "pt",
            self.scope,
        ]
        if self.calibration:
            parts.append(self.calibration)
        if self.symmetric_activations:
            parts.append("sym")
        if self.fuse_after:
            parts.append("mha")
        return "-".join(parts)

    @property
    def kernels(self) -> tuple[str, str, bool]:
        """Points with equal kernels run at the same speed; only their accuracy can differ."""
        return (self.mode, self.scope, self.fuse_after)

    def op_types(self) -> list[str] | None:
        ops = SCOPES[self.scope]
        if ops is None:
            return None
        return [*ops, *DYNAMIC_EXTRA_OPS] if self.mode == "dynamic" else list(ops)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "scope": self.scope,
            "op_types": self.op_types() or "all",
            "per_channel": self.per_channel,
            "calibration": self.calibration or None,
            "symmetric_activations": self.symmetric_activations,
            "attention_fused_after": self.fuse_after,
        }


def search_space(
    kind: str,
    *,
    has_matmul_weights: bool,
    transformer: bool,
    has_conv_weights: bool = False,
    mode: str = "auto",
    per_channel: bool | None = None,
    calibration: str | None = None,
) -> list[QuantPoint]:
    """The points for a model, most promising first. `kind` ("matmul" or "conv", by where most
    weights are) picks the family searched first; the other family follows when the model has
    such weights (a CNN with a large classifier, a CNN+RNN recognizer). `mode`, `per_channel`
    and `calibration` (recipe options) narrow the space."""
    D, S = "dynamic", "static"
    matmul_family = [
        QuantPoint(D, "matmul"),
        *([QuantPoint(D, "matmul", fuse_after=True)] if transformer else []),
        QuantPoint(D, "matmul", per_channel=False),
        QuantPoint(S, "matmul", calibration="minmax"),
        QuantPoint(S, "matmul", calibration="percentile"),
        QuantPoint(S, "matmul", calibration="entropy"),
    ]
    conv_family = [
        QuantPoint(S, "conv-matmul", calibration="minmax"),
        QuantPoint(S, "conv-matmul", calibration="percentile"),
        QuantPoint(S, "conv-matmul", calibration="entropy"),
        QuantPoint(S, "conv-matmul", calibration="minmax", symmetric_activations=True),
        QuantPoint(S, "all", calibration="minmax"),
        QuantPoint(S, "conv-matmul", per_channel=False, calibration="minmax"),
    ]
    if kind == "matmul":
        points = matmul_family + (conv_family if has_conv_weights else [])
    else:
        points = conv_family[:4] + (matmul_family[:1] if has_matmul_weights else []) + conv_family[4:]
    if mode in (D, S):
        points = [p for p in points if p.mode == mode]
    if per_channel is not None:
        points = [p for p in points if p.per_channel == per_channel]
    if calibration:
        points = [p for p in points if p.mode == D or p.calibration == calibration]
    return points


def dominated_reason(point: QuantPoint, tried: Mapping[QuantPoint, Outcome], explicit: bool = False) -> str:
    """Why `point` cannot beat what was tried ("" when it is worth trying). `tried` maps earlier
    points to their outcome: kept | slower | unverified | inaccurate | failed (StageContext.outcomes).
    `explicit`: the recipe asked for exactly this family, so only outright duplicates are skipped."""
    same_kernels = [(p, o) for p, o in tried.items() if p.kernels == point.kernels]
    if point.fuse_after:
        # The same quantization with attention fused after: a speed variant of its unfused twin.
        unfused = QuantPoint(point.mode, point.scope, point.per_channel, point.calibration)
        outcome = tried.get(unfused)
        if outcome in (Outcome.INACCURATE, Outcome.FAILED):
            return f"the same quantization without fusion ({unfused.label}) was {outcome}"
        return ""
    if not point.per_channel:
        twin = next((o for p, o in tried.items() if p == _per_channel_twin(point)), None)
        if twin is not None and twin != Outcome.FAILED and not explicit:
            return (
                f"per-tensor weights run the same kernels as {_per_channel_twin(point).label} ({twin}) "
                "and are less accurate"
            )
        return ""
    if explicit:
        return ""
    decided = [(p, o) for p, o in same_kernels if o in (Outcome.KEPT, Outcome.SLOWER, Outcome.UNVERIFIED)]
    if decided:
        p, outcome = decided[0]
        what = {
            Outcome.KEPT: "was kept",
            Outcome.SLOWER: "was accurate but not faster than the best",
            Outcome.UNVERIFIED: "was measured but could not be verified on the data given",
        }[outcome]
        return f"only the activation ranges differ from {p.label}, which {what}: it cannot be faster"
    return ""


def _per_channel_twin(point: QuantPoint) -> QuantPoint:
    return QuantPoint(
        point.mode, point.scope, True, point.calibration, point.symmetric_activations, point.fuse_after
    )


# ---------------------------------------------------------------------------------------------
# Known failures inside onnxruntime.quantization, and the settings that avoid them.


@dataclass(frozen=True)
class Workaround:
    name: str
    signature: str  # a substring of the error message
    extra_options: Mapping[str, Any]
    why: str


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        "no-int32-bias-weight-adjust",
        "truth value of an array with more than one element is ambiguous",
        {"QDQDisableWeightAdjustForInt32Bias": True},
        "ORT 1.32's per-channel bias check fails on some real conv weights",
    ),
    Workaround(
        "default-tensor-type",
        "Unable to find data type for weight_name",
        {"DefaultTensorType": 1},  # onnx.TensorProto.FLOAT
        "shape inference could not type a tensor (fused or re-exported graphs)",
    ),
)


def workaround_for(error: str, applied: Sequence[str]) -> Workaround | None:
    """The known workaround for an error message, unless it was already applied."""
    return next((w for w in WORKAROUNDS if w.signature in error and w.name not in applied), None)


# ---------------------------------------------------------------------------------------------
# Groups of nodes that back-off tries to keep in float as a whole, and what a node costs.


def node_costs(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, float]:
    """Multiply-accumulates per node where the output shape is known, else weight parameters:
    a relative cost, to keep the cheapest nodes in float when several choices pass."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        shapes = {
            vi.name: [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
            for vi in [*inferred.graph.value_info, *inferred.graph.output]
        }
    except Exception:  # shape inference is best effort here
        shapes = {}
    sizes = {init.name: int(np.prod(init.dims)) if init.dims else 1 for init in model.graph.initializer}
    wanted = set(names)
    costs: dict[str, float] = {}
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        weight = max((sizes.get(i, 0) for i in node.input[1:2]), default=0) or 1
        out = shapes.get(node.output[0]) if node.output else None
        if node.op_type in ("Conv", "ConvTranspose") and out and len(out) > 2 and all(out[2:]):
            costs[node.name] = float(weight * int(np.prod(out[2:])))
        elif out and len(out) >= 2 and all(out[:-1]):
            costs[node.name] = float(weight * int(np.prod(out[:-2] or [1])) * out[-2])
        else:
            costs[node.name] = float(weight)
    return costs


def output_head(model: onnx.ModelProto, quantizable: Sequence[str]) -> list[str]:
    """Quantizable nodes from which a graph output is reached without passing another one: the
    layers that write the outputs (a detector's score convs, a classifier's last Gemm)."""
    wanted = set(quantizable)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    head: list[str] = []
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        frontier, seen = list(node.output), set()
        while frontier:
            tensor = frontier.pop()
            if tensor in outputs:
                head.append(node.name)
                break
            for nxt in consumers.get(tensor, []):
                if nxt.name in wanted or id(nxt) in seen:
                    continue
                seen.add(id(nxt))
                frontier.extend(nxt.output)
    return head


def _weight_kn(node: onnx.NodeProto, dims: Mapping[str, tuple[int, ...]]) -> tuple[int, int] | None:
    """(input features, output features) of a MatMul/Gemm with a 2-D initializer weight."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    shape = dims.get(node.input[1])
    if not shape or len(shape) != 2:
        return None
    trans_b = any(a.name == "transB" and a.i for a in node.attribute)
    return (int(shape[1]), int(shape[0])) if trans_b else (int(shape[0]), int(shape[1]))


def attention_projections(model: onnx.ModelProto, quantizable: Sequence[str]) -> list[str]:
    """Q/K/V and output projections (square weights, or [h, 3h] when Q, K and V are packed): the
    attention half of a transformer's weights, kept in float apart from the FFN half."""
    dims = {init.name: tuple(init.dims) for init in model.graph.initializer}
    wanted = set(quantizable)
    found = []
    for node in model.graph.node:
        kn = _weight_kn(node, dims) if node.name in wanted else None
        if kn and kn[0] > 1 and (kn[1] == kn[0] or kn[1] == 3 * kn[0]):
            found.append(node.name)
    return found


def late_ffn_outputs(model: onnx.ModelProto, quantizable: Sequence[str]) -> list[str]:
    """The FFN down-projections (weight [r*h, h], r = 2..8) of the later half of a transformer's
    layers: where accuracy-aware tuners of BERT-class models most often fall back to float."""
    dims = {init.name: tuple(init.dims) for init in model.graph.initializer}
    wanted = set(quantizable)
    down = []
    for node in model.graph.node:
        kn = _weight_kn(node, dims) if node.name in wanted else None
        if kn is None:
            continue
        k, n = kn
        if n > 0 and 2 <= k / n <= 8:  # FFN expansion ratios; a classifier head's is far larger
            down.append(node.name)  # graph order is layer order
    return down[len(down) // 2 :]


__all__ = [
    "SCOPES",
    "WORKAROUNDS",
    "QuantPoint",
    "Workaround",
    "attention_projections",
    "dominated_reason",
    "late_ffn_outputs",
    "node_costs",
    "output_head",
    "search_space",
    "workaround_for",
]
