"""`lto export` through the real entry point: help with examples, --json, one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from optimize.export.batching import BatchProfile, plan_batching
from tests.cli_helpers import assert_clean_error, run_cli, run_lto
from tests.export.conftest import ArtifactMaker


def test_help_shows_examples_and_the_serving_commands() -> None:
    # Needs a process: help starts in an interpreter that has imported only what help needs.
    proc = run_lto("export", "--help")
    assert proc.returncode == 0
    for needle in ("Examples", "--triton", "tritonserver --model-repository", "kubectl apply -f"):
        assert needle in proc.stdout, needle


@pytest.mark.slow
def test_json_export_with_a_profile_lto_bench_measured(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact()
    bench = tmp_path / "bench.json"
    proc = run_cli("bench", "--artifact", artifact, "--batch", "1,2,4", "--time", "0.2s", "-o", bench)
    assert proc.returncode == 0, proc.stderr
    repo = tmp_path / "repo"
    proc = run_cli(
        "export", artifact, "--triton", repo, "--name", "mlp", "--batch-profile", bench,
        "--slo-ms", "1000", "--instances", "2", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model_dir"] == str(repo / "mlp") and out["checked_with_triton_schema"] is True
    assert out["batch_profile"]["source"] == str(bench)
    config = model_config_pb2.ModelConfig()
    text_format.Parse((repo / "mlp" / "config.pbtxt").read_text(), config)
    # The rule applied to the samples in the report: every size fits 1 s, the best rate wins.
    rule = plan_batching(BatchProfile.from_bench_report(json.loads(bench.read_text()), "b"), 1000, 99)
    assert config.max_batch_size == out["config"]["max_batch_size"] == rule.max_batch_size
    assert config.instance_group[0].count == 2
    # Two instances that each take every core: said, on stderr, once.
    assert "contend" in proc.stderr
    marker = json.loads((repo / "mlp" / "lto-export.json").read_text())
    assert (
        marker["tool"]["name"] == "lto"
        and marker["files"]["1/model.onnx"] == marker["artifact"]["model_sha256"]
    )


@pytest.mark.slow
def test_a_profile_of_another_model_is_refused(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact()
    bench = tmp_path / "bench.json"
    proc = run_cli("bench", "sample_models/mlp_small.onnx", "--time", "0.1s", "-o", bench)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(
        "export", artifact, "--triton", tmp_path / "repo", "--batch-profile", bench, "--slo-ms", "5"
    )
    assert_clean_error(proc, 2, "measured another model")
    assert not (tmp_path / "repo").exists()


@pytest.mark.slow
def test_refusals_are_one_line(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    ort = make_artifact()
    repo = tmp_path / "repo"
    assert_clean_error(
        run_cli("export", ort, "--triton", repo, "--batch-profile", "b.json", "--measure-batches", "1,2"),
        2,
        "not both",
    )
    assert_clean_error(run_cli("export", make_artifact(backend="tvm"), "--triton", repo), 2, "no TVM backend")
    (repo / "mine").mkdir(parents=True)
    (repo / "mine" / "notes.txt").write_text("keep me")
    assert_clean_error(run_cli("export", ort, "--triton", repo, "--name", "mine"), 2, "lto did not export")
    assert (repo / "mine" / "notes.txt").read_text() == "keep me"
    assert_clean_error(
        run_cli("export", ort, "--triton", repo, "--name", "a/b"), 2, "not a Triton model folder"
    )
    assert_clean_error(run_cli("export", tmp_path / "nothing", "--triton", repo), 2, "does not exist")
