"""The pipeline's accuracy gate and its inputs: what the samples are (never calibration rows), data
files checked before any stage, thresholds and metrics from the command line into the report and
the manifest, the user's metric. Measuring is faked as in test_pipeline.py; no timing is asserted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.accuracy import MetricError
from optimize.artifact import load_artifact
from optimize.errors import InputError, UsageError
from optimize.pipeline import OptimizeRequest, Pipeline, PipelineResult, optimize
from optimize.pipeline.baseline import prepare_inputs
from optimize.pipeline.request import apply_overrides, choose_recipe, parse_accuracy_spec
from optimize.recipes import Recipe
from optimize.report import load_report
from optimize.stage import Candidate, Stage, StageContext
from tests.accuracy.test_accuracy import make_head_model
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model
from tests.pipeline.test_pipeline import FakeBench, FakeStage, by_label, model_candidate, write_recipe


def run_on(
    tmp_path: Path,
    model: Path,
    stages: dict[str, Stage],
    speeds: dict[str, float],
    extra_recipe: str = "",
    **request_kw: Any,
) -> PipelineResult:
    recipe = write_recipe(tmp_path, list(stages), extra_recipe)
    bench = FakeBench({"baseline": 1.0, **speeds})
    request = OptimizeRequest(model_path=model, recipe=str(recipe), out_dir=tmp_path / "out", **request_kw)
    return optimize(request, stage_factory=stages.__getitem__, measure_fn=bench.measure,
                    compare_fn=bench.compare, open_worker_fn=bench.open_worker,
                    known_stages=list(stages))  # fmt: skip


@dataclass
class Prepared:
    """What a run knows once its inputs are resolved, before the baseline runs."""

    feeds: dict[str, np.ndarray]
    samples: list[dict[str, np.ndarray]]
    warnings: list[str]
    recipe: Recipe
    workdir: Path


def prepare(
    tmp_path: Path, model: Path, request: OptimizeRequest, recipe: Recipe, notes: list[str]
) -> Prepared:
    pipeline = Pipeline(request, recipe, recipe_notes=notes)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    inputs = prepare_inputs(pipeline.record, model, workdir)
    return Prepared(inputs.feeds, inputs.rows.samples, pipeline.record.warnings, recipe, workdir)


def prepared(tmp_path: Path, model: Path, extra_recipe: str = "", **request_kw: Any) -> Prepared:
    """A run with its inputs resolved (what runs before the baseline), and nothing else."""
    recipe_path = write_recipe(tmp_path, ["quantize"], extra_recipe)
    request = OptimizeRequest(model_path=model, recipe=str(recipe_path), **request_kw)
    recipe, _ = choose_recipe(request, known_stages=["quantize"])
    return prepare(tmp_path, model, request, recipe, apply_overrides(recipe, request))


# --- the gate in the loop -----------------------------------------------------------------------


def test_a_head_with_ruined_scores_is_rejected_naming_output_axis_and_slice(tmp_path: Path) -> None:
    model = make_head_model(tmp_path / "head.onnx")

    def noisy_scores(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        path = make_head_model(ctx.workdir / "int8.onnx", score_seed=1)
        return [Candidate(label="fake-int8", model_path=path)]

    result = run_on(tmp_path, model, {"fake-int8": FakeStage(noisy_scores)}, {"fake-int8": 0.5})
    row = by_label(result)["fake-int8"]
    assert row.status == "rejected"
    assert row.reason.startswith("inaccurate: output 'output0': ")
    assert "of axis 2 (length 6" in row.reason
    figures = row.accuracy["per_output"]["output0"]
    assert figures["cosine"] > 0.9999 and figures["slice"]["index"] in (4, 5)
    assert result.best.label == "baseline"
    # The metric chosen for the head, and why, is in the report.
    metrics = result.report["optimize"]["accuracy"]["metrics"]
    assert metrics["output0"]["metric"] == "detection" and "score fields" in metrics["output0"]["why"]


# --- samples: enough of them, never the calibration ones ----------------------------------------


def test_accuracy_samples_default_to_32_and_never_equal_calibration_inputs(tmp_path: Path) -> None:
    """Seed 1000 is where the old scheme (accuracy seeds seed+1+i) met the calibration seeds 1000+i."""
    from optimize.runtimes.quantization import generated_calibration
    from tests.factories import make_stage_context

    model = make_matmul_model(tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, ["quantize"]).read_text().replace("samples = 4\n", "")
    (tmp_path / "test-recipe.toml").write_text(recipe)
    request = OptimizeRequest(model_path=model, recipe=str(tmp_path / "test-recipe.toml"), seed=1000)
    chosen, _ = choose_recipe(request, known_stages=["quantize"])
    pipeline = prepare(tmp_path, model, request, chosen, [])
    assert len(pipeline.samples) == 32
    ctx = make_stage_context(tmp_path / "stage", model, feeds=pipeline.feeds)
    calibration = {c["x"].tobytes() for c in generated_calibration(ctx, 64)}
    assert calibration.isdisjoint(s["x"].tobytes() for s in pipeline.samples)
    # The benchmark input (--seed 1000, which calibration may also draw) is not judged on either.
    assert all(pipeline.feeds["x"].tobytes() != s["x"].tobytes() for s in pipeline.samples)


def test_input_data_rows_are_the_samples_and_the_first_is_benchmarked(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    rows = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", x=rows)
    pipeline = prepared(tmp_path, model, input_data=tmp_path / "rows.npz", batch=1)
    np.testing.assert_array_equal(pipeline.feeds["x"], rows[:1])
    assert len(pipeline.samples) == 40
    np.testing.assert_array_equal(pipeline.samples[39]["x"], rows[39:])
    assert not any("fewer than 32" in w for w in pipeline.warnings)
    few = prepared(tmp_path, model, input_data=_npz(tmp_path / "few.npz", x=rows[:3]))
    assert len(few.samples) == 3 and any("judged on 3 samples" in w for w in few.warnings)


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_eval_rows_that_are_calibration_rows_are_not_used(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    rows = np.random.default_rng(1).standard_normal((12, 16)).astype(np.float32)
    evals = _npz(tmp_path / "eval.npz", x=rows)
    static = '[stages.quantize]\nmode = "static"\n'
    overlap = prepared(
        tmp_path, model, static, eval_data=evals, calib_data=_npz(tmp_path / "c.npz", x=rows[:3])
    )
    assert len(overlap.samples) == 9
    assert not {s["x"].tobytes() for s in overlap.samples} & {rows[i : i + 1].tobytes() for i in range(3)}
    assert any("3 of 12 --eval-data samples are calibration rows too" in w for w in overlap.warnings)
    with pytest.raises(InputError, match=r"every --eval-data sample is also a --calib-data row"):
        prepared(tmp_path, model, static, eval_data=evals, calib_data=evals)
    # Fewer than 8 left to judge on: an error that says how many are needed.
    with pytest.raises(InputError, match=r"--eval-data \(less the calibration rows\) holds 4 sample"):
        prepared(tmp_path, model, static, eval_data=evals, calib_data=_npz(tmp_path / "c8.npz", x=rows[:8]))


def test_calib_data_is_checked_before_any_stage_and_unused_modes_are_warned(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    stage = FakeStage(model_candidate("quantize:fake"))
    bad = _npz(tmp_path / "bad.npz", x=np.zeros((4, 16), np.float64))
    with pytest.raises(InputError, match="--calib-data array 'x' has dtype float64"):
        run_on(tmp_path, model, {"quantize": stage}, {}, calib_data=bad)
    assert stage.calls == 0
    rows = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    good = _npz(tmp_path / "calib.npz", x=rows)
    dynamic = prepared(tmp_path, model, '[stages.quantize]\nmode = "dynamic"\n', calib_data=good)
    unused = "--calib-data is not used to calibrate: quantize searches dynamic int8 only"
    assert any(w.startswith(unused) for w in dynamic.warnings)
    assert len(dynamic.samples) == 16  # nothing calibrates on it: every row judges
    auto = prepared(tmp_path, model, '[stages.quantize]\nmode = "auto"\n', calib_data=good)
    assert not any("is not used to calibrate" in w for w in auto.warnings)  # static points may run
    assert len(auto.samples) == 8  # half judges, half calibrates
    off = prepared(tmp_path, model, '[stages.quantize]\nmode = "static"\n', calib_data=good, quantize="never")
    never = "--calib-data is not used to calibrate: the quantize stage is off (--quantize never)"
    assert never in off.warnings
    used = prepared(tmp_path, model, '[stages.quantize]\nmode = "static"\n', calib_data=good)
    assert not any("is not used to calibrate" in w for w in used.warnings)


def test_calib_data_rows_off_axis_zero_are_restacked_for_the_quantize_stage(tmp_path: Path) -> None:
    from optimize.runtimes.quantization import load_calibration
    from tests.data.test_inputs import make_state_model

    model = make_state_model(tmp_path / "vad.onnx")
    x = np.random.default_rng(4).standard_normal((16, 4)).astype(np.float32)
    calib = _npz(tmp_path / "calib.npz", x=x, sr=np.array(16000), state=np.zeros((2, 16, 4), np.float32))
    pipeline = prepared(tmp_path, model, '[stages.quantize]\nmode = "static"\n', calib_data=calib)
    given = pipeline.recipe.stage("quantize").options["calib_data"]
    assert Path(given).parent == pipeline.workdir
    samples = load_calibration(given, pipeline.feeds)  # what the stage will read: the calibration half
    assert len(samples) == 8 and samples[0]["state"].shape == (2, 1, 4) and samples[0]["sr"].shape == ()


def test_every_data_file_is_read_by_one_reader_whose_errors_name_the_flag(tmp_path: Path) -> None:
    from optimize.data import read_npz
    from optimize.errors import InputError
    from optimize.runtimes.quantization import load_calibration

    like = {"x": np.zeros((1, 4), np.float32)}
    with pytest.raises(InputError, match="--calib-data file not found"):
        load_calibration(tmp_path / "none.npz", like)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"cannot read --calib-data .*broken\.npz as \.npz") as info:
        load_calibration(broken, like)
    assert "numpy.savez" in info.value.one_line()
    with pytest.raises(InputError, match="cannot read --input-data"):
        read_npz(broken, "--input-data")
    good = _npz(tmp_path / "good.npz", x=np.ones((3, 4), np.float32))
    assert read_npz(good, "--eval-data")["x"].shape == (3, 4)


# --- thresholds, task metrics, the user's metric ------------------------------------------------


def test_parse_accuracy_spec() -> None:
    assert parse_accuracy_spec("cosine>=0.995, top1>=0.98,rel<=0.1,abs=off,samples=64,task-cosine>=0.7") == {
        "min_cosine": 0.995,
        "min_top1": 0.98,
        "max_rel": 0.1,
        "max_abs": None,
        "samples": 64,
        "min_task_cosine": 0.7,
    }
    assert parse_accuracy_spec("ctc>=0.97,detection>=0.8,detection-iou=0.6") == {
        "min_ctc": 0.97,
        "min_detection": 0.8,
        "detection_iou": 0.6,
    }
    for bad, needle in (
        ("cosine>0.9", "bad --accuracy item"),
        ("speed>=2", "unknown key 'speed'"),
        ("cosine<=0.9", "cosine takes >="),
        ("cosine>=high", "needs a number"),
        ("cosine=off", "cosine cannot be off"),
        ("top1>=0.9,top1>=0.8", "top1 given twice"),
    ):
        with pytest.raises(UsageError, match=needle):
            parse_accuracy_spec(bad)
    with pytest.raises(UsageError, match=r"min_cosine: must be at most 1\.0"):
        OptimizeRequest(model_path=Path("m.onnx"), accuracy="cosine>=1.5").validate()


METRIC = """
import numpy as np

seen = {}

def agree(reference, candidate, inputs, labels):
    same = [np.array_equal(np.argmax(r["y"], 1), np.argmax(c["y"], 1)) for r, c in zip(reference, candidate)]
    seen["labels"] = None if labels is None else sorted(labels)
    seen["rows"] = len(inputs)
    share = sum(same) / len(same)
    return share, share >= 0.95
"""


def test_eval_data_labels_and_the_user_metric_reach_the_report_and_manifest(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    metric = tmp_path / "agree.py"
    metric.write_text(METRIC, encoding="utf-8")
    rows = np.random.default_rng(2).standard_normal((40, 16)).astype(np.float32)
    evals = _npz(tmp_path / "eval.npz", x=rows, label=np.arange(40))
    stages: dict[str, Stage] = {
        "fake-fast": FakeStage(model_candidate("fake-fast", extra_work=1)),
        "fake-wrong": FakeStage(model_candidate("fake-wrong", seed=9)),
    }
    loose = {"min_task_cosine": 0.0, "min_top1": None}  # only the user's metric decides
    result = run_on(tmp_path, model, stages, {"fake-fast": 0.5, "fake-wrong": 0.25}, eval_data=evals,
                    metric=f"{metric}:agree", accuracy=loose)  # fmt: skip
    rows_by = by_label(result)
    assert rows_by["fake-fast"].status == "kept"
    assert rows_by["fake-wrong"].status == "rejected"
    assert "--metric agree.py:agree: score" in rows_by["fake-wrong"].reason
    section = load_report(result.artifact_dir / "report.json")["optimize"]  # validated by the schema
    accuracy = section["accuracy"]
    assert accuracy["user_metric"] == {"name": "agree.py:agree", "score": 1.0, "ok": True}
    assert accuracy["samples"] == 40 and accuracy["sample_source"] == "--eval-data eval.npz (40 samples)"
    assert accuracy["thresholds"]["min_top1"] is None and accuracy["thresholds"]["min_task_cosine"] == 0.0
    manifest = load_artifact(result.artifact_dir).manifest
    assert manifest["accuracy"]["thresholds"] == accuracy["thresholds"]
    assert manifest["accuracy"]["user_metric"]["name"] == "agree.py:agree"
    md = (result.artifact_dir / "report.md").read_text()
    assert "agree.py:agree 1 (pass)" in md and "- accuracy thresholds: cosine >= 0.99" in md
    assert "`y`: classifier: [batch, 4] float" in md


def test_a_metric_that_fails_the_original_or_breaks_on_a_candidate_is_a_usage_error(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    stage = FakeStage(model_candidate("fake-other", seed=9))
    never = tmp_path / "never.py"
    never.write_text("def m(reference, candidate, inputs, labels):\n    return 0.0, False\n")
    with pytest.raises(UsageError, match=r"--metric never\.py:m fails the original model's own outputs"):
        run_on(tmp_path, model, {"fake-other": stage}, {}, metric=f"{never}:m")
    assert stage.calls == 0
    fragile = tmp_path / "fragile.py"
    fragile.write_text(
        "import numpy as np\n\ndef m(reference, candidate, inputs, labels):\n"
        "    same = all(np.array_equal(r['y'], c['y']) for r, c in zip(reference, candidate))\n"
        "    assert same, 'outputs moved'\n"
        "    return 1.0, True\n"
    )
    with pytest.raises(MetricError, match=r"--metric fragile\.py:m raised AssertionError: outputs moved"):
        (tmp_path / "b").mkdir()
        run_on(tmp_path / "b", model, {"fake-other": stage}, {}, metric=f"{fragile}:m")


@pytest.mark.slow
def test_cli_accuracy_flags_into_report_and_manifest(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, ["operator-fusion"])
    out = tmp_path / "art"
    proc = run_cli("optimize", model, "--recipe", recipe, "-o", out, "--json", "--accuracy",
                   "cosine>=0.95,rel<=0.5", "--min-top1", "0.9", "--task-metric", "y=embedding")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    accuracy = json.loads(proc.stdout)["optimize"]["accuracy"]
    assert accuracy["thresholds"]["min_cosine"] == 0.95 and accuracy["thresholds"]["max_rel"] == 0.5
    assert accuracy["thresholds"]["min_top1"] == 0.9
    assert accuracy["metrics"]["y"] == {
        "metric": "embedding",
        "why": accuracy["metrics"]["y"]["why"],
        "source": "override",
    }
    assert load_artifact(out).manifest["accuracy"]["thresholds"]["min_cosine"] == 0.95

    for args, needle in (
        (["--task-metric", "y=banana"], "bad --task-metric 'y=banana'"),
        (["--task-metric", "nope=none"], "task metric set for 'nope', which is not an output"),
        (
            ["--accuracy", "cosine>=0.9", "--min-cosine", "0.8"],
            "--min-cosine and --accuracy both set min_cosine",
        ),
        (["--metric", "missing.py:score"], "--metric file not found: missing.py"),
        (["--eval-data", str(tmp_path / "none.npz")], "--eval-data file not found"),
    ):
        bad = run_cli("optimize", model, "--recipe", recipe, "-o", tmp_path / "bad", *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert needle in bad.stderr and "Traceback" not in bad.stderr
