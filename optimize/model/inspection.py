"""What is in an ONNX file: versions, inputs/outputs, ops, parameters, compute, validity.

Compute convention (what `macs` and `flops` mean):

* MatMul, Gemm, Conv, ConvTranspose are counted exactly from the tensor shapes: MACs are the
  multiply-accumulates of the product, FLOPs = 2 x MACs plus one per output element for a bias.
  MatMul: prod(output shape) x K. Gemm: M x N x K. Conv: prod(output shape) x (C_in / group) x
  prod(kernel). ConvTranspose: prod(input shape) x (C_out / group) x prod(kernel).
* Elementwise arithmetic and activations (Add, Mul, Relu, Erf, Tanh, ...): 1 FLOP per output element.
* Normalizations and softmax, per element: Softmax 5 (max, subtract, exp, sum, divide),
  LayerNormalization 8, SkipLayerNormalization 9, BatchNormalization 2 (folded scale and shift),
  Gelu 8, FastGelu/BiasGelu 9. Pooling: one per window element per output; global pooling and
  reductions: one per input element.
* Data movement (Reshape, Transpose, Gather, Slice, Concat, Cast, Shape, ...): 0 FLOPs.
* Ops outside these tables (contrib kernels such as Attention, custom ops) are not counted and
  are listed under `not_counted`, so the totals are a lower bound when that list is not empty.
  Nodes inside control-flow bodies (If/Loop/Scan) are not walked; the If/Loop node itself is
  listed as not counted.

Tensor shapes come from onnxruntime's symbolic shape inference (it follows Shape->Slice chains
that onnx's own inference loses), falling back to onnx shape inference if it fails.

FLOPs depend on the input shapes: with dynamic dims they are only computed once every dim is
pinned (`--shape`), never guessed.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.errors import InputError
from optimize.model.onnx_file import (
    check_model,
    external_data_files,
    load_model,
    model_sha256,
    opset_version,
    symbolic_infer_shapes,
    uses_external_data,
)

if TYPE_CHECKING:
    import onnx

ELEMENTWISE = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Neg", "Abs", "Max", "Min",
        "Mean", "Sum", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid",
        "HardSwish", "Tanh", "Erf", "Softplus", "Softsign", "Clip", "Where", "Equal", "Greater", "Less",
        "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "Sign", "Floor", "Ceil", "Round",
        "Mod", "Sin", "Cos", "QuickGelu", "BiasAdd", "Mish",
    }
)  # fmt: skip
PER_ELEMENT = {
    "Softmax": 5, "LogSoftmax": 5, "LayerNormalization": 8, "SkipLayerNormalization": 9,
    "SimplifiedLayerNormalization": 6, "SkipSimplifiedLayerNormalization": 7, "BatchNormalization": 2,
    "InstanceNormalization": 8, "GroupNormalization": 8, "Gelu": 8, "FastGelu": 9, "BiasGelu": 9,
}  # fmt: skip
REDUCE_INPUT = frozenset(
    {
        "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
        "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin",
    }
)  # fmt: skip
WINDOW = frozenset({"MaxPool", "AveragePool", "LpPool"})
DATA_MOVEMENT = frozenset(
    {
        "Reshape", "Transpose", "Gather", "GatherElements", "GatherND", "Slice", "Concat", "Split",
        "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "CastLike", "Shape", "Size", "Constant",
        "ConstantOfShape", "Expand", "Tile", "Pad", "Range", "Dropout", "DepthToSpace", "SpaceToDepth",
        "ScatterND", "ScatterElements", "NonZero", "TopK", "OneHot", "Trilu",
    }
)  # fmt: skip
MATMUL_LIKE = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv")
CONVENTION = (
    "MACs exact for MatMul/Gemm/Conv/ConvTranspose (FLOPs = 2 x MACs + bias); "
    "elementwise 1 FLOP per element; Softmax 5, LayerNorm 8, BatchNorm 2 per element; "
    "data movement 0 (see optimize/model/inspection.py)"
)


def _dtype_name(elem_type: int) -> str:
    """numpy's name where numpy has the type (float32, int64), else ONNX's (bfloat16, float8e4m3fn)."""
    import numpy as np
    import onnx

    onnx_name = onnx.helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()
    if onnx_name in ("bfloat16", "string") or onnx_name.startswith(
        ("float8", "float4", "int4", "uint4", "int2")
    ):
        return onnx_name
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx_name


def _elem_bytes(elem_type: int) -> float:
    import numpy as np
    import onnx

    name = _dtype_name(elem_type)
    if name in ("int4", "uint4", "float4e2m1"):
        return 0.5
    if name in ("int2", "uint2"):
        return 0.25
    if name == "string":
        return 0.0
    if name.startswith("float8"):
        return 1.0
    return float(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)


def _value_shape(value: onnx.ValueInfoProto) -> list[int | str | None]:
    dims: list[int | str | None] = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return dims


def _io(values: Any, initializers: set[str]) -> list[dict[str, Any]]:
    out = []
    for v in values:
        if v.name in initializers:
            continue
        tensor_type = v.type.tensor_type
        out.append(
            {
                "name": v.name,
                "dtype": _dtype_name(tensor_type.elem_type) if tensor_type.elem_type else "unknown",
                "shape": _value_shape(v) if tensor_type.HasField("shape") else None,
            }
        )
    return out


def _parameters(model: onnx.ModelProto) -> dict[str, Any]:
    by_dtype: dict[str, dict[str, float]] = {}
    count = 0
    size = 0.0
    for init in model.graph.initializer:
        n = math.prod(init.dims)
        if _dtype_name(init.data_type) == "string":
            nbytes = float(sum(len(s) for s in init.string_data))
        else:
            nbytes = n * _elem_bytes(init.data_type)
        entry = by_dtype.setdefault(_dtype_name(init.data_type), {"tensors": 0, "count": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["count"] += n
        entry["bytes"] += nbytes
        count += n
        size += nbytes
    return {
        "tensors": len(model.graph.initializer),
        "count": count,
        "bytes": math.ceil(size),
        "by_dtype": {k: {**v, "bytes": math.ceil(v["bytes"])} for k, v in sorted(by_dtype.items())},
    }


def _pin_inputs(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]
) -> dict[str, list[int | str | None]]:
    """Apply --shape pins (by input name or by dim name) to the graph inputs, in place.

    A pin by input name also binds that input's named dims, so `--shape input_ids=1x128`
    pins `batch` and `sequence` in attention_mask too. Returns the resulting input shapes.
    """
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    by_name = {v.name: v for v in inputs}
    dim_names = {d for v in inputs for d in _value_shape(v) if isinstance(d, str)}
    for key in shapes:
        if key not in by_name and key not in dim_names:
            raise InputError(
                f"--shape {key}: the model has no input or dynamic dim named {key!r}",
                f"inputs: {', '.join(by_name) or 'none'}; "
                f"dynamic dims: {', '.join(sorted(dim_names)) or 'none'}",
            )
    bound: dict[str, int] = {k: v[0] for k, v in shapes.items() if k in dim_names and k not in by_name}
    for key, dims in shapes.items():
        if key in dim_names and key not in by_name and len(dims) != 1:
            raise InputError(f"--shape {key}: a named dim takes one size, e.g. {key}=128")
    for name, dims in shapes.items():
        if name not in by_name:
            continue
        declared = _value_shape(by_name[name])
        if len(declared) != len(dims):
            raise InputError(
                f"--shape {name}={'x'.join(map(str, dims))} has rank {len(dims)}, "
                f"the model's input {name!r} has rank {len(declared)} (shape {declared})"
            )
        for axis, (want, got) in enumerate(zip(declared, dims, strict=True)):
            if isinstance(want, int) and want != got:
                raise InputError(f"--shape {name}: axis {axis} is fixed at {want} in the model, not {got}")
            if isinstance(want, str):
                if bound.get(want, got) != got:
                    raise InputError(f"--shape pins dim {want!r} to both {bound[want]} and {got}")
                bound[want] = got
    pinned: dict[str, list[int | str | None]] = {}
    for v in inputs:
        explicit = shapes.get(v.name)
        for axis, d in enumerate(v.type.tensor_type.shape.dim):
            size = explicit[axis] if explicit else (bound.get(d.dim_param) if d.dim_param else None)
            if size is not None:
                d.ClearField("dim_param")
                d.dim_value = size
        pinned[v.name] = _value_shape(v)
    return pinned


def _infer_shapes(model: onnx.ModelProto) -> tuple[dict[str, list[int | str | None]], str]:
    """Tensor name -> shape for every tensor inference reaches, and which engine produced it."""
    inferred, engine = _inferred_model(model)
    shapes = {}
    for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = _value_shape(v)
    for init in inferred.graph.initializer:
        shapes[init.name] = [int(d) for d in init.dims]
    return shapes, engine


def _inferred_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The model annotated by shape inference (symbolic, else onnx's), and the engine's name."""
    import onnx

    engine = "onnxruntime symbolic shape inference"
    try:
        inferred = symbolic_infer_shapes(model)
    except Exception:
        # The symbolic engine asserts on graphs it does not understand; onnx's own inference is
        # weaker (no data propagation through Slice, for one) but robust, so fall back to it.
        engine = "onnx shape inference"
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
            # No shapes beyond the declared ones: every cost then shows up as unknown.
            engine = "none (shape inference failed; see checks)"
            inferred = model
    if inferred is None:  # the symbolic engine declines opsets below 7
        inferred = model
    return inferred, engine


def _static(shape: list[int | str | None] | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _node_cost(node: onnx.NodeProto, shapes: dict[str, list[int | str | None]]) -> tuple[int, int] | None:
    """(MACs, FLOPs) of one node, or None when it is not counted or shapes are unknown."""
    op = node.op_type

    def shape(i: int, outputs: bool = False) -> list[int] | None:
        names = node.output if outputs else node.input
        if i >= len(names) or not names[i]:
            return None
        s = shapes.get(names[i])
        return s if _static(s) else None  # type: ignore[return-value]

    out = shape(0, outputs=True)
    if op in DATA_MOVEMENT:
        return 0, 0
    if op in ("MatMul", "FusedMatMul", "MatMulInteger"):
        a = shape(0)
        if out is None or a is None:
            return None
        # FusedMatMul may transpose A; K is then its second-to-last dim.
        transposed = op == "FusedMatMul" and _attr(node, "transA", 0) and len(a) >= 2
        k = a[-2] if transposed else a[-1]
        macs = math.prod(out) * k
        return macs, 2 * macs
    if op in ("Gemm", "FusedGemm"):
        a = shape(0)
        if out is None or a is None:
            return None
        k = a[0] if _attr(node, "transA", 0) else a[1]
        macs = math.prod(out) * k
        bias = math.prod(out) if len(node.input) > 2 and node.input[2] else 0
        return macs, 2 * macs + bias
    if op in ("Conv", "FusedConv", "ConvInteger"):
        w = shape(1)
        if out is None or w is None:
            return None
        macs = math.prod(out) * math.prod(w[1:])
        bias = math.prod(out) if len(node.input) > 2 and node.input[2] else 0
        return macs, 2 * macs + bias
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        if out is None or x is None or w is None:
            return None
        macs = math.prod(x) * math.prod(w[1:])
        bias = math.prod(out) if len(node.input) > 2 and node.input[2] else 0
        return macs, 2 * macs + bias
    if op in ELEMENTWISE:
        return (0, math.prod(out)) if out is not None else None
    if op in PER_ELEMENT:
        return (0, PER_ELEMENT[op] * math.prod(out)) if out is not None else None
    if op in REDUCE_INPUT:
        x = shape(0)
        return (0, math.prod(x)) if x is not None else None
    if op in WINDOW:
        kernel = _attr(node, "kernel_shape", None)
        return (0, math.prod(out) * math.prod(kernel)) if out is not None and kernel else None
    return None


def _load_small_external_tensors(model: onnx.ModelProto, base_dir: Path) -> None:
    """Read in side-file tensors up to 64 KiB: shape inference needs the values of shape and
    index tensors (Reshape targets, position-id buffers), never those of the big weights."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if math.prod(tensor.dims) * _elem_bytes(tensor.data_type) <= 64 * 1024:
            load_external_data_for_tensor(tensor, str(base_dir))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


def _compute(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None, base_dir: Path
) -> dict[str, Any]:
    work = type(model)()
    work.CopyFrom(model)
    pinned = _pin_inputs(work, shapes or {})
    unpinned = [(name, axis, d) for name, dims in pinned.items() for axis, d in enumerate(dims)
                if not isinstance(d, int)]  # fmt: skip
    result: dict[str, Any] = {"input_shapes": pinned, "convention": CONVENTION}
    if unpinned:
        named = sorted({d for _, _, d in unpinned if d})
        unnamed = [f"{name}[{axis}]" for name, axis, d in unpinned if not d]
        examples = [f"--shape {d}=N" for d in named]
        for name in dict.fromkeys(name for name, _, d in unpinned if not d):
            examples.append(
                f"--shape {name}=" + "x".join(str(d) if isinstance(d, int) else "N" for d in pinned[name])
            )
        result.update(
            available=False,
            unpinned=named + unnamed,
            reason=f"dynamic dims not pinned ({', '.join(named + unnamed)}): FLOPs need {' '.join(examples)}",
        )
        return result
    _load_small_external_tensors(work, base_dir)
    tensor_shapes, engine = _infer_shapes(work)
    by_op: dict[tuple[str, str], dict[str, int]] = {}
    not_counted: Counter[str] = Counter()
    unknown_shape: Counter[str] = Counter()
    for node in work.graph.node:
        cost = _node_cost(node, tensor_shapes)
        key = (node.domain or "ai.onnx", node.op_type)
        if cost is None:
            known_op = (
                node.op_type in ELEMENTWISE | REDUCE_INPUT | WINDOW | set(PER_ELEMENT) | set(MATMUL_LIKE)
                or node.op_type == "MatMulInteger"
            )
            (unknown_shape if known_op else not_counted)[node.op_type] += 1
            continue
        entry = by_op.setdefault(key, {"nodes": 0, "macs": 0, "flops": 0})
        entry["nodes"] += 1
        entry["macs"] += cost[0]
        entry["flops"] += cost[1]
    rows = [{"domain": d, "op_type": o, **v} for (d, o), v in by_op.items() if v["flops"] or v["macs"]]
    rows.sort(key=lambda r: (-r["flops"], r["op_type"]))
    result.update(
        available=True,
        shape_engine=engine,
        macs=sum(r["macs"] for r in rows),
        flops=sum(r["flops"] for r in rows),
        by_op_type=rows,
        not_counted=dict(sorted(not_counted.items())),
        unknown_shapes=dict(sorted(unknown_shape.items())),
    )
    return result


# Initializers above this size are weights: shape inference needs only their shapes.
_SMALL_TENSOR_BYTES = 64 * 1024


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference that leaves the big weights behind: each becomes a graph input
    of its shape, so the copy stays small whatever the model's size."""
    import onnx

    work = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "domain"):
        setattr(work, name, getattr(model, name))
    work.opset_import.extend(model.opset_import)
    work.functions.extend(model.functions)
    graph = model.graph
    work.graph.name = graph.name
    work.graph.node.extend(graph.node)
    work.graph.input.extend(graph.input)
    work.graph.output.extend(graph.output)
    work.graph.value_info.extend(graph.value_info)
    declared = {v.name for v in graph.input}
    for init in graph.initializer:
        if math.prod(init.dims) * _elem_bytes(init.data_type) <= _SMALL_TENSOR_BYTES:
            work.graph.initializer.append(init)
        elif init.name not in declared:
            work.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    return work


def largest_activation(
    model_path: str | os.PathLike[str], input_shapes: dict[str, tuple[int, ...]]
) -> tuple[str, str, int] | None:
    """The biggest intermediate tensor at these input shapes: (name, shape as text, bytes).

    From the shape inference `lto inspect` uses, on the graph without its weights. A dim that
    inference leaves unknown counts as 1, so the size is a lower bound. None when inference
    cannot tell: an estimate for a memory check, never a reason to fail.
    """
    try:
        stat = os.stat(model_path)
    except OSError:
        return None
    # Cached: a batch sweep and the optimize pipeline ask again for the same file and shapes.
    key = tuple(sorted((name, tuple(shape)) for name, shape in input_shapes.items()))
    return _largest_activation(str(model_path), stat.st_mtime_ns, stat.st_size, key)


@lru_cache(maxsize=16)
def _largest_activation(
    model_path: str, _mtime_ns: int, _size: int, input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
) -> tuple[str, str, int] | None:
    try:
        path = Path(model_path)
        model = load_model(path, load_external_data=False)
        work = _without_weights(model)
        del model
        _pin_inputs(work, dict(input_shapes))
        _load_small_external_tensors(work, path.parent)
        inferred, _ = _inferred_model(work)
        skip = {v.name for v in inferred.graph.input} | {i.name for i in inferred.graph.initializer}
        best: tuple[str, str, int] | None = None
        for value in [*inferred.graph.value_info, *inferred.graph.output]:
            tensor_type = value.type.tensor_type
            if value.name in skip or not tensor_type.elem_type or not tensor_type.HasField("shape"):
                continue
            shape = _value_shape(value)
            known = [d if isinstance(d, int) and d >= 0 else 1 for d in shape]
            size = math.ceil(math.prod(known) * _elem_bytes(tensor_type.elem_type))
            if best is None or size > best[2]:
                text = "x".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in shape)
                best = (value.name, text, size)
        return best
    except Exception:  # third-party inference can raise anything on graphs it does not know
        return None


def _op_histogram(model: onnx.ModelProto) -> list[dict[str, Any]]:
    import onnx

    counts: Counter[tuple[str, str]] = Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            counts[(node.domain or "ai.onnx", node.op_type)] += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        walk(g)

    walk(model.graph)
    return [
        {"op_type": op, "domain": domain, "count": n}
        for (domain, op), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][1]))
    ]


def model_flops(path: str | os.PathLike[str], shapes: dict[str, tuple[int, ...]]) -> int | None:
    """FLOPs of one run of the model at these input shapes (the convention above); None when some
    dim is still dynamic."""
    p = Path(path)
    compute = _compute(load_model(p, load_external_data=False), shapes, p.parent)
    return int(compute["flops"]) if compute.get("available") else None


def inspect_model(
    path: str | os.PathLike[str], shapes: dict[str, tuple[int, ...]] | None = None
) -> dict[str, Any]:
    """Everything `lto inspect` shows, as JSON-ready data. Raises ModelError for unusable files."""
    p = Path(path)
    model = load_model(p, load_external_data=False)
    initializer_names = {i.name for i in model.graph.initializer}
    external = uses_external_data(model)
    side_files = external_data_files(model)
    info: dict[str, Any] = {
        "path": str(p),
        "size_bytes": p.stat().st_size,
        "sha256": model_sha256(p),
        "ir_version": int(model.ir_version),
        "opset_version": opset_version(model),
        "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "producer": {"name": model.producer_name, "version": model.producer_version},
        "graph_name": model.graph.name,
        "doc_string": model.doc_string,
        "metadata": {m.key: m.value for m in model.metadata_props},
        "inputs": _io(model.graph.input, initializer_names),
        "outputs": _io(model.graph.output, set()),
        "node_count": len(model.graph.node),
        "ops": _op_histogram(model),
        "parameters": _parameters(model),
        "external_data": {
            "used": external,
            "files": side_files,
            "bytes": sum((p.parent / f).stat().st_size for f in side_files if (p.parent / f).is_file()),
        },
        "compute": _compute(model, shapes, p.parent),
        "checks": check_model(p),
    }
    return info
