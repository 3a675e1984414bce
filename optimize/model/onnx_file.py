"""Facts about ONNX files, in one place: loading the user's file with one clear error for every
way it can be unusable, walking graphs, external data, saving, shape inference.

`load_model` is the front door for every command: a missing path, a folder, a file that is not
ONNX, a truncated download, a structurally broken graph, or an opset / IR version newer than the
installed onnx understands all become a one-line `ModelError` (exit code 2) instead of a protobuf
or checker traceback. It runs only the cheap structural checker; `check_model` runs the full
check (strict shape inference) and returns its findings instead of raising, for `lto inspect`.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optimize.errors import ModelError
from optimize.files import sha256_file, write_bytes_atomic

if TYPE_CHECKING:
    import onnx

# protobuf cannot hold a message over 2 GiB: bigger models must be checked through their path.
PROTOBUF_LIMIT = 2**31 - 1
DEFAULT_DOMAINS = ("", "ai.onnx")
# First bytes of a Git LFS pointer file: a common "model" that is not the model.
LFS_POINTER = b"version https://git-lfs"


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _existing_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file not found: {p}", "check the path")
    if p.is_dir():
        raise ModelError(f"{p} is a directory, not an ONNX file", "pass the .onnx file inside it")
    if not os.access(p, os.R_OK):
        raise ModelError(f"cannot read {p}: permission denied", "check the file's permissions")
    if p.stat().st_size == 0:
        raise ModelError(f"{p} is empty (0 bytes), not an ONNX model", "re-export or re-download it")
    return p


def _parse_failure(path: Path, detail: str) -> ModelError:
    # "Error parsing message with type 'onnx.ModelProto': Wire format was corrupt" -> the cause only.
    detail = detail.split("': ", 1)[-1] if detail.startswith("Error parsing message") else detail
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(LFS_POINTER):
        return ModelError(f"{path} is a Git LFS pointer, not the model itself", "run `git lfs pull`")
    # A serialized ModelProto starts with field 1 (ir_version, varint): tag byte 0x08 and a small
    # version. A file that starts that way but does not parse was most likely cut short.
    if len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= 64:
        return ModelError(
            f"{path} is truncated or corrupt: protobuf parse failed ({detail})",
            "re-export or re-download the model",
        )
    return ModelError(f"{path} is not an ONNX model: protobuf parse failed ({detail})", "pass an .onnx file")


def max_supported_opsets() -> dict[str, int]:
    """Highest opset per domain that the installed onnx package knows ('' is the default domain)."""
    import onnx.defs

    return {domain: int(bounds[1]) for domain, bounds in onnx.defs.C.schema_version_map().items()}


def opset_version(model: onnx.ModelProto) -> int:
    """The default-domain (ai.onnx) opset the model imports; 0 if none."""
    return max((int(o.version) for o in model.opset_import if o.domain in DEFAULT_DOMAINS), default=0)


def _check_versions(model: onnx.ModelProto, path: Path) -> None:
    import onnx

    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"{path} has IR version {model.ir_version}; the installed onnx {onnx.__version__} "
            f"supports IR version {onnx.IR_VERSION} at most",
            "upgrade onnx and onnxruntime, or re-export with an older IR version",
        )
    known = max_supported_opsets()
    for imp in model.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        if domain in known and imp.version > known[domain]:
            label = "ai.onnx" if domain == "" else domain
            raise ModelError(
                f"{path} uses opset {imp.version} of {label}; the installed onnx {onnx.__version__} "
                f"supports up to opset {known[domain]}",
                "upgrade onnx and onnxruntime, or re-export the model with a lower opset",
            )


def _iter_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Initializers and Constant-attribute tensors of the graph and every subgraph."""
    import onnx

    def walk(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors
                elif attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        yield from walk(sub)

    yield from walk(model.graph)


def uses_external_data(model: onnx.ModelProto) -> bool:
    """True if any tensor keeps its bytes in a side file (as loaded, before the data is read in)."""
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _iter_tensors(model))


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """Side files the model's tensors point to, relative to the model's folder, sorted."""
    import onnx

    files = set()
    for tensor in _iter_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    files.add(entry.value)
    return sorted(files)


def _parse(path: Path) -> onnx.ModelProto:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise _parse_failure(path, _first_line(str(exc))) from exc
    except (ValueError, RuntimeError) as exc:
        # protobuf's C++ backend reports some malformed input as RuntimeError/ValueError.
        raise _parse_failure(path, _first_line(str(exc))) from exc
    if not model.HasField("graph") or model.ir_version <= 0:
        raise _parse_failure(path, "no graph or IR version in the message")
    return model


# Files that passed the structural checker, keyed by (path, size, mtime): commands load the
# same model several times (inputs, vocab sizes, stages) and need not re-check it each time.
_CHECKED: set[tuple[str, int, int]] = set()


def _structural_check(path: Path) -> None:
    import onnx

    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _CHECKED:
        return
    try:
        # Through the path: C++ reads the file itself (no >2 GiB message, external data resolved).
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise ModelError(
            f"{path} is not a valid ONNX model: {_first_line(str(exc))}",
            "re-export it, or fix the graph the checker names",
        ) from exc
    _CHECKED.add(key)


def load_model(path: str | os.PathLike[str], load_external_data: bool = True) -> onnx.ModelProto:
    """Read, version-check and structurally check an ONNX file; raise ModelError if unusable.

    With `load_external_data=False` tensors stored in side files keep only their metadata
    (dims, dtype, location), which is all that inspection and input handling need.
    """
    p = _existing_file(path)
    model = _parse(p)
    _check_versions(model, p)
    external = uses_external_data(model)
    if external:
        missing = [f for f in external_data_files(model) if not (p.parent / f).is_file()]
        if missing:
            raise ModelError(
                f"{p} keeps its weights in {', '.join(missing)}, which is missing",
                "keep the external data file(s) beside the model",
            )
    _structural_check(p)
    if external and load_external_data:
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"cannot read the external data of {p}: {_first_line(str(exc))}",
                "keep the external data file(s) beside the model, whole",
            ) from exc
    return model


def check_model(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Full onnx checker (strict shape inference included) and plain shape inference, as data.

    Never raises for an invalid graph: returns {"checker": {"ok", "error"}, "shape_inference":
    {"ok", "error"}} so that `lto inspect` can show what is wrong. The path must load (see load_model).
    """
    import tempfile

    import onnx

    p = _existing_file(path)
    model = load_model(p, load_external_data=False)
    big = uses_external_data(model) or p.stat().st_size > PROTOBUF_LIMIT
    result: dict[str, Any] = {"checker": {"full_check": True}, "shape_inference": {"strict": True}}
    try:
        onnx.checker.check_model(str(p), full_check=True)
        result["checker"].update(ok=True, error=None)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        result["checker"].update(ok=False, error=_first_line(str(exc)))
    try:
        if big:
            # Path-based inference streams the file instead of building one >2 GiB message.
            with tempfile.TemporaryDirectory(prefix="lto-shapes-") as tmp:
                onnx.shape_inference.infer_shapes_path(
                    str(p), str(Path(tmp) / "inferred.onnx"), check_type=True, strict_mode=True
                )
        else:
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        result["shape_inference"].update(ok=True, error=None)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        result["shape_inference"].update(ok=False, error=_first_line(str(exc)))
    return result


def model_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of the model file; with external data, of the file and every side file it names.

    Without side files this equals `sha256_file(path)`. With them, it is the SHA-256 of the lines
    "<name> <sha256>" for the model file and each side file in sorted order, so that changing the
    weights changes the hash even though the .onnx file itself did not change.
    """

    p = _existing_file(path)
    own = sha256_file(p)
    try:
        model = _parse(p)
    except ModelError:
        return own
    files = external_data_files(model)
    if not files:
        return own
    lines = [f"{p.name} {own}"]
    for name in files:
        side = p.parent / name
        lines.append(f"{name} {sha256_file(side) if side.is_file() else 'missing'}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# protobuf refuses to serialise a message over 2 GiB; stay well below it before switching to side files.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

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


def save_model(model: onnx.ModelProto, path: str | Path, external: bool | None = None) -> list[Path]:
    """Strip unused opsets and write `model`; returns side files written next to it.

    Weights go to `<name>.data` when asked, or when the model is too big for one protobuf.
    """
    import onnx

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


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Move the main graph's tensor-valued Constant nodes into initializers; how many moved.

    Some exporters (paddle2onnx) keep every weight in a Constant node, where onnxruntime's
    quantizer does not look for weights."""
    keep = []
    moved = 0
    for node in model.graph.node:
        value = (
            next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant"
            else None
        )
        if value is None or len(node.output) != 1:
            keep.append(node)
            continue
        tensor = type(value)()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        moved += 1
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return moved


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

    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD or uses_external_data(model):
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


def file_has_external_data(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` keeps tensors (of any graph or subgraph) in side files."""
    return uses_external_data(read_model(path, load_external_data=False))


def external_data_paths(model_path: Path) -> list[Path]:
    """The side files of the ONNX file at `model_path` (none for other files or unreadable ones)."""
    if model_path.suffix != ".onnx" or not model_path.is_file():
        return []
    try:
        model = read_model(model_path, load_external_data=False)
    except Exception:  # not our job to judge the file here; the backend load reports it
        return []
    return [model_path.parent / name for name in external_data_files(model)]
