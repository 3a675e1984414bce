"""The batcher's lifecycle apart from any model (optimize/serve/batching/lifecycle.py): the dispatcher
task wakes at the time its step names or when kicked, and drain waits for what was accepted."""

from __future__ import annotations

import asyncio

import pytest

from optimize.serve.batching.lifecycle import Lifecycle
from tests.serve.fake_clock import FakeClock, settle


def test_the_dispatcher_wakes_at_the_time_its_step_names_or_when_kicked_and_drain_waits() -> None:
    async def main() -> None:
        clock = FakeClock(start=100.0)
        lifecycle = Lifecycle(clock)
        steps: list[float] = []

        def step(now: float) -> float | None:
            steps.append(now)
            return 100.5 if len(steps) == 1 else None  # the first step asks to look again at 100.5

        lifecycle.open()
        lifecycle.run(step, pytest.fail)
        await settle()
        assert lifecycle.accepting and lifecycle.dispatching and steps == [100.0]
        await clock.advance(0.4)
        assert steps == [100.0]  # nothing before its time
        await clock.advance(0.2)
        assert steps == [100.0, 100.5]
        await clock.advance(10.0)
        assert steps == [100.0, 100.5]  # no timer asked for: it sleeps until kicked
        lifecycle.kick()
        await settle()
        assert steps == pytest.approx([100.0, 100.5, 110.6])  # at once, at the present time
        lifecycle.busy()  # a request accepted: drain waits for it
        drained = asyncio.ensure_future(lifecycle.drain())
        await settle()
        assert not drained.done() and not lifecycle.accepting and lifecycle.draining
        lifecycle.idle()
        await asyncio.wait_for(drained, 1)
        assert not lifecycle.dispatching

    asyncio.run(main())


def test_a_step_that_raises_is_reported_and_the_dispatcher_goes_on() -> None:
    async def main() -> tuple[list[float], list[Exception], bool]:
        clock = FakeClock(start=5.0)
        lifecycle = Lifecycle(clock)
        steps: list[float] = []
        failures: list[Exception] = []

        def step(now: float) -> float | None:
            steps.append(now)
            if len(steps) == 2:
                raise RuntimeError("a bug in a step")
            return None

        lifecycle.open()
        lifecycle.run(step, failures.append)
        await settle()
        lifecycle.kick()  # the step that raises
        await settle()
        lifecycle.kick()  # the task is still there to take the next one
        await settle()
        dispatching = lifecycle.dispatching
        await lifecycle.drain()
        return steps, failures, dispatching

    steps, failures, dispatching = asyncio.run(main())
    assert steps == [5.0, 5.0, 5.0] and dispatching
    assert len(failures) == 1 and str(failures[0]) == "a bug in a step"
