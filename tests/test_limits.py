"""Limits are usage errors, found before work starts: each driven through the real `lto` entry point."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.artifact import write_artifact
from optimize.data import check_memory, resolve_inputs
from optimize.report import load_report
from optimize.stage import Candidate
from tests.cli_helpers import ROOT, assert_clean_error, run_cli
from tests.conftest import sample_path

FAST = ["--warmup", "2", "--min-runs", "10", "--runs", "20", "--time", "0.5"]
BOUND = 4 * (os.cpu_count() or 1)
MLP = sample_path("mlp_small.onnx")


def run_lto_capped(*args: str | Path, cap_gib: int = 8) -> subprocess.CompletedProcess:
    """`lto` under an address-space limit: were a memory check to regress, the allocation
    fails fast with MemoryError instead of taking the machine's memory. Needs a process: the
    limit holds for the whole process, which must not be pytest's."""

    def cap() -> None:
        limit = cap_gib * 2**30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("LTO_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        preexec_fn=cap,
    )


# -- 1. thread counts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--threads", "100000", f"more than {BOUND} threads"),
        ("--inter-threads", "100000", f"more than {BOUND} threads"),
        ("--threads", "-1", "must not be negative"),
        ("--inter-threads", "-3", "must not be negative"),
    ],
)
def test_bench_thread_counts_out_of_bounds(flag: str, value: str, needle: str) -> None:
    started = time.monotonic()
    proc = run_cli("bench", MLP, flag, value, *FAST)
    assert_clean_error(proc, 2, flag, needle, str(BOUND))
    assert time.monotonic() - started < 30  # refused up front, not after starting the threads


def test_recipe_thread_count_out_of_bounds(tmp_path: Path) -> None:
    recipe = tmp_path / "threads.toml"
    recipe.write_text('order = ["memory-layout"]\n[stages.memory-layout]\nthreads = 100000\n')
    proc = run_cli("optimize", MLP, "--recipe", recipe, "-o", tmp_path / "out")
    assert_clean_error(proc, 2, "stages.memory-layout.threads", f"more than {BOUND} threads")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["serve", "load"])
def test_instances_out_of_bounds(command: str) -> None:
    # One thread per instance: refused before any instance is loaded or a port is bound.
    proc = run_cli(command, MLP, "--instances", "100000")
    assert_clean_error(proc, 2, "--instances 100000", f"more than {BOUND} threads")


def test_bench_thread_count_within_bounds_runs() -> None:
    proc = run_cli("bench", MLP, "--threads", str(BOUND), "--inter-threads", "1", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr


# -- 2. batch lists ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "needle"),
    [
        ("1,,8", "empty size"),
        (",8", "empty size"),
        ("1,", "empty size"),
        ("0", "at least 1"),
        ("-2", "at least 1"),
        ("1,x", "--batch"),
        ("1.5", "--batch"),
    ],
)
def test_bad_batch_lists_are_usage_errors(batch: str, needle: str) -> None:
    proc = run_cli("bench", MLP, f"--batch={batch}", *FAST)
    assert_clean_error(proc, 2, "--batch", needle)


# -- 3. memory ---------------------------------------------------------------------------------


# Each case runs twice: in this process (the fast selection: the refusal and its words), and in
# a process of its own under an address-space cap (slow: were the check to regress, the
# allocation fails there instead of taking the machine's memory). The sizes are far past any
# machine, so a regression in-process fails at once with MemoryError too.
ABSURD_INPUT_SHAPE = (
    ["bench", sample_path("resnet_tiny.onnx"), "--shape", "pixel_values=1000000000x3x64x64"],
    ["'pixel_values'", "1000000000x3x64x64", "GiB", "memory available"],
)
# The inputs are 24 MB; the attention scores at sequence 10^6 are terabytes.
ABSURD_ACTIVATION = (
    ["bench", sample_path("bert_tiny.onnx"), "--shape", "sequence=1000000"],
    ["1000000x1000000", "GiB", "memory available"],
)


def _one_row(tmp_path: Path) -> Path:
    data = tmp_path / "one_row.npz"
    np.savez(data, features=np.ones((1, 256), dtype=np.float32))
    return data


def _repeated_past_memory(data: Path) -> tuple[list[Any], list[str]]:
    return ["bench", MLP, "--input-data", data, "--batch", "10000000000"], [
        "'features'",
        "GiB",
        "memory available",
    ]


@pytest.mark.parametrize(("args", "needles"), [ABSURD_INPUT_SHAPE, ABSURD_ACTIVATION])
def test_absurd_shapes_are_refused_before_allocating(args: list[Any], needles: list[str]) -> None:
    assert_clean_error(run_cli(*args), 2, *needles)


def test_input_data_repeated_past_memory_is_refused_before_loading(tmp_path: Path) -> None:
    args, needles = _repeated_past_memory(_one_row(tmp_path))
    assert_clean_error(run_cli(*args), 2, *needles)


@pytest.mark.slow
def test_absurd_input_shape_is_refused_before_allocating() -> None:
    args, needles = ABSURD_INPUT_SHAPE
    assert_clean_error(run_lto_capped(*args), 2, *needles)


@pytest.mark.slow
def test_absurd_activation_is_refused_before_allocating() -> None:
    args, needles = ABSURD_ACTIVATION
    assert_clean_error(run_lto_capped(*args), 2, *needles)


@pytest.mark.slow
def test_input_data_repeated_past_memory_is_refused_before_loading_under_a_cap(tmp_path: Path) -> None:
    args, needles = _repeated_past_memory(_one_row(tmp_path))
    assert_clean_error(run_lto_capped(*args), 2, *needles)


def test_memory_check_passes_normal_shapes_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("optimize.system.env.available_memory", lambda: 2**30)
    started = time.monotonic()
    shapes = {name: (1, 128) for name in ("input_ids", "attention_mask", "token_type_ids")}
    check_memory([(n, "int64", s) for n, s in shapes.items()], sample_path("bert_tiny.onnx"))
    assert time.monotonic() - started < 5


def test_memory_check_skips_activations_when_inference_fails(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    check_memory([("x", "float32", (1, 4))], broken)  # nothing to infer from: no error


# -- 4. recipe encoding ------------------------------------------------------------------------


def test_recipe_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.toml"
    recipe.write_bytes('name = "café"\norder = ["graph-fusion"]\n'.encode("latin-1"))
    proc = run_cli("optimize", MLP, "--recipe", recipe, "-o", tmp_path / "out")
    assert_clean_error(proc, 2, str(recipe), "not UTF-8")


# -- 5. damaged manifests ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP on ONNX Runtime defaults, written as `lto optimize` writes an artifact, without the
    search (these tests damage its manifest, not its figures)."""
    spec, _ = resolve_inputs(MLP, {}, None, batch=1)
    return write_artifact(
        tmp_path_factory.mktemp("artifact") / "mlp",
        candidate=Candidate(label="baseline", model_path=MLP, runtime_config={}),
        input_spec=spec.to_json(),
        outputs=[{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
        history=[],
        accuracy={"ok": True},
        chain_details=[],
        report={"kind": "optimize"},
        report_md="# report\n",
    )


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(manifest: dict[str, Any]) -> Any:
        manifest[key] = value
        return manifest

    return edit


def _set_input(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(manifest: dict[str, Any]) -> Any:
        manifest["input_spec"]["inputs"][0][key] = value
        return manifest

    return edit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_set("files", []), "'files' must be an object, not an array"),
        (_set("runtime_config", "x"), "'runtime_config' must be an object, not a string"),
        (_set("requires", 3), "'requires' must be an object, not a number"),
        (_set("input_spec", None), "'input_spec' must be an object, not null"),
        (_set("backend", ["onnxruntime"]), "'backend' must be a string"),
        (_set("manifest_version", "1"), "'manifest_version' must be a whole number"),
        (_set("files", {"model.onnx": "abc"}), "'files.model.onnx'"),
        (_set("requires", {"cpu_isa": [{"any_of": [1]}]}), "'requires.cpu_isa'"),
        (_set_input("shape", ["a", 256]), "'input_spec.inputs[0].shape'"),
        (_set_input("seed", 1), "'input_spec.inputs[0].seed' is not known"),
        (_set("runtime_config", {"intra_op_num_threads": 100000}), f"more than {BOUND} threads"),
        (lambda manifest: [manifest], "must hold a JSON object, not an array"),
    ],
)
@pytest.mark.slow
def test_damaged_manifest_is_refused_naming_the_field(
    artifact: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], Any], needle: str
) -> None:
    damaged = tmp_path / "art"
    shutil.copytree(artifact, damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    (damaged / "manifest.json").write_text(json.dumps(edit(manifest)))
    proc = run_cli("bench", "--artifact", damaged, *FAST)
    assert_clean_error(proc, 2, "manifest.json", needle)
    assert "internal error" not in proc.stderr


@pytest.mark.slow
def test_manifest_with_absurd_shape_is_refused_before_allocating(artifact: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "art"
    shutil.copytree(artifact, damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["input_spec"]["inputs"][0]["shape"] = [10**9, 256]
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    proc = run_lto_capped("bench", "--artifact", damaged, *FAST)
    assert_clean_error(proc, 2, "'features'", "GiB", "memory available")


def test_intact_artifact_still_benches(artifact: Path) -> None:
    proc = run_cli("bench", "--artifact", artifact, *FAST, "--json")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_compare_with_the_original_takes_the_artifacts_stored_inputs(artifact: Path, tmp_path: Path) -> None:
    # Optimized at batch 3: the original, whose batch dim is dynamic, is measured at batch 3 too,
    # without flags (`lto bench --artifact ART --compare ORIGINAL`, the check users run).
    at_three = tmp_path / "art"
    shutil.copytree(artifact, at_three)
    manifest = json.loads((at_three / "manifest.json").read_text())
    manifest["input_spec"]["inputs"][0]["shape"] = [3, *manifest["input_spec"]["inputs"][0]["shape"][1:]]
    (at_three / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli("bench", "--artifact", at_three, "--compare", MLP, *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["batch_size"] for r in json.loads(proc.stdout)["results"]] == [3, 3]


# -- 6. input data values ----------------------------------------------------------------------


def test_nan_and_inf_input_data_warn_naming_the_input(tmp_path: Path) -> None:
    features = np.ones((1, 256), dtype=np.float32)
    features[0, 3], features[0, 5] = np.nan, np.inf
    data, out = tmp_path / "nan.npz", tmp_path / "bench.json"
    np.savez(data, features=features)
    proc = run_cli("bench", MLP, "--input-data", data, *FAST, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "'features'" in proc.stderr and "1 NaN and 1 inf" in proc.stderr
    warnings = load_report(out)["warnings"]
    assert len(warnings) == 1 and "'features'" in warnings[0] and "NaN" in warnings[0]


def test_clean_input_data_has_no_warnings(tmp_path: Path) -> None:
    data, out = tmp_path / "ok.npz", tmp_path / "bench.json"
    np.savez(data, features=np.ones((1, 256), dtype=np.float32))
    proc = run_cli("bench", MLP, "--input-data", data, *FAST, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr and "warnings" not in load_report(out)


def test_input_data_without_rows_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "empty.npz"
    np.savez(data, features=np.zeros((0, 256), dtype=np.float32))
    proc = run_cli("bench", MLP, "--input-data", data, *FAST)
    assert_clean_error(proc, 2, "--input-data", "'features'", "0 rows")


def test_calib_data_without_rows_is_refused_before_work(tmp_path: Path) -> None:
    data = tmp_path / "empty.npz"
    np.savez(data, features=np.zeros((0, 256), dtype=np.float32))
    proc = run_cli("optimize", MLP, "--quantize", "always", "--calib-data", data, "-o", tmp_path / "out")
    assert_clean_error(proc, 2, "--calib-data", "'features'", "0 rows")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_nan_calib_data_warns_naming_the_input(tmp_path: Path) -> None:
    calib = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    calib[2, 1] = np.nan
    data = tmp_path / "calib.npz"
    np.savez(data, features=calib)
    proc = run_cli(
        "optimize",
        MLP,
        "--calib-data",
        data,
        "--target-ms",
        "100",
        "--stop-at-target",
        "-o",
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "--calib-data array 'features' holds 1 NaN" in proc.stderr
