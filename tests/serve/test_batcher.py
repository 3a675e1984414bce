"""The dynamic batcher: when batches form, exact splitting, deadlines, shedding, exactly-once, drain.

Tests of its decisions run on a FakeClock: time passes only when the test advances it or a fake
model takes simulated time, so they wait for no timer and decide alike on any machine. The
exactly-once test keeps the real clock: it is about real threads and racing arrivals, and its
timing checks use only bounds that a loaded machine cannot break.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.errors import InputError
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.estimators import LatencyModel
from optimize.serve.batching.outcomes import DeadlineExceeded, ModelFailure, Overloaded
from optimize.serve.batching.policy import max_rows_now
from optimize.serve.batching.signature import sample_row
from tests.serve.fake_clock import FakeClock, settle
from tests.serve.helpers import SleepBackend, make_token_model

LONG = 60_000.0  # ms: a timer or deadline that a test must never reach
# The fake time a real runtime's call takes: on the fake clock it would take none, and the
# batcher reads a model measured at 0 ms as having no efficient batch size (one row a batch).
MODEL_S = 0.001


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    # No test waits for a real timer (the slowest takes well under a second): a run this long
    # is a batcher that waits for fake time nobody will pass.
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


async def raised(awaitable: Awaitable[Any], kind: type[BaseException]) -> BaseException | None:
    """The `kind` exception that `awaitable` raises, or None when it returns."""
    try:
        await awaitable
    except kind as exc:
        return exc
    return None


def x(rows: int, start: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + start)}


def test_latency_model_fits_a_line_and_is_cautious_with_one_point() -> None:
    model = LatencyModel(decay=1.0)
    for work, ms in [(1, 1.5), (2, 2.0), (4, 3.0), (8, 5.0)]:
        model.observe(work, ms)
    assert model.intercept == pytest.approx(1.0)
    assert model.slope == pytest.approx(0.5)
    assert model.predict(3) == pytest.approx(2.5)  # between measured sizes: interpolated
    # Beyond the largest measured size it assumes no further gain per row: 5 ms + 8 x 5/8 ms.
    assert model.predict(16) == pytest.approx(10.0)

    spiky = LatencyModel()
    for _ in range(10):
        spiky.observe(1, 2.0)
    spiky.observe(1, 200.0)  # one descheduled run on a busy machine
    assert spiky.predict(1) < 4.0

    single = LatencyModel()
    for _ in range(5):
        single.observe(1, 2.0)
    # Never measured a bigger batch: assume no gain from batching.
    assert single.predict(4) == pytest.approx(8.0)


def test_batch_size_follows_measured_efficiency_not_just_the_budget() -> None:
    # A runtime whose batch-1 path is far faster per row than its batched one (resnet_tiny on
    # ORT behaves so): batching would cut throughput, so the cap falls to one row.
    batcher = Batcher([SleepBackend()], BatcherConfig(max_batch=32, target_latency_ms=200))
    for rows, ms in [(1, 2.0), (2, 11.0), (4, 22.0), (8, 41.0), (16, 82.0)]:
        batcher.latency.observe(rows, ms)
    assert batcher.latency.predict(1) == pytest.approx(2.0)
    assert batcher.latency.predict(3) == pytest.approx(16.5)
    assert max_rows_now(batcher.policy_state(), 1.0) == 1

    # The usual case: per-row cost falls with size; the cap is what fits half the target.
    usual = Batcher([SleepBackend()], BatcherConfig(max_batch=64, target_latency_ms=40))
    for rows, ms in [(1, 2.0), (2, 2.5), (4, 3.5), (8, 5.5), (16, 9.5)]:
        usual.latency.observe(rows, ms)
    cap = max_rows_now(usual.policy_state(), 1.0)
    assert 16 <= cap < 64
    assert usual.latency.upper(cap) <= 20.0 < usual.latency.upper(cap + 1)

    # Flat per-row model cost (the PP-OCR cls measured 0.85, 0.84, 0.84 ms a row at 1, 2, 4 rows): by
    # model time alone batching gains nothing. Each batch also costs hand-offs while requests
    # wait (~0.4 ms measured under overload), and counting them makes 4-row batches the best.
    flat = Batcher([SleepBackend()], BatcherConfig(max_batch=32, target_latency_ms=10))
    for rows, ms in [(1, 0.84), (2, 1.70), (4, 3.40), (8, 8.1)]:
        for _ in range(5):
            flat.latency.observe(rows, ms)
    assert max_rows_now(flat.policy_state(), 1.0) == 1
    flat.estimates.batch_gap_ms = 0.4
    assert max_rows_now(flat.policy_state(), 1.0) == 4


def test_batch_forms_when_full_without_waiting_for_the_timer() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, clock=clock)

    async def main() -> tuple[list[Any], float]:
        config = BatcherConfig(max_batch=4, max_wait_ms=LONG, target_latency_ms=LONG * 2)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        t0 = clock.now()
        # The test lets no time pass: only leaving when full answers them.
        results = await asyncio.gather(*(batcher.submit(x(1, i)) for i in range(4)))
        elapsed = clock.now() - t0
        await batcher.drain()
        return results, elapsed

    results, elapsed = run(main())
    assert backend.calls == [4]
    assert elapsed < 30  # left when full, not after the 60 s wait
    assert all(r.batch_rows == 4 and r.batch_requests == 4 for r in results)


def test_batch_forms_after_max_wait_with_no_further_arrival() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=64, max_wait_ms=50, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        submitted = asyncio.gather(*(batcher.submit(x(1, i)) for i in range(3)))
        await clock.advance(0.05)
        results = await submitted
        await batcher.drain()
        return results

    results = run(main())
    # One batch of the three, sent by the timer: nothing else ever arrived.
    assert backend.calls == [3]
    assert all(r.queue_ms >= 45 for r in results)


def test_sparse_arrivals_do_not_wait_for_company() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=64, max_wait_ms=500, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        results = []
        for i in range(3):
            pending = asyncio.ensure_future(batcher.submit(x(1, i)))
            if i == 0:
                await clock.advance(0.5)  # no arrival history yet: the first waits out the max wait
            results.append(await pending)
            await clock.advance(0.6)  # arrivals further apart than the 500 ms wait
        await batcher.drain()
        return results

    results = run(main())
    assert backend.calls == [1, 1, 1]
    # The first had no arrival history and waited; the later ones left at once instead of 500 ms.
    assert results[0].queue_ms >= 450
    assert all(r.queue_ms < 250 for r in results[1:])


def test_batch_leaves_early_to_meet_the_earliest_deadline() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=20, clock=clock)

    async def main() -> Any:
        config = BatcherConfig(max_batch=64, max_wait_ms=LONG, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start(x(1))  # calibration teaches it the model takes about 20 ms
        backend.calls.clear()
        t0 = clock.now()
        pending = asyncio.ensure_future(batcher.submit(x(1), deadline_ms=400))
        await clock.run_next_timer()  # when the batcher chose to leave
        result = await pending
        elapsed = (clock.now() - t0) * 1e3
        await batcher.drain()
        return result, elapsed

    result, elapsed = run(main())
    assert backend.calls == [1]
    # It waited for company (the deadline allowed it), but not for the 60 s max wait.
    assert result.queue_ms > 100
    assert elapsed < 30_000


def test_results_are_split_exactly_across_requests_of_different_rows() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, clock=clock)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((rows, 4)).astype(np.float32)} for rows in (1, 3, 2, 1)]

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=16, max_wait_ms=100, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        submitted = asyncio.gather(*(batcher.submit(f) for f in feeds))
        await clock.advance(0.1)  # the max wait
        results = await submitted
        await batcher.drain()
        return results

    results = run(main())
    assert backend.calls == [7]
    for f, r in zip(feeds, results, strict=True):
        np.testing.assert_array_equal(r.outputs["y"], f["x"] * 2 + 1)
        np.testing.assert_array_equal(r.outputs["s"], f["x"].sum(axis=1))


def test_request_that_cannot_meet_its_deadline_gets_a_timeout_and_never_runs() -> None:
    clock = FakeClock()
    gate = threading.Event()
    backend = SleepBackend(base_ms=1, gate=gate, clock=clock)

    async def main() -> tuple[Any, BaseException | None]:
        config = BatcherConfig(max_batch=8, max_wait_ms=0, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(x(1)))
        await clock.advance(0.05)  # first is now in flight, blocked on the gate
        waiting = asyncio.ensure_future(raised(batcher.submit(x(2, 100), deadline_ms=30), DeadlineExceeded))
        await clock.advance(0.05)  # past its deadline, the instance still busy
        late = await waiting
        gate.set()
        result = await first
        await batcher.drain()
        return result, late

    result, late = run(main())
    assert isinstance(late, DeadlineExceeded)
    assert "deadline" in str(late)
    assert backend.calls == [1]  # the late request (2 rows) was never run
    assert result.batch_rows == 1


def test_a_lone_request_skips_the_queue_but_keeps_its_deadline_and_exact_results() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=20, clock=clock)

    async def main() -> tuple[list[Any], BaseException | None, int]:
        config = BatcherConfig(max_batch=8, max_wait_ms=0, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        results = [await batcher.submit(x(r, 10 * r), alone=True) for r in (1, 3, 2)]
        # The model is known to take 20 ms: a 5 ms deadline cannot be met, even alone.
        late = await raised(batcher.submit(x(1), deadline_ms=5, alone=True), DeadlineExceeded)
        queued = batcher.queued_rows
        await asyncio.wait_for(batcher.drain(), 5)  # nothing left behind in the queue
        return results, late, queued

    results, late, queued = run(main())
    for rows, result in zip((1, 3, 2), results, strict=True):
        np.testing.assert_array_equal(result.outputs["y"], x(rows, 10 * rows)["x"] * 2 + 1)
        assert result.batch_rows == rows
    assert isinstance(late, DeadlineExceeded) and queued == 0
    assert backend.calls == [1, 3, 2]  # the late request never ran


def test_a_deadline_that_the_queue_ahead_would_break_is_refused_at_once() -> None:
    clock = FakeClock()
    gate = threading.Event()
    gate.set()
    backend = SleepBackend(base_ms=20, gate=gate, clock=clock)

    async def main() -> tuple[BaseException | None, float, list[Any]]:
        config = BatcherConfig(max_batch=1, max_wait_ms=0, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        for _ in range(3):  # learn that a call takes about 20 ms
            await batcher.submit(x(1))
        gate.clear()
        held = [asyncio.ensure_future(batcher.submit(x(1, 10 * i))) for i in range(4)]
        await clock.advance(0.05)  # one runs (held at the gate), three wait: ~80 ms ahead
        t0 = clock.now()
        # 50 ms would do alone, not behind the queue.
        refused = await raised(batcher.submit(x(1, 99), deadline_ms=50), Overloaded)
        waited = clock.now() - t0
        patient = asyncio.ensure_future(batcher.submit(x(1, 7), deadline_ms=LONG))
        gate.set()
        results = await asyncio.gather(*held, patient)
        await batcher.drain()
        return refused, waited, results

    refused, waited, results = run(main())
    assert isinstance(refused, Overloaded) and "ahead of this request" in str(refused)
    assert refused.retry_after_s >= 1
    assert waited < 0.04  # refused at once, not after waiting for its deadline to pass
    np.testing.assert_array_equal(results[-1].outputs["y"], x(1, 7)["x"] * 2 + 1)
    assert 99 * 2 + 1 not in [float(v) for r in results for v in r.outputs["y"].ravel()]
    assert len(backend.calls) == 3 + 4 + 1  # the refused request never ran


def test_full_queue_sheds_at_once_with_a_retry_hint_and_answers_the_rest() -> None:
    clock = FakeClock()
    gate = threading.Event()
    backend = SleepBackend(base_ms=1, gate=gate, clock=clock)

    async def main() -> tuple[list[Any], Overloaded | None]:
        config = BatcherConfig(max_batch=8, max_wait_ms=0, target_latency_ms=LONG, max_queue=4)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        inflight = asyncio.ensure_future(batcher.submit(x(1)))
        await clock.advance(0.05)
        queued = [asyncio.ensure_future(batcher.submit(x(1, i))) for i in range(4)]
        await clock.advance(0.01)
        shed: Overloaded | None = None
        try:
            await batcher.submit(x(1, 99))
        except Overloaded as exc:
            shed = exc
        gate.set()
        results = await asyncio.gather(inflight, *queued)
        await batcher.drain()
        return results, shed

    results, shed = run(main())
    assert shed is not None and shed.retry_after_s >= 1 and "queue full" in shed.message
    assert len(results) == 5
    assert sorted(backend.calls) == [1, 4]


def test_every_accepted_request_is_answered_exactly_once_under_concurrent_load() -> None:
    backend = SleepBackend(base_ms=0.5, per_row_ms=0.05)
    n = 400
    answers: dict[int, list[str]] = {i: [] for i in range(n)}

    async def client(batcher: Batcher, i: int, rng: random.Random) -> None:
        await asyncio.sleep(rng.random() * 0.3)
        rows = rng.randint(1, 3)
        feeds = {"x": np.full((rows, 4), float(i), dtype=np.float32)}
        try:
            result = await batcher.submit(feeds, deadline_ms=rng.choice([5.0, LONG]))
        except (DeadlineExceeded, Overloaded) as exc:
            answers[i].append(type(exc).__name__)
            return
        # The answer belongs to this request: its own values, its own rows.
        np.testing.assert_array_equal(result.outputs["y"], feeds["x"] * 2 + 1)
        answers[i].append("ok")

    async def main() -> Batcher:
        batcher = Batcher(
            [backend, SleepBackend(base_ms=0.5, per_row_ms=0.05)],
            BatcherConfig(max_batch=16, max_wait_ms=2, target_latency_ms=LONG, max_queue=64),
        )
        await batcher.start()
        rng = random.Random(0)
        await asyncio.gather(*(client(batcher, i, rng) for i in range(n)))
        await batcher.drain()
        return batcher

    batcher = run(main())
    assert all(len(a) == 1 for a in answers.values()), "a request was answered twice or never"
    ok = sum(a == ["ok"] for a in answers.values())
    assert ok > 0
    assert batcher.requests_answered == n - sum(a == ["Overloaded"] for a in answers.values())
    assert batcher.queued_rows == 0 and batcher.inflight_batches == 0


def test_drain_answers_everything_accepted_and_refuses_new_requests() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=30, clock=clock)

    async def main() -> tuple[list[Any], Overloaded | None]:
        config = BatcherConfig(max_batch=4, max_wait_ms=LONG, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        pending = [asyncio.ensure_future(batcher.submit(x(1, i))) for i in range(10)]
        await settle()  # queued, the first batch running: time need not pass
        drain = asyncio.ensure_future(batcher.drain())
        await asyncio.sleep(0)
        refused: Overloaded | None = None
        try:
            await batcher.submit(x(1))
        except Overloaded as exc:
            refused = exc
        results = await asyncio.gather(*pending)
        await drain
        return results, refused

    results, refused = run(main())
    assert len(results) == 10
    assert sum(backend.calls) == 10  # the last two did not wait 60 s for company: drain flushed them
    assert refused is not None and "shutting down" in refused.message


def test_a_dispatch_step_that_raises_answers_what_was_queued_and_the_batcher_goes_on() -> None:
    # A bug in a step must not leave requests queued for ever (nor a drain waiting for them).
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, clock=clock)

    async def main() -> tuple[list[Any], Any]:
        config = BatcherConfig(max_batch=4, max_wait_ms=5, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        real_step, steps = batcher.dispatcher.step, []

        def step(now: float) -> float | None:
            steps.append(now)
            if len(steps) == 2:  # the first step after requests were queued
                raise RuntimeError("a bug in the policy")
            return real_step(now)

        batcher.dispatcher.step = step  # type: ignore[method-assign]
        await batcher.start()
        queued = [asyncio.ensure_future(batcher.submit(x(1, i))) for i in range(2)]
        await settle()
        failed = await asyncio.gather(*queued, return_exceptions=True)
        later = asyncio.ensure_future(batcher.submit(x(1, 7)))
        await settle()
        await clock.advance(0.010)
        answer = await asyncio.wait_for(later, 5)
        await asyncio.wait_for(batcher.drain(), 5)
        return failed, answer

    failed, answer = run(main())
    assert all(
        isinstance(f, ModelFailure) and "batcher failed: a bug in the policy" in f.message for f in failed
    )
    np.testing.assert_array_equal(answer.outputs["y"], x(1, 7)["x"] * 2 + 1)


def test_a_failing_batch_is_rerun_one_by_one_so_only_the_bad_request_fails() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, poison=-1.0, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=4, max_wait_ms=LONG, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        feeds = [x(1, 1), x(1, 2), {"x": np.full((1, 4), -1.0, np.float32)}, x(1, 3)]
        results = await asyncio.gather(*(batcher.submit(f) for f in feeds), return_exceptions=True)
        await batcher.drain()
        return results

    results = run(main())
    assert backend.calls == [4, 1, 1, 1, 1]  # the batch, then each request alone
    bad = results[2]
    assert isinstance(bad, ModelFailure) and "holds -1.0" in bad.message
    for i, value in ((0, 1), (1, 2), (3, 3)):
        np.testing.assert_array_equal(results[i].outputs["y"], x(1, value)["x"] * 2 + 1)


def test_a_batch_that_fails_only_as_a_batch_succeeds_request_by_request() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, fail_rows=2, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=2, max_wait_ms=LONG, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(x(1, v)) for v in (4, 5)), return_exceptions=True)
        await batcher.drain()
        return results

    results = run(main())
    assert backend.calls == [2, 1, 1]
    for result, value in zip(results, (4, 5), strict=True):
        np.testing.assert_array_equal(result.outputs["y"], x(1, value)["x"] * 2 + 1)


def test_target_latency_steers_but_never_rejects() -> None:
    """Triton's rule: no deadline unless the request (or --queue-timeout-ms) sets one. A
    target far below the model time still answers every request."""
    clock = FakeClock()
    backend = SleepBackend(base_ms=30, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=2, max_wait_ms=0, target_latency_ms=1)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(x(1, v)) for v in range(6)), return_exceptions=True)
        await batcher.drain()
        return results

    results = run(main())
    assert not [r for r in results if isinstance(r, BaseException)]


def test_queue_timeout_gives_requests_without_their_own_a_deadline() -> None:
    clock = FakeClock()
    gate = threading.Event()
    backend = SleepBackend(base_ms=1, gate=gate, clock=clock)

    async def main() -> tuple[Any, Any]:
        config = BatcherConfig(max_batch=1, max_wait_ms=0, target_latency_ms=LONG, queue_timeout_ms=50)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(x(1)))  # holds the only instance
        await clock.advance(0.01)
        waiting = asyncio.gather(batcher.submit(x(1, 2)), return_exceptions=True)
        await clock.advance(0.06)  # past the queue timeout, the instance still busy
        second = await waiting
        gate.set()
        done = await first
        await batcher.drain()
        return done, second[0]

    first, second = run(main())
    np.testing.assert_array_equal(first.outputs["y"], x(1)["x"] * 2 + 1)
    assert isinstance(second, DeadlineExceeded) and second.queue_ms >= 40


def test_a_full_batch_waits_on_the_busy_instance_not_in_the_queue() -> None:
    # With the only instance busy, a full batch is handed to its thread at once: it starts when
    # the running batch ends, without waiting for the event loop. A partial one stays queued.
    clock = FakeClock()
    gate = threading.Event()
    backend = SleepBackend(base_ms=1, gate=gate, clock=clock)

    async def main() -> tuple[list[Any], list[int]]:
        config = BatcherConfig(max_batch=2, max_wait_ms=0, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        running = [asyncio.ensure_future(batcher.submit(x(1, 0)))]
        await clock.advance(0.01)
        seen = [batcher.inflight_batches, batcher.queued_rows]
        full = [asyncio.ensure_future(batcher.submit(x(1, i))) for i in range(1, 3)]
        await clock.advance(0.01)
        seen += [batcher.inflight_batches, batcher.queued_rows]
        partial = asyncio.ensure_future(batcher.submit(x(1, 3)))
        await clock.advance(0.01)
        seen += [batcher.inflight_batches, batcher.queued_rows]
        gate.set()
        results = await asyncio.gather(*running, *full, partial)
        await batcher.drain()
        return results, seen

    results, seen = run(main())
    assert seen == [1, 0, 2, 0, 2, 1]  # running; + the full batch on standby; the partial waits
    assert backend.calls == [1, 2, 1]
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.outputs["y"], x(1, i)["x"] * 2 + 1)


def test_a_full_batch_with_deadlines_goes_on_standby_only_when_predicted_to_meet_them() -> None:
    clock = FakeClock()
    gate = threading.Event()
    gate.set()
    backend = SleepBackend(base_ms=10, gate=gate, clock=clock)

    async def main() -> tuple[list[int], BaseException | None, list[Any]]:
        config = BatcherConfig(max_batch=1, max_wait_ms=0, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        for _ in range(3):  # learn that a call takes about 10 ms
            await batcher.submit(x(1))
        gate.clear()
        running = asyncio.ensure_future(batcher.submit(x(1, 1)))
        await clock.advance(0.01)
        # Predicted to end ~20 ms from now, well within 10 s: handed to the busy instance.
        roomy = asyncio.ensure_future(batcher.submit(x(1, 2), deadline_ms=10_000))
        await asyncio.sleep(0)  # roomy is submitted, predicted to start when the running one ends
        seen = [batcher.inflight_batches, batcher.queued_rows]
        # 15 ms is enough alone, not behind the 10 ms standby batch: refused at once.
        tight = await raised(batcher.submit(x(1, 3), deadline_ms=15), Overloaded)
        gate.set()
        results = await asyncio.gather(running, roomy)
        await batcher.drain()
        return seen, tight, results

    seen, tight, results = run(main())
    assert seen == [2, 0]  # the running batch, and the roomy one on standby
    assert isinstance(tight, Overloaded)
    for i, r in enumerate(results, start=1):
        np.testing.assert_array_equal(r.outputs["y"], x(1, i)["x"] * 2 + 1)


def test_model_with_fixed_batch_runs_one_request_per_call() -> None:
    clock = FakeClock()
    backend = SleepBackend(base_ms=1, batchable=False, clock=clock)

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=8, max_wait_ms=20, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        assert not batcher.signature.batchable and batcher.max_rows == 1
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(x(1, i)) for i in range(3)))
        await batcher.drain()
        return results

    results = run(main())
    assert backend.calls == [1, 1, 1]
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.outputs["y"], x(1, i)["x"] * 2 + 1)


def test_check_request_names_what_is_wrong() -> None:
    batcher = Batcher([SleepBackend()], BatcherConfig())
    with pytest.raises(InputError, match="'x' has dtype float64"):
        batcher.check_request({"x": np.zeros((1, 4))})
    with pytest.raises(InputError, match="axis 1"):
        batcher.check_request({"x": np.zeros((1, 5), np.float32)})
    with pytest.raises(InputError, match="unknown input 'z'"):
        batcher.check_request({"x": np.zeros((1, 4), np.float32), "z": np.zeros(1)})
    assert batcher.check_request({"x": np.zeros((3, 4), np.float32)}) == 3
    with pytest.raises(InputError, match="can never fit the queue of 256 rows"):
        batcher.check_request({"x": np.zeros((300, 4), np.float32)})


def test_token_sequences_are_padded_to_a_bucket_with_the_mask_and_cut_back(tmp_path: Path) -> None:
    from optimize.runtimes.backends import open_backend

    path = make_token_model(tmp_path / "tokens.onnx")
    backend = open_backend("onnxruntime", path, {"intra_op_num_threads": 1})
    calls: list[tuple[int, ...]] = []
    original = backend.run
    clock = FakeClock()

    def spy(feeds: Any) -> dict[str, np.ndarray]:
        calls.append(tuple(feeds["input_ids"].shape))
        clock.pass_time(MODEL_S)
        return original(feeds)

    backend.run = spy  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    requests = []
    for length in (5, 7, 8):
        ids = rng.integers(1, 50, size=(1, length)).astype(np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=8, max_wait_ms=200, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        assert batcher.signature.seq_inputs == ("input_ids", "attention_mask")
        await batcher.start()
        submitted = asyncio.gather(*(batcher.submit(r) for r in requests))
        await clock.advance(0.2)  # the max wait
        results = await submitted
        await batcher.drain()
        return results

    results = run(main())
    assert calls == [(3, 8)]  # one batch, padded to the bucket of 8
    for req, res in zip(requests, results, strict=True):
        alone = original(req)
        assert res.outputs["hidden"].shape == alone["hidden"].shape
        np.testing.assert_allclose(res.outputs["hidden"], alone["hidden"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(res.outputs["pooled"], alone["pooled"], rtol=1e-6, atol=1e-6)


def test_different_shapes_without_a_mask_batch_only_with_equals(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from optimize.runtimes.backends import open_backend

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "relu.onnx"))
    backend = open_backend("onnxruntime", tmp_path / "relu.onnx", {"intra_op_num_threads": 1})
    shapes: list[tuple[int, ...]] = []
    original = backend.run
    clock = FakeClock()

    def spy(feeds: Any) -> dict[str, np.ndarray]:
        shapes.append(feeds["x"].shape)
        clock.pass_time(MODEL_S)
        return original(feeds)

    backend.run = spy  # type: ignore[method-assign]

    async def main() -> list[Any]:
        config = BatcherConfig(max_batch=8, max_wait_ms=100, target_latency_ms=LONG)
        batcher = Batcher([backend], config, clock=clock)
        await batcher.start()
        feeds = [{"x": np.full((1, n), -1.0 + n, np.float32)} for n in (3, 5, 3, 5)]
        submitted = asyncio.gather(*(batcher.submit(f) for f in feeds))
        await clock.advance(0.1)  # the max wait
        results = await submitted
        await batcher.drain()
        return results

    results = run(main())
    assert sorted(shapes) == [(2, 3), (2, 5)]
    assert [r.outputs["y"].shape for r in results] == [(1, 3), (1, 5), (1, 3), (1, 5)]


def test_sample_row_uses_known_dims_and_gives_up_on_unknown_ones() -> None:
    backend = SleepBackend()
    row = sample_row(backend.inputs)
    assert row["x"].shape == (1, 4)
    from optimize.backend import TensorSpec

    assert sample_row([TensorSpec("ids", "int64", ("batch", "sequence"))]) == {}
    pinned = sample_row([TensorSpec("attention_mask", "int64", ("batch", "sequence"))], {"sequence": (16,)})
    assert pinned["attention_mask"].shape == (1, 16) and pinned["attention_mask"].min() == 1
