"""When a batch leaves and how many requests it takes: pure functions of the state and a time.

Nothing here reads a clock, mutates the queue or starts a model call: `decide(state, now)` says
which batch to launch now, if any, and else when to look again; the batcher acts on it. So the
policy can be tested with plain values and any time a test likes.

A batch leaves when it is full, when its oldest request has waited `max_wait_s`, or when waiting
any longer would miss the earliest target in it given the predicted latency of a larger batch.
It also leaves at once when requests arrive further apart (on average) than `max_wait_s`: then
waiting buys no company, only latency. Only hard deadlines shrink a batch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Waiting(Protocol):
    """A queued request as the policy sees it."""

    @property
    def rows(self) -> int: ...
    @property
    def work(self) -> float: ...
    @property
    def deadline(self) -> float: ...  # math.inf: none
    @property
    def target(self) -> float: ...
    @property
    def enqueued(self) -> float: ...
    @property
    def queued(self) -> bool: ...  # False: taken out, to be skipped


class Predictor(Protocol):
    """Predicted batch latency (ms) by work; `n` is how many batches it has measured."""

    @property
    def n(self) -> int: ...
    def predict(self, work: float) -> float: ...
    def upper(self, work: float) -> float: ...
    def most_efficient_work(
        self, budget_ms: float, per_batch_ms: float = 0.0, least_work: float = 0.0
    ) -> tuple[float, bool] | None: ...


W = TypeVar("W", bound=Waiting)


@dataclass(frozen=True, slots=True)
class PolicyState(Generic[W]):
    """What the decisions depend on, read at one instant."""

    # Each batch key's requests in arrival order; a queue's head is queued, later ones may not be.
    queues: Collection[Sequence[W]]
    latency: Predictor
    max_rows: int  # the most rows a model call takes (1 when the model cannot batch)
    max_wait_s: float
    model_budget_ms: float  # the most one batch's model call should take
    batch_gap_ms: float = 0.0  # what each batch costs besides its model call (hand-offs)
    arrival_gap_s: float | None = None  # mean time between arrivals; None: unknown
    draining: bool = False  # nothing more will arrive: waiting gains nothing


@dataclass(frozen=True, slots=True)
class Decision(Generic[W]):
    """Launch `batch` now; or, when it is None, look again at `wake_at` (None: on the next event)."""

    batch: list[W] | None
    wake_at: float | None = None


def decide(state: PolicyState[W], now: float) -> Decision[W]:
    """The batch to launch on a free instance now (the one whose earliest target is nearest,
    cut to meet its deadlines), or when the next batch must leave."""
    best: tuple[float, list[W]] | None = None
    wake_at: float | None = None
    for queue in state.queues:
        batch, leave_at = plan(state, queue, now)
        if leave_at <= now:
            earliest = min(r.target for r in batch)
            if best is None or earliest < best[0]:
                best = (earliest, batch)
        else:
            wake_at = leave_at if wake_at is None else min(wake_at, leave_at)
    if best is None:
        return Decision(None, wake_at)
    return Decision(shrink(state.latency, best[1], now))


def plan(state: PolicyState[W], queue: Sequence[W], now: float) -> tuple[list[W], float]:
    """The batch this queue would send now, and when it must leave at the latest."""
    batch, rows, full = head_batch(state, queue)
    if full or state.draining:
        return batch, now
    if waiting_gains_nothing(state):
        return batch, now
    earliest = min(r.target for r in batch)
    # Latest start that still meets the earliest target if one more row joins.
    grown = (rows + 1) * queue[0].work / queue[0].rows
    latency = state.latency
    latest = earliest - latency.upper(grown) / 1e3 if latency.n else earliest
    return batch, min(batch[0].enqueued + state.max_wait_s, latest)


def waiting_gains_nothing(state: PolicyState[W]) -> bool:
    """Arrivals are further apart than the whole wait: waiting would add latency and most likely
    gain no company. (At low load this makes the batcher cost nothing.)"""
    return state.arrival_gap_s is not None and state.arrival_gap_s >= state.max_wait_s


def head_batch(state: PolicyState[W], queue: Sequence[W]) -> tuple[list[W], int, bool]:
    """The requests at the head of this queue that fit one batch, their rows, and whether the
    batch is full: as large as batches grow now, or the next request waiting does not fit."""
    head = queue[0]
    cap = max_rows_now(state, head.work / head.rows, head.rows)
    batch: list[W] = []
    rows = 0
    for req in queue:
        if not req.queued:
            continue
        if batch and rows + req.rows > cap:
            return batch, rows, True
        batch.append(req)
        rows += req.rows
    return batch, rows, rows >= cap


def max_rows_now(state: PolicyState[W], row_work: float, least_rows: int = 1) -> int:
    """How many rows to batch at most: the most efficient measured size within the model
    budget, or, when the largest measured size is the most efficient, as many rows as the
    budget allows. Sizes under `least_rows` (the request at the head) are not compared: no
    batch that takes it can be that small."""
    latency = state.latency
    if latency.n == 0 or row_work <= 0:
        return state.max_rows
    budget = state.model_budget_ms
    best = latency.most_efficient_work(budget, state.batch_gap_ms, least_rows * row_work)
    if best is None:
        return 1
    work, largest = best
    rows = max(1, int(work / row_work + 0.5))
    if largest and rows < state.max_rows:
        lo, hi = rows, state.max_rows  # latency grows with size: bisect the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if latency.upper(mid * row_work) <= budget:
                lo = mid
            else:
                hi = mid - 1
        rows = lo
    return min(rows, state.max_rows)


def efficient_work(state: PolicyState[W], least_work: float = 0.0) -> float:
    """The work of the most efficient batch size within the model budget, among sizes of at least
    `least_work` (a request's own: see max_rows_now); 1.0 unknown."""
    best = state.latency.most_efficient_work(state.model_budget_ms, state.batch_gap_ms, least_work)
    return best[0] if best is not None else 1.0


def ends_in_time(latency: Predictor, batch: Sequence[Waiting], start: float) -> bool:
    """Whether the batch, started at `start`, is predicted (upper bound) to end within all its
    deadlines; a batch with deadlines and no measured model is not."""
    earliest = min(r.deadline for r in batch)
    if earliest == math.inf:
        return True
    return latency.n > 0 and start + latency.upper(sum(r.work for r in batch)) / 1e3 <= earliest


def shrink(latency: Predictor, batch: list[W], start: float) -> list[W]:
    """Drop requests from the tail until the batch, started at `start`, is predicted to end
    within all its deadlines.

    Only hard deadlines count: shrinking for a missed target would cut batches to one row
    exactly when load is highest, and throughput with them."""
    while len(batch) > 1 and latency.n and not ends_in_time(latency, batch, start):
        batch.pop()
    return batch


def standby_batch(state: PolicyState[W], start: float) -> list[W] | None:
    """The batch to hand an instance that is busy until `start`, to run as soon as it is free.

    Only full batches go early (nothing would join them by waiting). A batch with deadlines goes
    only when the model is measured and the batch is predicted to end within them, started at
    `start`; among those, the one whose earliest target is nearest."""
    chosen: list[W] | None = None
    for queue in state.queues:
        batch, _, full = head_batch(state, queue)
        if not full:
            continue
        batch = shrink(state.latency, batch, start)
        if not ends_in_time(state.latency, batch, start):
            continue
        if chosen is None or min(r.target for r in batch) < min(r.target for r in chosen):
            chosen = batch
    return chosen


def leaves_alone(state: PolicyState[W], rows: int, work: float, deadline: float, now: float) -> bool:
    """Whether a request arriving at an idle batcher at `now` would be launched alone at once:
    it cannot wait for company (it fills a batch, or arrivals are further apart than the wait),
    the model is measured, and it can meet its deadline."""
    latency = state.latency
    if latency.n == 0:
        return False
    alone_now = (
        rows >= state.max_rows
        or waiting_gains_nothing(state)
        or rows >= max_rows_now(state, work / rows, rows)
    )
    return alone_now and now + latency.predict(work) / 1e3 <= deadline
