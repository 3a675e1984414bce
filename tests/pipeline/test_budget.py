"""pipeline/budget.py: the --time-budget's rules on a hand-set clock and hand-set cost estimates."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from optimize.pipeline.budget import FINAL_MIN_TIME_S, TimeBudget


@dataclass
class Costs:
    end_s: float = 10.0  # the final comparison and the artifact's write
    evaluation: float = 5.0  # checking and timing one candidate

    def end_cost_s(self) -> float:
        return self.end_s

    def evaluation_s(self) -> float:
        return self.evaluation


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def budget(deadline: float | None = 100.0) -> tuple[TimeBudget, Clock]:
    clock = Clock()
    kept = TimeBudget(deadline, clock=clock)
    kept.estimates = Costs()
    return kept, clock


def test_without_a_budget_nothing_is_short_of_time() -> None:
    unbounded, clock = budget(None)
    clock.now = 1e9
    assert unbounded.time_left() is None and not unbounded.used_up()
    assert unbounded.too_little_time(stage_cost_s=1e6) == ""
    assert unbounded.unmeasured_reason(stage_deadline=0.0, produced=5) == ""
    assert unbounded.final_time_s(max_time_s=5.0) is None
    share = unbounded.stage_share(budget_s=30.0, weight_s=30.0, later_weights_s=[300.0])
    assert share.deadline == 1e9 + 30.0 and share.share_s is None


def test_the_end_of_the_run_is_kept_back_from_the_search() -> None:
    bounded, clock = budget()
    assert bounded.time_left() == 90.0
    clock.now = 90.0
    assert bounded.used_up()
    assert bounded.unmeasured_reason(stage_deadline=None, produced=1) == (
        "the --time-budget was used up before it could be measured"
    )


def test_one_more_candidate_or_stage_must_fit_in_what_is_left() -> None:
    bounded, clock = budget()
    clock.now = 50.0  # 40 s left
    assert bounded.too_little_time() == ""
    assert bounded.too_little_time(stage_cost_s=60.0) == (
        "the --time-budget left for the search (40 s) is less than this stage took in earlier runs "
        "(about 60 s)"
    )
    clock.now = 87.0  # 3 s left, a candidate takes 5
    assert bounded.too_little_time() == (
        "the --time-budget left for the search (3 s) is less than checking and timing a candidate "
        "takes here (about 5 s)"
    )
    assert bounded.unmeasured_reason(stage_deadline=None, produced=1) == bounded.too_little_time()


def test_a_stage_measures_its_first_candidate_even_past_its_share() -> None:
    bounded, clock = budget()
    clock.now = 20.0
    assert bounded.unmeasured_reason(stage_deadline=10.0, produced=1) == ""
    assert bounded.unmeasured_reason(stage_deadline=10.0, produced=2) == (
        "the stage's share of the --time-budget was used up before it could be measured"
    )


def test_a_stage_gets_its_weights_share_capped_by_its_own_budget() -> None:
    bounded, _ = budget()  # 90 s left
    share = bounded.stage_share(budget_s=None, weight_s=100.0, later_weights_s=[200.0])
    assert (share.deadline, share.share_s, share.left_s) == (30.0, 30.0, 90.0)
    assert bounded.stage_share(budget_s=10.0, weight_s=100.0, later_weights_s=[200.0]).deadline == 10.0


def test_the_final_comparison_times_what_is_left_but_never_under_its_floor() -> None:
    bounded, clock = budget()
    assert bounded.final_time_s(max_time_s=5.0) == 5.0  # the recipe's: time enough
    clock.now = 93.0  # the processes and the write take 5 s of the 10 reserved; 2 s left to time
    assert bounded.final_time_s(max_time_s=5.0) == pytest.approx(FINAL_MIN_TIME_S)
    clock.now = 89.0
    assert bounded.final_time_s(max_time_s=5.0) == pytest.approx(5.0)
    clock.now = 91.0
    assert bounded.final_time_s(max_time_s=5.0) == pytest.approx(4.0)
