"""One input specification for every command: pinned shapes, real data or meaningful generated data."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.backend import TensorSpec, check_feeds
from optimize.env import available_memory
from optimize.errors import InputError, UsageError
from optimize.files import sha256_file
from optimize.inspection import largest_activation
from optimize.onnx_file import load_model
from optimize.shapes import opt_shapes, parse_shape_range, parse_shape_ranges


def parse_shape_args(args: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--shape NAME=1x128` pins (NAME: an input name or a named dynamic dim), each
    read by the one --shape parser (optimize.shapes.parse_shape_range); a MIN:OPT:MAX range is
    split off before (split_shape_args)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for arg in args or []:
        if ":" in arg:
            raise UsageError(
                f"bad --shape {arg!r}", "write NAME=DIMS with dims joined by 'x', e.g. input_ids=1x128"
            )
        name, pinned = parse_shape_range(arg)
        if name in shapes:
            raise UsageError(f"--shape given twice for {name!r}")
        shapes[name] = pinned.opt
    return shapes


def split_shape_args(args: list[str] | None) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Separate `--shape NAME=MIN:OPT:MAX` ranges (TensorRT optimization profiles) from plain pins.

    Returns the pins to benchmark at (a range contributes its OPT shape) and the range strings,
    which go to the stages that build for a range of shapes.
    """
    ranges = [arg for arg in args or [] if ":" in arg]
    pins = parse_shape_args([arg for arg in args or [] if ":" not in arg])
    if ranges:
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
    # Where the batch is: not always axis 0 (a recurrent state [2, batch, 128]); None: no batch axis.
    batch_axis: int | None = 0


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
            if t.shape and t.batch_axis is not None and t.batch_axis < len(t.shape):
                return t.shape[t.batch_axis]
        return 1

    def batch_axes(self) -> dict[str, int | None]:
        return {t.name: t.batch_axis if t.shape else None for t in self.tensors}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors}

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "data_file": self.data_file,
            "data_sha256": self.data_sha256,
            # batch_axis stays out: manifests list their input fields (artifact.py), and a loaded
            # spec falls back to axis 0, which is what every spec written before it meant.
            "inputs": [{**_tensor_json(t), "shape": list(t.shape)} for t in self.tensors],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        tensors = [InputTensor(**{**t, "shape": tuple(t["shape"])}) for t in data["inputs"]]
        return cls(tensors, seed=data.get("seed", 0), data_file=data.get("data_file"),
                   data_sha256=data.get("data_sha256"))  # fmt: skip


def _tensor_json(tensor: InputTensor) -> dict[str, Any]:
    data = asdict(tensor)
    del data["batch_axis"]
    return data


def model_input_specs(model_path: str | Path) -> list[TensorSpec]:
    """Graph inputs (not initializers) of an ONNX file, read without its weights."""
    import onnx

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


def _is_batch_name(dim: int | str | None) -> bool:
    return isinstance(dim, str) and ("batch" in dim.lower() or dim.lower() in ("n", "b", "bs"))


def batch_axes(specs: Sequence[TensorSpec]) -> dict[str, int | None]:
    """The batch axis of every input, found from the model rather than assumed to be axis 0.

    In order: a dim named like a batch ("batch", "batch_size"); the dim named like the first
    input's leading dynamic dim; a dynamic axis 0; the only dynamic dim of an input whose axis 0
    is fixed, when the first input's axis 0 is dynamic (silero-vad's state [2, batch, 128]).
    Scalars have none; a fully fixed input keeps axis 0 (rows of data are split there).
    """
    first = next((s for s in specs if s.shape), None)
    lead = first.shape[0] if first is not None else None
    lead_dynamic = first is not None and not isinstance(lead, int)
    axes: dict[str, int | None] = {}
    for spec in specs:
        dims = spec.shape
        if not dims:
            axes[spec.name] = None
            continue
        named = [i for i, d in enumerate(dims) if _is_batch_name(d)]
        dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if named:
            axes[spec.name] = named[0]
        elif isinstance(lead, str) and lead in dims:
            axes[spec.name] = dims.index(lead)
        elif not isinstance(dims[0], int):
            axes[spec.name] = 0
        elif lead_dynamic and len(dynamic) == 1:
            axes[spec.name] = dynamic[0]
        else:
            axes[spec.name] = 0
    return axes


def output_batch_axes(
    outputs: Sequence[TensorSpec],
    inputs: Sequence[TensorSpec],
    arrays: Mapping[str, np.ndarray] | None = None,
    batch: int | None = None,
) -> dict[str, int | None]:
    """The batch axis of every output: a dim named like an input's batch dim, else (given the
    arrays of one run and the batch size) the first axis of that size, else axis 0."""
    in_axes = batch_axes(inputs)
    names = {s.shape[a] for s in inputs if (a := in_axes[s.name]) is not None and isinstance(s.shape[a], str)}
    axes: dict[str, int | None] = {}
    for spec in outputs:
        array = arrays.get(spec.name) if arrays is not None else None
        rank = array.ndim if array is not None else len(spec.shape)
        if rank == 0:
            axes[spec.name] = None
            continue
        named = [
            i for i, d in enumerate(spec.shape) if isinstance(d, str) and (d in names or _is_batch_name(d))
        ]
        if named and named[0] < rank:
            axes[spec.name] = named[0]
        elif array is not None and batch is not None and batch in array.shape:
            axes[spec.name] = array.shape.index(batch)
        else:
            axes[spec.name] = 0
    return axes


def _pin_shape(
    spec: TensorSpec, shapes: dict[str, tuple[int, ...]], batch: int | None, batch_axis: int | None = 0
) -> tuple[int, ...]:
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
        elif axis == batch_axis and batch is not None:
            dims.append(batch)
        else:
            label = f"dim {dim!r}" if dim else "an unnamed dynamic dim"
            example = "x".join(str(d) if isinstance(d, int) else ("1" if i == batch_axis else "128")
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


def generate_feeds(spec: InputSpec, seed: int | Sequence[int]) -> dict[str, np.ndarray]:
    """Fresh inputs with the spec's shapes and meaning (e.g. more calibration samples)."""
    rng = np.random.default_rng(seed)
    return {t.name: _generate(t, rng) for t in spec.tensors}


# The accuracy samples' own stream of seeds. numpy's SeedSequence treats an int seed n like
# [n, 0, 0, ...], so a 3-word seed whose last word is non-zero can never equal an int seed: not
# the benchmark's --seed, not the quantize stage's calibration seeds (1000 + i).
_ACCURACY_STREAM = 0xACC


def accuracy_seed(seed: int, index: int) -> tuple[int, int, int]:
    """The seed of the index-th generated accuracy sample of a run with --seed `seed`."""
    return (seed, index, _ACCURACY_STREAM)


def generated_samples(spec: InputSpec, seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """`count` accuracy samples with the spec's shapes and meaning, disjoint from any int seed."""
    return [generate_feeds(spec, accuracy_seed(seed, i)) for i in range(count)]


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


def _contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping a 0-d array 0-d (np.ascontiguousarray makes a scalar input [1])."""
    return np.require(array, requirements="C")


def read_npz(path: Path, flag: str) -> dict[str, np.ndarray]:
    """Every array of a data file given as `flag` (--input-data, --calib-data ...), or one clear
    error naming the flag: the one reader of users' .npz files."""
    if not path.is_file():
        raise InputError(f"{flag} file not found: {path}", f"pass an existing .npz file to {flag}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:
        raise InputError(
            f"cannot read {flag} {path} as .npz: {exc}", "save arrays with numpy.savez(path, name=array)"
        ) from exc


def _load_npz(
    path: Path, specs: list[TensorSpec], first_sample: bool = False
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of an --input-data file, checked against the model's inputs, and warnings.
    `first_sample`: an array of samples stacked on a new first axis gives its first sample."""
    data = read_npz(path, "--input-data")
    # First: an empty array would otherwise be reported as a size mismatch on axis 0.
    warnings = check_data_arrays(data, "--input-data")
    if first_sample:
        ranks = {s.name: len(s.shape) for s in specs}
        data = {k: v[0] if k in ranks and v.ndim == ranks[k] + 1 else v for k, v in data.items()}
    check_feeds(specs, data, data_file="--input-data")
    return data, warnings


def _pinned_dims(spec: TensorSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[int, int]:
    """Axis -> size that --shape pins for a dynamic axis of `spec` (by input name or dim name)."""
    if spec.name in shapes and len(shapes[spec.name]) == len(spec.shape):
        return {
            a: n
            for a, (d, n) in enumerate(zip(spec.shape, shapes[spec.name], strict=True))
            if not isinstance(d, int)
        }
    return {
        a: shapes[d][0]
        for a, d in enumerate(spec.shape)
        if isinstance(d, str) and d in shapes and len(shapes[d]) == 1
    }


def _pad_to(name: str, array: np.ndarray, target: Mapping[int, int], flag: str) -> tuple[np.ndarray, str]:
    """Pad dynamic axes shorter than the pinned size with zeros (token ids 0, mask 0: padding a
    model masks out), with a warning; longer than pinned is an error (cutting would lose data)."""
    pad = [(0, 0)] * array.ndim
    grown: list[str] = []
    for axis, size in target.items():
        have = array.shape[axis]
        if have > size:
            raise InputError(
                f"{flag} array {name!r} has size {have} on axis {axis}, longer than the pinned {size}",
                f"pin a larger shape with --shape (e.g. --shape {name}="
                + "x".join(str(n if i != axis else have) for i, n in enumerate(array.shape))
                + ")",
            )
        if have < size:
            pad[axis] = (0, size - have)
            grown.append(f"axis {axis} from {have} to {size}")
    if not grown:
        return array, ""
    mask = "mask" in name.lower()
    what = "mask 0: padded positions are masked out" if mask else "zeros (padding id 0)"
    note = f"{flag} array {name!r} padded on {', '.join(grown)} with {what}" + (
        "" if mask else "; results are only right when the model masks padding (give its attention mask)"
    )
    return np.pad(array, pad), note


def _rebatch(
    name: str, array: np.ndarray, batch: int, axis: int | None = 0, first_rows: bool = False
) -> np.ndarray:
    if axis is None or array.ndim == 0 or array.shape[axis] == batch:
        return array
    if array.shape[axis] == 1:
        return np.repeat(array, batch, axis=axis)
    if first_rows and array.shape[axis] > batch:
        return np.take(array, np.arange(batch), axis=axis)
    raise InputError(
        f"--input-data array {name!r} has batch {array.shape[axis]}, cannot make batch {batch} from it",
        "give data with batch 1 (it is repeated) or the same batch as --batch",
    )


def scalar_warning(tensor: InputTensor, value: np.ndarray) -> str:
    """A generated scalar input is usually a setting (a sample rate, a threshold, a step count)."""
    return (
        f"input {tensor.name!r} is a scalar {tensor.dtype} generated as {value.item()!r}; a scalar input "
        "is usually meaningful (e.g. a sample rate or a threshold): give its real value with "
        f"--input-data (np.savez(..., {tensor.name}=np.array(VALUE, dtype=np.{tensor.dtype})))"
    )


def resolve_inputs(
    model_path: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    input_data: str | Path | None = None,
    seed: int = 0,
    batch: int | None = None,
    specs: list[TensorSpec] | None = None,
    first_rows: bool = False,
) -> tuple[InputSpec, dict[str, np.ndarray]]:
    """Pin every input and produce the arrays to feed.

    `specs` overrides the inputs read from `model_path` (artifacts whose model is not ONNX).
    `batch` sets a dynamic batch dim that --shape did not pin (the batch axis is found from the
    model, see `batch_axes`); with --input-data whose batch is 1 the rows are repeated to reach
    it, and with `first_rows` a file of more rows gives its first `batch` (the rest are accuracy
    samples; an array of samples stacked on a new first axis gives its first). A dynamic axis of the
    data shorter than --shape pins is padded (with a warning).
    Scalar inputs stay 0-d.
    """

    shapes = dict(shapes or {})
    onnx_path = Path(model_path)
    is_onnx = onnx_path.suffix == ".onnx"
    if specs is None:
        specs = model_input_specs(onnx_path)
    axes = batch_axes(specs)
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
            planned = []
            for spec_ in specs:
                if spec_.name not in headers:
                    continue
                dtype, shape = headers[spec_.name]
                axis = axes[spec_.name]
                if batch and axis is not None and axis < len(shape) and (shape[axis] == 1 or first_rows):
                    shape = (*shape[:axis], batch, *shape[axis + 1 :])
                planned.append((spec_.name, dtype, shape))
            check_memory(planned, onnx_path if is_onnx else None)
        data, warnings = _load_npz(path, specs, first_sample=first_rows)
        if batch is not None:
            data = {k: _rebatch(k, v, batch, axes.get(k, 0), first_rows) for k, v in data.items()}
        for spec_ in specs:
            target = {a: n for a, n in _pinned_dims(spec_, shapes).items() if a != axes[spec_.name]}
            data[spec_.name], note = _pad_to(spec_.name, data[spec_.name], target, "--input-data")
            if note:
                warnings.append(note)
        tensors = [
            InputTensor(s.name, s.dtype, tuple(data[s.name].shape), "file", batch_axis=axes[s.name])
            for s in specs
        ]
        spec = InputSpec(tensors, seed=seed, data_file=str(path), data_sha256=sha256_file(path),
                         warnings=warnings)  # fmt: skip
        return spec, {s.name: _contiguous(data[s.name]) for s in specs}

    vocab = embedding_vocab_sizes(onnx_path) if is_onnx else {}
    tensors = []
    for s in specs:
        generator, low, high, note = _describe_generator(s, vocab)
        tensors.append(
            InputTensor(
                s.name,
                s.dtype,
                _pin_shape(s, shapes, batch, axes[s.name]),
                "generated",
                generator,
                low,
                high,
                note,
                batch_axis=axes[s.name],
            )
        )
    check_memory([(t.name, t.dtype, t.shape) for t in tensors], onnx_path if is_onnx else None)
    spec = InputSpec(tensors, seed=seed)
    feeds = generate_feeds(spec, seed)
    spec.warnings += [scalar_warning(t, feeds[t.name]) for t in tensors if not t.shape]
    return spec, feeds


def _fit(array: np.ndarray, tensor: InputTensor) -> np.ndarray:
    """A data file's array made the shape the spec records (its first sample or rows, or its row
    repeated, on the batch axis; zero padding elsewhere), as resolve_inputs made it."""
    if array.ndim == len(tensor.shape) + 1:  # samples stacked on a new first axis: the first
        array = array[0]
    if tuple(array.shape) == tensor.shape or array.ndim != len(tensor.shape):
        return array
    axis = tensor.batch_axis
    if axis is not None and array.shape[axis] != tensor.shape[axis]:
        array = _rebatch(tensor.name, array, tensor.shape[axis], axis, first_rows=True)
    target = {a: n for a, n in enumerate(tensor.shape) if a != axis and array.shape[a] < n}
    return np.pad(array, [(0, target[a] - array.shape[a] if a in target else 0) for a in range(array.ndim)])


def feeds_from_spec(spec: InputSpec) -> dict[str, np.ndarray]:
    """Re-create the feeds a report or artifact describes."""
    if spec.data_file:
        path = Path(spec.data_file)
        if not path.is_file():
            raise InputError(f"the input data file {path} recorded in the spec is gone")
        with np.load(path, allow_pickle=False) as npz:
            return {t.name: _contiguous(_fit(npz[t.name], t)) for t in spec.tensors}
    return generate_feeds(spec, spec.seed)


# --- sample files: --eval-data, --input-data and --calib-data as lists of samples ----------------


@dataclass
class SampleFile:
    """An .npz read as samples shaped like the pinned feeds."""

    path: Path
    samples: list[dict[str, np.ndarray]]
    labels: dict[str, np.ndarray]  # arrays named like no model input (--eval-data: for --metric)
    warnings: list[str]
    restacked: bool = False  # rows were not on axis 0, or were padded: the file as is reads differently


def load_samples(
    path: str | Path,
    specs: Sequence[TensorSpec],
    like: Mapping[str, np.ndarray],
    flag: str,
    axes: Mapping[str, int | None] | None = None,
    labels_allowed: bool = False,
) -> SampleFile:
    """Read an .npz as samples shaped like `like` (the pinned feeds), checking it against the model
    first: every input present, its dtype, its rank, its fixed dims.

    Each input's array holds either rows along the input's batch axis (grouped into samples of the
    pinned batch; a remainder is dropped with a warning) or samples stacked on a new first axis
    ([samples, *pinned shape]); an array of the pinned rank without a batch axis (a scalar such as
    a sample rate) goes into every sample. A dynamic axis shorter than pinned is padded with zeros
    (a warning says so). Arrays named like no input are labels where `labels_allowed`, else an
    error naming them.
    """
    path = Path(path)
    axes = dict(axes) if axes is not None else batch_axes(specs)
    arrays = read_npz(path, flag)
    warnings = check_data_arrays(arrays, flag)
    names = [s.name for s in specs]
    labels = {k: v for k, v in arrays.items() if k not in names}
    if labels and not labels_allowed:
        raise InputError(
            f"{flag} has an array {sorted(labels)[0]!r} that is not a model input",
            f"the model's inputs are: {', '.join(names)}",
        )
    per_input: dict[str, list[np.ndarray]] = {}
    shared: dict[str, np.ndarray] = {}  # inputs without a batch axis: one value for every sample
    restacked = False
    padded: dict[str, str] = {}
    for spec in specs:
        if spec.name not in arrays:
            raise InputError(f"{flag} has no array for input {spec.name!r}", "add one array per model input")
        array, want = arrays[spec.name], np.asarray(like[spec.name])
        if str(array.dtype) != spec.dtype:
            raise InputError(
                f"{flag} array {spec.name!r} has dtype {array.dtype}, the model expects {spec.dtype}"
            )
        axis = axes.get(spec.name)
        pieces: list[np.ndarray] | None
        if array.ndim == want.ndim + 1:
            pieces = list(array)
        elif array.ndim == want.ndim and (axis is None or want.ndim == 0):
            pieces = None  # the same value in every sample
        elif array.ndim == want.ndim:
            assert axis is not None
            rows, size = array.shape[axis], want.shape[axis]
            if rows < size:
                if rows != 1:
                    raise InputError(
                        f"{flag} array {spec.name!r} has {rows} rows on its batch axis {axis}, fewer than "
                        f"the pinned batch {size}",
                        "give at least one batch of rows, or a smaller --batch",
                    )
                array, rows = np.repeat(array, size, axis=axis), size
            count = rows // size
            if rows % size:
                warnings.append(
                    f"{flag} array {spec.name!r}: {rows % size} rows left over after {count} batches of "
                    f"{size} are not used"
                )
            pieces = [np.take(array, np.arange(i * size, (i + 1) * size), axis=axis) for i in range(count)]
            restacked = restacked or axis != 0
        else:
            raise InputError(
                f"{flag} array {spec.name!r} has rank {array.ndim} (shape {list(array.shape)}), the model "
                f"input has rank {want.ndim} (pinned shape {list(want.shape)})",
                f"give rows along its batch axis, or samples stacked on a new first axis: {[8, *want.shape]}",
            )
        if pieces is None:
            shared[spec.name] = _fit_sample(flag, spec, array, want, axis, padded)
        else:
            per_input[spec.name] = [_fit_sample(flag, spec, piece, want, axis, padded) for piece in pieces]
    if padded:
        restacked = True
        warnings += list(padded.values())
    counts = {len(v) for v in per_input.values()}
    if len(counts) > 1:
        raise InputError(
            f"{flag}: inputs hold different numbers of samples {sorted(counts)}",
            "give every input the same number of rows",
        )
    count = counts.pop() if counts else 1
    samples = [
        {s.name: _contiguous(per_input[s.name][i] if s.name in per_input else shared[s.name]) for s in specs}
        for i in range(count)
    ]
    return SampleFile(path, samples, labels, warnings, restacked)


def _fit_sample(
    flag: str, spec: TensorSpec, piece: np.ndarray, want: np.ndarray, axis: int | None, padded: dict[str, str]
) -> np.ndarray:
    """One sample of one input checked against the model's fixed dims and the pinned shape; a
    shorter dynamic axis padded (the note kept once per input in `padded`)."""
    if piece.ndim != want.ndim:
        raise InputError(
            f"{flag} array {spec.name!r}: a sample has rank {piece.ndim}, the model input {want.ndim}"
        )
    target: dict[int, int] = {}
    for a, (have, size) in enumerate(zip(piece.shape, want.shape, strict=True)):
        fixed = isinstance(spec.shape[a], int)
        if have == size:
            continue
        if a == axis and have == 1:
            piece = np.repeat(piece, size, axis=a)
        elif fixed:
            raise InputError(
                f"{flag} array {spec.name!r} has size {have} on axis {a}, the model expects {size} "
                f"(shape {list(spec.shape)})"
            )
        elif a == axis:
            raise InputError(
                f"{flag} array {spec.name!r}: a sample has batch {have}, the run uses batch {size}",
                "give rows along the batch axis (they are grouped into batches) or --batch " + str(have),
            )
        else:
            target[a] = size
    if target:
        piece, note = _pad_to(spec.name, piece, target, flag)
        padded.setdefault(spec.name, note)
    return piece


def row_keys(sample: Mapping[str, np.ndarray], axes: Mapping[str, int | None]) -> set[bytes]:
    """A fingerprint of every row of a sample (all inputs' slices at one batch index), to find
    samples that are also calibration samples."""
    import hashlib

    batch = 1
    for name, array in sample.items():
        axis = axes.get(name)
        if axis is not None and array.ndim > axis:
            batch = array.shape[axis]
            break
    keys: set[bytes] = set()
    for i in range(batch):
        digest = hashlib.sha256()
        for name in sorted(sample):
            array, axis = sample[name], axes.get(name)
            sliced = axis is not None and array.ndim > axis and array.shape[axis] == batch
            row = np.take(array, i, axis=axis) if sliced else array
            digest.update(name.encode() + b"\0" + str(row.dtype).encode() + str(row.shape).encode())
            digest.update(np.ascontiguousarray(row).tobytes())
        keys.add(digest.digest())
    return keys
