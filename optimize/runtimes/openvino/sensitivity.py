"""Which of NNCF's quantized nodes hurt accuracy most: the ranking behind the int8 back-off.

The float IR and its quantized version run on the same inputs with every quantized node's output
and its activation inputs exposed (by OpenVINO friendly name, which NNCF keeps; its IgnoredScope
takes the same names); each node is scored by the error it adds itself, with the per-channel
measure ONNX Runtime's back-off uses (runtimes/onnxruntime/quant_sensitivity.channel_error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from optimize.runtimes.quantization import channel_error
from optimize.system.interrupts import ensure_signal_stack

# OpenVINO op types whose inputs NNCF quantizes (the ones an IgnoredScope entry helps).
WEIGHTED_TYPES = frozenset(
    {"MatMul", "Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData"}
)
_CONV_TYPES = WEIGHTED_TYPES - {"MatMul"}


def quantized_nodes(quantized: Any) -> list[str]:
    """Friendly names of weighted ops that NNCF fed through a FakeQuantize."""
    names = []
    for op in quantized.get_ordered_ops():
        if op.get_type_name() not in WEIGHTED_TYPES:
            continue
        sources = [i.get_source_output().get_node().get_type_name() for i in op.inputs()]
        if "FakeQuantize" in sources:
            names.append(op.get_friendly_name())
    return names


def _activation_inputs(op: Any) -> list[Any]:
    """The op's inputs that are not constants (through a weight's Convert/Multiply chain too)."""
    outs = []
    for inp in op.inputs():
        src = inp.get_source_output()
        node = src.get_node()
        if node.get_type_name() in ("Constant", "Convert") or _is_constant_chain(node):
            continue
        outs.append(src)
    return outs


def _is_constant_chain(node: Any, depth: int = 4) -> bool:
    if node.get_type_name() == "Constant":
        return True
    if depth == 0 or node.get_type_name() == "Parameter" or not node.inputs():
        return False
    return all(_is_constant_chain(i.get_source_output().get_node(), depth - 1) for i in node.inputs())


def attention_matmuls(model: Any) -> list[str]:
    """MatMuls of two activations (attention's Q x K^T and scores x V): no weights to quantize, and
    the part of a transformer whose int8 error softmax amplifies."""
    return [
        op.get_friendly_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() == "MatMul"
        and not any(_is_constant_chain(i.get_source_output().get_node()) for i in op.inputs())
    ]


def _tensor_key(output: Any) -> str:
    return f"{output.get_node().get_friendly_name()}:{output.get_index()}"


def _probe(model: Any, keys: Sequence[str], samples: Sequence[Mapping[str, np.ndarray]]) -> list[dict]:
    """Run `model` (a fresh copy is changed) with the named node outputs exposed, at f32."""
    import openvino as ov

    model = model.clone()
    by_name = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    wanted: list[tuple[str, Any]] = []
    for key in keys:
        name, _, index = key.rpartition(":")
        op = by_name.get(name)
        if op is not None and int(index) < op.get_output_size():
            wanted.append((key, op.output(int(index))))
    added = model.add_outputs([out for _, out in wanted]) if wanted else []
    compiled = ov.Core().compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    )
    ensure_signal_stack()  # the CPU plugin swaps the thread's signal stack (optimize/system/interrupts.py)
    request = compiled.create_infer_request()
    results = []
    for sample in samples:
        request.infer(dict(sample))
        values = {}
        for (key, _), port in zip(wanted, added, strict=True):
            values[key] = np.array(request.get_tensor(port).data, copy=True)
        results.append(values)
    return results


def rank_sensitive_nodes(
    float_model: Any, quantized: Any, samples: Sequence[Mapping[str, np.ndarray]]
) -> list[tuple[str, float]]:
    """Quantized nodes, most harmful first, with the error each adds (output error minus the
    largest error already on its activation inputs)."""
    names = set(quantized_nodes(quantized))
    nodes = [op for op in float_model.get_ordered_ops() if op.get_friendly_name() in names]
    axes: dict[str, int] = {}
    inputs_of: dict[str, list[str]] = {}
    for op in nodes:
        axis = 1 if op.get_type_name() in _CONV_TYPES else -1
        out_key = _tensor_key(op.output(0))
        axes.setdefault(out_key, axis)
        inputs_of[op.get_friendly_name()] = []
        for src in _activation_inputs(op):
            key = _tensor_key(src)
            axes.setdefault(key, axis)
            inputs_of[op.get_friendly_name()].append(key)
    keys = sorted(axes)
    ref = _probe(float_model, keys, samples)
    got = _probe(quantized, keys, samples)
    errors: dict[str, float] = {}
    for key in keys:
        pairs = [(r[key], g[key]) for r, g in zip(ref, got, strict=True) if key in r and key in g]
        if pairs:
            error = channel_error([p[0] for p in pairs], [p[1] for p in pairs], axes[key])
            if error is not None:
                errors[key] = error
    scored = []
    for op in nodes:
        out_err = errors.get(_tensor_key(op.output(0)))
        if out_err is None:
            continue
        in_err = max((errors.get(k, 0.0) for k in inputs_of[op.get_friendly_name()]), default=0.0)
        scored.append((op.get_friendly_name(), max(out_err - in_err, 0.0), out_err))
    scored.sort(key=lambda item: (item[1], item[2]), reverse=True)
    return [(name, own) for name, own, _ in scored]


__all__ = ["attention_matmuls", "quantized_nodes", "rank_sensitive_nodes"]
