"""Users' `.npz` files: one reader, their checks, and rows fitted to the shapes a model was pinned to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimize.backend import TensorSpec, check_feeds
from optimize.data.spec import batch_axes
from optimize.errors import InputError


def npz_headers(path: Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
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


def contiguous(array: np.ndarray) -> np.ndarray:
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


def load_npz(
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


def pinned_dims(spec: TensorSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[int, int]:
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


def pad_to(name: str, array: np.ndarray, target: Mapping[int, int], flag: str) -> tuple[np.ndarray, str]:
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


def rebatch(
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
        {s.name: contiguous(per_input[s.name][i] if s.name in per_input else shared[s.name]) for s in specs}
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
        piece, note = pad_to(spec.name, piece, target, flag)
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
