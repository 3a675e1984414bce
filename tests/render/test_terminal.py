"""Terminal rendering: rich tables on known data, and library modules that never import rich."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from optimize.gate import Side, decide
from optimize.render.terminal import render_gate
from tests.cli_helpers import ROOT


def _gate_text(data: dict[str, Any]) -> str:
    console = Console(record=True, width=200, color_system=None)
    render_gate(data, console)
    return console.export_text()


def test_gate_table_shows_a_p_value_of_zero_as_tiny_not_as_one() -> None:
    rng = np.random.default_rng(0)
    base_parts = [rng.normal(1.0, 0.01, 40) for _ in range(6)]
    cand_parts = [rng.normal(0.5, 0.01, 40) for _ in range(6)]
    base = Side("base.json", "m", np.concatenate(base_parts), fingerprint="f", repetitions=base_parts)
    cand = Side("cand.json", "m", np.concatenate(cand_parts), fingerprint="f", repetitions=cand_parts)
    data = decide(base, cand).to_json()
    data["mann_whitney"] = {"p_slower": 1.0, "p_faster": 0.0}
    text = _gate_text(data)
    assert "slower 1 / faster <1e-4" in text
    assert "faster 1 " not in text
    assert "lto gate: improved (exit 10)" in text and data["reason"][:40] in text


def test_library_modules_do_not_import_rich() -> None:
    # Rendering for terminals lives in optimize.render.terminal; the library returns data.
    modules = ["optimize.report", "optimize.gate", "optimize.model.inspection", "optimize.bench",
               "optimize.bench.command", "optimize.serve.app", "optimize.serve.loadgen",
               "optimize.serve.server", "optimize.render.markdown"]  # fmt: skip
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "[]"


# -- 80 columns and CI logs ------------------------------------------------------------------------


def _measurement(label: str, p50: float, runs: int, batch: int = 1, stable: bool = True) -> dict[str, Any]:
    lat = {"min": p50 * 0.9, "mean": p50 * 1.1, "p50": p50, "p90": p50 * 1.3, "p95": p50 * 1.4,
           "p99": p50 * 1.9, "p999": p50 * 2.5, "max": p50 * 3, "stdev": p50 * 0.1, "cv": 0.09,
           "median_ci95": [p50 * 0.99, p50 * 1.01]}  # fmt: skip
    reasons = [] if stable else ["other processes used 50% of the CPU during the run"]
    return {"label": label, "backend": "onnxruntime", "batch_size": batch, "latency_ms": lat,
            "throughput_per_s": batch * 1000 / lat["mean"], "runs": runs,
            "stability": {"stable": stable, "reasons": reasons}, "samples_ms": [p50] * runs}  # fmt: skip


def _text(render: Any, *args: Any, width: int = 80) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    render(*args, console)
    return console.export_text()


def test_bench_table_at_80_columns_shortens_labels_never_numbers() -> None:
    from optimize.render.terminal import render_measurements

    long = "a_really_long_model_name_from_a_model_zoo_v2_int8_dynamic@b32"
    report = {"kind": "bench", "results": [_measurement(long, 91.234, 6000, batch=32),
                                           _measurement("tiny@b1", 0.0123, 40, stable=False)]}  # fmt: skip
    text = _text(render_measurements, report)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if line.startswith("label"))
    assert "b" in header.split() and "runs" in header.split()  # no column dropped
    row = next(line for line in lines if "@b32" in line)
    for number in ("32", "91.2", "119", "173", "228", "±1.0%", "9%", "6000"):  # every figure whole
        assert number in row.split(), (number, row)
    label = row.split()[0]
    assert "…" in label and label.endswith("@b32") and label.startswith("a_real")
    tiny = next(line for line in lines if line.startswith("tiny@b1"))
    # 40 runs cannot estimate a p90 (needs 36: fine), a p99 (368) or a p99.9 (3,688): flagged
    assert "0.0234*" in tiny.split() and "0.0307*" in tiny.split() and "0.016" in tiny.split()
    assert "runs needed: p99 368, p99.9 3,688)" in " ".join(text.split())
    assert "unstable tiny@b1: other processes used 50%" in text


def test_shorten_label_keeps_the_batch_suffix() -> None:
    from optimize.render.terminal import shorten_label

    assert shorten_label("short@b1", 20) == "short@b1"
    cut = shorten_label("a_very_long_model_name_here@b8", 16)
    assert len(cut) == 16 and cut.endswith("@b8") and "…" in cut
    assert len(shorten_label("no_suffix_but_very_long_indeed", 10)) == 10


def _optimize_report(rows: int) -> dict[str, Any]:
    stages = [{"label": "baseline", "status": "baseline", "latency_ms": {"p50": 1.9, "p99": 3.0},
               "baseline_ms": 1.9, "speedup_vs_baseline": 1.0, "reason": "original model"}]  # fmt: skip
    statuses = ["kept", "rejected", "reverted", "skipped", "failed"]
    for i in range(rows - 1):
        status = statuses[i % len(statuses)]
        timed = status in ("kept", "rejected", "reverted")
        stages.append(
            {
                "label": f"memory-layout:nchwc8-saved-nospin-variant-{i}",
                "status": status,
                "latency_ms": {"p50": 1.5 + i / 100, "p99": 2.5} if timed else None,
                "versus": {"label": "baseline", "latency_ms": {"p50": 1.91, "p99": 2.9}} if timed else None,
                "speedup_vs_baseline": 1.25 + i / 100 if timed else None,
                "speedup_ci95": [1.2, 1.3 + i / 100] if timed else None,
                "baseline_ms": (1.5 + i / 100) * (1.25 + i / 100) if timed else None,
                "accuracy": {"worst": {"cosine": 0.999912}},
                "reason": "a long reason that explains in many words why this candidate was judged so " * 2,
            }
        )
    section = {"stages": stages, "best": {"label": "memory-layout:nchwc8-saved-nospin-variant-0"},
               "speedup": 1.25, "speedup_ci95": [1.2, 1.3], "accuracy": {}}  # fmt: skip
    return {"model": {"path": "models/model.onnx"}, "optimize": section}


def test_optimize_summary_is_one_line_a_stage_at_80_columns() -> None:
    from optimize.render.terminal import render_optimize_summary

    def summary(report: dict[str, Any], console: Console) -> None:
        render_optimize_summary(report, "out/artifact", "target met", 0, console, console)

    text = _text(summary, _optimize_report(10))
    lines = text.splitlines()
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("artifact:"))]
    assert max(len(line) for line in table) <= 80  # the artifact line soft-wraps: paths stay whole
    stage_lines = [line for line in table if "variant-" in line or line.startswith("baseline")]
    assert len(stage_lines) == 10  # one line per stage: the reasons were streamed already
    assert "a long reason" not in text
    assert len(lines) < 25
    reverted = next(line for line in stage_lines if "reverted" in line)
    assert "1.52" in reverted and "1.27x" in reverted
    # Each row's two latencies, divided, give its speedup: they come from one measurement.
    for line in stage_lines:
        cells = line.split()
        if cells[2] != "–":
            ms, base_ms = float(cells[2]), float(cells[3])
            shown = float(cells[4].rstrip("x"))
            assert base_ms / ms == pytest.approx(shown, rel=0.01)
    # Beside its p50, the baseline's p50 in the same run: the two divide into its speedup.
    assert "1.930" in reverted and "baseline ms" in text


def test_streamed_row_shows_the_same_run_figure_its_verdict_compares() -> None:
    from optimize.pipeline.record import StageRecord
    from optimize.render.terminal import optimize_row_line

    record = StageRecord("quantize", "quantize:qdq", "rejected", "slower than baseline (p50 ratio 1.05)")
    record.latency_ms = {"p50": 1.344, "p99": 2.0}
    record.versus = {"label": "baseline", "latency_ms": {"p50": 1.280, "p99": 1.9}}
    line = optimize_row_line(record.to_json())
    assert "p50 1.344 ms vs baseline 1.280 ms" in line  # both from one run: the verdict and figures agree


def test_streamed_row_styles_a_reverted_candidate() -> None:
    from optimize.pipeline.record import StageRecord
    from optimize.render.terminal import optimize_row_line

    reason = "slower than the original side by side"
    record = StageRecord("quantize", "quantize:static-qdq", "reverted", reason)
    line = optimize_row_line(record.to_json())
    assert line.startswith("[yellow]reverted[/]") and "quantize:static-qdq" in line


def test_budget_progress_prints_plain_lines_with_an_eta_when_piped() -> None:
    from optimize.render.terminal import BudgetProgress

    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)  # not a terminal: a CI log
    with BudgetProgress(console, total_s=20.0, every_s=5.0) as progress:
        for elapsed in (0.0, 1.0, 5.5, 9.0, 10.0):  # a line at most every 5 s of the budget
            progress.update("m@b1 (repetition 1/2)", int(elapsed * 100), elapsed)
        for elapsed in (0.5, 6.0):  # the second measurement: the budget counts on
            progress.update("m@b1 (repetition 2/2)", int(elapsed * 100), elapsed)
    lines = out.getvalue().splitlines()
    assert lines == [
        "measuring m@b1 (repetition 1/2): 0 runs, 0.0s (≤20s left)",
        "measuring m@b1 (repetition 1/2): 550 runs, 5.5s (≤14s left)",
        "measuring m@b1 (repetition 2/2): 50 runs, 0.5s (≤10s left)",  # 10.5 s spent of 20
        "measuring m@b1 (repetition 2/2): 600 runs, 6.0s (≤4s left)",
    ]


def test_optimize_summary_lists_unverified_candidates_with_the_command_that_verifies_them() -> None:
    from optimize.render.terminal import render_optimize_summary

    report = _optimize_report(3)
    section = report["optimize"]
    section["best"]["numerics"] = "reassociated"
    section["accuracy"] = {"sample_source": "generated (seed 0, 32 samples)"}
    section["unverified"] = {
        "candidates": [{"label": "openvino-convert:bf16", "numerics": "reduced", "speedup": 1.52}],
        "why": "accuracy was judged on generated (seed 0, 32 samples) inputs, not on the model's own data",
        "needs": "at least 8 real samples",
        "command": "lto optimize models/model.onnx --eval-data EVAL.npz",
    }
    verdict = "no target given; 1 faster candidate(s) not shipped, unverified"

    def summary(report: dict[str, Any], console: Console) -> None:
        render_optimize_summary(report, "out/artifact", verdict, 4, console, console)

    text = _text(summary, report)
    assert "numerics: reassociated" in text and "judged on: generated (seed 0, 32 samples)" in text
    assert "not shipped, unverified: accuracy was judged on generated" in text
    assert "openvino-convert:bf16 (reduced) measured 1.52x" in text
    assert "lto optimize models/model.onnx --eval-data EVAL.npz" in text
    assert text.rstrip().splitlines()[-1].endswith("(exit code 4)")
