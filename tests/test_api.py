"""The Python API (`import optimize`): bench, optimize, load and run, without the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import optimize
from optimize.errors import UsageError
from tests.cli_helpers import ROOT
from tests.conftest import sample_path

HEAVY = ("onnxruntime", "onnx", "tvm", "tensorrt", "tensorrt_rtx")


def test_import_optimize_stays_light() -> None:
    code = "import sys, optimize; print(' '.join(m for m in sys.modules if m.split('.')[0] in sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, *HEAVY], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert proc.stdout.strip() == ""
    assert set(optimize.__all__) >= {"optimize_model", "bench_model", "load", "__version__"}


def test_dir_lists_the_api_before_it_loads() -> None:
    """`dir(optimize)` (and an interactive session's completion) shows the API, which loads only
    on first use, without loading it."""
    code = "import sys, optimize; print(' '.join(dir(optimize))); print('optimize.api' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    names, loaded = proc.stdout.splitlines()
    assert {"optimize_model", "bench_model", "load", "LoadedModel", "__version__"} <= set(names.split())
    assert loaded == "False"


def test_bench_optimize_load_and_run_match_onnxruntime(tmp_path: Path) -> None:
    model = sample_path("mlp_small.onnx")
    report = optimize.bench_model(model, time="0.5s", warmup=2, min_runs=10, max_runs=30)
    assert report["kind"] == "bench" and report["results"][0]["latency_ms"]["p50"] > 0

    result = optimize.optimize_model(model, target_ms=100, output=tmp_path / "art", stop_at_target=True)
    assert result.exit_code == 0 and result.artifact_dir == tmp_path / "art"

    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    feeds = {
        i.name: np.random.default_rng(0).standard_normal((4, *i.shape[1:])).astype(np.float32)
        for i in reference.get_inputs()
    }
    expected = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feeds), strict=True))
    with optimize.load(result.artifact_dir) as loaded:
        assert [spec.name for spec in loaded.inputs] == list(feeds)
        outputs = loaded.run(feeds)
        assert set(outputs) == set(expected)
        for name, want in expected.items():
            np.testing.assert_allclose(outputs[name], want, rtol=1e-4, atol=1e-5)
        assert set(loaded.run(loaded.example_inputs())) == set(expected)
    with optimize.load(model) as plain:  # a plain .onnx file runs on ONNX Runtime defaults
        assert plain.manifest is None and set(plain.run(feeds)) == set(expected)


@pytest.mark.slow
def test_bench_model_repeats_in_fresh_processes_with_a_minimum_time() -> None:
    model = sample_path("mlp_small.onnx")
    report = optimize.bench_model(model, time="0.3s", min_time="0.2s", repeat=2, warmup=2, min_runs=5)
    assert report["settings"]["repeat"] == 2
    assert report["settings"]["bench"]["min_time_s"] == 0.2
    assert report["settings"]["bench"]["target_ci_rel"] is None  # repetitions spend their time
    assert len(report["results"][0]["repetitions"]) == 2
    with pytest.raises(UsageError, match="min_time 2s is more than time 1s"):
        optimize.bench_model(model, time="1s", min_time="2s")
    with pytest.raises(UsageError, match="repeat=0"):
        optimize.bench_model(model, repeat=0)


def test_api_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown option 'target'"):
        optimize.optimize_model(sample_path("mlp_small.onnx"), target=5)
    with pytest.raises(UsageError, match="not found"):
        optimize.load(tmp_path / "nope")
