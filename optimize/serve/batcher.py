"""An asyncio dynamic batcher: many concurrent requests, as few model calls as latency allows.

`Batcher` puts together the parts in `optimize.serve.batching`, one role each: the bounded queue
and admission, the latency and load estimators, the batching policy (a pure function of that
state and a time) and the model instances. The dispatcher runs on the event loop and is driven
by a timer, not by arrivals: at every event it asks the policy which batch leaves now, or when
to look again (docs/serving.md).
Model calls run off the loop, on one thread per model instance, so the loop keeps accepting
and timing requests while the model runs. Two exceptions save the hand-offs where they cost:
at low load a short batch that is all there is to do runs on the loop's thread itself
(`inline_max_ms`), and with every instance busy a full batch waits on an instance's thread,
which starts it as soon as the running one ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from optimize.backend import Backend
from optimize.errors import UsageError, message_line
from optimize.serve.batching import admission, policy
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.estimators import LatencyModel, LoadEstimates
from optimize.serve.batching.instances import BatchRun, Instances
from optimize.serve.batching.outcomes import (
    BatchStats,
    DeadlineExceeded,
    InferResult,
    ModelFailure,
    Overloaded,
    ServeError,
)
from optimize.serve.batching.queue import Pending, RequestQueue
from optimize.serve.batching.signature import (
    ModelSignature,
    batch_key,
    batch_shapes,
    bucket_of,
    elements_of,
    rows_of,
    sample_row,
    warm_shapes,
)
from optimize.serve.clock import Clock, MonotonicClock, Timer

# What callers import from here, wherever it is defined.
__all__ = [
    "BatchStats",
    "Batcher",
    "BatcherConfig",
    "DeadlineExceeded",
    "InferResult",
    "LatencyModel",
    "ModelFailure",
    "ModelSignature",
    "Overloaded",
    "ServeError",
    "batch_shapes",
    "sample_row",
    "warm_shapes",
]


class Batcher:
    """Dynamic batching over one or more instances of the same model.

    Use inside a running event loop: `await start()`, then `await submit(feeds)` from any
    number of tasks, and `await drain()` to finish what was accepted and stop.
    Every time it reads or compares comes from `clock` (the real one by default).
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        config: BatcherConfig | None = None,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not backends:
            raise UsageError("the batcher needs at least one model instance")
        self.config = config or BatcherConfig()
        self.config.validate()
        self.backends = list(backends)
        self.signature = ModelSignature.of(self.backends[0], self.config.seq_buckets)
        self.max_rows = self.config.max_batch if self.signature.batchable else 1
        self.latency = LatencyModel()
        self.estimates = LoadEstimates()
        self.on_batch = on_batch
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        # Input name -> values must lie in [0, limit) (embedding table rows); found by the loader.
        self.value_limits: dict[str, int] = {}
        # Longest sequence (axis 1 of token inputs) the model's position table covers.
        self.max_sequence: int | None = None
        self.instances = Instances(self.backends, self.signature, self.clock)
        self.queue = RequestQueue()
        self._ref_elems: float | None = None  # input elements of one row: one unit of work
        self._accepting = False
        self._draining = False
        self._wake: asyncio.Event | None = None
        self._timer: Timer | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Event | None = None
        self.batches_run = 0
        self.requests_answered = 0

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self, sample_row: Mapping[str, np.ndarray] | None = None) -> None:
        """Calibrate on `sample_row` (one request's feeds) if given, then start dispatching."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        if sample_row is not None:
            self.check_request(sample_row)
            # Every batch shape runs once on every instance, so that calibration then times the
            # prepared runs that requests will get.
            await self.instances.warm(sample_row, self.max_rows)
            if self.config.calibrate:
                self._ref_elems = self._ref_elems or elements_of(sample_row) / rows_of(sample_row)
                await self.instances.calibrate(
                    sample_row,
                    self.latency,
                    self._work,
                    max_rows=self.max_rows,
                    budget_ms=self.config.model_budget_ms,
                    runs=self.config.calibration_runs,
                )
        self._accepting = True
        self._task = asyncio.get_running_loop().create_task(self._dispatch_loop(), name="lto-dispatcher")

    async def drain(self) -> None:
        """Stop accepting, answer everything already accepted, release the model threads."""
        self._accepting = False
        self._draining = True
        self._kick()
        if self._idle is not None:
            await self._idle.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._timer is not None:
            self._timer.cancel()
        self.instances.shutdown()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def queued_rows(self) -> int:
        return self.queue.rows

    @property
    def inflight_batches(self) -> int:
        return self.instances.inflight

    # ----------------------------------------------------------------------------- requests
    def check_request(self, feeds: Mapping[str, np.ndarray], full: bool = True) -> int:
        """Raise InputError naming what is wrong; return the request's rows.

        `full=False` skips the per-input name/dtype/shape checks for callers that made them
        already (the protocol decoder does) and checks only what batching needs.
        """
        rows = admission.check_request(feeds, self.backends[0], self.signature, self.config.max_queue, full)
        if self.signature.batchable:
            self.check_values(feeds)
        return rows

    def check_values(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Refuse token values and sequence lengths the model's tables do not cover."""
        admission.check_values(feeds, self.value_limits, self.max_sequence, self.signature.seq_inputs)

    async def submit(
        self,
        feeds: Mapping[str, np.ndarray],
        deadline_ms: float | None = None,
        arrived: float | None = None,
        alone: bool = False,
    ) -> InferResult:
        """Queue one request (already checked with `check_request`) and wait for its outputs.

        A request has a deadline only when it brings one (`deadline_ms`) or the batcher has a
        `queue_timeout_ms` (Triton's rule); it counts from `arrived`, a reading of `self.clock`
        (not of any other clock), by default from now, i.e. from when the request was queued.
        `target_latency_ms` only steers when batches leave and how big they grow. `alone`: the
        caller has no other request in hand, so a short batch may run on the loop (inline_max_ms).

        Raises Overloaded at once when the queue is full or the batcher is draining,
        DeadlineExceeded when a deadline can no longer be met, ModelFailure when the run fails.
        """
        if not self._accepting:
            raise Overloaded("the server is shutting down", retry_after_s=1)
        feeds = dict(feeds)
        rows = rows_of(feeds) if self.signature.batchable else 1
        if refusal := admission.queue_full(self.queue.rows, rows, self.config, self.retry_after_s()):
            raise refusal
        now = self.clock.now()
        self.estimates.arrival(now)
        budget = self.config.queue_timeout_ms if deadline_ms is None else float(deadline_ms)
        if self._ref_elems is None:
            self._ref_elems = elements_of(feeds) / max(1, rows)
        seq_len = bucket = None
        if self.signature.seq_inputs:
            seq_len = feeds[self.signature.seq_inputs[0]].shape[1]
            bucket = bucket_of(seq_len, self.config.min_bucket)
        row_elems = elements_of(feeds) / max(1, rows)
        if seq_len and bucket:
            row_elems *= bucket / seq_len  # padded to its bucket
        work = rows * row_elems / self._ref_elems
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        deadline = math.inf if budget is None else (now if arrived is None else arrived) + budget / 1e3
        target = min(deadline, now + self.config.target_latency_ms / 1e3)
        if alone and self._idle_now() and policy.leaves_alone(self.policy_state(), rows, work, deadline, now):
            # Nothing queued, nothing running, and the dispatcher would send it alone at once:
            # skip the queue and the planning (a third of the batcher's cost per request).
            req = Pending(feeds, rows, seq_len, bucket, (), work, deadline, target, now, future, alone=True)
            req.queued = False
            self._busy()
            self._launch([req])
            return await future
        if refusal := self._behind_the_queue(now, work, deadline):
            raise refusal
        key = batch_key(feeds, bucket, self.signature.seq_inputs)
        req = Pending(feeds, rows, seq_len, bucket, key, work, deadline, target, now, future, alone=alone)
        self.queue.add(req)
        self._busy()
        self._dispatch_ready(now)
        if req.queued:
            self._kick()  # it waits: let the dispatcher set its timer
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (client disconnected): drop the request if still queued.
            self._remove(req)
            raise

    def _idle_now(self) -> bool:
        return not self.queue and not self.instances.inflight and bool(self.instances.free)

    def _behind_the_queue(self, now: float, work: float, deadline: float) -> Overloaded | None:
        """Fail fast: refuse now (503) a request with a deadline that it could meet alone but not
        behind the work already queued and running, rather than let it wait to expire."""
        if deadline == math.inf or not self.latency.n or not (self.queue or self.instances.busy_until):
            return None
        unit = policy.efficient_work(self.policy_state())
        wait_ms = admission.predicted_wait_ms(
            self.instances.busy_ms(now), self.queue.work, unit, self.latency,
            self.estimates.served_ms_per_work, len(self.instances),
        )  # fmt: skip
        return admission.behind_the_queue(
            now, work, deadline, unit, wait_ms, self.latency, self.retry_after_s()
        )

    def _work(self, feeds: Mapping[str, np.ndarray]) -> float:
        return elements_of(feeds) / (self._ref_elems or 1.0)

    def retry_after_s(self) -> int:
        """Seconds a shed client should wait: the predicted time to clear the backlog, at least 1."""
        return admission.retry_after_s(self.latency, self.queue.rows, len(self.backends))

    def _remove(self, req: Pending) -> None:
        self.queue.remove(req)
        self._check_idle()

    def _busy(self) -> None:
        assert self._idle is not None
        self._idle.clear()

    def _check_idle(self) -> None:
        if self._idle is not None and self.queue.rows == 0 and self.instances.inflight == 0:
            self._idle.set()

    # ----------------------------------------------------------------------------- dispatch
    def policy_state(self) -> policy.PolicyState[Pending]:
        """What the batching policy decides from, now."""
        return policy.PolicyState(
            queues=self.queue.by_key.values(),
            latency=self.latency,
            max_rows=self.max_rows,
            max_wait_s=self.config.max_wait_ms / 1e3,
            model_budget_ms=self.config.model_budget_ms,
            batch_gap_ms=self.estimates.batch_gap_ms,
            arrival_gap_s=self.estimates.arrival_gap_s,
            draining=self._draining,
        )

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _needs_ms(self, req: Pending) -> float:
        return self.latency.predict(req.work) if self.latency.n else 0.0

    def _expire(self, now: float) -> None:
        """Answer requests whose deadline cannot be met even alone, rather than run them late."""
        for req, needs in self.queue.expired(now, self._needs_ms):
            self._check_idle()
            if not req.future.done():
                waited = (now - req.enqueued) * 1e3
                message = f"deadline missed: queued {waited:.1f} ms, the model needs {needs:.1f} ms"
                req.future.set_exception(DeadlineExceeded(message, queue_ms=waited, needs_ms=needs))
                self.requests_answered += 1

    def _dispatch_ready(self, now: float) -> float | None:
        """Launch every batch that should leave now; return when the next one must leave.

        Synchronous, so submit() and batch completion can call it directly: a request that
        can go at once starts without waiting for the dispatcher task to be scheduled.
        """
        self._expire(now)
        while self.instances.free and self.queue:
            decision = policy.decide(self.policy_state(), now)
            if decision.batch is None:
                return decision.wake_at
            self._launch(decision.batch)
        if not self.instances.free and self.queue:
            self._launch_standby(now)
        return None

    def _launch_standby(self, now: float) -> None:
        """Every instance is busy: give the one first to be free its next batch now, if one is
        ready (policy.standby_batch). Its thread starts it the moment the running batch ends,
        instead of idling until the event loop, busy reading and shedding requests under
        overload, hands it one."""
        while self.queue and (ready := self.instances.next_free()) is not None:
            instance, busy_until = ready
            start = max(now, busy_until)
            batch = policy.standby_batch(self.policy_state(), start)
            if batch is None:
                return
            self._launch(batch, instance, start)

    async def _dispatch_loop(self) -> None:
        """The timer side of dispatch: wakes for max-wait, deadline and expiry times."""
        assert self._wake is not None
        while True:
            self._wake.clear()
            wake_at = self._dispatch_ready(self.clock.now())
            expiry = self.queue.next_expiry(self._needs_ms)
            if expiry is not None:
                wake_at = expiry if wake_at is None else min(wake_at, expiry)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if wake_at is not None:
                self._timer = self.clock.call_at(wake_at, self._wake.set)
            await self._wake.wait()

    def _launch(self, batch: list[Pending], standby_of: int | None = None, start: float = 0.0) -> None:
        """Run `batch` on a free instance, or queue it behind the running batch of `standby_of`
        (predicted to start at `start`)."""
        instances = self.instances
        instance = instances.free.pop() if standby_of is None else standby_of
        instances.inflight += 1  # before removing, so the batcher never looks idle in between
        for req in batch:
            self._remove(req)
        live = [r for r in batch if not r.future.done()]
        if not live:  # every caller went away while queued
            instances.inflight -= 1
            if standby_of is None:
                instances.free.append(instance)
            self._check_idle()
            return
        work = sum(r.work for r in live)
        end = max(start, self.clock.now()) + (self.latency.predict(work) if self.latency.n else 0.0) / 1e3
        instances.occupy(instance, end, standby=standby_of is not None)
        if standby_of is None and len(live) == 1 and live[0].alone and self._runs_inline(work):
            done: concurrent.futures.Future[BatchRun] = concurrent.futures.Future()
            try:
                done.set_result(instances.execute(instance, live, self._work))
            except Exception as exc:
                done.set_exception(exc)
            self._finish(instance, live, done)
            return
        future = instances.start(instance, live, self._work)
        future.add_done_callback(lambda f: self._finish(instance, live, f))

    def _runs_inline(self, work: float) -> bool:
        """Whether a lone request's batch runs on the loop's thread (see inline_max_ms): only
        when it is all there is to do and it is known to be short. Under load the server holds
        other requests, so batches go to the model threads and grow."""
        return (
            self.config.inline_max_ms > 0
            and self.instances.inflight == 1  # this batch
            and not self.queue
            and self.latency.n > 0
            and self.latency.upper(work) <= self.config.inline_max_ms
        )

    def _finish(
        self,
        instance: int,
        live: list[Pending],
        future: asyncio.Future[BatchRun] | concurrent.futures.Future[BatchRun],
    ) -> None:
        """On the loop when a batch returns: answer its requests, free the instance, dispatch."""
        t_back = self.clock.now()
        rows = sum(r.rows for r in live)
        ok = False
        model_ms = 0.0
        try:
            outs, t_asm, t_run, t_end, work = future.result()
            model_ms = (t_end - t_run) * 1e3
            self.estimates.observe_service(t_back, work, backlog=bool(self.queue))
            self.estimates.observe_gap(instance, min(r.enqueued for r in live), t_run, t_end)
            ok = not any(isinstance(out, BaseException) for out in outs)
            if ok:  # a batch re-run one by one after a failure says nothing about batch latency
                self.latency.observe(work, model_ms)
            batch_ms = ((t_run - t_asm) + (t_back - t_end)) * 1e3
            for req, out in zip(live, outs, strict=True):
                if isinstance(out, BaseException):
                    self._answer(req, ModelFailure(f"the model failed on this request: {message_line(out)}"))
                else:
                    queue_ms = (t_asm - req.enqueued) * 1e3
                    self._answer(req, InferResult(out, queue_ms, batch_ms, model_ms, rows, len(live)))
        except Exception as exc:
            # Assembling or splitting failed: every request of the batch gets the error.
            failure = f"the model failed on this batch: {message_line(exc)}"
            for req in live:
                self._answer(req, ModelFailure(failure))
        finally:
            self.batches_run += 1
            self.instances.release(instance)
            if self.on_batch is not None and live:
                self.on_batch(BatchStats(rows=rows, requests=len(live), model_ms=model_ms, ok=ok))
            if self.queue and self._task is not None:
                self._dispatch_ready(self.clock.now())
                self._kick()  # the dispatcher re-arms its timer for whatever is left
            self._check_idle()

    def _answer(self, req: Pending, answer: InferResult | ServeError) -> None:
        """Give a request its outputs or its error, unless its caller went away."""
        if req.future.done():
            return
        if isinstance(answer, ServeError):
            req.future.set_exception(answer)
        else:
            req.future.set_result(answer)
        self.requests_answered += 1

    def describe(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "instances": len(self.backends),
            "max_rows": self.max_rows,
            "signature": self.signature.to_json(),
            "latency_model": self.latency.to_json(),
            "batches_run": self.batches_run,
        }
