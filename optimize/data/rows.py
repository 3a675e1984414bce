"""Which rows judge accuracy and which calibrate: the user's real rows first, never one row for both.

Generated inputs judge nothing the user will run: a byte classifier fed random bytes gives
near-uniform logits, a detector fed noise detects nothing (docs/accuracy-evidence.md). So:

- `--eval-data` judges, when given; `--calib-data` (or `--data`) then calibrates, whole;
- with `--calib-data` or `--data` alone, the rows are split with `--seed`: half calibrate, the
  other half judge (when no stage calibrates, all of them judge);
- `--input-data` alone judges on its own rows;
- generated inputs judge only when the user gave no rows at all, and then no reduced or
  quantized candidate can ship (optimize/accuracy/evidence.py).

Every row that judges is checked not to be a calibration row too. Too few rows to judge is a
one-line error that says how many are needed. The plan says, for the log and the report, which
rows served which purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.accuracy import MIN_ROWS
from optimize.backend import TensorSpec
from optimize.data.npz import load_samples, row_keys
from optimize.errors import InputError
from optimize.units import index_ranges

Sample = dict[str, np.ndarray]
MIN_CALIBRATION_ROWS = 8  # fewer, and int8 ranges come from a handful of inputs


@dataclass
class RealRows:
    """Rows the user gave, already read: from an .npz flag or `--data` (optimize/data/datasets.py)."""

    flag: str  # "--calib-data", "--data"
    path: Path
    samples: list[Sample]
    restacked: bool = False  # the file as is reads differently from the pinned samples
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # information for the log, not warnings


@dataclass
class RowPlan:
    """The judging rows, where they came from, and what calibrates."""

    samples: list[Sample]
    source: str  # in words, for the log, the report and every "cannot tell"
    real: bool
    labels: dict[str, np.ndarray] | None = None
    # The file the calibrating stages read instead of the user's (a split, or rows restacked at
    # the pinned shapes); None: leave their options as the recipe and flags set them.
    calibration_file: Path | None = None
    purposes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def split_rows(count: int, seed: int) -> tuple[list[int], list[int]]:
    """(judging indices, calibration indices): a seeded half of the rows judges, the rest (the
    larger half when odd) calibrates. Shuffled, not alternated: rows are often ordered by class."""
    order = np.random.default_rng(seed).permutation(count)
    judge = sorted(int(i) for i in order[: count // 2])
    calibrate = sorted(int(i) for i in order[count // 2 :])
    return judge, calibrate


def _keys(samples: Sequence[Sample], axes: Mapping[str, int | None]) -> set[bytes]:
    keys: set[bytes] = set()
    for sample in samples:
        keys |= row_keys(sample, axes)
    return keys


def _without(
    samples: list[Sample], calibration: Sequence[Sample], axes: Mapping[str, int | None]
) -> tuple[list[Sample], int]:
    """The samples that share no row with `calibration`, and how many were dropped."""
    if not calibration:
        return samples, 0
    calib = _keys(calibration, axes)
    kept = [s for s in samples if not row_keys(s, axes) & calib]
    return kept, len(samples) - len(kept)


def _write_calibration(samples: Sequence[Sample], specs: Sequence[TensorSpec], path: Path) -> Path:
    """Samples stacked on a new first axis: how the calibrating stages read a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{s.name: np.stack([x[s.name] for x in samples]) for s in specs})
    return path


def _too_few(what: str, count: int, need: int, hint: str) -> InputError:
    return InputError(f"{what} holds {count} sample(s); lto needs at least {need} {hint}")


def plan_rows(
    *,
    specs: Sequence[TensorSpec],
    feeds: Mapping[str, np.ndarray],
    axes: Mapping[str, int | None],
    seed: int,
    workdir: Path,
    eval_data: Path | None,
    input_data: Path | None,
    calibration: RealRows | None,
    calibrates: bool,
    generated: Callable[[], tuple[list[Sample], str]],
) -> RowPlan:
    """The rows that judge accuracy, and the calibration file when it must be rewritten.

    `calibration` is --calib-data or --data, read; `calibrates` whether an enabled stage will read
    calibration rows; `generated` makes the generated samples (and says how), used only when the
    user gave no rows at all."""
    warnings: list[str] = list(calibration.warnings) if calibration is not None else []
    if eval_data is not None:
        data = load_samples(eval_data, specs, feeds, "--eval-data", axes, labels_allowed=True)
        warnings += data.warnings
        calib_rows = calibration.samples if calibration is not None else []
        samples, dropped = _without(data.samples, calib_rows, axes)
        source = f"--eval-data {Path(eval_data).name} ({len(samples)} samples)"
        if dropped:
            if not samples:
                raise InputError(
                    f"every --eval-data sample is also a {calibration.flag if calibration else ''} row",
                    "judge accuracy on rows the model was not calibrated on",
                )
            warnings.append(
                f"{dropped} of {len(data.samples)} --eval-data samples are calibration rows too and do "
                "not judge accuracy"
            )
        if len(samples) < MIN_ROWS:
            raise _too_few(
                "--eval-data" + (" (less the calibration rows)" if dropped else ""),
                len(samples),
                MIN_ROWS,
                "to judge accuracy: give more rows",
            )
        plan = RowPlan(samples, source, True, data.labels or None, warnings=warnings)
        plan.purposes["judge"] = _part("--eval-data", eval_data, len(samples))
        if calibration is not None:
            plan.purposes["calibration"] = _whole(calibration)
            if calibration.restacked:
                plan.calibration_file = _write_calibration(
                    calibration.samples, specs, workdir / "calib-data.npz"
                )
        plan.notes.append(f"rows: accuracy is judged on {source}; {_calibration_words(calibration)}")
        return plan

    if calibration is not None:
        return _split_plan(calibration, specs, axes, seed, workdir, calibrates, warnings)

    if input_data is not None:
        data = load_samples(input_data, specs, feeds, "--input-data", axes)
        warnings += data.warnings
        source = f"--input-data {Path(input_data).name} ({len(data.samples)} samples)"
        if len(data.samples) < MIN_ROWS:
            warnings.append(
                f"accuracy is judged on {len(data.samples)} samples ({source}): real, enough to check "
                f"fp32 candidates, too few to verify a reduced or quantized one (at least {MIN_ROWS}); "
                f"give --eval-data, or --calib-data with at least {2 * MIN_ROWS} samples"
            )
        plan = RowPlan(data.samples, source, True, warnings=warnings)
        plan.purposes["judge"] = _part("--input-data", input_data, len(data.samples))
        plan.notes.append(f"rows: accuracy is judged on {source}")
        return plan

    samples, how = generated()
    source = f"generated ({how})"
    plan = RowPlan(samples, source, False, warnings=warnings)
    plan.purposes["judge"] = _part(None, None, len(samples), generated=how)
    plan.notes.append(
        f"rows: no real rows given; accuracy is judged on {source}, which cannot verify a reduced or "
        "quantized candidate"
    )
    return plan


def _part(flag: str | None, path: Path | None, samples: int, **more: Any) -> dict[str, Any]:
    """What a set of rows did, for the report: the flag, the file and how many samples."""
    return {"flag": flag, "file": str(path) if path is not None else None, "samples": samples, **more}


def _whole(rows: RealRows) -> dict[str, Any]:
    return _part(rows.flag, rows.path, len(rows.samples))


def _calibration_words(rows: RealRows | None) -> str:
    if rows is None:
        return "calibration (if any) on generated inputs"
    return f"calibration on all {len(rows.samples)} samples of {rows.flag} {rows.path.name}"


def _split_plan(
    rows: RealRows,
    specs: Sequence[TensorSpec],
    axes: Mapping[str, int | None],
    seed: int,
    workdir: Path,
    calibrates: bool,
    warnings: list[str],
) -> RowPlan:
    """--calib-data or --data alone: half judges, half calibrates (all judge when none calibrates)."""
    name, count = f"{rows.flag} {rows.path.name}", len(rows.samples)
    if not calibrates:
        if count < MIN_ROWS:
            raise _too_few(rows.flag, count, MIN_ROWS, "to judge accuracy: give more rows")
        source = f"{name} ({count} samples; no stage calibrates)"
        plan = RowPlan(list(rows.samples), source, True, warnings=warnings)
        plan.purposes["judge"] = _whole(rows)
        plan.notes.append(f"rows: no stage calibrates, so all {count} samples of {name} judge accuracy")
        return plan
    need = MIN_ROWS + MIN_CALIBRATION_ROWS
    if count < need:
        raise _too_few(
            rows.flag,
            count,
            need,
            f"to calibrate on some ({MIN_CALIBRATION_ROWS}+) and judge accuracy on others ({MIN_ROWS}+): "
            f"give more rows, or --eval-data with at least {MIN_ROWS} samples",
        )
    judge_idx, calib_idx = split_rows(count, seed)
    calibration = [rows.samples[i] for i in calib_idx]
    judged, dropped = _without([rows.samples[i] for i in judge_idx], calibration, axes)
    if len(judged) < MIN_ROWS:
        raise InputError(
            f"{rows.flag}: {dropped} of the {len(judge_idx)} samples held out to judge accuracy repeat "
            f"calibration rows, leaving {len(judged)} (at least {MIN_ROWS} needed)",
            "give distinct rows, or --eval-data",
        )
    if dropped:
        warnings.append(f"{dropped} held-out {rows.flag} samples repeat calibration rows and do not judge")
    source = f"{name}, {len(judged)} of its {count} samples held out from calibration"
    plan = RowPlan(judged, source, True, warnings=warnings)
    plan.calibration_file = _write_calibration(calibration, specs, workdir / "calib-data.npz")
    plan.purposes["judge"] = _part(rows.flag, rows.path, len(judged), indices=judge_idx)
    plan.purposes["calibration"] = _part(rows.flag, rows.path, len(calib_idx), indices=calib_idx)
    plan.purposes["split_seed"] = seed
    plan.notes.append(
        f"rows: {name} split with seed {seed}: accuracy is judged on samples {index_ranges(judge_idx)} "
        f"({len(judged)}), calibration on samples {index_ranges(calib_idx)} ({len(calib_idx)}); no row "
        "does both"
    )
    return plan


def read_real_rows(
    flag: str,
    path: Path,
    specs: Sequence[TensorSpec],
    feeds: Mapping[str, np.ndarray],
    axes: Mapping[str, int | None],
) -> RealRows:
    """An .npz of rows (--calib-data, or --data FILE.npz) read as pinned samples."""
    data = load_samples(path, specs, feeds, flag, axes, labels_allowed=True)
    warnings = list(data.warnings)
    if data.labels:
        warnings.append(f"{flag} arrays {', '.join(sorted(data.labels))} are not model inputs: ignored")
    return RealRows(flag, Path(path), data.samples, data.restacked, warnings)


__all__ = [
    "MIN_CALIBRATION_ROWS",
    "RealRows",
    "RowPlan",
    "plan_rows",
    "read_real_rows",
    "split_rows",
]
