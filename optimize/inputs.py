"""One input specification for every command: pinned shapes, real data or meaningful generated data."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.errors import InputError, UsageError
from optimize.runtimes.base import TensorSpec, check_feeds

_SHAPE_ARG = re.compile(r"^\s*([^=\s]+)\s*=\s*([0-9xX,\s]+)\s*$")


def parse_shape_args(args: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--shape NAME=1x128` flags. NAME is an input name or a named dynamic dim."""
    shapes: dict[str, tuple[int, ...]] = {}
    for arg in args or []:
        match = _SHAPE_ARG.match(arg)
        if not match:
            raise UsageError(
                f"bad --shape {arg!r}", "write NAME=DIMS with dims joined by 'x', e.g. input_ids=1x128"
            )
        name, dims_text = match.groups()
        parts = [p for p in re.split(r"[xX,]", dims_text.replace(" ", ""))]
        if not parts or any(not p.isdigit() for p in parts):
            raise UsageError(f"bad --shape {arg!r}: dims must be whole numbers", "e.g. input_ids=1x128")
        dims = tuple(int(p) for p in parts)
        if any(d <= 0 for d in dims):
            raise UsageError(f"bad --shape {arg!r}: every dim must be at least 1")
        if name in shapes:
            raise UsageError(f"--shape given twice for {name!r}")
        shapes[name] = dims
    return shapes


def split_shape_args(args: list[str] | None) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Separate `--shape NAME=MIN:OPT:MAX` ranges (TensorRT optimization profiles) from plain pins.

    Returns the pins to benchmark at (a range contributes its OPT shape) and the range strings,
    which go to the stages that build for a range of shapes.
    """
    ranges = [arg for arg in args or [] if ":" in arg]
    pins = parse_shape_args([arg for arg in args or [] if ":" not in arg])
    if ranges:
        from optimize.runtimes.tensorrt.engine import opt_shapes, parse_shape_ranges

        for name, opt in opt_shapes(parse_shape_ranges(ranges)).items():
            if name in pins:
                raise UsageError(f"--shape given twice for {name!r}")
            pins[name] = opt
    return pins, ranges


@dataclass
class InputTensor:
    """One pinned model input and how its values are made."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str  # "generated" or "file"
    # How generated values are drawn: normal | randint | ones | zeros | arange
    generator: str = "normal"
    low: int = 0
    high: int = 0
    note: str = ""


@dataclass
class InputSpec:
    tensors: list[InputTensor]
    seed: int = 0
    data_file: str | None = None
    data_sha256: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        for t in self.tensors:
            if t.shape:
                return t.shape[0]
        return 1

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors}

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "data_file": self.data_file,
            "data_sha256": self.data_sha256,
            "inputs": [{**asdict(t), "shape": list(t.shape)} for t in self.tensors],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        tensors = [InputTensor(**{**t, "shape": tuple(t["shape"])}) for t in data["inputs"]]
        return cls(tensors, seed=data.get("seed", 0), data_file=data.get("data_file"),
                   data_sha256=data.get("data_sha256"))  # fmt: skip


def model_input_specs(model_path: str | Path) -> list[TensorSpec]:
    """Graph inputs (not initializers) of an ONNX file, read without its weights."""
    import onnx

    from optimize.onnx_file import load_model

    model = load_model(model_path, load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        dims: list[int | str | None] = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or None)
        specs.append(TensorSpec(value.name, dtype, tuple(dims)))
    return specs


def embedding_vocab_sizes(model_path: str | Path) -> dict[str, int]:
    """Input name -> rows of the embedding table it indexes (Gather on an initializer)."""
    from optimize.onnx_file import load_model

    model = load_model(model_path, load_external_data=False)
    tables = {init.name: (int(init.dims[0]) if init.dims else 0) for init in model.graph.initializer}
    # Follow the input through shape-preserving casts: exporters often Cast ids before Gather.
    aliases: dict[str, str] = {v.name: v.name for v in model.graph.input}
    for node in model.graph.node:
        if node.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze") and node.input:
            src = aliases.get(node.input[0])
            if src is not None:
                for out in node.output:
                    aliases[out] = src
    vocab: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) >= 2 and node.input[0] in tables:
            src = aliases.get(node.input[1])
            if src is not None and tables[node.input[0]] > 0:
                vocab[src] = min(vocab.get(src, tables[node.input[0]]), tables[node.input[0]])
    return vocab


def _pin_shape(spec: TensorSpec, shapes: dict[str, tuple[int, ...]], batch: int | None) -> tuple[int, ...]:
    if spec.name in shapes:
        pinned = shapes[spec.name]
        if len(pinned) != len(spec.shape):
            raise InputError(
                f"--shape {spec.name}={'x'.join(map(str, pinned))} has rank {len(pinned)}, "
                f"the model's input {spec.name!r} has rank {len(spec.shape)} (shape {list(spec.shape)})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, pinned, strict=True)):
            if isinstance(want, int) and want != got:
                raise InputError(
                    f"--shape {spec.name}: axis {axis} is fixed at {want} in the model, not {got}"
                )
        return pinned
    dims: list[int] = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            dims.append(dim)
        elif isinstance(dim, str) and dim in shapes and len(shapes[dim]) == 1:
            dims.append(shapes[dim][0])
        elif axis == 0 and batch is not None:
            dims.append(batch)
        else:
            label = f"dim {dim!r}" if dim else "an unnamed dynamic dim"
            example = "x".join(str(d) if isinstance(d, int) else ("1" if i == 0 else "128")
                               for i, d in enumerate(spec.shape))  # fmt: skip
            alt = f" or --shape {dim}=N" if dim else ""
            raise InputError(
                f"input {spec.name!r} has {label} on axis {axis} that is not pinned",
                f"pin it with --shape {spec.name}={example}{alt}",
            )
    return tuple(dims)


def _describe_generator(spec: TensorSpec, vocab: dict[str, int]) -> tuple[str, int, int, str]:
    lowered = spec.name.lower()
    kind = np.dtype(spec.dtype).kind
    if kind == "b":
        return "ones", 0, 0, "all true"
    if kind in "iu":
        if "mask" in lowered:
            return "ones", 0, 0, "attention mask of ones"
        if "token_type" in lowered or "segment" in lowered:
            return "zeros", 0, 0, "single segment"
        if "position" in lowered:
            return "arange", 0, 0, "positions 0..n-1 along the last axis"
        if spec.name in vocab:
            return (
                "randint",
                0,
                vocab[spec.name],
                f"token ids in [0, {vocab[spec.name]}) from the embedding table",
            )
        return "randint", 0, 2, "no embedding table found: integers in [0, 2)"
    return "normal", 0, 0, "seeded standard normal"


def _generate(tensor: InputTensor, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(tensor.dtype)
    if tensor.generator == "ones":
        return np.ones(tensor.shape, dtype=dtype)
    if tensor.generator == "zeros":
        return np.zeros(tensor.shape, dtype=dtype)
    if tensor.generator == "arange":
        last = tensor.shape[-1] if tensor.shape else 1
        return np.broadcast_to(np.arange(last, dtype=dtype), tensor.shape).copy()
    if tensor.generator == "randint":
        return rng.integers(tensor.low, tensor.high, size=tensor.shape).astype(dtype)
    return rng.standard_normal(size=tensor.shape).astype(dtype)


def generate_feeds(spec: InputSpec, seed: int) -> dict[str, np.ndarray]:
    """Fresh inputs with the spec's shapes and meaning (e.g. more calibration samples)."""
    rng = np.random.default_rng(seed)
    return {t.name: _generate(t, rng) for t in spec.tensors}


def _gib(n: float) -> str:
    gib = n / 2**30
    return f"{gib:,.1f} GiB" if gib >= 1 else f"{gib:.2g} GiB"


def check_memory(
    tensors: list[tuple[str, str, tuple[int, ...]]], model_path: str | Path | None = None
) -> None:
    """Refuse inputs (name, dtype, shape) that cannot fit in memory, before any is allocated.

    With an ONNX `model_path`, the largest intermediate tensor at these shapes counts too (an
    estimate from shape inference, skipped when inference fails). A run that dies of
    MemoryError, or gets the machine swapping, after minutes of work helps nobody.
    """
    from optimize.env import available_memory

    available = available_memory()
    if available is None or not tensors:
        return
    sizes = {name: math.prod(shape) * np.dtype(dtype).itemsize for name, dtype, shape in tensors}
    total = sum(sizes.values())
    hint = "pin smaller shapes with --shape, or a smaller --batch"
    if total > available:
        name, dtype, shape = max(tensors, key=lambda t: sizes[t[0]])
        where = f"input {name!r} at {'x'.join(map(str, shape))} {dtype} needs {_gib(sizes[name])}"
        if len(tensors) > 1:
            where = f"the inputs need {_gib(total)} ({where})"
        raise InputError(f"{where}, more than the {_gib(available)} of memory available", hint)
    if model_path is None or Path(model_path).suffix != ".onnx":
        return
    from optimize.inspection import largest_activation

    largest = largest_activation(model_path, {name: shape for name, _, shape in tensors})
    if largest is not None and total + largest[2] > available:
        name, shape_text, size = largest
        raise InputError(
            f"at these shapes the model's tensor {name!r} ({shape_text}) needs {_gib(size)}: with "
            f"the inputs' {_gib(total)} that is more than the {_gib(available)} of memory available",
            hint,
        )


def _npz_headers(path: Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """dtype and shape of each array in an .npz, read from its headers without loading any data.

    None when the file is not a plain .npz this can read (np.load then says what is wrong).
    """
    import zipfile

    from numpy.lib import format as npy

    headers: dict[str, tuple[str, tuple[int, ...]]] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as fh:
                    version = npy.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = npy.read_array_header_1_0(fh)
                    elif version == (2, 0):
                        shape, _, dtype = npy.read_array_header_2_0(fh)
                    else:
                        return None
                headers[info.filename.removesuffix(".npy")] = (np.dtype(dtype).name, tuple(shape))
    except Exception:  # a corrupt or unusual file: left to np.load to report
        return None
    return headers


def check_data_arrays(arrays: dict[str, np.ndarray], flag: str) -> list[str]:
    """Refuse an array with no rows; warn (returned) about NaN or inf values, naming the input.

    Zero rows would make every timing and accuracy figure an average over nothing; NaN/inf
    inputs run (some models take them) but make accuracy comparisons meaningless.
    """
    warnings: list[str] = []
    for name, array in arrays.items():
        if array.ndim >= 1 and array.shape[0] == 0:
            raise InputError(
                f"{flag} array {name!r} has 0 rows on its batch axis (shape {list(array.shape)})",
                "give at least one row per input",
            )
        if array.dtype.kind in "fc" and array.size:
            nan = int(np.count_nonzero(np.isnan(array)))
            inf = int(np.count_nonzero(np.isinf(array)))
            if nan or inf:
                found = " and ".join(f"{n:,} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n)
                warnings.append(
                    f"{flag} array {name!r} holds {found} of {array.size:,} values: "
                    "outputs and accuracy figures on it may be meaningless"
                )
    return warnings


def check_data_file(path: str | Path, flag: str) -> list[str]:
    """check_data_arrays on an .npz file (e.g. --calib-data), before any stage reads it."""
    source = Path(path)
    warnings: list[str] = []
    try:
        with np.load(source, allow_pickle=False) as npz:
            for name in npz.files:  # one array in memory at a time
                warnings += check_data_arrays({name: npz[name]}, flag)
        return warnings
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"cannot read {flag} {source} as .npz: {exc}", "save arrays with numpy.savez(path, name=array)"
        ) from exc


def _load_npz(path: Path, specs: list[TensorSpec]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of an --input-data file, checked against the model's inputs, and warnings."""
    if not path.is_file():
        raise InputError(f"input data file not found: {path}", "pass an existing .npz file to --input-data")
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
    except Exception as exc:
        raise InputError(
            f"cannot read {path} as .npz: {exc}", "save inputs with numpy.savez(path, name=array)"
        ) from exc
    # First: an empty array would otherwise be reported as a size mismatch on axis 0.
    warnings = check_data_arrays(data, "--input-data")
    check_feeds(specs, data, data_file="--input-data")
    return data, warnings


def resolve_inputs(
    model_path: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    input_data: str | Path | None = None,
    seed: int = 0,
    batch: int | None = None,
    specs: list[TensorSpec] | None = None,
) -> tuple[InputSpec, dict[str, np.ndarray]]:
    """Pin every input and produce the arrays to feed.

    `specs` overrides the inputs read from `model_path` (artifacts whose model is not ONNX).
    `batch` sets a dynamic leading dim that --shape did not pin; with --input-data whose
    batch is 1 the rows are repeated to reach it.
    """
    from optimize.files import sha256_file

    shapes = dict(shapes or {})
    onnx_path = Path(model_path)
    is_onnx = onnx_path.suffix == ".onnx"
    if specs is None:
        specs = model_input_specs(onnx_path)
    known = {s.name for s in specs} | {d for s in specs for d in s.shape if isinstance(d, str)}
    for name in shapes:
        if name not in known:
            raise InputError(
                f"--shape names {name!r}, which is neither an input nor a dynamic dim of the model",
                f"inputs: {', '.join(s.name for s in specs)}",
            )
    if input_data is not None:
        path = Path(input_data)
        headers = _npz_headers(path) if path.is_file() else None
        if headers is not None:
            # Before loading: the arrays as they will be fed (batch-1 rows repeated to --batch).
            planned = [
                (name, dtype, (batch, *shape[1:]) if batch and shape and shape[0] == 1 else shape)
                for name, (dtype, shape) in headers.items()
                if name in {s.name for s in specs}
            ]
            check_memory(planned, onnx_path if is_onnx else None)
        data, warnings = _load_npz(path, specs)
        if batch is not None:
            data = {k: _rebatch(k, v, batch) for k, v in data.items()}
        tensors = [InputTensor(s.name, s.dtype, tuple(data[s.name].shape), "file") for s in specs]
        spec = InputSpec(tensors, seed=seed, data_file=str(path), data_sha256=sha256_file(path),
                         warnings=warnings)  # fmt: skip
        return spec, {s.name: np.ascontiguousarray(data[s.name]) for s in specs}

    vocab = embedding_vocab_sizes(onnx_path) if is_onnx else {}
    tensors = []
    for s in specs:
        generator, low, high, note = _describe_generator(s, vocab)
        tensors.append(InputTensor(s.name, s.dtype, _pin_shape(s, shapes, batch), "generated", generator,
                                   low, high, note))  # fmt: skip
    check_memory([(t.name, t.dtype, t.shape) for t in tensors], onnx_path if is_onnx else None)
    spec = InputSpec(tensors, seed=seed)
    return spec, generate_feeds(spec, seed)


def _rebatch(name: str, array: np.ndarray, batch: int) -> np.ndarray:
    if array.ndim == 0 or array.shape[0] == batch:
        return array
    if array.shape[0] == 1:
        return np.repeat(array, batch, axis=0)
    raise InputError(
        f"--input-data array {name!r} has batch {array.shape[0]}, cannot make batch {batch} from it",
        "give data with batch 1 (it is repeated) or the same batch as --batch",
    )


def feeds_from_spec(spec: InputSpec) -> dict[str, np.ndarray]:
    """Re-create the feeds a report or artifact describes (generated inputs only)."""
    if spec.data_file:
        path = Path(spec.data_file)
        if not path.is_file():
            raise InputError(f"the input data file {path} recorded in the spec is gone")
        with np.load(path, allow_pickle=False) as npz:
            return {t.name: np.ascontiguousarray(npz[t.name]) for t in spec.tensors}
    return generate_feeds(spec, spec.seed)
