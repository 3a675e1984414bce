"""pipeline/summary.py: the figures a report takes from the record alone (each runtime's best, the
best so far of a stopped run, the final comparison's line)."""

from __future__ import annotations

from optimize.pipeline.summary import best_so_far, final_line, runtime_bests
from optimize.stage import Status
from tests.pipeline.values import comparison, row


def test_each_runtimes_best_is_its_fastest_accurate_timed_candidate() -> None:
    rows = [
        row("baseline", Status.BASELINE, speedup=1.0, backend="onnxruntime"),
        row("fuse", Status.KEPT, speedup=1.3, backend="onnxruntime"),
        row("ov", Status.REJECTED, speedup=1.2, backend="openvino"),  # accurate, slower than the best
        row("ov:int8", Status.REJECTED, speedup=3.0, backend="openvino", inaccurate=True),
        row("q", Status.UNVERIFIED, speedup=2.0, backend="onnxruntime"),
        row("ov:bf16", Status.REVERTED, speedup=1.1, backend="openvino"),
    ]
    bests = runtime_bests(rows)
    assert {name: best["label"] for name, best in bests.items()} == {"onnxruntime": "fuse", "openvino": "ov"}


def test_a_stopped_run_names_its_last_kept_candidate() -> None:
    assert best_so_far([]) is None
    start = row("baseline", Status.BASELINE, latency_ms={"p50": 2.0, "p99": 3.0})
    assert best_so_far([start])["summary"] == "no candidate had beaten the original model yet"  # type: ignore[index]
    kept = row("fuse", Status.KEPT, speedup=1.5, latency_ms={"p50": 1.0, "p99": 1.2}, accuracy={"ok": True})
    best = best_so_far([start, kept, row("q", Status.REJECTED)])
    assert best is not None and best["label"] == "fuse"
    assert best["summary"].startswith(
        "best accurate candidate so far: fuse (1.50x vs the baseline, p50 1.000 ms"
    )
    assert best["summary"].endswith("--time-budget that ends after fuse")


def test_the_final_line_gives_the_figures_every_report_shows() -> None:
    final = comparison(0.5, (0.45, 0.55), a_ms=10.0)
    line = final_line("fuse", "p50", final, 2.0, (1.8, 2.2), None)
    assert line.startswith("final: fuse against ONNX Runtime defaults, 1 fresh pair(s) of processes: ")
    assert "p50 5.000 ms vs 10.000 ms, 2.00x (95% CI 1.80–2.20)" in line
