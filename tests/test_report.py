from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from optimize.errors import LtoError, UsageError
from optimize.files import atomic_directory, write_json_atomic
from optimize.report import load_report, new_report, validate_report, write_report

SAMPLE_MEASUREMENT = {
    "label": "m@b1",
    "backend": "onnxruntime",
    "batch_size": 1,
    "latency_ms": {
        "min": 1.0, "mean": 1.2, "p50": 1.1, "p90": 1.5, "p95": 1.6, "p99": 1.9, "p999": 2.0,
        "max": 2.0, "stdev": 0.2, "cv": 0.16, "median_ci95": [1.05, 1.15],
    },
    "throughput_per_s": 833.3,
    "runs": 3,
    "warmup_runs": 1,
    "wall_s": 0.01,
    "stopped_by": "runs",
    "stability": {"stable": True, "reasons": [], "foreign_cpu_fraction": 0.0},
    "samples_ms": [1.0, 1.1, 2.0],
}  # fmt: skip


def _report(tmp_path: Path) -> dict:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"fake model bytes")
    report = new_report("bench", model_path=model, input_spec=None, settings={"x": 1})
    report["results"].append(SAMPLE_MEASUREMENT)
    return report


def test_new_report_is_valid_and_records_environment(tmp_path: Path) -> None:
    report = _report(tmp_path)
    validate_report(report)
    assert report["schema_version"] == "1.0"
    assert len(report["model"]["sha256"]) == 64 and report["model"]["size_bytes"] == 16
    env = report["environment"]
    assert env["fingerprint"] and env["cpu"]["logical_cores"] >= 1 and "onnxruntime" in env["packages"]


def test_write_and_load_roundtrip(tmp_path: Path) -> None:
    report = _report(tmp_path)
    path = write_report(tmp_path / "out" / "r.json", report)
    assert load_report(path) == json.loads(json.dumps(report))
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda r: r.pop("environment"), "environment"),
        (lambda r: r["results"][0].__setitem__("samples_ms", []), "results/0/samples_ms"),
        (lambda r: r.__setitem__("kind", "nonsense"), "kind"),
        (lambda r: r["results"][0]["latency_ms"].pop("p99"), "results/0/latency_ms"),
    ],
)
def test_invalid_reports_name_the_place(tmp_path: Path, mutate, where: str) -> None:
    report = json.loads(json.dumps(_report(tmp_path)))
    mutate(report)
    with pytest.raises(UsageError) as info:
        validate_report(report)
    assert where.split("/")[0] in info.value.one_line() or "(top level)" in info.value.one_line()
    # an invalid report is never written
    with pytest.raises(UsageError):
        write_report(tmp_path / "bad.json", report)
    assert not (tmp_path / "bad.json").exists()


def test_load_report_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_report(tmp_path / "nope.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(UsageError, match="not JSON"):
        load_report(tmp_path / "junk.json")
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": "0.1"}))
    with pytest.raises(UsageError, match="schema_version"):
        load_report(tmp_path / "old.json")


def test_atomic_directory_keeps_old_contents_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "artifact"
    with atomic_directory(target) as staging:
        (staging / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "a.txt").write_text("second")
        raise RuntimeError("crash mid-write")
    assert (target / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"], "staging leftovers"


def test_write_json_atomic_reports_a_readonly_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; simulate with a path under a regular file instead
        blocker = tmp_path / "file"
        blocker.write_text("x")
        with pytest.raises(LtoError, match="cannot write"):
            write_json_atomic(blocker / "r.json", {"a": 1})
        return
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(LtoError, match="cannot write"):
        write_json_atomic(ro / "r.json", {"a": 1})
