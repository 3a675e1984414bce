"""Model surgery for tests, also used by the benchmarks: "model X with +N% compute".

`add_extra_work` gives the same outputs with measurably more work, to check that `lto gate`
catches a real slowdown. The extra work is a chain of MatMul+Tanh layers fed by the model's float
input or output with the most rows, sized so its multiply-accumulates are `extra` x the model's
(MatMul, Gemm and Conv counted, by `count_macs`). The chain is reduced to a scalar, multiplied by
zero and added to a float output, so the runtime must compute it; Tanh keeps every value finite,
so 0 * chain is exactly 0 and the outputs are bit-identical to the original's.

`benchmarks/slow_model.py` writes such a model to a file from the command line.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _static_copy(
    model: onnx.ModelProto, dims: dict[str, int], input_shapes: dict[str, tuple[int, ...]] | None = None
) -> onnx.ModelProto:
    """A copy with every dynamic input dim pinned and shapes inferred: whole inputs from
    `input_shapes` (exports that name every dim "?"), named dims from `dims`, others 1."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        pinned = (input_shapes or {}).get(value.name)
        for i, d in enumerate(value.type.tensor_type.shape.dim):
            if pinned is not None and i < len(pinned):
                d.dim_value = pinned[i]
            elif not d.HasField("dim_value") or d.dim_value <= 0:
                d.dim_value = dims.get(d.dim_param, 1)
    return onnx.shape_inference.infer_shapes(copy, data_prop=True)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if not value.type.tensor_type.HasField("shape"):
            continue  # rank unknown
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            shapes[value.name] = [int(d.dim_value) for d in dims]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    missing = [
        name
        for node in model.graph.node
        if node.op_type in ("MatMul", "Gemm", "Conv")
        for name in (*node.input[:2], node.output[0])
        if name not in shapes
    ]
    if missing:
        shapes.update(_shapes_by_running(model, missing))
    return shapes


def _shapes_by_running(model: onnx.ModelProto, names: list[str]) -> dict[str, list[int]]:
    """Shapes that inference could not find (a Reshape to a computed shape, as Paddle exports
    write), read off one run of the static copy on zeros with ONNX Runtime."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    inits = {i.name for i in probe.graph.initializer}
    wanted = [n for n in dict.fromkeys(names) if n not in known and n not in inits]
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in wanted)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    types = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}
    feeds = {
        i.name: np.zeros(
            [d.dim_value for d in i.type.tensor_type.shape.dim],
            types.get(i.type.tensor_type.elem_type, np.float32),
        )
        for i in probe.graph.input
        if i.name not in inits
    }
    outs = session.run(None, feeds)
    return {o.name: list(v.shape) for o, v in zip(session.get_outputs(), outs, strict=True)}


def count_macs(
    model: onnx.ModelProto,
    dims: dict[str, int] | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> int:
    """Multiply-accumulates of MatMul, Gemm and Conv (the work that dominates these models)."""
    inferred = _static_copy(model, dims or {}, input_shapes)
    shapes = _shapes(inferred)
    total = 0
    for node in inferred.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
            out = shapes.get(node.output[0])
            if a is None or b is None or out is None:
                raise ValueError(f"cannot infer the shapes of {node.op_type} {node.name!r}")
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            k = a[-2] if (node.op_type == "Gemm" and trans_a) else a[-1]
            total += math.prod(out) * k
        elif node.op_type == "Conv":
            w, out = shapes.get(node.input[1]), shapes.get(node.output[0])
            if w is None or out is None:
                raise ValueError(f"cannot infer the shapes of Conv {node.name!r}")
            total += math.prod(out) * math.prod(w[1:])
    return total


def add_extra_work(
    model: onnx.ModelProto,
    extra: float,
    *,
    width: int = 128,
    dims: dict[str, int] | None = None,
    seed: int = 0,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> tuple[onnx.ModelProto, int]:
    """Return (slower model, chain layers) with about `extra` x the model's MACs added.

    `dims` pins named dynamic dims for the MAC count (e.g. {"sequence": 128}), `input_shapes`
    whole inputs (e.g. {"x": (1, 3, 48, 192)}); the batch dim cancels out because the chain's
    work scales with it like the model's.
    """
    if extra <= 0:
        raise ValueError("extra must be positive")
    base = count_macs(model, dims, input_shapes)
    inferred = _static_copy(model, dims or {}, input_shapes)
    shapes = _shapes(inferred)
    floats = [
        v
        for v in [*model.graph.input, *model.graph.output]
        if v.type.tensor_type.elem_type == TensorProto.FLOAT and v.name in shapes and shapes[v.name]
    ]
    target = next((o for o in model.graph.output if o in floats), None)
    if target is None:
        raise ValueError("the model has no float output with a known shape to add the extra work to")
    # Feed the chain from the float tensor with the most rows: a GEMM over many rows runs at
    # the machine's real compute rate, a chain of matrix-vector products would be all overhead.
    source = max(floats, key=lambda v: math.prod(shapes[v.name][:-1]))
    rows, depth = math.prod(shapes[source.name][:-1]), shapes[source.name][-1]
    layers = round((extra * base - rows * depth * width) / (rows * width * width))
    if layers > 16:  # widen rather than stack hundreds of tiny layers
        width = max(width, 16 * round(math.sqrt(extra * base / (rows * 16)) / 16))
        layers = round((extra * base - rows * depth * width) / (rows * width * width))
    if layers < 1:  # the projection alone is too much: one layer, narrower, to hit the target
        layers = 1
        width = max(8, round((-depth + math.sqrt(depth * depth + 4 * extra * base / rows)) / 2))

    slow = onnx.ModelProto()
    slow.CopyFrom(model)
    graph = slow.graph
    pre = f"{target.name}__before_extra_work"
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == target.name:
                node.output[i] = pre
    rng = np.random.default_rng(seed)

    def weight(name: str, n_in: int, n_out: int) -> str:
        arr = (rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(arr, name))
        return name

    x = pre if source.name == target.name else source.name
    nodes = []
    for i in range(layers + 1):
        w = weight(f"extra_work.w{i}", depth if i == 0 else width, width)
        mm, th = f"extra_work.mm{i}", f"extra_work.tanh{i}"
        nodes.append(helper.make_node("MatMul", [x, w], [mm], name=mm))
        nodes.append(helper.make_node("Tanh", [mm], [th], name=th))
        x = th
    graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "extra_work.zero"))
    nodes += [
        helper.make_node("ReduceSum", [x], ["extra_work.sum"], name="extra_work.sum", keepdims=0),
        helper.make_node(
            "Mul", ["extra_work.sum", "extra_work.zero"], ["extra_work.nothing"], name="extra_work.mul"
        ),
        helper.make_node("Add", [pre, "extra_work.nothing"], [target.name], name="extra_work.add"),
    ]
    graph.node.extend(nodes)
    onnx.checker.check_model(slow)
    return slow, layers
