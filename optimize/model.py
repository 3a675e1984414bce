"""Loading the user's ONNX file, with one clear error for every way it can be unusable.

`load_model` is the front door for every command: a missing path, a folder, a file that is not
ONNX, a truncated download, a structurally broken graph, or an opset / IR version newer than the
installed onnx understands all become a one-line `ModelError` (exit code 2) instead of a protobuf
or checker traceback. It runs only the cheap structural checker; `check_model` runs the full
check (strict shape inference) and returns its findings instead of raising, for `lto inspect`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.errors import ModelError

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
    from optimize.files import sha256_file

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
