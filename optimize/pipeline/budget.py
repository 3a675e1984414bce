"""The --time-budget of one `lto optimize` run: what is left for the search, whether one more
candidate or stage fits, a stage's share, and how long the final comparison may time.

What the end of the run will cost (the final comparison in fresh processes and the artifact's
write) and what checking one candidate costs are estimated by the evaluator from this run's own
measurements; they are kept back from the search, so a run ends near its budget with an artifact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from optimize.pipeline import judge

# The final comparison times for at least this long, even when the --time-budget is spent: a
# headline needs its own measurement (a few rounds in each set of processes).
FINAL_MIN_TIME_S = 3.0


class Estimates(Protocol):
    """What the budget needs to know about the run's costs (pipeline/evaluate.Evaluator)."""

    def end_cost_s(self) -> float:
        """Seconds the end of the run will take with the best so far as the artifact."""
        ...

    def evaluation_s(self) -> float:
        """Seconds checking and timing one candidate takes here."""
        ...


@dataclass(frozen=True)
class StageShare:
    """A stage's deadline under the --time-budget, and its share of what was left."""

    deadline: float | None
    share_s: float | None = None  # None: no --time-budget
    left_s: float | None = None


class TimeBudget:
    """The --time-budget's rules; with no budget (deadline None) nothing is ever short of time."""

    def __init__(self, deadline: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline = deadline
        self.clock = clock
        self.estimates: Estimates | None = None  # known once the baseline is measured

    def time_left(self) -> float | None:
        """Seconds of the --time-budget left for the search: what the end of the run will take is
        kept back (None: no budget)."""
        if self.deadline is None:
            return None
        reserve = self.estimates.end_cost_s() if self.estimates is not None else 0.0
        return self.deadline - self.clock() - reserve

    def used_up(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0

    def too_little_time(self, stage_cost_s: float = 0.0) -> str:
        """Why what is left of the --time-budget cannot fit one more candidate ("" when it can):
        checking and timing one takes about evaluation_s here, and a measurement once begun runs
        its least rounds whatever the budget. A stage about to start needs `stage_cost_s` too
        (what it took in earlier runs: a quantizer's calibration cannot be cut short)."""
        left = self.time_left()
        if left is None or self.estimates is None:
            return ""
        evaluation = self.estimates.evaluation_s()
        if left >= max(evaluation, stage_cost_s):
            return ""
        if stage_cost_s > evaluation:
            return (
                f"the --time-budget left for the search ({max(left, 0.0):.0f} s) is less than this "
                f"stage took in earlier runs (about {stage_cost_s:.0f} s)"
            )
        return (
            f"the --time-budget left for the search ({max(left, 0.0):.0f} s) is less than checking "
            f"and timing a candidate takes here (about {evaluation:.0f} s)"
        )

    def unmeasured_reason(self, stage_deadline: float | None, produced: int) -> str:
        """Why a stage's `produced`-th candidate is left unmeasured ("" when it is measured)."""
        if self.used_up():
            return "the --time-budget was used up before it could be measured"
        short = self.too_little_time()
        if short:
            return short
        share_deadline = stage_deadline if self.deadline is not None else None
        if judge.share_used_up(share_deadline, self.clock(), produced - 1):
            return "the stage's share of the --time-budget was used up before it could be measured"
        return ""

    def stage_share(
        self, budget_s: float | None, weight_s: float, later_weights_s: Sequence[float]
    ) -> StageShare:
        """A stage's deadline: its recipe budget (`budget_s`), and under a --time-budget its share
        of what is left by its weight among the stages still to run (judge.stage_time_share)."""
        now = self.clock()
        deadline = now + budget_s if budget_s else None
        left = self.time_left()
        if left is None:
            return StageShare(deadline)
        share = judge.stage_time_share(weight_s, later_weights_s, left)
        deadline = min(deadline, now + share) if deadline is not None else now + share
        return StageShare(deadline, share, left)

    def final_time_s(self, max_time_s: float) -> float | None:
        """The final comparison's timing budget: the recipe's (`max_time_s`), or what is left of the
        --time-budget once its processes' start and the artifact's write are counted, whichever is
        less, but never under FINAL_MIN_TIME_S (None: no budget, the recipe's)."""
        if self.deadline is None or self.estimates is None:
            return None
        overhead = self.estimates.end_cost_s() - max_time_s
        left = self.deadline - self.clock() - overhead
        return float(min(max_time_s, max(left, FINAL_MIN_TIME_S)))


__all__ = ["FINAL_MIN_TIME_S", "Estimates", "StageShare", "TimeBudget"]
