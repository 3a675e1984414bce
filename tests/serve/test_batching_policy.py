"""The batching policy (optimize/serve/batching/policy.py) on plain values: no batcher, no event
loop, no clock; `now` is whatever number the test passes."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from optimize.serve.batching.estimators import LatencyModel
from optimize.serve.batching.policy import (
    PolicyState,
    decide,
    efficient_work,
    leaves_alone,
    max_rows_now,
    shrink,
    standby_batch,
)

NOW = 100.0


@dataclass
class Req:
    rows: int = 1
    work: float = 1.0
    deadline: float = math.inf
    target: float = NOW + 1.0
    enqueued: float = NOW
    queued: bool = True


@dataclass
class Line:
    """A measured model whose batch of `work` takes base + per_row x work ms, exactly: batching pays."""

    base_ms: float = 0.5
    per_row_ms: float = 0.5
    sizes: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)  # the batch sizes measured
    n: int = 1

    def predict(self, work: float) -> float:
        return self.base_ms + self.per_row_ms * work

    def upper(self, work: float) -> float:
        return self.predict(work)

    def most_efficient_work(
        self, budget_ms: float, per_batch_ms: float = 0.0, least_work: float = 0.0
    ) -> tuple[float, bool] | None:
        fits = [w for w in self.sizes if self.predict(w) <= budget_ms and w >= least_work]
        if not fits:
            return None
        best = max(fits, key=lambda w: w / (self.predict(w) + per_batch_ms))
        return best, best == self.sizes[-1]


def state(*queues: list[Req], **overrides: object) -> PolicyState[Req]:
    base: PolicyState[Req] = PolicyState(
        queues=list(queues), latency=LatencyModel(), max_rows=4, max_wait_s=0.010, model_budget_ms=50.0
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_a_full_batch_leaves_now_and_takes_only_what_fits() -> None:
    queue = [Req(enqueued=NOW - 0.001 * i) for i in range(6)]
    decision = decide(state(queue), NOW)
    assert decision.batch == queue[:4] and decision.wake_at is None


def test_a_partial_batch_waits_for_max_wait_from_its_oldest_request() -> None:
    queue = [Req(enqueued=NOW - 0.004), Req(enqueued=NOW)]
    decision = decide(state(queue), NOW)
    assert decision.batch is None
    assert decision.wake_at == pytest.approx(NOW + 0.006)
    # At that time it leaves, with both requests.
    assert decide(state(queue), NOW + 0.006).batch == queue


def test_sparse_arrivals_and_draining_send_a_partial_batch_at_once() -> None:
    queue = [Req()]
    assert decide(state(queue, arrival_gap_s=0.020), NOW).batch == queue
    assert decide(state(queue, arrival_gap_s=0.005), NOW).batch is None
    assert decide(state(queue, draining=True), NOW).batch == queue


def test_a_near_target_makes_a_batch_leave_before_max_wait() -> None:
    # A batch grown to 2 rows needs 1.5 ms, so a target 3 ms away leaves 1.5 ms to wait.
    queue = [Req(target=NOW + 0.003)]
    decision = decide(state(queue, latency=Line(), max_wait_s=1.0), NOW)
    assert decision.batch is None
    assert decision.wake_at == pytest.approx(NOW + 0.0015)


def test_the_queue_with_the_nearest_target_goes_first_and_the_others_set_the_wake_up() -> None:
    later = [Req(target=NOW + 0.5) for _ in range(4)]
    sooner = [Req(target=NOW + 0.1) for _ in range(4)]
    waiting = [Req(enqueued=NOW - 0.002)]
    assert decide(state(later, sooner, waiting), NOW).batch == sooner
    decision = decide(state(waiting), NOW)
    assert decision.batch is None and decision.wake_at == pytest.approx(NOW + 0.008)


def test_requests_no_longer_queued_are_skipped() -> None:
    queue = [Req(), Req(queued=False), Req(), Req(queued=False), Req(), Req()]
    batch = decide(state(queue), NOW).batch
    assert batch == [queue[0], queue[2], queue[4], queue[5]]


def test_shrink_drops_the_tail_until_the_deadlines_are_met() -> None:
    latency = Line()
    batch = [Req(deadline=NOW + 0.0018), Req(), Req(), Req()]
    # Four rows would take 2.5 ms, three 2 ms; the first request's deadline allows 1.8 ms: two rows.
    assert shrink(latency, list(batch), NOW) == batch[:2]
    # Without deadlines a batch is never cut, whatever its targets.
    assert shrink(latency, [Req(target=NOW), Req(), Req()], NOW) == [Req(target=NOW), Req(), Req()]
    # With no measurement nothing is known to be too slow.
    assert shrink(LatencyModel(), list(batch), NOW) == batch


def test_standby_takes_only_full_batches_that_end_in_time() -> None:
    full = [Req() for _ in range(4)]
    partial = [Req()]
    assert standby_batch(state(partial), NOW + 0.01) is None
    assert standby_batch(state(partial, full), NOW + 0.01) == full
    # A deadline with an unmeasured model: it might not end in time, so it does not go early.
    tight = [Req(deadline=NOW + 1.0) for _ in range(4)]
    assert standby_batch(state(tight), NOW + 0.01) is None
    # Measured, and started when the running batch ends, 4 rows end 2.5 ms later.
    assert standby_batch(state(tight, latency=Line()), NOW + 0.01) == tight
    late = [Req(deadline=NOW + 0.0118) for _ in range(4)]
    assert standby_batch(state(late, latency=Line()), NOW + 0.01) == late[:2]


def test_batch_size_is_what_fits_the_model_budget() -> None:
    assert max_rows_now(state(max_rows=32), 1.0) == 32  # nothing measured: as large as allowed
    # The largest size measured (8) is the most efficient: grow while 0.5 + 0.5 x rows <= 5 ms.
    assert max_rows_now(state(max_rows=32, latency=Line(), model_budget_ms=5.0), 1.0) == 9
    assert max_rows_now(state(max_rows=3, latency=Line(), model_budget_ms=5.0), 1.0) == 3
    # A size that is not the largest measured is the most efficient: it is the cap.
    assert max_rows_now(state(max_rows=32, latency=Line(base_ms=0.0), model_budget_ms=5.0), 1.0) == 1
    # Every measured size over the budget: one row at a time.
    assert max_rows_now(state(latency=Line(base_ms=10.0), model_budget_ms=5.0), 1.0) == 1


def test_sizes_smaller_than_a_request_do_not_set_the_cap() -> None:
    # PP-OCR's direction classifier under lto serve at half its throughput (2026-12-06): requests
    # of 6 text lines; the warm-up measured 1, 2 and 4 rows on an idle machine, the sizes a batch
    # can be were measured under load. Comparing all of them made 4 rows the most efficient, so
    # each 6-row request was a full batch: 1,305 of 1,465 requests left one at a time while up
    # to 54 rows waited, and the queue grew for the whole run.
    latency = LatencyModel()
    for rows, ms in [(1, 0.75), (2, 1.03), (4, 1.64), (6, 4.18), (15, 10.07), (30, 18.31)]:
        latency.observe(rows, ms)
    loaded = state(latency=latency, max_rows=32, model_budget_ms=25.0)
    assert max_rows_now(loaded, 1.0) == 4  # what any size may be: 4 rows are the cheapest per row
    assert max_rows_now(loaded, 1.0, least_rows=6) == 32  # what a batch of 6-row requests can be
    # The unit admission predicts the queue's wait in: a batch such a request can be part of.
    assert efficient_work(loaded) == pytest.approx(4.0)
    assert efficient_work(loaded, least_work=6.0) == pytest.approx(30.0)
    waiting = [Req(rows=6, work=6.0, enqueued=NOW - 0.001 * i) for i in range(9)]
    batch = standby_batch(state(waiting, latency=latency, max_rows=32, model_budget_ms=25.0), NOW)
    assert batch == waiting[:5]  # 30 rows: the sixth request would not fit
    assert (
        decide(state(waiting, latency=latency, max_rows=32, model_budget_ms=25.0), NOW).batch == waiting[:5]
    )


def test_a_batch_the_next_request_does_not_fit_is_full() -> None:
    # Two 3-row requests under a 4-row cap: the first cannot grow, so it need not wait.
    waiting = [Req(rows=3, work=3.0), Req(rows=3, work=3.0)]
    assert decide(state(waiting, max_rows=4), NOW).batch == waiting[:1]
    assert standby_batch(state(waiting, max_rows=4, latency=Line()), NOW) == waiting[:1]
    # Alone, it waits for company (max_wait) as before.
    assert decide(state(waiting[:1], max_rows=4), NOW).batch is None


def test_a_lone_request_leaves_alone_only_when_measured_and_in_time() -> None:
    sparse = state(arrival_gap_s=1.0, latency=Line())
    assert leaves_alone(sparse, 1, 1.0, math.inf, NOW)
    assert not leaves_alone(sparse, 1, 1.0, NOW + 0.0005, NOW)  # needs 1 ms, has 0.5
    assert not leaves_alone(state(arrival_gap_s=1.0), 1, 1.0, math.inf, NOW)  # not measured
    assert not leaves_alone(state(arrival_gap_s=0.001, latency=Line()), 1, 1.0, math.inf, NOW)
    assert leaves_alone(state(arrival_gap_s=0.001, latency=Line()), 4, 4.0, math.inf, NOW)  # fills a batch
