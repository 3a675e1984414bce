"""Which rows judge and which calibrate (optimize/data/rows.py): real rows first, never both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimize.accuracy import MIN_ROWS
from optimize.data import batch_axes, model_input_specs, resolve_inputs
from optimize.data.rows import RowPlan, plan_rows, read_real_rows, split_rows
from optimize.errors import InputError
from optimize.units import index_ranges
from tests.conftest import make_matmul_model


def _rows(path: Path, count: int, seed: int = 0) -> Path:
    np.savez(path, x=np.random.default_rng(seed).standard_normal((count, 1, 16)).astype(np.float32))
    return path


def _plan(tmp_path: Path, **kw: object) -> RowPlan:
    model = make_matmul_model(tmp_path / "m.onnx")
    specs = model_input_specs(model)
    _, feeds = resolve_inputs(model, {}, batch=1)
    axes = batch_axes(specs)
    calib = kw.pop("calib", None)
    calibration = read_real_rows("--calib-data", calib, specs, feeds, axes) if calib else None
    args: dict[str, object] = {
        "eval_data": None,
        "input_data": None,
        "calibrates": True,
        "generated": lambda: ([dict(feeds)] * 32, "seed 0, 32 samples"),
        **kw,
    }
    return plan_rows(
        specs=specs, feeds=feeds, axes=axes, seed=0, workdir=tmp_path / "work", calibration=calibration,
        **args,  # type: ignore[arg-type]
    )  # fmt: skip


def _keys(samples: list[dict[str, np.ndarray]]) -> set[bytes]:
    return {s["x"].tobytes() for s in samples}


def test_calibration_rows_alone_are_split_into_disjoint_halves_that_the_report_names(tmp_path: Path) -> None:
    plan = _plan(tmp_path, calib=_rows(tmp_path / "calib.npz", 32))
    assert plan.real and len(plan.samples) == 16
    judge, calib = plan.purposes["judge"], plan.purposes["calibration"]
    assert judge["samples"] == 16 and calib["samples"] == 16
    assert sorted(judge["indices"] + calib["indices"]) == list(range(32))
    # The stages calibrate from lto's file, which holds exactly the other half.
    assert plan.calibration_file is not None
    with np.load(plan.calibration_file) as npz:
        calibrated = [{"x": row} for row in npz["x"]]
    assert not _keys(calibrated) & _keys(plan.samples)
    assert len(calibrated) == 16
    assert any("no row does both" in note and index_ranges(judge["indices"]) in note for note in plan.notes)
    # The same seed splits the same way; the rows are shuffled, not alternated.
    assert split_rows(32, 0) == split_rows(32, 0) and split_rows(32, 0)[0] != list(range(0, 32, 2))


def test_too_few_calibration_rows_to_split_is_an_error_that_says_how_many(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"holds 10 sample\(s\); lto needs at least 16"):
        _plan(tmp_path, calib=_rows(tmp_path / "calib.npz", 10))


def test_when_no_stage_calibrates_every_calibration_row_judges(tmp_path: Path) -> None:
    plan = _plan(tmp_path, calib=_rows(tmp_path / "calib.npz", 10), calibrates=False)
    assert len(plan.samples) == 10 and plan.calibration_file is None
    assert "no stage calibrates" in plan.source


def test_eval_data_judges_less_the_rows_that_also_calibrate(tmp_path: Path) -> None:
    calib = _rows(tmp_path / "calib.npz", 12, seed=1)
    both = np.load(calib)["x"][:3]
    extra = np.random.default_rng(2).standard_normal((9, 1, 16)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=np.concatenate([both, extra]))
    plan = _plan(tmp_path, calib=calib, eval_data=tmp_path / "eval.npz")
    assert len(plan.samples) == 9 and plan.real
    assert any("3 of 12 --eval-data samples are calibration rows" in w for w in plan.warnings)
    assert plan.purposes["calibration"]["samples"] == 12


def test_too_few_eval_rows_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=rf"--eval-data holds 5 sample\(s\); lto needs at least {MIN_ROWS}"):
        _plan(tmp_path, eval_data=_rows(tmp_path / "eval.npz", 5))


def test_input_data_alone_judges_on_its_rows_and_says_when_they_are_too_few(tmp_path: Path) -> None:
    plan = _plan(tmp_path, input_data=_rows(tmp_path / "in.npz", 1))
    assert plan.real and len(plan.samples) == 1
    assert any("too few to verify a reduced or quantized one" in w for w in plan.warnings)


def test_generated_rows_only_when_the_user_gave_none(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert not plan.real and len(plan.samples) == 32 and plan.source.startswith("generated")
