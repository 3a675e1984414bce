"""Which quantized nodes hurt accuracy most: the ranking behind the quantize stage's back-off.

The float model and its quantized version run on the same inputs with every quantizable node's
activation inputs and output exposed; each node is scored by the error it adds itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from optimize.model.onnx_file import read_model, save_model
from optimize.runtimes.quantization import channel_error

if TYPE_CHECKING:
    import onnx

CONV_WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "FusedConv"})


def _float_tensors_of(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> dict[str, int]:
    """Activation inputs and outputs of `nodes` -> their channel axis (1 around Conv, else last)."""
    inits = {init.name for init in model.graph.initializer}
    consts = {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    names: dict[str, int] = {}
    for node in nodes:
        axis = 1 if node.op_type in CONV_WEIGHT_OPS else -1
        for name in [*node.input, *node.output[:1]]:
            if name and name not in inits and name not in consts:
                names.setdefault(name, axis)
    return names


def _run_with_outputs(
    path: Path, names: Sequence[str], samples: Sequence[Mapping[str, np.ndarray]], workdir: Path
) -> list[dict[str, np.ndarray]]:
    """Run `path` on `samples` and return the values of the named (float) tensors."""
    import onnx
    import onnxruntime as ort

    model = read_model(path)
    existing = {o.name for o in model.graph.output}
    produced = {out for node in model.graph.node for out in node.output}
    wanted = [n for n in names if n in produced]
    for name in wanted:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    probe = workdir / f"probe-{path.stem}.onnx"
    extra = save_model(model, probe)
    try:
        so = ort.SessionOptions()
        # No fusion: every probed tensor must exist exactly as named, and nothing may be rewritten.
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        session = ort.InferenceSession(str(probe), so, providers=["CPUExecutionProvider"])
        feeds_names = {i.name for i in session.get_inputs()}
        results = []
        for sample in samples:
            values = session.run(wanted, {k: v for k, v in sample.items() if k in feeds_names})
            results.append(dict(zip(wanted, values, strict=True)))
        return results
    finally:
        for file in [probe, *extra]:
            file.unlink(missing_ok=True)


def quantized_node_names(quant_model: onnx.ModelProto, candidates: Sequence[str]) -> set[str]:
    """Which of the float graph's nodes the quantizer actually changed.

    Dynamic quantization replaces a node (its name disappears); QDQ keeps it but feeds it
    from DequantizeLinear.
    """
    producer = {out: node.op_type for node in quant_model.graph.node for out in node.output}
    by_name = {node.name: node for node in quant_model.graph.node}
    changed = set()
    for name in candidates:
        node = by_name.get(name)
        if node is None or any(producer.get(t) == "DequantizeLinear" for t in node.input):
            changed.add(name)
    return changed


def rank_sensitive_nodes(
    float_path: Path,
    quant_path: Path,
    node_names: Sequence[str],
    samples: Sequence[Mapping[str, np.ndarray]],
    workdir: Path,
) -> list[tuple[str, float]]:
    """Quantizable nodes of `float_path`, most harmful first, with the error each adds.

    A node's score is the per-channel relative error of its output (quantized vs float model)
    minus the largest error already present on its activation inputs: the error it adds itself.
    """

    model = read_model(float_path, load_external_data=False)
    wanted = set(node_names) & quantized_node_names(
        read_model(quant_path, load_external_data=False), node_names
    )
    nodes = [n for n in model.graph.node if n.name in wanted]
    axes = _float_tensors_of(model, nodes)
    tensors = sorted(axes)
    ref = _run_with_outputs(float_path, tensors, samples, workdir)
    got = _run_with_outputs(quant_path, tensors, samples, workdir)
    errors: dict[str, float] = {}
    for name in tensors:
        pairs = [(r[name], g[name]) for r, g in zip(ref, got, strict=True) if name in r and name in g]
        error = channel_error([p[0] for p in pairs], [p[1] for p in pairs], axes[name]) if pairs else None
        if error is not None:
            errors[name] = error
    scored = []
    for node in nodes:
        out_err = errors.get(node.output[0]) if node.output else None
        if out_err is None:
            continue
        in_err = max((errors.get(t, 0.0) for t in node.input), default=0.0)
        scored.append((node.name, max(out_err - in_err, 0.0), out_err))
    scored.sort(key=lambda item: (item[1], item[2]), reverse=True)
    return [(name, own) for name, own, _ in scored]
