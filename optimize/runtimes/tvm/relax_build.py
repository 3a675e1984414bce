"""ONNX -> Relax import, the one preprocessing recipe, and building with or without tuning records.

MetaSchedule keys its records by the exact fused PrimFunc. If tuning and applying preprocess
the module differently, most records silently miss (docs/tvm.md#tuning-records: 7 of 16
kernels scheduled, no warning). So there is exactly one recipe, `preprocess`, and both paths
call it: tuning sees `fuse(preprocess(mod))`, applying runs the same `fuse` with the database
current. `RECIPE_VERSION` goes into the tuning-cache key, so a change here never reuses
records tuned under the old recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimize.backend import TensorSpec
from optimize.errors import ModelError, message_line

RECIPE_VERSION = "decompose+canonicalize+zero/1"


class TvmImportError(Exception):
    """The Relax ONNX frontend cannot read this model; the message names the op."""


@dataclass
class ImportedModel:
    raw: Any  # tvm.IRModule after `preprocess` (before legalization/fusion)
    inputs: list[TensorSpec]  # ONNX names, dtypes and the pinned static shapes, in call order
    outputs: list[TensorSpec]  # ONNX names and dtypes; shapes filled in after a first run
    opset: int


def graph_io(model: Any) -> tuple[list[Any], list[Any]]:
    """The graph's real inputs (initializers excluded) and outputs."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    return inputs, list(model.graph.output)


def unsupported_ops(model: Any) -> list[str]:
    """Ops the Relax ONNX frontend has no converter for (custom domains count as unsupported)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    convert_map = onnx_frontend._get_convert_map()
    bad: dict[str, None] = {}
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        if domain not in ("ai.onnx", "ai.onnx.ml"):
            bad[f"{domain}:{node.op_type}"] = None
        elif node.op_type not in convert_map and node.op_type not in ("If", "Constant"):
            bad[node.op_type] = None
    return list(bad)


def import_onnx(model_path: Path, feeds: Mapping[str, np.ndarray]) -> ImportedModel:
    """Import `model_path` with every input's shape pinned to the shape of its feed.

    Raises TvmImportError naming the op when the frontend cannot read the model.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(str(model_path))
    inputs, outputs = graph_io(model)
    missing = [i.name for i in inputs if i.name not in feeds]
    if missing:
        raise ModelError(
            f"no input data for {missing[0]!r}", "the TVM stage needs a feed for every model input"
        )
    bad = unsupported_ops(model)
    if bad:
        raise TvmImportError(f"TVM's ONNX frontend does not support {', '.join(bad)}")
    shape_dict = {i.name: [int(d) for d in feeds[i.name].shape] for i in inputs}
    dtype_dict = {i.name: str(feeds[i.name].dtype) for i in inputs}
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    try:
        mod = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict, keep_params_in_input=False)
    except Exception as exc:  # the frontend raises OpNotImplemented, KeyError, TVMError ...
        raise TvmImportError(_import_failure(model, exc)) from exc
    in_specs = [TensorSpec(i.name, dtype_dict[i.name], tuple(shape_dict[i.name])) for i in inputs]
    types = output_types(mod)
    if len(types) != len(outputs):
        raise TvmImportError(f"TVM's import returns {len(types)} outputs, the ONNX graph has {len(outputs)}")
    out_specs = [TensorSpec(o.name, dtype, shape) for o, (dtype, shape) in zip(outputs, types, strict=True)]
    return ImportedModel(raw=preprocess(mod), inputs=in_specs, outputs=out_specs, opset=int(opset))


def output_types(mod: Any) -> list[tuple[str, tuple[int | None, ...]]]:
    """(dtype, static shape) of each output of `main`, flattened like the VM's results, read from
    its return type: the stage never has to run TVM in the pipeline's process to learn them."""
    from tvm import relax

    def walk(ty: Any) -> list[tuple[str, tuple[int | None, ...]]]:
        if isinstance(ty, relax.TensorType):
            dims: tuple[int | None, ...] = ()
            shape = ty.shape
            if shape is not None and hasattr(shape, "values"):
                dims = tuple(
                    int(v) if hasattr(v, "value") or isinstance(v, int) else None for v in shape.values
                )
            return [(str(ty.dtype), dims)]
        fields = getattr(ty, "fields", None)
        if fields is None:
            raise TvmImportError(f"TVM's import returns a {type(ty).__name__}, not tensors")
        return [item for field in fields for item in walk(field)]

    return walk(mod["main"].ret_ty)


# Ops the frontend lists as supported but fails on (docs/tvm.md#import): named in the skip reason.
_KNOWN_BROKEN = {
    "Attention": "the ONNX-standard Attention (the frontend implements com.microsoft's signature)"
}


def _import_failure(model: Any, exc: Exception) -> str:
    first = message_line(exc)
    broken = sorted({n.op_type for n in model.graph.node if n.op_type in _KNOWN_BROKEN})
    if broken:
        return f"TVM's ONNX frontend cannot convert {', '.join(_KNOWN_BROKEN[op] for op in broken)} ({first})"
    return f"TVM's ONNX frontend failed: {type(exc).__name__}: {first}"


def preprocess(mod: Any) -> Any:
    """THE preprocessing recipe (see module docstring): decompose inference-only ops and
    canonicalize bindings, which lets FuseOps put conv+BN+ReLU(+residual) in one kernel."""
    from tvm import relax

    mod = relax.transform.DecomposeOpsForInference()(mod)
    return relax.transform.CanonicalizeBindings()(mod)


def fuse(raw: Any, target: Any, database: Any = None) -> Any:
    """Legalize + fuse (`zero` pipeline). With `database`, tuned schedules are applied in the same
    pass sequence (zero_pipeline runs MetaScheduleApplyDatabase when a database is current)."""
    import tvm
    from tvm import relax

    pipeline = relax.get_pipeline("zero")
    if database is None:
        with target:
            return pipeline(raw)
    with target, database, tvm.transform.PassContext(opt_level=3):
        return pipeline(raw)


@dataclass
class KernelCount:
    scheduled: int
    total: int
    unscheduled: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"scheduled": self.scheduled, "total": self.total, "unscheduled": self.unscheduled}


def count_scheduled(mod: Any) -> KernelCount:
    """How many TIR kernels in `mod` carry a schedule (tirx.is_scheduled) and which do not."""
    from tvm import tirx

    total = 0
    unscheduled: list[str] = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        total += 1
        attrs = func.attrs or {}
        if not bool(attrs.get("tirx.is_scheduled", False)):
            unscheduled.append(str(gv.name_hint))
    return KernelCount(total - len(unscheduled), total, sorted(unscheduled))


def build(fused: Any, target: Any) -> Any:
    """Compile a fused (and possibly scheduled) module into a Relax VM executable."""
    import tvm

    return tvm.compile(fused, target=target)


def flatten_outputs(result: Any) -> list[np.ndarray]:
    """The VM returns a tensor or a (nested) tuple of tensors; ONNX outputs are a flat list."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    flat: list[np.ndarray] = []
    for item in result:
        flat.extend(flatten_outputs(item))
    return flat


def extract_tasks(fused: Any, target: Any) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    return list(ms.relax_integration.extract_tasks(fused, target))


def task_hash(task: Any) -> str:
    """Structural hash of a task's PrimFunc: the key MetaSchedule's database uses for it."""
    import tvm_ffi

    return f"{int(tvm_ffi.structural_hash(task.dispatched[0])) & 0xFFFFFFFFFFFFFFFF:016x}"
