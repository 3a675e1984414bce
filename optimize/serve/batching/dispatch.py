"""Acting on the batching policy: which batch leaves now, on which instance, and its answers.

`Dispatcher.dispatch_ready` is synchronous, so a request that can go at once starts from
`submit()` or from a batch's completion without waiting for the dispatcher task (lifecycle.py)
to be scheduled. Two exceptions save the hand-offs to a model thread where they cost: at low
load a short batch that is all there is to do runs on the loop's thread itself (`inline_max_ms`),
and with every instance busy a full batch waits on an instance's thread, which starts it as
soon as the running one ends (standby).
"""

from __future__ import annotations

import asyncio
import concurrent.futures

from optimize.errors import message_line
from optimize.serve.batching import policy
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.estimators import LatencyModel, LoadEstimates
from optimize.serve.batching.instances import BatchRun, Instances
from optimize.serve.batching.lifecycle import Lifecycle
from optimize.serve.batching.metrics import BatcherMetrics
from optimize.serve.batching.outcomes import (
    BatchStats,
    DeadlineExceeded,
    InferResult,
    ModelFailure,
    ServeError,
)
from optimize.serve.batching.queue import Pending, RequestQueue
from optimize.serve.batching.signature import WorkMeasure
from optimize.serve.clock import Clock


class Dispatcher:
    """Launches the batches the policy picks on free instances and answers their requests."""

    def __init__(
        self,
        config: BatcherConfig,
        max_rows: int,
        *,
        queue: RequestQueue,
        instances: Instances,
        latency: LatencyModel,
        estimates: LoadEstimates,
        work: WorkMeasure,
        lifecycle: Lifecycle,
        metrics: BatcherMetrics,
        clock: Clock,
    ) -> None:
        self.config = config
        self.max_rows = max_rows
        self.queue = queue
        self.instances = instances
        self.latency = latency
        self.estimates = estimates
        self.work = work
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.clock = clock

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
            draining=self.lifecycle.draining,
        )

    # ----------------------------------------------------------------------------- the queue
    def idle_now(self) -> bool:
        """Nothing queued, nothing running, and an instance free."""
        return not self.queue and not self.instances.inflight and bool(self.instances.free)

    def remove(self, req: Pending) -> None:
        self.queue.remove(req)
        self.check_idle()

    def check_idle(self) -> None:
        if self.queue.rows == 0 and self.instances.inflight == 0:
            self.lifecycle.idle()

    def _needs_ms(self, req: Pending) -> float:
        return self.latency.predict(req.work) if self.latency.n else 0.0

    def _expire(self, now: float) -> None:
        """Answer requests whose deadline cannot be met even alone, rather than run them late."""
        for req, needs in self.queue.expired(now, self._needs_ms):
            self.check_idle()
            if not req.future.done():
                waited = (now - req.enqueued) * 1e3
                message = f"deadline missed: queued {waited:.1f} ms, the model needs {needs:.1f} ms"
                req.future.set_exception(DeadlineExceeded(message, queue_ms=waited, needs_ms=needs))
                self.metrics.answered()

    # ----------------------------------------------------------------------------- dispatch
    def step(self, now: float) -> float | None:
        """The dispatcher task's step: launch what leaves now; when to wake next (a batch's
        leaving time or the earliest expiry), if ever."""
        wake_at = self.dispatch_ready(now)
        expiry = self.queue.next_expiry(self._needs_ms)
        if expiry is not None:
            wake_at = expiry if wake_at is None else min(wake_at, expiry)
        return wake_at

    def dispatch_ready(self, now: float) -> float | None:
        """Launch every batch that should leave now; return when the next one must leave."""
        self._expire(now)
        while self.instances.free and self.queue:
            decision = policy.decide(self.policy_state(), now)
            if decision.batch is None:
                return decision.wake_at
            self.launch(decision.batch)
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
            self.launch(batch, instance, start)

    def launch(self, batch: list[Pending], standby_of: int | None = None, start: float = 0.0) -> None:
        """Run `batch` on a free instance, or queue it behind the running batch of `standby_of`
        (predicted to start at `start`)."""
        instances = self.instances
        instance = instances.free.pop() if standby_of is None else standby_of
        instances.inflight += 1  # before removing, so the batcher never looks idle in between
        for req in batch:
            self.remove(req)
        live = [r for r in batch if not r.future.done()]
        if not live:  # every caller went away while queued
            instances.inflight -= 1
            if standby_of is None:
                instances.free.append(instance)
            self.check_idle()
            return
        work = sum(r.work for r in live)
        end = max(start, self.clock.now()) + (self.latency.predict(work) if self.latency.n else 0.0) / 1e3
        instances.occupy(instance, end, standby=standby_of is not None)
        if standby_of is None and len(live) == 1 and live[0].alone and self._runs_inline(work):
            done: concurrent.futures.Future[BatchRun] = concurrent.futures.Future()
            try:
                done.set_result(instances.execute(instance, live, self.work.of))
            except Exception as exc:
                done.set_exception(exc)
            self._finish(instance, live, done)
            return
        future = instances.start(instance, live, self.work.of)
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

    def fail_queued(self, exc: Exception) -> None:
        """A dispatch step raised: answer every queued request with the error (a 500), rather
        than leave it queued where the failing step may never launch it."""
        failure = ModelFailure(f"the server's batcher failed: {message_line(exc)}")
        for req in self.queue.take_all():
            self._answer(req, failure)
        self.check_idle()

    # ----------------------------------------------------------------------------- answers
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
            self.instances.release(instance)
            self.metrics.batch_ran(BatchStats(rows=rows, requests=len(live), model_ms=model_ms, ok=ok))
            if self.queue and self.lifecycle.dispatching:
                self.dispatch_ready(self.clock.now())
                self.lifecycle.kick()  # the dispatcher re-arms its timer for whatever is left
            self.check_idle()

    def _answer(self, req: Pending, answer: InferResult | ServeError) -> None:
        """Give a request its outputs or its error, unless its caller went away."""
        if req.future.done():
            return
        if isinstance(answer, ServeError):
            req.future.set_exception(answer)
        else:
            req.future.set_result(answer)
        self.metrics.answered()
