"""pipeline/record.py: a row takes the judge's decision, says what a searching stage learns, and
writes its status as the word reports have always shown; the record's own rules (warnings once,
the external-data note, a revert)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimize.pipeline.record import Decision, Figures, StageRecord, latency_figures
from optimize.stage import Outcome, Status
from tests.pipeline.values import measurement, row, run_record


def test_a_row_takes_the_decision_and_its_figures() -> None:
    figures = Figures(
        latency_ms={"p50": 8.0, "p99": 9.0},
        versus={"label": "best", "latency_ms": {"p50": 10.0, "p99": 11.0}},
        ratio=0.8,
        ratio_ci95=(0.75, 0.85),
        speedup=2.5,
        speedup_ci95=(2.3, 2.7),
        baseline_ms=20.0,
        metric="p99",
    )
    target = row("fake", Status.FAILED)
    target.take(Decision(Status.KEPT, "faster", figures))
    assert (target.status, target.reason, target.inaccurate) == (Status.KEPT, "faster", False)
    assert (target.ratio, target.ratio_ci95, target.speedup, target.speedup_ci95) == (
        0.8,
        (0.75, 0.85),
        2.5,
        (2.3, 2.7),
    )
    assert (target.baseline_ms, target.metric, target.latency_ms) == (20.0, "p99", {"p50": 8.0, "p99": 9.0})
    # A decision taken before any timing leaves the figures alone.
    target.take(Decision(Status.REJECTED, "inaccurate: x", inaccurate=True))
    assert target.inaccurate and target.ratio == 0.8


@pytest.mark.parametrize(
    ("status", "inaccurate", "outcome"),
    [
        (Status.KEPT, False, Outcome.KEPT),
        (Status.UNVERIFIED, False, Outcome.UNVERIFIED),
        (Status.REJECTED, False, Outcome.SLOWER),
        (Status.REJECTED, True, Outcome.INACCURATE),
        (Status.FAILED, False, Outcome.FAILED),
        (Status.SKIPPED, False, Outcome.FAILED),
    ],
)
def test_what_a_searching_stage_learns_of_a_row(status: Status, inaccurate: bool, outcome: Outcome) -> None:
    assert row("fake", status, inaccurate=inaccurate).outcome() is outcome


def test_the_status_is_written_as_its_word() -> None:
    written = json.dumps(StageRecord("fake", "fake", "reverted").to_json())  # a string still reads
    assert '"status": "reverted"' in written
    assert [s.value for s in Status] == [
        "baseline", "kept", "rejected", "skipped", "failed", "reverted", "unverified"
    ]  # fmt: skip
    assert Status.KEPT == "kept" and f"{Status.SKIPPED}" == "skipped" and {"kept": 1}[Status.KEPT] == 1


def test_a_failure_on_a_model_with_external_data_says_so(tmp_path: Path) -> None:
    record = run_record(tmp_path)
    record.external_data = True
    record.add(row("fake", Status.FAILED, reason="it broke"))
    record.add(row("other", Status.FAILED, reason="External data is not supported"))
    record.add(row("kept", Status.KEPT, reason="faster"))
    assert [r.reason for r in record.records] == [
        "it broke (the model keeps its weights as external data)",
        "External data is not supported",
        "faster",
    ]


def test_a_warning_is_kept_once_and_the_inputs_warnings_follow(tmp_path: Path) -> None:
    record = run_record(tmp_path)
    record.warn("twice")
    record.warn("twice")
    assert record.all_warnings() == ["twice"]


def test_a_revert_reaches_every_kept_row_and_the_skips_decided_on_them(tmp_path: Path) -> None:
    record = run_record(tmp_path)
    record.add(row("a", Status.KEPT, reason="1.2x"))
    record.add(row("late", Status.SKIPPED, reason="target met", details={"decided_on": "a"}))
    record.add(row("other", Status.SKIPPED, reason="off", details={"decided_on": "baseline"}))
    record.add(row("b", Status.REJECTED, reason="slower"))
    record.revert_kept("reverted: a measured 0.9x")
    assert [(r.status, r.reason) for r in record.records] == [
        (Status.REVERTED, "reverted: a measured 0.9x; it had been kept: 1.2x"),
        (Status.SKIPPED, "target met (decided on a, which was reverted)"),
        (Status.SKIPPED, "off"),
        (Status.REJECTED, "slower"),
    ]


def test_latency_figures_use_the_comparison_figure_when_given() -> None:
    runs = measurement("x", 10.0, spread=0.1)
    assert latency_figures(runs, "p50") == {"p50": runs.latency["p50"], "p99": runs.latency["p99"]}
    assert latency_figures(runs, "p90", 7.5)["p90"] == 7.5
