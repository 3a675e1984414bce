"""Small ONNX graph helpers shared by the pipeline stages.

Everything here works on `onnx.ModelProto` objects and plain files; no stage logic. The
opset stripping and the ISA helpers exist because of measured portability problems
(notes/ort.md §2b): ORT-written files declare opsets that older runtimes reject, and files
saved at ORT's ALL level carry NCHWc kernels tied to the SIMD width of the CPU that wrote them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

# protobuf refuses to serialise a message over 2 GiB; stay well below it before switching to side files.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
DEFAULT_DOMAINS = ("", "ai.onnx")
NCHWC_DOMAIN = "com.microsoft.nchwc"
QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QAttention",
        "QGemm",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)


def read_model(path: str | Path, load_external_data: bool = True) -> onnx.ModelProto:
    """Load a stage input. Candidates come from the pipeline, which already validated the user's file."""
    import onnx

    return onnx.load(str(path), load_external_data=load_external_data)


def iter_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node: main graph, control-flow subgraphs (If/Loop/Scan bodies) and local functions."""
    import onnx

    def walk(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
        for node in graph.node:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        yield from walk(sub)

    yield from walk(model.graph)
    for function in model.functions:
        yield from function.node


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """Op type -> count; ops outside the default domain are keyed "domain:Op"."""
    counts: Counter[str] = Counter()
    for node in iter_nodes(model):
        key = node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}:{node.op_type}"
        counts[key] += 1
    return counts


def used_domains(model: onnx.ModelProto) -> set[str]:
    domains = {node.domain for node in iter_nodes(model)}
    domains |= {function.domain for function in model.functions}
    return {"" if d == "ai.onnx" else d for d in domains} | {""}


def strip_unused_opsets(model: onnx.ModelProto) -> list[str]:
    """Drop opset imports no node uses and declare used ones (in place); returns the removed domains.

    onnxruntime writes an import for every domain it knows (ai.onnx.ml v5, training ...),
    and older runtimes refuse to load a file that declares a version they do not have.
    """
    import onnx

    used = used_domains(model)
    keep = [o for o in model.opset_import if ("" if o.domain == "ai.onnx" else o.domain) in used]
    removed = [o.domain or "ai.onnx" for o in model.opset_import if o not in keep]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    # onnxruntime.transformers leaves the com.microsoft import out; onnx's checker and shape
    # inference then reject the file. ORT's contrib domains are all at version 1.
    declared = {"" if o.domain == "ai.onnx" else o.domain for o in keep}
    for domain in sorted(used - declared):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    return removed


def opset_map(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}


def has_external_data(model: onnx.ModelProto) -> bool:
    import onnx

    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: str | Path, external: bool | None = None) -> list[Path]:
    """Strip unused opsets and write `model`; returns side files written next to it.

    Weights go to `<name>.data` when asked, or when the model is too big for one protobuf.
    """
    import onnx

    from optimize.files import write_bytes_atomic

    target = Path(path)
    strip_unused_opsets(model)
    if external is None:
        external = model.ByteSize() > EXTERNAL_DATA_THRESHOLD
    if not external:
        write_bytes_atomic(target, model.SerializeToString())
        return []
    data_name = target.name + ".data"
    data_path = target.with_name(data_name)
    data_path.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        model,
        str(target),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data_name,
        size_threshold=1024,
    )
    return [data_path]


def file_has_external_data(path: str | Path) -> bool:
    return has_external_data(read_model(path, load_external_data=False))


def ort_save_optimized(
    src: str | Path,
    dst: str | Path,
    level: str,
    disabled_optimizers: Sequence[str] = (),
) -> tuple[onnx.ModelProto, list[Path]]:
    """Let onnxruntime optimize `src` at `level` and write the result to `dst`, opsets stripped.

    Returns the written model (weights loaded) and the side files it needs.
    """
    import onnxruntime as ort

    from optimize.runtimes.onnxruntime.backend import session_options

    src, dst = Path(src), Path(dst)
    external = file_has_external_data(src)
    config: dict[str, Any] = {"graph_optimization_level": level, "optimized_model_filepath": str(dst)}
    if external:
        # ORT writes big initializers to a side file only when told to; without it a >2 GB model fails.
        config["config_entries"] = {
            "session.optimized_model_external_initializers_file_name": dst.name + ".data",
            "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
        }
    so = session_options(config)
    kwargs: dict[str, Any] = {"providers": ["CPUExecutionProvider"]}
    if disabled_optimizers:
        kwargs["disabled_optimizers"] = list(disabled_optimizers)
    ort.InferenceSession(str(src), so, **kwargs)
    model = read_model(dst)
    extra = save_model(model, dst, external=external)
    return model, extra


def constant_values(model: onnx.ModelProto, max_elements: int | None = None) -> dict[str, np.ndarray]:
    """Tensor name -> value for initializers and Constant nodes of the main graph.

    Initializers stored as external data are left out (they may not be loaded), and so are
    those over `max_elements` (shape vectors and scalars are what graph matching needs).
    """
    import onnx
    from onnx import numpy_helper

    values = {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.data_location != onnx.TensorProto.EXTERNAL
        and (max_elements is None or int(np.prod(init.dims)) <= max_elements)
    }
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
                elif attr.name in ("value_int", "value_ints"):
                    values[node.output[0]] = np.array(attr.i if attr.name == "value_int" else list(attr.ints))
    return values


def ensure_node_names(model: onnx.ModelProto) -> int:
    """Name unnamed or duplicate-named nodes (in place) so they can be excluded by name; returns how many."""
    seen: set[str] = set()
    renamed = 0
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
            renamed += 1
        seen.add(node.name)
    return renamed


# ---------------------------------------------------------------------------------------------
# The CPU this runs on


def has_vnni(flags: set[str]) -> bool:
    """int8 dot-product instructions: without them u8*s8 products can saturate in 16 bits (x86)."""
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def nchwc_block_width(flags: set[str]) -> int | None:
    """Channel block ORT's NchwcTransformer uses on this CPU (None: no NCHWc kernels).

    MLAS picks 16 floats on AVX-512F and 8 on AVX2+FMA; other CPUs get no NCHWc rewrite.
    """
    if "avx512f" in flags:
        return 16
    if {"avx2", "fma"} <= flags:
        return 8
    return None


def nchwc_isa_requires(block: int) -> list[str]:
    return ["avx512f"] if block == 16 else ["avx2", "fma"]


def symbolic_infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference, without its litter.

    On a graph it cannot finish, ORT saves `sym_shape_infer_temp.onnx` (+ external data) into the
    current directory before raising. Run it from a throw-away directory so a user's folder never
    gets those files. Raises whatever the inference raises.
    """
    import logging
    import os
    import tempfile

    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    sym_logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = sym_logger.level
    # Its warnings about ops it cannot infer are expected (callers fall back), not the user's problem.
    sym_logger.setLevel(logging.ERROR)
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="lto-shapes-") as scratch:
        os.chdir(scratch)
        try:
            return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
        finally:
            os.chdir(previous)
            sym_logger.setLevel(level)


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Annotate intermediate shapes so ORT's fusions can prove their shape preconditions.

    Returns the model and the method that worked: "symbolic" (onnxruntime's symbolic shape
    inference, which also names dynamic dims), "onnx", or "none" when both fail or the model
    is too big for in-memory inference.
    """
    import onnx

    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD or has_external_data(model):
        return model, "none"
    try:
        inferred = symbolic_infer_shapes(model)
        if inferred is not None:
            return inferred, "symbolic"
    except Exception:  # any failure inside the third-party inference means "not available here"
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True), "onnx"
    except Exception:
        return model, "none"
