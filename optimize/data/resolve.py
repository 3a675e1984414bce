"""One input specification for every command: pinned shapes, real data or meaningful generated data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.backend import TensorSpec
from optimize.data.generate import check_memory, describe_generator, generate_feeds
from optimize.data.npz import contiguous, load_npz, npz_headers, pad_to, pinned_dims, rebatch
from optimize.data.spec import InputSpec, InputTensor, batch_axes, embedding_vocab_sizes, model_input_specs
from optimize.errors import InputError
from optimize.files import sha256_file


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
        headers = npz_headers(path) if path.is_file() else None
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
        data, warnings = load_npz(path, specs, first_sample=first_rows)
        if batch is not None:
            data = {k: rebatch(k, v, batch, axes.get(k, 0), first_rows) for k, v in data.items()}
        for spec_ in specs:
            target = {a: n for a, n in pinned_dims(spec_, shapes).items() if a != axes[spec_.name]}
            data[spec_.name], note = pad_to(spec_.name, data[spec_.name], target, "--input-data")
            if note:
                warnings.append(note)
        tensors = [
            InputTensor(s.name, s.dtype, tuple(data[s.name].shape), "file", batch_axis=axes[s.name])
            for s in specs
        ]
        # Absolute: an artifact is read again from other folders (lto serve, bench, export).
        spec = InputSpec(tensors, seed=seed, data_file=str(Path(path).resolve()),
                         data_sha256=sha256_file(path), warnings=warnings)  # fmt: skip
        return spec, {s.name: contiguous(data[s.name]) for s in specs}

    vocab = embedding_vocab_sizes(onnx_path) if is_onnx else {}
    tensors = []
    for s in specs:
        generator, low, high, note = describe_generator(s, vocab)
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
        array = rebatch(tensor.name, array, tensor.shape[axis], axis, first_rows=True)
    target = {a: n for a, n in enumerate(tensor.shape) if a != axis and array.shape[a] < n}
    return np.pad(array, [(0, target[a] - array.shape[a] if a in target else 0) for a in range(array.ndim)])


def feeds_from_spec(spec: InputSpec) -> dict[str, np.ndarray]:
    """Re-create the feeds a report or artifact describes."""
    if spec.data_file:
        path = Path(spec.data_file)
        if not path.is_file():
            raise InputError(f"the input data file {path} recorded in the spec is gone")
        with np.load(path, allow_pickle=False) as npz:
            return {t.name: contiguous(_fit(npz[t.name], t)) for t in spec.tensors}
    return generate_feeds(spec, spec.seed)
