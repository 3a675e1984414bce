"""Tuning plans and options (optimize/runtimes/tvm/tuning.py)."""

from __future__ import annotations

import pytest

from optimize.errors import UsageError

pytestmark = pytest.mark.tvm


def test_plan_covers_every_task_before_deepening() -> None:
    from optimize.runtimes.tvm.tuning import TaskState, TuneSettings, plan

    states = [TaskState(f"t{i}", f"{i:016x}", 1, 100.0 - i) for i in range(3)]
    work = plan(states, TuneSettings(trials=12, trials_per_iter=2))
    assert [(s.name, n) for s, n in work[:3]] == [("t0", 2), ("t1", 2), ("t2", 2)]
    assert sum(n for _, n in work) == 12
    # Trials allotted in earlier runs (from the cache) count toward each task's share, even where
    # the search measured fewer candidates than allotted: nothing left to plan.
    for s in states:
        s.budgeted, s.trials, s.best_us = 4, 3, 1.0
    assert plan(states, TuneSettings(trials=12, trials_per_iter=2)) == []
    # A bigger budget continues where the last run stopped.
    assert sum(n for _, n in plan(states, TuneSettings(trials=24, trials_per_iter=2))) == 12


def test_rpc_options_are_checked() -> None:
    from optimize.runtimes.tvm.tuning import parse_tracker

    assert parse_tracker("10.0.0.5:9190") == ("10.0.0.5", 9190)
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        parse_tracker("10.0.0.5")
