"""pipeline/judge.py's rules on hand-made figures: each decision a candidate can get, the target
verdict, the exit codes, and when a stage runs. The judge returns values; nothing here is timed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from optimize.accuracy import AccuracyResult
from optimize.pipeline import judge
from optimize.pipeline.record import Decision
from optimize.pipeline.request import OptimizeRequest
from optimize.recipes import StageSpec
from optimize.stage import LIFT_REFERENCE_KEY, Candidate, Status
from tests.pipeline.values import comparison, recipe, row


def decide(ratio: float, ci: tuple[float, float], *, confirmation: bool = False) -> Decision:
    """The judge on a candidate at `ratio` to the best; the baseline is twice as slow as the best."""
    versus_best = comparison(ratio, ci)
    versus_baseline = comparison(ratio / 2.0, (ci[0] / 2.0, ci[1] / 2.0), a_ms=20.0, a_label="baseline")
    return judge.judge_candidate(
        versus_best, versus_baseline, label="cand", metric="p50", best_label="best",
        min_improvement=0.05, confirmation=confirmation,
    )  # fmt: skip


def test_faster_with_confidence_by_the_minimum_is_kept_with_the_figures_it_read() -> None:
    decision = decide(0.8, (0.75, 0.85))
    assert decision.status == Status.KEPT
    assert decision.reason.startswith("1.25x faster than best (p50 ratio 0.800, CI 0.750–0.850)")
    figures = decision.figures
    assert figures is not None
    assert figures.ratio == 0.8 and figures.ratio_ci95 == (0.75, 0.85)
    # The speedup is the one measured against the baseline in the same run, not chained.
    assert figures.speedup == pytest.approx(2.5)
    assert figures.speedup_ci95 == pytest.approx((1.0 / 0.425, 1.0 / 0.375))
    assert figures.baseline_ms == 20.0
    assert figures.latency_ms["p50"] == pytest.approx(8.0)
    assert figures.versus == {"label": "best", "latency_ms": {"p50": 10.0, "p99": 10.0}}
    assert not decision.inaccurate


def test_a_confirmation_says_so_in_the_reason() -> None:
    assert decide(0.8, (0.75, 0.85), confirmation=True).reason.endswith(", confirmed on fresh processes")
    assert "confirmed" not in decide(0.8, (0.75, 0.85)).reason


@pytest.mark.parametrize(
    ("ratio", "ci", "said"),
    [
        (1.1, (1.05, 1.2), "slower than best"),
        (0.9, (0.8, 1.01), "not faster than best with confidence"),
        (0.98, (0.97, 0.99), "gain below the recipe's 5% minimum"),
    ],
)
def test_each_way_to_lose_is_rejected_and_named(ratio: float, ci: tuple[float, float], said: str) -> None:
    decision = decide(ratio, ci)
    assert decision.status == Status.REJECTED and decision.reason.startswith(said)
    assert decision.figures is not None and not decision.inaccurate


def test_a_decision_is_a_value() -> None:
    decision = decide(0.8, (0.75, 0.85))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.status = Status.REJECTED  # type: ignore[misc]


def test_an_inaccurate_candidate_is_rejected_for_its_outputs_before_any_timing() -> None:
    decision = judge.inaccurate(AccuracyResult(False, "output 'y': cosine 0.5 < 0.99", {}))
    assert decision == Decision(Status.REJECTED, "inaccurate: output 'y': cosine 0.5 < 0.99", inaccurate=True)
    target = row("fake", Status.FAILED)
    target.take(decision)
    assert target.outcome() == "inaccurate" and target.latency_ms is None


def test_only_a_stages_unlifted_twin_is_timed_though_inaccurate_and_it_is_never_kept() -> None:
    plain = Candidate("q:int8-unlifted", Path("q.xml"), details={LIFT_REFERENCE_KEY: "q:int8"})
    assert judge.timed_though_inaccurate(plain)
    assert not judge.timed_though_inaccurate(Candidate("q:int8", Path("q.xml")))
    failed = AccuracyResult(False, "cosine 0.9 < 0.99", {})
    timed = decide(0.8, (0.75, 0.85))  # faster than the best: still not kept
    decision = judge.inaccurate(failed, timed=timed)
    assert decision.status == Status.REJECTED and decision.inaccurate
    assert decision.figures == timed.figures
    assert decision.reason.startswith("inaccurate: cosine 0.9 < 0.99; timed to price the lift: ")
    assert decision.reason.endswith("x over the baseline")
    target = row("q:int8-unlifted", Status.FAILED)
    target.take(decision)
    assert target.outcome() == "inaccurate" and target.speedup == timed.figures.speedup


def test_an_unverified_winner_is_held_back_and_losers_stay_as_they_are() -> None:
    unverified = AccuracyResult(True, "", {}, unverified="the rows cannot tell")
    held = judge.hold_unverified(decide(0.8, (0.75, 0.85)), unverified)
    assert held.status == Status.UNVERIFIED
    assert held.reason.endswith(", but not shipped: unverified (the rows cannot tell)")
    assert held.figures == decide(0.8, (0.75, 0.85)).figures
    lost = decide(1.1, (1.05, 1.2))
    assert judge.hold_unverified(lost, unverified) == lost
    verified = AccuracyResult(True, "", {})
    assert judge.hold_unverified(decide(0.8, (0.75, 0.85)), verified).status == Status.KEPT


def test_a_win_that_does_not_repeat_on_fresh_processes_says_so() -> None:
    first = comparison(0.8, (0.75, 0.85))
    kept = decide(0.8, (0.75, 0.85), confirmation=True)
    assert judge.confirm(first, kept) == kept
    lost = judge.confirm(first, decide(0.99, (0.9, 1.05), confirmation=True))
    assert lost.status == Status.REJECTED
    assert lost.reason.startswith(
        "the first measurement's gain (ratio 0.800) did not repeat on fresh processes: "
    )


def test_the_target_verdict_and_the_exit_codes() -> None:
    assert judge.target_verdict(5.0, None, "p50") == ("no target given", judge.EXIT_TARGET_MET, None)
    assert judge.target_verdict(5.0, 5.0, "p50")[1:] == (judge.EXIT_TARGET_MET, True)
    assert judge.target_verdict(5.1, 5.0, "p99") == (
        "target missed: best p99 5.100 ms > 5 ms",
        judge.EXIT_TARGET_MISSED,
        False,
    )


def test_an_unverified_candidate_that_would_meet_a_missed_target_exits_4() -> None:
    faster = [{"label": "q", "speedup": 4.0}]
    verdict, code = judge.final_exit(
        judge.EXIT_TARGET_MISSED, "missed", faster, target_ms=3.0, baseline_ms=10.0
    )
    assert code == judge.EXIT_UNVERIFIED and verdict.endswith("and q would meet the target")
    # It would not meet it: the missed target stands.
    assert (
        judge.final_exit(judge.EXIT_TARGET_MISSED, "missed", faster, target_ms=2.0, baseline_ms=10.0)[1] == 3
    )
    assert judge.final_exit(judge.EXIT_TARGET_MET, "met", faster)[1] == judge.EXIT_TARGET_MET
    assert judge.final_exit(judge.EXIT_TARGET_MET, "met", faster, fail_on_unverified=True)[1] == 4
    assert judge.final_exit(judge.EXIT_TARGET_MET, "met", []) == ("met", judge.EXIT_TARGET_MET)


def test_unverified_faster_keeps_the_fastest_of_each_label_above_what_ships() -> None:
    rows = [
        row("q:a", Status.UNVERIFIED, speedup=1.5),
        row("q:a", Status.UNVERIFIED, speedup=1.8),
        row("q:b", Status.UNVERIFIED, speedup=1.1),  # not faster than what ships
        row("q:c", Status.KEPT, speedup=3.0),  # verified: not listed
    ]
    listed = judge.unverified_faster(rows, shipped_speedup=1.2)
    assert [(c["label"], c["speedup"]) for c in listed] == [("q:a", 1.8)]


def test_the_original_ships_when_the_artifact_measures_slower_at_the_end() -> None:
    assert judge.original_wins_final(comparison(1.01, (0.9, 1.1)))
    assert not judge.original_wins_final(comparison(0.99, (0.9, 1.1)))


def test_why_a_stage_does_not_run() -> None:
    request = OptimizeRequest(model_path=Path("m.onnx"), target_ms=5.0)
    spec = StageSpec("fake", run_when="above-target")
    unit = recipe(spec)
    reason = judge.pre_skip_reason(spec, request, unit, stop_reason="", best_latency_ms=4.0, time_left_s=None)
    assert reason == "the best p50 (4.000 ms, measured alone) already meets the 5 ms target"
    assert (
        judge.pre_skip_reason(spec, request, unit, stop_reason="", best_latency_ms=6.0, time_left_s=None)
        == ""
    )
    spent = judge.pre_skip_reason(spec, request, unit, stop_reason="", best_latency_ms=6.0, time_left_s=0.0)
    assert spent == "the --time-budget is used up"
    stopped = judge.pre_skip_reason(
        spec, request, unit, stop_reason="stop", best_latency_ms=6.0, time_left_s=1.0
    )
    assert stopped == "stop"
    assert judge.search_done(spec, 5.0, 4.0) and not judge.search_done(spec, 5.0, 6.0)
    assert not judge.search_done(StageSpec("fake"), 5.0, 4.0)  # runs whatever the target


def test_a_stage_share_of_the_budget_and_its_first_candidate() -> None:
    assert judge.stage_time_share(100.0, [100.0, 200.0], 80.0) == pytest.approx(20.0)
    assert judge.stage_time_share(100.0, [], 80.0) == 80.0  # the last one gets all that is left
    assert judge.stage_time_share(100.0, [], -1.0) == 0.0
    assert not judge.share_used_up(10.0, 11.0, measured_in_stage=0)  # the first is always measured
    assert judge.share_used_up(10.0, 11.0, measured_in_stage=1)
    assert not judge.share_used_up(None, 11.0, measured_in_stage=3)


def test_runoff_takes_the_close_runners_up_most_promising_first() -> None:
    best, near, nearer, far = (
        Candidate(label=x, model_path=Path(f"{x}.onnx")) for x in ("best", "near", "nearer", "far")
    )
    picked = judge.runoff_candidates([(near, 1.85), (far, 1.0), (nearer, 1.95), (best, 2.0)], best, 2.0)
    assert picked == [nearer, near]
