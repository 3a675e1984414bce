from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from optimize.report import load_report
from tests.cli_helpers import assert_clean_error, run_lto
from tests.conftest import make_matmul_model, sample_path

FAST = ["--warmup", "2", "--min-runs", "10", "--runs", "30", "--time", "1"]


def test_bench_json_report_is_valid_and_complete(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_lto("bench", tiny_model, "--batch", "1,4", *FAST, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    saved = load_report(out)
    assert printed == saved
    assert [m["batch_size"] for m in saved["results"]] == [1, 4]
    assert all(10 <= m["runs"] <= 30 and len(m["samples_ms"]) == m["runs"] for m in saved["results"])
    assert saved["input_spec"]["inputs"][0]["shape"] == [1, 16]
    assert saved["settings"]["runtime"]["runtime"] == "onnxruntime"


def test_bench_table_output_and_markdown(tiny_model: Path, tmp_path: Path) -> None:
    md = tmp_path / "bench.md"
    proc = run_lto("bench", tiny_model, *FAST, "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    assert "latency in ms" in proc.stdout and "p99.9" in proc.stdout and "tiny@b1" in proc.stdout
    assert "## Latency" in md.read_text()


def test_bench_bert_with_named_dim(tmp_path: Path) -> None:
    model = sample_path("bert_tiny.onnx")
    proc = run_lto("bench", model, "--shape", "sequence=16", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {t["name"]: t["shape"] for t in report["input_spec"]["inputs"]}["input_ids"] == [1, 16]


def test_compare_reports_ratio_with_ci(tmp_path: Path) -> None:
    a = make_matmul_model(tmp_path / "a.onnx", features=64, out=64)
    b = make_matmul_model(tmp_path / "b.onnx", features=64, out=64, extra_work=8)
    proc = run_lto("bench", a, "--compare", b, "--batch", "16", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    comparison = report["comparison"]
    assert report["kind"] == "compare" and len(report["results"]) == 2
    lo, hi = comparison["ratio_ci95"]
    assert lo <= comparison["ratio"] <= hi
    assert comparison["chunks"] >= 4


def test_bench_user_errors_are_one_line(tiny_model: Path, tmp_path: Path) -> None:
    assert_clean_error(run_lto("bench", tmp_path / "missing.onnx"), 2, "not found")
    assert_clean_error(run_lto("bench", tiny_model, "--shape", "x=1x"), 2, "--shape")
    assert_clean_error(run_lto("bench", tiny_model, "--batch", "1,zero"), 2, "--batch")
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 16), dtype=np.int32))
    assert_clean_error(run_lto("bench", tiny_model, "--input-data", tmp_path / "bad.npz"), 2, "int32")
    assert_clean_error(run_lto("bench", tiny_model, "--opt-level", "max"), 2, "optimization level")
    assert_clean_error(run_lto("bench"), 2, "MODEL")
    bert = sample_path("bert_tiny.onnx")
    assert_clean_error(run_lto("bench", bert), 2, "sequence", "--shape")
