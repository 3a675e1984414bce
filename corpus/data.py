"""Running corpus models on onnxruntime and writing their samples as .npz files that `lto` reads.

Two files per entry, because lto reads them differently (optimize/data/, quantize.py):
- `--input-data`: ONE sample, one array per input named after it, exactly as fed to the model. lto
  checks it against the model's inputs (fixed dims included), so a stack of samples is refused for a
  fixed-batch model and, for a dynamic-batch one, silently becomes a bigger benchmark batch.
- `--calib-data` (and `--eval-data`): samples with each input stacked on a NEW leading axis
  ([n, *feed.shape]), which lto's `load_calibration` splits back into per-sample feeds. That works for
  every entry, silero's included: `state` has its batch on axis 1 ([2,1,128] -> [n,2,1,128]) and `sr`
  is 0-d (-> [n]), where concatenating along a batch axis would not split back correctly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

Feed = dict[str, np.ndarray]


def ort_session(model: Path, threads: int | None = None) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # ddddocr's OCR model declares a wrong output shape: ORT warns each run
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def run_model(model: Path, samples: Sequence[Feed]) -> list[Feed]:
    """Outputs of the model on ONNX Runtime defaults, one dict (by output name) per sample."""
    session = ort_session(model)
    names = [o.name for o in session.get_outputs()]  # type: ignore[attr-defined]
    return [dict(zip(names, session.run(None, dict(s)), strict=True)) for s in samples]  # type: ignore[attr-defined]


def write_input_npz(sample: Feed, path: Path) -> Path:
    """One sample for `lto ... --input-data`: arrays named by input, shapes as fed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # np.asarray, not np.ascontiguousarray: the latter turns silero's 0-d `sr` into shape (1,).
    np.savez(path, **{k: np.asarray(v) for k, v in sample.items()})
    return path


def write_calib_npz(samples: Sequence[Feed], path: Path) -> Path:
    """Samples for `lto optimize --calib-data`: each input stacked on a new leading axis."""
    if not samples:
        raise ValueError("no samples to write")
    names = list(samples[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{k: np.stack([s[k] for s in samples]) for k in names})
    return path


def read_calib_npz(path: Path) -> list[Feed]:
    """The inverse of write_calib_npz."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    count = len(next(iter(arrays.values())))
    return [{k: v[i] for k, v in arrays.items()} for i in range(count)]


def write_npz_pair(name: str, samples: Sequence[Feed], folder: Path) -> tuple[Path, Path]:
    """`<name>.input.npz` (the first sample) and `<name>.calib.npz` (the others) in `folder`.

    Disjoint on purpose: lto judges accuracy on the --input-data row and refuses to judge it on a row
    the model was calibrated on.
    """
    if len(samples) < 2:
        raise ValueError("need at least two samples: one to run on, the others to calibrate with")
    return (
        write_input_npz(samples[0], folder / f"{name}.input.npz"),
        write_calib_npz(samples[1:], folder / f"{name}.calib.npz"),
    )
