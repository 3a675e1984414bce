"""An asyncio dynamic batcher: many concurrent requests, as few model calls as latency allows.

`Batcher` puts together the parts in `optimize.serve.batching`, one role each: the bounded queue
and admission, the latency and load estimators, the batching policy (a pure function of that
state and a time), the dispatcher that acts on it, the model instances, the lifecycle (start,
drain, the dispatcher task) and the metrics. The dispatcher is driven by a timer, not by
arrivals: at every event it asks the policy which batch leaves now, or when to look again
(docs/serving.md).
Model calls run off the loop, on one thread per model instance, so the loop keeps accepting
and timing requests while the model runs (batching/dispatch.py has the two exceptions).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from optimize.backend import Backend
from optimize.errors import UsageError
from optimize.runtimes.warmup import rows_of
from optimize.serve.batching import admission, policy
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.dispatch import Dispatcher
from optimize.serve.batching.estimators import LatencyModel, LoadEstimates
from optimize.serve.batching.instances import Instances
from optimize.serve.batching.lifecycle import Lifecycle
from optimize.serve.batching.metrics import BatcherMetrics
from optimize.serve.batching.outcomes import BatchStats, InferResult, Overloaded
from optimize.serve.batching.queue import Pending, RequestQueue
from optimize.serve.batching.signature import ModelSignature, WorkMeasure, batch_key, bucket_of
from optimize.serve.clock import Clock, MonotonicClock


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
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        # Input name -> values must lie in [0, limit) (embedding table rows); found by the loader.
        self.value_limits: dict[str, int] = {}
        # Longest sequence (axis 1 of token inputs) the model's position table covers.
        self.max_sequence: int | None = None
        self.instances = Instances(self.backends, self.signature, self.clock)
        self.queue = RequestQueue()
        self.work = WorkMeasure()
        self.lifecycle = Lifecycle(self.clock)
        self.metrics = BatcherMetrics(on_batch)
        self.dispatcher = Dispatcher(
            self.config, self.max_rows, queue=self.queue, instances=self.instances, latency=self.latency,
            estimates=self.estimates, work=self.work, lifecycle=self.lifecycle, metrics=self.metrics,
            clock=self.clock,
        )  # fmt: skip

    # ----------------------------------------------------------------------------- lifecycle
    async def start(self, sample_row: Mapping[str, np.ndarray] | None = None) -> None:
        """Calibrate on `sample_row` (one request's feeds) if given, then start dispatching."""
        self.lifecycle.open()
        if sample_row is not None:
            self.check_request(sample_row)
            if self.config.calibrate:
                self.work.reference(sample_row, rows_of(sample_row))
            await self.instances.warm_up(
                sample_row, self.latency, self.work.of, max_rows=self.max_rows, config=self.config
            )
        self.lifecycle.run(self.dispatcher.step, self.dispatcher.fail_queued)

    async def drain(self) -> None:
        """Stop accepting, answer everything already accepted, release the model threads."""
        await self.lifecycle.drain()
        self.instances.shutdown()

    @property
    def accepting(self) -> bool:
        return self.lifecycle.accepting

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
        if not self.lifecycle.accepting:
            raise Overloaded("the server is shutting down", retry_after_s=1)
        feeds = dict(feeds)
        rows = rows_of(feeds) if self.signature.batchable else 1
        if refusal := admission.queue_full(self.queue.rows, rows, self.config, self.retry_after_s()):
            raise refusal
        now = self.clock.now()
        self.estimates.arrival(now)
        req = self._pending(feeds, rows, now, deadline_ms, arrived, alone)
        if alone and self._leaves_alone_now(req, now):
            # Nothing queued, nothing running, and the dispatcher would send it alone at once:
            # skip the queue and the planning (a third of the batcher's cost per request).
            req.queued = False
            self.lifecycle.busy()
            self.dispatcher.launch([req])
            return await req.future
        if refusal := self._behind_the_queue(now, req.work, req.deadline):
            raise refusal
        req.key = batch_key(feeds, req.bucket, self.signature.seq_inputs)
        self.queue.add(req)
        self.lifecycle.busy()
        self.dispatcher.dispatch_ready(now)
        if req.queued:
            self.lifecycle.kick()  # it waits: let the dispatcher set its timer
        try:
            return await req.future
        except asyncio.CancelledError:
            # The caller went away (client disconnected): drop the request if still queued.
            self.dispatcher.remove(req)
            raise

    def _leaves_alone_now(self, req: Pending, now: float) -> bool:
        return self.dispatcher.idle_now() and policy.leaves_alone(
            self.policy_state(), req.rows, req.work, req.deadline, now
        )

    def _pending(
        self,
        feeds: dict[str, np.ndarray],
        rows: int,
        now: float,
        deadline_ms: float | None,
        arrived: float | None,
        alone: bool,
    ) -> Pending:
        """The request as the queue holds it: its work, deadline and target (its batch key is set
        only if it is queued: the fast path skips computing it)."""
        budget = self.config.queue_timeout_ms if deadline_ms is None else float(deadline_ms)
        self.work.reference(feeds, max(1, rows))
        seq_len = bucket = None
        if self.signature.seq_inputs:
            seq_len = feeds[self.signature.seq_inputs[0]].shape[1]
            bucket = bucket_of(seq_len, self.config.min_bucket)
        work = self.work.of_request(feeds, rows, seq_len, bucket)
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        deadline = math.inf if budget is None else (now if arrived is None else arrived) + budget / 1e3
        target = min(deadline, now + self.config.target_latency_ms / 1e3)
        return Pending(feeds, rows, seq_len, bucket, (), work, deadline, target, now, future, alone=alone)

    def _behind_the_queue(self, now: float, work: float, deadline: float) -> Overloaded | None:
        """Fail fast: refuse now (503) a request with a deadline that it could meet alone but not
        behind the work already queued and running, rather than let it wait to expire."""
        if deadline == math.inf or not self.latency.n or not (self.queue or self.instances.busy_until):
            return None
        unit = policy.efficient_work(self.policy_state(), work)
        wait_ms = admission.predicted_wait_ms(
            self.instances.busy_ms(now), self.queue.work, unit, self.latency,
            self.estimates.served_ms_per_work, len(self.instances),
        )  # fmt: skip
        return admission.behind_the_queue(
            now, work, deadline, unit, wait_ms, self.latency, self.retry_after_s()
        )

    def retry_after_s(self) -> int:
        """Seconds a shed client should wait: the predicted time to clear the backlog, at least 1."""
        return admission.retry_after_s(self.latency, self.queue.rows, len(self.backends))

    def policy_state(self) -> policy.PolicyState[Pending]:
        """What the batching policy decides from, now."""
        return self.dispatcher.policy_state()

    # ----------------------------------------------------------------------------- metrics
    @property
    def on_batch(self) -> Callable[[BatchStats], None] | None:
        """Told about every batch the batcher runs (the server's metrics set it)."""
        return self.metrics.on_batch

    @on_batch.setter
    def on_batch(self, observer: Callable[[BatchStats], None] | None) -> None:
        self.metrics.on_batch = observer

    @property
    def batches_run(self) -> int:
        return self.metrics.batches_run

    @property
    def requests_answered(self) -> int:
        return self.metrics.requests_answered

    def describe(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "instances": len(self.backends),
            "max_rows": self.max_rows,
            "signature": self.signature.to_json(),
            "latency_model": self.latency.to_json(),
            "batches_run": self.batches_run,
        }
