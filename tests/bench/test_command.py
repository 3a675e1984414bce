from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optimize.report import load_report
from tests.cli_helpers import assert_clean_error, run_cli, run_lto
from tests.conftest import make_matmul_model, sample_path

FAST = ["--warmup", "2", "--min-runs", "10", "--runs", "30", "--time", "1"]


def test_bench_json_report_is_valid_and_complete(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_cli("bench", tiny_model, "--batch", "1,4", *FAST, "-o", out, "--json")
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
    proc = run_cli("bench", tiny_model, *FAST, "--markdown", md)
    assert proc.returncode == 0, proc.stderr
    assert "latency in ms" in proc.stdout and "p99.9" in proc.stdout and "tiny@b1" in proc.stdout
    assert "## Latency" in md.read_text()


def test_bench_bert_with_named_dim(tmp_path: Path) -> None:
    model = sample_path("bert_tiny.onnx")
    proc = run_cli("bench", model, "--shape", "sequence=16", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {t["name"]: t["shape"] for t in report["input_spec"]["inputs"]}["input_ids"] == [1, 16]


@pytest.mark.slow
def test_compare_reports_ratio_with_ci(tmp_path: Path) -> None:
    a = make_matmul_model(tmp_path / "a.onnx", features=64, out=64)
    b = make_matmul_model(tmp_path / "b.onnx", features=64, out=64, extra_work=8)
    proc = run_cli("bench", a, "--compare", b, "--batch", "16", *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (tmp_path / "c.json").write_text(proc.stdout)
    comparison = report["comparison"]
    assert report["kind"] == "compare" and len(report["results"]) == 2
    lo, hi = comparison["ratio_ci95"]
    assert lo <= comparison["ratio"] <= hi
    assert comparison["chunks"] >= 4
    # Each side ran in a worker process of its own, and the report says how apart they were.
    assert comparison["process"] == "own worker per side"
    assert comparison["isolation"]["blocks_not_idle_after_wait"] >= 0
    # One figure: the ratio and both sides' latency from the same block pairs, over fresh process sets.
    assert comparison["paired"]["figure"]["ratio"] == comparison["ratio"]
    a_ms, b_ms = comparison["latency_ms"]["A"], comparison["latency_ms"]["B"]
    assert b_ms / a_ms == pytest.approx(comparison["ratio"], rel=0.1)
    assert len(comparison["paired"]["figure"]["process_sets"]) >= 1
    text = run_cli("report", tmp_path / "c.json").stdout
    assert "block-pair ratios from 3 fresh pairs of processes" in text
    # The table's p50s pool every run, so dividing them need not give the ratio: the line that
    # gives both sides' figures says they are the block pairs' and that the table pools all runs.
    assert f"p50 over those block pairs: A {a_ms:.3f} ms, B {b_ms:.3f} ms (the latency table pools" in text


@pytest.mark.slow
def test_bench_user_errors_are_one_line(tiny_model: Path, tmp_path: Path) -> None:
    assert_clean_error(run_cli("bench", tmp_path / "missing.onnx"), 2, "not found")
    assert_clean_error(run_cli("bench", tiny_model, "--shape", "x=1x"), 2, "--shape")
    assert_clean_error(run_cli("bench", tiny_model, "--batch", "1,zero"), 2, "--batch")
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 16), dtype=np.int32))
    assert_clean_error(run_cli("bench", tiny_model, "--input-data", tmp_path / "bad.npz"), 2, "int32")
    assert_clean_error(run_cli("bench", tiny_model, "--opt-level", "max"), 2, "optimization level")
    assert_clean_error(run_cli("bench"), 2, "MODEL")
    bert = sample_path("bert_tiny.onnx")
    assert_clean_error(run_cli("bench", bert), 2, "sequence", "--shape")


@pytest.mark.slow
def test_repeat_runs_each_repetition_in_a_fresh_process(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "repeated.json"
    args = ["--repeat", "3", "--warmup", "2", "--time", "0.2"]
    proc = run_cli("bench", tiny_model, *args, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = load_report(out)
    (m,) = report["results"]
    reps = m["repetitions"]
    assert len(reps) == 3 and report["settings"]["repeat"] == 3
    # the pooled runs are the repetitions' runs, in order, and each spent its --time (no CI stop)
    assert sum(r["runs"] for r in reps) == m["runs"] == len(m["samples_ms"])
    assert all(r["stopped_by"] in ("time", "runs") for r in reps)
    starts = np.cumsum([0] + [r["runs"] for r in reps])
    for r, a, b in zip(reps, starts[:-1], starts[1:], strict=True):
        assert r["latency_ms"]["p50"] == pytest.approx(np.percentile(m["samples_ms"][a:b], 50), abs=1e-5)
    # the median's interval is over the repetitions' medians: with 3 it is their whole range
    p50s = [r["latency_ms"]["p50"] for r in reps]
    assert m["latency_ms"]["median_ci95"] == [min(p50s), max(p50s)]
    assert "repetition_spread" in m["stability"] and "reasons" in m["stability"]


def test_repeat_passes_a_childs_error_on_as_one_line(tmp_path: Path) -> None:
    bert = sample_path("bert_tiny.onnx")
    assert_clean_error(run_cli("bench", bert, "--repeat", "2", "--time", "0.1"), 2, "sequence", "--shape")
    assert_clean_error(
        run_cli("bench", bert, "--compare", bert, "--repeat", "2"), 2, "--repeat applies to a single target"
    )


@pytest.mark.slow
def test_minimum_runs_and_time_win_over_the_maxima(tiny_model: Path) -> None:
    args = ["--warmup", "1", "--min-runs", "400", "--runs", "400", "--time", "0.01"]
    proc = run_cli("bench", tiny_model, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    (m,) = json.loads(proc.stdout)["results"]
    assert m["runs"] >= 400  # --time 10 ms would have stopped it far earlier
    assert m["too_few_runs_for"] == {"p999": 3688, "p99": 368} or m["too_few_runs_for"] == {"p999": 3688}
    proc = run_cli("bench", tiny_model, "--warmup", "1", "--min-time", "0.5", "--time", "1", "--runs", "20",
                   "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (m,) = json.loads(proc.stdout)["results"]
    assert m["wall_s"] >= 0.5 and m["runs"] > 20  # the minimum time outlasts --runs
    assert_clean_error(run_cli("bench", tiny_model, "--min-runs", "50", "--runs", "10"), 2, "--min-runs 50")
    assert_clean_error(run_cli("bench", tiny_model, "--min-time", "5s", "--time", "1s"), 2, "--min-time")


def test_help_says_which_limits_are_maxima_and_minima() -> None:
    proc = run_cli("bench", "--help")
    text = " ".join(proc.stdout.split())
    assert "At most this many timed runs" in text and "At most this much time" in text
    assert "At least this many timed runs" in text and "--min-time" in text and "--repeat" in text


def test_bench_table_keeps_every_number_at_80_columns_when_piped(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "a_very_long_model_name_from_some_model_zoo_int8_v2.onnx")
    # 400 runs: p90 and p99 are estimated, not starred, so the fixture's table fits 80 columns
    # at the label's 8-character floor (test_a_table_too_wide_for_the_console_keeps_its_numbers).
    runs = ["--warmup", "2", "--min-runs", "400", "--runs", "400", "--time", "1"]
    # Needs a process: the width a process takes from COLUMNS at start-up, printing into a pipe.
    proc = run_lto("bench", model, "--batch", "1,8", *runs, "-o", tmp_path / "r.json", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    report = load_report(tmp_path / "r.json")
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("label"))
    assert header.split() == ["label", "b", "p50", "p90", "p99", "p99.9", "p50", "CI", "CV", "thr/s", "runs"]
    rows = [line for line in lines if "@b" in line and not line.startswith(("unstable", "*"))]
    assert len(rows) == 2 and all(len(line) <= 80 for line in lines if line in rows or line == header)
    for row, m in zip(rows, report["results"], strict=True):
        cells = row.split()
        assert cells[0].endswith(f"@b{m['batch_size']}") and "…" in cells[0]
        assert cells[1] == str(m["batch_size"]) and cells[-1] == str(m["runs"])
        assert cells[-2] == f"{m['throughput_per_s']:,.0f}"


def test_a_table_too_wide_for_the_console_keeps_its_numbers() -> None:
    import io

    from rich.console import Console

    from optimize.render.terminal import render_measurements

    def measurement(batch: int, throughput: float, runs: int) -> dict[str, object]:
        lat = {"p50": 0.00522, "p90": 0.00887, "p99": 0.0313, "p999": 0.0402, "median_ci95": [0.005, 0.0056]}
        return {"label": f"a_very_long_model_name_from_some_model_zoo_int8_v2@b{batch}", "batch_size": batch,
                "latency_ms": {**lat, "cv": 0.9}, "throughput_per_s": throughput, "runs": runs,
                "too_few_runs_for": {"p90": 40, "p99": 368, "p999": 3688},
                "stability": {"stable": True, "reasons": []}}  # fmt: skip

    out = io.StringIO()
    report = {"kind": "bench", "results": [measurement(1, 140413, 30), measurement(8, 13755390, 3000000)]}
    render_measurements(report, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    for number in ("0.00887*", "0.0402*", "140,413", "13,755,390", "3000000", "runs"):
        assert number in text, text  # wider than 80 columns, but nothing cut
