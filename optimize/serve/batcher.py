"""An asyncio dynamic batcher: many concurrent requests, as few model calls as latency allows.

The dispatcher runs on the event loop and is driven by a timer, not by arrivals: a batch
leaves when it is full, when its oldest request has waited `max_wait_ms`, or when waiting
any longer would miss the earliest deadline in it given the predicted latency of the batch.
It also leaves at once when requests arrive further apart (on average) than `max_wait_ms`:
then waiting buys no company, only latency.
Model calls run off the loop, on one thread per model instance, so the loop keeps accepting
and timing requests while the model runs. Two exceptions save the hand-offs where they cost:
at low load a short batch that is all there is to do runs on the loop's thread itself
(`inline_max_ms`), and with every instance busy a full batch waits on an instance's thread,
which starts it as soon as the running one ends.

Batch latency is predicted by `LatencyModel`, a line fitted online to measured
(work, latency) pairs and seeded by a short calibration at start. "Work" is the number of
input elements in the batch relative to one calibration row, so one model covers batch
size and sequence length alike.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.errors import InputError, UsageError, message_line
from optimize.serve.clock import Clock, MonotonicClock, Timer


class ServeError(Exception):
    """A request that was accepted but could not be answered with outputs."""

    kind = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Overloaded(ServeError):
    """The queue is full (or the server is draining): shed at once, with a retry hint."""

    kind = "overloaded"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServeError):
    """The request's deadline can no longer be met, so it is not run late.

    Only requests with a deadline (sent by the client, or the server's --queue-timeout-ms) ever
    get this; `queue_ms` is how long it waited and `needs_ms` the predicted model time."""

    kind = "timeout"

    def __init__(self, message: str, queue_ms: float = 0.0, needs_ms: float = 0.0) -> None:
        super().__init__(message)
        self.queue_ms = queue_ms
        self.needs_ms = needs_ms


class ModelFailure(ServeError):
    """The runtime raised while running the batch this request was in."""

    kind = "error"


@dataclass
class BatcherConfig:
    max_batch: int = 32
    max_wait_ms: float = 1.0
    # What batch sizes aim for (a batch may take half of it); it steers, it never rejects.
    target_latency_ms: float = 50.0
    # A deadline for requests that bring none (Triton's default queue timeout); None: no deadline.
    queue_timeout_ms: float | None = None
    # Bound on rows waiting in the queue; beyond it requests are shed.
    max_queue: int = 256
    instances: int = 1
    # Pad token inputs to power-of-two lengths (with the attention mask) so that different
    # sequence lengths batch together; only when the model has such inputs.
    seq_buckets: bool = True
    min_bucket: int = 8
    calibrate: bool = True
    calibration_runs: int = 3
    # A request the caller says is alone (the server: the only one it holds) that finds nothing
    # queued or running, and is predicted to take at most this long, runs on the event loop's
    # thread. Handing it to a model thread and back costs two wake-ups, 0.25 ms on an idle
    # 2-core VM: a third of the overhead lto serve added to a 0.7 ms CNN. 0 turns it off.
    inline_max_ms: float = 10.0

    def validate(self) -> None:
        if self.max_batch < 1:
            raise UsageError("--max-batch must be at least 1")
        if self.max_wait_ms < 0:
            raise UsageError("--max-wait-ms cannot be negative")
        if self.target_latency_ms <= 0:
            raise UsageError("--target-latency-ms must be positive")
        if self.queue_timeout_ms is not None and not (0 < self.queue_timeout_ms < math.inf):
            raise UsageError("--queue-timeout-ms must be a positive number")
        if self.max_queue < 1:
            raise UsageError("--max-queue must be at least 1")
        if self.instances < 1:
            raise UsageError("--instances must be at least 1")
        if not self.inline_max_ms >= 0:
            raise UsageError("inline_max_ms cannot be negative")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class LatencyModel:
    """Predicted model latency (ms) for a batch of `work`, learned from measured (work, ms) pairs.

    Two views of the same observations, both fading old data so they follow the machine:
    - a line, intercept + slope·work, fitted by exponentially weighted least squares: it
      extrapolates beyond the sizes measured so far;
    - a table of mean latency per power-of-two size class, interpolated: it captures what a
      line cannot, e.g. a runtime whose batch-1 kernel is much faster per row than its batched
      one (measured: resnet_tiny on ORT, 2.3 ms at batch 1, 5+ ms per row at batch 2..32).
    `predict` trusts the table inside the measured range and the line beyond it; `upper` adds
    two residual deviations, which is what deadline decisions use: a deadline is a promise.
    `most_efficient_work` is the size with the most rows per ms that fits a latency budget.
    """

    def __init__(self, decay: float = 0.98, class_decay: float = 0.8) -> None:
        self.decay = decay
        self.class_decay = class_decay
        self.n = 0
        self._s0 = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._var = 0.0  # EW mean squared residual
        self.intercept = 0.0
        self.slope = 0.0
        self._classes: dict[int, tuple[float, float]] = {}  # log2 class -> (EW work, EW ms)
        # Sorted once per observation, not on each of the several predictions a request asks for.
        self._sorted: list[tuple[float, float]] = []

    def observe(self, work: float, latency_ms: float) -> None:
        if self.n:
            expected = self.predict(work)
            # A thread descheduled by a busy machine can take 10x longer once; clip such spikes
            # so that one of them cannot make every later prediction (and deadline) pessimistic.
            latency_ms = min(latency_ms, 3.0 * expected) if expected > 0 else latency_ms
            resid = latency_ms - expected
            self._var = self.decay * self._var + (1 - self.decay) * resid * resid
        d = self.decay
        self._s0 = d * self._s0 + 1.0
        self._sx = d * self._sx + work
        self._sy = d * self._sy + latency_ms
        self._sxx = d * self._sxx + work * work
        self._sxy = d * self._sxy + work * latency_ms
        self.n += 1
        self._fit()
        key = round(math.log2(max(work, 1e-6)))
        if key in self._classes:
            w0, m0 = self._classes[key]
            c = self.class_decay
            self._classes[key] = (c * w0 + (1 - c) * work, c * m0 + (1 - c) * latency_ms)
        else:
            self._classes[key] = (work, latency_ms)
        self._sorted = sorted(self._classes.values())

    def _fit(self) -> None:
        mx, my = self._sx / self._s0, self._sy / self._s0
        var_x = self._sxx / self._s0 - mx * mx
        if var_x <= 1e-9 * max(1.0, mx * mx):
            # Only one work level seen: assume no gain from batching (latency ∝ work),
            # the safe guess until a bigger batch has been measured.
            self.intercept, self.slope = 0.0, my / mx if mx > 0 else 0.0
            return
        slope = (self._sxy / self._s0 - mx * my) / var_x
        if slope < 0:  # noise; bigger batches are never faster
            self.intercept, self.slope = my, 0.0
            return
        intercept = my - slope * mx
        if intercept < 0:
            self.intercept, self.slope = 0.0, self._sxy / self._sxx
            return
        self.intercept, self.slope = intercept, slope

    def _points(self) -> list[tuple[float, float]]:
        return self._sorted

    def predict(self, work: float) -> float:
        line = self.intercept + self.slope * work
        points = self._points()
        if not points:
            return line
        if work <= points[0][0]:
            w0, m0 = points[0]
            # Below the smallest measured size: no faster than the line, no slower than that size.
            return min(m0, max(line, m0 * work / w0 if w0 > 0 else m0))
        for (w0, m0), (w1, m1) in itertools.pairwise(points):
            if work <= w1:
                return m0 + (m1 - m0) * (work - w0) / (w1 - w0) if w1 > w0 else m1
        w_last, m_last = points[-1]
        return m_last + max(self.slope, m_last / w_last if w_last > 0 else 0.0) * (work - w_last)

    def upper(self, work: float) -> float:
        return self.predict(work) + 2.0 * math.sqrt(self._var)

    def most_efficient_work(self, budget_ms: float, per_batch_ms: float = 0.0) -> tuple[float, bool] | None:
        """(work, is_largest_measured) of the size class with the most work per ms within budget;
        `per_batch_ms`: what each batch costs besides the model call (hand-offs), which favours
        larger batches when work waits."""
        points = [p for p in self._points() if p[1] <= budget_ms and p[1] > 0]
        if not points:
            return None
        best = max(points, key=lambda p: p[0] / (p[1] + per_batch_ms))
        return best[0], best == self._points()[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "intercept_ms": self.intercept,
            "slope_ms_per_row": self.slope,
            "residual_ms": math.sqrt(self._var),
            "observations": self.n,
            "by_size": [{"work": round(w, 3), "ms": round(m, 4)} for w, m in self._points()],
        }


@dataclass
class InferResult:
    """Outputs of one request, and where its time went (all in ms)."""

    outputs: dict[str, np.ndarray]
    queue_ms: float  # arrival in the queue -> batch assembly starts
    batch_ms: float  # assembling the batch, splitting it, handing the result back to the loop
    model_ms: float  # the model call the request was part of
    batch_rows: int
    batch_requests: int


@dataclass
class BatchStats:
    """What the batcher tells an observer (metrics) about every batch it ran."""

    rows: int
    requests: int
    model_ms: float
    ok: bool


@dataclass(eq=False)
class _Pending:
    feeds: dict[str, np.ndarray]
    rows: int
    seq_len: int | None
    bucket: int | None
    key: tuple[Any, ...]
    work: float
    deadline: float  # hard: math.inf unless the client or --queue-timeout-ms set one
    target: float  # soft: when the batch should leave to keep to --target-latency-ms
    enqueued: float
    future: asyncio.Future[InferResult]
    seq: int = 0
    queued: bool = True
    alone: bool = False  # the caller holds no other request (see BatcherConfig.inline_max_ms)


@dataclass
class ModelSignature:
    """How requests to this model combine into batches, decided once from its inputs and outputs."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batchable: bool
    # Inputs padded on axis 1 (token ids, masks) when sequence bucketing applies.
    seq_inputs: tuple[str, ...] = ()
    # Outputs whose axis 1 is the sequence axis: cut back to each request's length.
    seq_outputs: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, backend: Backend, seq_buckets: bool = True) -> ModelSignature:
        inputs, outputs = backend.inputs, backend.outputs
        notes: list[str] = []
        dynamic0 = [bool(s.shape) and not isinstance(s.shape[0], int) for s in inputs]
        out_dynamic0 = [bool(s.shape) and not isinstance(s.shape[0], int) for s in outputs]
        batchable = bool(inputs) and all(dynamic0) and all(out_dynamic0)
        if not batchable:
            notes.append("axis 0 is not dynamic on every input and output: one request per model call")
        seq_inputs: tuple[str, ...] = ()
        seq_outputs: tuple[str, ...] = ()
        if batchable and seq_buckets:
            names = [s.name.lower() for s in inputs]
            token_like = all(
                np.dtype(s.dtype).kind in "iu" and len(s.shape) == 2 and not isinstance(s.shape[1], int)
                for s in inputs
            )
            if token_like and any("attention_mask" in n for n in names):
                seq_inputs = tuple(s.name for s in inputs)
                seq_dim = inputs[0].shape[1]
                seq_outputs = tuple(
                    o.name
                    for o in outputs
                    if len(o.shape) >= 2 and not isinstance(o.shape[1], int) and o.shape[1] == seq_dim
                )
                notes.append("token inputs with an attention mask: sequences padded to power-of-two buckets")
            elif any(len(s.shape) > 1 and not isinstance(d, int) for s in inputs for d in s.shape[1:]):
                notes.append(
                    "dynamic non-batch dims without an attention mask: only equal shapes batch together"
                )
        return cls(inputs, outputs, batchable, seq_inputs, seq_outputs, notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "batchable": self.batchable,
            "sequence_bucketing": bool(self.seq_inputs),
            "notes": list(self.notes),
        }


def _bucket(length: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, length - 1).bit_length())


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
        self.on_batch = on_batch
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        # Input name -> values must lie in [0, limit) (embedding table rows); found by the loader.
        self.value_limits: dict[str, int] = {}
        # Longest sequence (axis 1 of token inputs) the model's position table covers.
        self.max_sequence: int | None = None
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lto-model-{i}")
            for i in range(len(backends))
        ]
        self._free: list[int] = list(range(len(backends)))
        # Instance -> when its running batch is predicted to end; and the instances that also
        # hold their next batch (one at most), with when that one should end.
        self._busy_until: dict[int, float] = {}
        self._standby: dict[int, float] = {}
        self._queues: dict[tuple[Any, ...], deque[_Pending]] = {}
        self._key_rows: dict[tuple[Any, ...], int] = {}
        self._deadlines: list[tuple[float, int, _Pending]] = []
        self._counter = itertools.count()
        self._queued_rows = 0
        self._queued_work = 0.0
        # Wall ms per unit of work between batch completions while work waited: what the server
        # really delivers, hand-offs and contention included, not only the model's time.
        self._served_ms_per_work: float | None = None
        self._last_finish: float | None = None
        # Instance -> when its last model call ended; and the EW mean idle time of an instance
        # between calls while work already waited for it (hand-offs to and from its thread).
        self._last_end: dict[int, float] = {}
        self._batch_gap_ms = 0.0
        self._inflight = 0
        self._ref_elems: float | None = None
        self._last_arrival: float | None = None
        self._gap_s: float | None = None  # EW mean time between arrivals
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
            loop = asyncio.get_running_loop()
            # Every instance prepares and runs every batch it can form of such rows once, so that no
            # request pays a first run's set-up (OpenVINO compiles each new input shape on first
            # sight: 17-36 ms for a 1.6 ms CNN, docs/serving.md), and calibration then times the
            # prepared runs that requests will get.
            sizes = batch_shapes(_rows(sample_row), self.max_rows)
            await asyncio.gather(
                *(
                    loop.run_in_executor(
                        self._executors[i], warm_shapes, self.backends[i], dict(sample_row), sizes
                    )
                    for i in range(len(self.backends))
                )
            )
            if self.config.calibrate:
                await loop.run_in_executor(self._executors[0], self._calibrate, dict(sample_row))
        self._accepting = True
        self._task = asyncio.get_running_loop().create_task(self._dispatch_loop(), name="lto-dispatcher")

    def _calibrate(self, row: dict[str, np.ndarray]) -> None:
        """Seed the latency model: batch sizes 1, 2, 4 ... until the model budget is spent."""
        backend = self.backends[0]
        rows = _rows(row)
        self._ref_elems = self._ref_elems or _elements(row) / rows
        budget = self._model_budget_ms()
        size = 1
        while size <= self.max_rows:
            feeds = {k: np.concatenate([v] * size, axis=0) if size > 1 else v for k, v in row.items()}
            backend.run(feeds)  # warm-up for this shape
            work = self._work(feeds)
            for _ in range(self.config.calibration_runs):
                t0 = self.clock.now()
                backend.run(feeds)
                self.latency.observe(work, (self.clock.now() - t0) * 1e3)
            if self.latency.predict(work) > budget or size == self.max_rows:
                break
            size = min(size * 2, self.max_rows)

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
        for executor in self._executors:
            executor.shutdown(wait=True)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    @property
    def inflight_batches(self) -> int:
        return self._inflight

    # ----------------------------------------------------------------------------- requests
    def check_request(self, feeds: Mapping[str, np.ndarray], full: bool = True) -> int:
        """Raise InputError naming what is wrong; return the request's rows.

        `full=False` skips the per-input name/dtype/shape checks for callers that made them
        already (the protocol decoder does) and checks only what batching needs.
        """
        if full:
            self.backends[0].check_feeds(feeds)
        if not self.signature.batchable:
            return 1
        rows = {name: arr.shape[0] for name, arr in feeds.items()}
        if len(set(rows.values())) > 1:
            raise InputError(
                f"inputs disagree on the batch size (axis 0): {rows}", "give every input the same rows"
            )
        n = next(iter(rows.values()))
        if n < 1:
            raise InputError("a request needs at least one row (axis 0 is 0)")
        if n > self.config.max_queue:
            raise InputError(
                f"a request of {n} rows can never fit the queue of {self.config.max_queue} rows",
                "split it, or raise --max-queue",
            )
        if self.signature.seq_inputs:
            lengths = {name: feeds[name].shape[1] for name in self.signature.seq_inputs}
            if len(set(lengths.values())) > 1:
                raise InputError(
                    f"token inputs disagree on the sequence length (axis 1): {lengths}",
                    "give ids and mask the same length",
                )
        self.check_values(feeds)
        return n

    def check_values(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Token ids beyond the vocabulary, token types beyond their table and sequences beyond
        the position table fail inside the model, and would fail every request batched with
        them: refuse them here, before batching, naming the input."""
        for name, limit in self.value_limits.items():
            arr = feeds.get(name)
            if arr is None or not arr.size or arr.dtype.kind not in "iu":
                continue
            low, high = int(arr.min()), int(arr.max())
            if low < 0 or high >= limit:
                bad = low if low < 0 else high
                raise InputError(
                    f"input {name!r} has value {bad}, outside [0, {limit}) (the rows of its embedding table)",
                    "check the tokenizer matches this model",
                )
        if self.max_sequence is not None:
            for name in self.value_limits or self.signature.seq_inputs:
                arr = feeds.get(name)
                if arr is not None and arr.ndim >= 2 and arr.shape[1] > self.max_sequence:
                    raise InputError(
                        f"input {name!r} has {arr.shape[1]} positions, the model's position table has "
                        f"{self.max_sequence}",
                        f"truncate sequences to {self.max_sequence} tokens",
                    )

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
        rows = _rows(feeds) if self.signature.batchable else 1
        if self._queued_rows + rows > self.config.max_queue:
            raise Overloaded(
                f"queue full ({self._queued_rows} rows waiting, limit {self.config.max_queue})",
                retry_after_s=self.retry_after_s(),
            )
        now = self.clock.now()
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self._gap_s = gap if self._gap_s is None else 0.9 * self._gap_s + 0.1 * gap
        self._last_arrival = now
        budget = self.config.queue_timeout_ms if deadline_ms is None else float(deadline_ms)
        if self._ref_elems is None:
            self._ref_elems = _elements(feeds) / max(1, rows)
        seq_len = bucket = None
        if self.signature.seq_inputs:
            seq_len = feeds[self.signature.seq_inputs[0]].shape[1]
            bucket = _bucket(seq_len, self.config.min_bucket)
        work = rows * self._row_elems_padded(feeds, rows, seq_len, bucket) / self._ref_elems
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        start = now if arrived is None else arrived
        deadline = math.inf if budget is None else start + budget / 1e3
        target = min(deadline, now + self.config.target_latency_ms / 1e3)
        if alone and self._leaves_at_once(rows, work, deadline, now):
            # Nothing queued, nothing running, and the dispatcher would send it alone at once:
            # skip the queue and the planning (a third of the batcher's cost per request).
            req = _Pending(feeds, rows, seq_len, bucket, (), work, deadline, target, now, future, alone=True)
            req.queued = False
            assert self._idle is not None
            self._idle.clear()
            self._launch([req])
            return await future
        if deadline < math.inf and self.latency.n and (self._queues or self._busy_until):
            # Fail fast: a request that could meet its deadline alone but not behind the work
            # already queued and running is refused now (503), rather than waiting to expire.
            # Behind the queue it runs in a batch of the efficient size, not alone: admitting
            # only what can finish in such a batch leaves the queue room to batch. (Admitting up
            # to the alone time filled the queue to the deadline, every batch then had to shrink
            # to one row to meet it, and the PP-OCR cls lost 45% of its capacity.)
            unit = self._efficient_work()
            wait_ms = self._predicted_wait_ms(now, unit)
            needs_ms = self.latency.predict(work)
            batched_ms = self.latency.upper(max(work, unit))
            if now + needs_ms / 1e3 <= deadline < now + (wait_ms + batched_ms) / 1e3:
                raise Overloaded(
                    f"overloaded: about {wait_ms:.0f} ms of work is ahead of this request, "
                    f"its deadline is {(deadline - now) * 1e3:.0f} ms away",
                    retry_after_s=self.retry_after_s(),
                )
        key = self._key(feeds, bucket)
        req = _Pending(feeds, rows, seq_len, bucket, key, work, deadline, target, now, future, alone=alone)
        req.seq = next(self._counter)
        self._queues.setdefault(key, deque()).append(req)
        self._key_rows[key] = self._key_rows.get(key, 0) + rows
        if deadline < math.inf:
            heapq.heappush(self._deadlines, (req.deadline, req.seq, req))
        self._queued_rows += rows
        self._queued_work += work
        assert self._idle is not None
        self._idle.clear()
        self._dispatch_ready(now)
        if req.queued:
            self._kick()  # it waits: let the dispatcher set its timer
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (client disconnected): drop the request if still queued.
            if req.queued:
                self._remove(req)
            raise

    def _leaves_at_once(self, rows: int, work: float, deadline: float, now: float) -> bool:
        """Whether the dispatcher, given this request, would launch it alone right away: the
        batcher is idle, the request cannot wait for company (it fills a batch, or arrivals are
        further apart than the wait), and it can meet its deadline."""
        if self._queues or self._inflight or not self._free or self.latency.n == 0:
            return False
        alone_now = (
            rows >= self.max_rows
            or (self._gap_s is not None and self._gap_s >= self.config.max_wait_ms / 1e3)
            or rows >= self._max_rows_now(work / rows)
        )
        return alone_now and now + self.latency.predict(work) / 1e3 <= deadline

    def _key(self, feeds: Mapping[str, np.ndarray], bucket: int | None) -> tuple[Any, ...]:
        parts = []
        for name, arr in sorted(feeds.items()):
            tail = list(arr.shape[1:])
            if bucket is not None and name in self.signature.seq_inputs:
                tail[0] = bucket
            parts.append((name, arr.dtype, tuple(tail)))
        return tuple(parts)

    def _row_elems_padded(
        self, feeds: Mapping[str, np.ndarray], rows: int, seq_len: int | None, bucket: int | None
    ) -> float:
        elems = _elements(feeds) / max(1, rows)
        if seq_len and bucket:
            elems *= bucket / seq_len
        return elems

    def _work(self, feeds: Mapping[str, np.ndarray]) -> float:
        return _elements(feeds) / (self._ref_elems or 1.0)

    def retry_after_s(self) -> int:
        """Seconds a shed client should wait: the predicted time to clear the backlog, at least 1."""
        backlog_ms = self.latency.predict(self._queued_rows * 1.0) / max(1, len(self.backends))
        return max(1, math.ceil(backlog_ms / 1e3))

    def _observe_gap(self, instance: int, live: list[_Pending], t_run: float, t_end: float) -> None:
        """Learn how long an instance sits idle between calls although work waits for it."""
        last, self._last_end[instance] = self._last_end.get(instance), t_end
        if last is None or min(r.enqueued for r in live) > last or t_run < last:
            return  # the instance had nothing to do: an idle gap, not a hand-off
        gap_ms = min((t_run - last) * 1e3, 10.0)  # a descheduled thread is not a hand-off
        self._batch_gap_ms = 0.9 * self._batch_gap_ms + 0.1 * gap_ms

    def _observe_service(self, t_back: float, work: float) -> None:
        """Learn the delivered rate from completions that follow each other under backlog."""
        last, self._last_finish = self._last_finish, t_back
        if last is None or not self._queues or work <= 0:
            return
        ms = (t_back - last) * 1e3 / work
        old = self._served_ms_per_work
        self._served_ms_per_work = ms if old is None else 0.9 * old + 0.1 * ms

    def _efficient_work(self) -> float:
        """The work of the most efficient batch size within the model budget (1.0 unknown)."""
        best = self.latency.most_efficient_work(self._model_budget_ms(), self._batch_gap_ms)
        return best[0] if best is not None else 1.0

    def _predicted_wait_ms(self, now: float, unit: float) -> float:
        """How long a request queued now would wait for its batch to start: what the running
        (and standby) batches have left, plus the queued work in batches of `unit` work (the
        most efficient size) shared among the instances, or at the rate the server has been
        delivering under backlog when that is slower."""
        busy_s = sum(max(0.0, self._standby.get(i, end) - now) for i, end in self._busy_until.items())
        queued_ms = self._queued_work * self.latency.predict(unit) / unit / len(self.backends)
        if self._served_ms_per_work is not None:
            queued_ms = max(queued_ms, self._queued_work * self._served_ms_per_work)
        return busy_s * 1e3 / len(self.backends) + queued_ms

    def _model_budget_ms(self) -> float:
        # At saturation a request waits for the batch in flight, then runs in the next one:
        # two batch times. So one batch may take at most half the target latency.
        return self.config.target_latency_ms / 2.0

    def _remove(self, req: _Pending) -> None:
        """Take a request out of the queue. Its deque entry is left behind and skipped later
        (removing from the middle of a deque is O(n), and overload expires many at once)."""
        if not req.queued:
            return
        req.queued = False
        self._queued_rows -= req.rows
        self._queued_work = max(0.0, self._queued_work - req.work) if self._queued_rows else 0.0
        left = self._key_rows[req.key] - req.rows
        if left:
            self._key_rows[req.key] = left
            queue = self._queues[req.key]
            while queue and not queue[0].queued:
                queue.popleft()
        else:
            del self._key_rows[req.key]
            del self._queues[req.key]
        self._check_idle()

    def _check_idle(self) -> None:
        if self._idle is not None and self._queued_rows == 0 and self._inflight == 0:
            self._idle.set()

    # ----------------------------------------------------------------------------- dispatch
    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _max_rows_now(self, row_work: float) -> int:
        """How many rows to batch at most: the most efficient measured size within the model
        budget, or, when the largest measured size is the most efficient, as many rows as the
        budget allows."""
        if self.latency.n == 0 or row_work <= 0:
            return self.max_rows
        budget = self._model_budget_ms()
        best = self.latency.most_efficient_work(budget, self._batch_gap_ms)
        if best is None:
            return 1
        work, largest = best
        rows = max(1, int(work / row_work + 0.5))
        if largest and rows < self.max_rows:
            lo, hi = rows, self.max_rows  # latency grows with size: bisect the largest that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.latency.upper(mid * row_work) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            rows = lo
        return min(rows, self.max_rows)

    def _expire(self, now: float) -> None:
        """Answer requests whose deadline cannot be met even alone, rather than run them late."""
        while self._deadlines:
            deadline, _, req = self._deadlines[0]
            if not req.queued:
                heapq.heappop(self._deadlines)
                continue
            needs = self.latency.predict(req.work) if self.latency.n else 0.0
            if now + needs / 1e3 <= deadline:
                break
            heapq.heappop(self._deadlines)
            self._remove(req)
            if not req.future.done():
                waited = (now - req.enqueued) * 1e3
                req.future.set_exception(
                    DeadlineExceeded(
                        f"deadline missed: queued {waited:.1f} ms, the model needs {needs:.1f} ms",
                        queue_ms=waited,
                        needs_ms=needs,
                    )
                )
                self.requests_answered += 1

    def _next_expiry(self) -> float | None:
        while self._deadlines and not self._deadlines[0][2].queued:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return None
        _, _, req = self._deadlines[0]
        return req.deadline - (self.latency.predict(req.work) if self.latency.n else 0.0) / 1e3

    def _head_batch(self, queue: deque[_Pending]) -> tuple[list[_Pending], int, bool]:
        """The requests at the head of this queue that fit one batch, their rows, and whether
        the batch is full (as large as batches grow now)."""
        row_work = queue[0].work / queue[0].rows  # _remove keeps the head live
        cap = self._max_rows_now(row_work)
        batch: list[_Pending] = []
        rows = 0
        for req in queue:
            if not req.queued:
                continue
            if batch and rows + req.rows > cap:
                break
            batch.append(req)
            rows += req.rows
        return batch, rows, rows >= cap

    def _plan(self, queue: deque[_Pending], now: float) -> tuple[list[_Pending], float]:
        """The batch this queue would send now, and when it must leave at the latest."""
        batch, rows, full = self._head_batch(queue)
        if full or self._draining:
            return batch, now
        if self._gap_s is not None and self._gap_s >= self.config.max_wait_ms / 1e3:
            # Arrivals are further apart than the whole wait: waiting would add latency and
            # most likely gain no company. (At low load this makes the batcher cost nothing.)
            return batch, now
        earliest = min(r.target for r in batch)
        # Latest start that still meets the earliest target if one more row joins.
        grown = (rows + 1) * queue[0].work / queue[0].rows
        latest = earliest - self.latency.upper(grown) / 1e3 if self.latency.n else earliest
        leave_at = min(batch[0].enqueued + self.config.max_wait_ms / 1e3, latest)
        return batch, leave_at

    def _shrink(self, batch: list[_Pending], start: float) -> list[_Pending]:
        """Drop requests from the tail until the batch, started at `start`, is predicted to end
        within all its deadlines.

        Only hard deadlines count: shrinking for a missed target would cut batches to one row
        exactly when load is highest, and throughput with them."""
        while len(batch) > 1 and self.latency.n and not self._ends_in_time(batch, start):
            batch.pop()
        return batch

    def _ends_in_time(self, batch: list[_Pending], start: float) -> bool:
        """Whether the batch, started at `start`, is predicted (upper bound) to end within all
        its deadlines; a batch with deadlines and no measured model is not."""
        earliest = min(r.deadline for r in batch)
        if earliest == math.inf:
            return True
        return self.latency.n > 0 and start + self.latency.upper(sum(r.work for r in batch)) / 1e3 <= earliest

    def _launch_standby(self, now: float) -> None:
        """Every instance is busy: give one whose batch is running its next batch now, if a full
        one waits. Its thread starts it the moment the running batch ends, instead of idling
        until the event loop, busy reading and shedding requests under overload, hands it
        one. Only full batches go early (nothing would join them by waiting). A batch with
        deadlines goes only when the model is measured and the batch is predicted to end within
        them, started when the running one ends: it can no longer expire there (answered late
        if the running batch overruns), but without standby the instance idled between batches
        under overload."""
        while self._queues:
            ready = [i for i in self._busy_until if i not in self._standby]
            if not ready:
                return
            instance = min(ready, key=self._busy_until.__getitem__)  # the first to be free
            start = max(now, self._busy_until[instance])
            chosen: list[_Pending] | None = None
            for queue in self._queues.values():
                batch, _, full = self._head_batch(queue)
                if not full:
                    continue
                batch = self._shrink(batch, start)
                if not self._ends_in_time(batch, start):
                    continue
                if chosen is None or min(r.target for r in batch) < min(r.target for r in chosen):
                    chosen = batch
            if chosen is None:
                return
            self._launch(chosen, instance, start)

    def _dispatch_ready(self, now: float) -> float | None:
        """Launch every batch that should leave now; return when the next one must leave.

        Synchronous, so submit() and batch completion can call it directly: a request that
        can go at once starts without waiting for the dispatcher task to be scheduled.
        """
        self._expire(now)
        while self._free and self._queues:
            best: tuple[float, list[_Pending]] | None = None
            wake_at: float | None = None
            for queue in self._queues.values():
                batch, leave_at = self._plan(queue, now)
                if leave_at <= now:
                    earliest = min(r.target for r in batch)
                    if best is None or earliest < best[0]:
                        best = (earliest, batch)
                else:
                    wake_at = leave_at if wake_at is None else min(wake_at, leave_at)
            if best is None:
                return wake_at
            self._launch(self._shrink(best[1], now))
        if not self._free and self._queues:
            self._launch_standby(now)
        return None

    async def _dispatch_loop(self) -> None:
        """The timer side of dispatch: wakes for max-wait, deadline and expiry times."""
        assert self._wake is not None
        while True:
            self._wake.clear()
            wake_at = self._dispatch_ready(self.clock.now())
            expiry = self._next_expiry()
            if expiry is not None:
                wake_at = expiry if wake_at is None else min(wake_at, expiry)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if wake_at is not None:
                self._timer = self.clock.call_at(wake_at, self._wake.set)
            await self._wake.wait()

    def _launch(self, batch: list[_Pending], standby_of: int | None = None, start: float = 0.0) -> None:
        """Run `batch` on a free instance, or queue it behind the running batch of `standby_of`
        (predicted to start at `start`)."""
        instance = self._free.pop() if standby_of is None else standby_of
        self._inflight += 1  # before _remove, so the batcher never looks idle in between
        for req in batch:
            self._remove(req)
        live = [r for r in batch if not r.future.done()]
        if not live:  # every caller went away while queued
            self._inflight -= 1
            if standby_of is None:
                self._free.append(instance)
            self._check_idle()
            return
        work = sum(r.work for r in live)
        end = max(start, self.clock.now()) + (self.latency.predict(work) if self.latency.n else 0.0) / 1e3
        if standby_of is None:
            self._busy_until[instance] = end
        else:
            self._standby[instance] = end
        if standby_of is None and len(live) == 1 and live[0].alone and self._runs_inline(work):
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            try:
                done.set_result(self._execute(instance, live))
            except Exception as exc:
                done.set_exception(exc)
            self._finish(instance, live, done)
            return
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executors[instance], self._execute, instance, live)
        future.add_done_callback(lambda f: self._finish(instance, live, f))

    def _runs_inline(self, work: float) -> bool:
        """Whether a lone request's batch runs on the loop's thread (see inline_max_ms): only
        when it is all there is to do and it is known to be short. Under load the server holds
        other requests, so batches go to the model threads and grow."""
        return (
            self.config.inline_max_ms > 0
            and self._inflight == 1  # this batch
            and not self._queues
            and self.latency.n > 0
            and self.latency.upper(work) <= self.config.inline_max_ms
        )

    def _finish(
        self,
        instance: int,
        live: list[_Pending],
        future: asyncio.Future[Any] | concurrent.futures.Future[Any],
    ) -> None:
        """On the loop when a batch returns: answer its requests, free the instance, dispatch."""
        t_back = self.clock.now()
        rows = sum(r.rows for r in live)
        ok = False
        model_ms = 0.0
        try:
            outs, t_asm, t_run, t_end, work = future.result()
            model_ms = (t_end - t_run) * 1e3
            self._observe_service(t_back, work)
            self._observe_gap(instance, live, t_run, t_end)
            ok = not any(isinstance(out, BaseException) for out in outs)
            if ok:  # a batch re-run one by one after a failure says nothing about batch latency
                self.latency.observe(work, model_ms)
            for req, out in zip(live, outs, strict=True):
                if req.future.done():
                    continue  # the caller went away
                if isinstance(out, BaseException):
                    message = f"the model failed on this request: {message_line(out)}"
                    req.future.set_exception(ModelFailure(message))
                    self.requests_answered += 1
                    continue
                req.future.set_result(
                    InferResult(
                        outputs=out,
                        queue_ms=(t_asm - req.enqueued) * 1e3,
                        batch_ms=((t_run - t_asm) + (t_back - t_end)) * 1e3,
                        model_ms=model_ms,
                        batch_rows=rows,
                        batch_requests=len(live),
                    )
                )
                self.requests_answered += 1
        except Exception as exc:
            # Assembling or splitting failed: every request of the batch gets the error.
            message = message_line(exc)
            for req in live:
                if not req.future.done():
                    req.future.set_exception(ModelFailure(f"the model failed on this batch: {message}"))
                    self.requests_answered += 1
        finally:
            self.batches_run += 1
            self._inflight -= 1
            if instance in self._standby:  # its next batch is already running
                self._busy_until[instance] = self._standby.pop(instance)
            else:
                self._busy_until.pop(instance, None)
                self._free.append(instance)
            if self.on_batch is not None and live:
                self.on_batch(BatchStats(rows=rows, requests=len(live), model_ms=model_ms, ok=ok))
            if self._queues and self._task is not None:
                self._dispatch_ready(self.clock.now())
                self._kick()  # the dispatcher re-arms its timer for whatever is left
            self._check_idle()

    def _execute(
        self, instance: int, batch: list[_Pending]
    ) -> tuple[list[dict[str, np.ndarray] | BaseException], float, float, float, float]:
        """On the instance's thread: run the batch; when it fails, run its requests one by one,
        so that only the request that fails gets the error. Returns outputs (or the error of
        each request) and timestamps."""
        try:
            split, t_asm, t_run, t_end, work = self._execute_batch(instance, batch)
            return list(split), t_asm, t_run, t_end, work
        except Exception as exc:
            if len(batch) == 1:
                return [exc], *self._no_times()
        outs: list[dict[str, np.ndarray] | BaseException] = []
        t_asm = self.clock.now()
        for req in batch:
            try:
                outs.append(self._execute_batch(instance, [req])[0][0])
            except Exception as exc:
                outs.append(exc)
        t_end = self.clock.now()
        return outs, t_asm, t_asm, t_end, 0.0

    def _no_times(self) -> tuple[float, float, float, float]:
        now = self.clock.now()
        return now, now, now, 0.0

    def _execute_batch(
        self, instance: int, batch: list[_Pending]
    ) -> tuple[list[dict[str, np.ndarray]], float, float, float, float]:
        """Assemble, run, split."""
        t_asm = self.clock.now()
        bucket = batch[0].bucket
        if len(batch) == 1 and (bucket is None or batch[0].seq_len == bucket):
            feeds = batch[0].feeds
        else:
            feeds = {}
            for name in batch[0].feeds:
                parts = [r.feeds[name] for r in batch]
                if bucket is not None and name in self.signature.seq_inputs:
                    # Pad ids, token types and mask with 0: a masked position attends to nothing.
                    parts = [
                        np.pad(p, ((0, 0), (0, bucket - p.shape[1]))) if p.shape[1] != bucket else p
                        for p in parts
                    ]
                feeds[name] = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        work = self._work(feeds)
        t_run = self.clock.now()
        outputs = self.backends[instance].run(feeds)
        t_end = self.clock.now()
        total = sum(r.rows for r in batch)
        split: list[dict[str, np.ndarray]] = [{} for _ in batch]
        for name, value in outputs.items():
            if not self.signature.batchable:
                split[0][name] = value
                continue
            if value.ndim == 0 or value.shape[0] != total:
                raise ModelFailure(
                    f"output {name!r} has {value.shape[0] if value.ndim else 0} rows for a batch of {total}"
                )
            offset = 0
            for i, req in enumerate(batch):
                part = value[offset : offset + req.rows]
                # Outputs that carry the padded sequence axis are cut back to the request's length.
                if bucket is not None and req.seq_len != bucket and name in self.signature.seq_outputs:
                    part = part[:, : req.seq_len]
                split[i][name] = part
                offset += req.rows
        return split, t_asm, t_run, t_end, work

    def describe(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "instances": len(self.backends),
            "max_rows": self.max_rows,
            "signature": self.signature.to_json(),
            "latency_model": self.latency.to_json(),
            "batches_run": self.batches_run,
        }


WARM_BUDGET_S = 10.0  # start-up time spent running every batch shape once, at most, per instance


def batch_shapes(rows_per_request: int, max_rows: int) -> list[int]:
    """The batch sizes (in rows) a batcher forms from requests of `rows_per_request` rows."""
    per = max(1, rows_per_request)
    return list(range(per, max(per, max_rows) + 1, per)) if max_rows >= per else [per]


def warm_shapes(backend: Backend, row: Mapping[str, np.ndarray], sizes: Sequence[int]) -> int:
    """Run `row` stacked to each size once (until WARM_BUDGET_S); how many sizes ran."""
    per = _rows(row)
    start = time.perf_counter()
    done = 0
    for size in sizes:
        if time.perf_counter() - start > WARM_BUDGET_S:
            break
        copies = max(1, size // per)
        feeds = {k: np.concatenate([v] * copies, axis=0) if copies > 1 else v for k, v in row.items()}
        backend.prepare(feeds)
        backend.run(feeds)
        done += 1
    return done


def _rows(feeds: Mapping[str, np.ndarray]) -> int:
    for arr in feeds.values():
        return int(arr.shape[0]) if arr.ndim else 1
    return 1


def _elements(feeds: Mapping[str, np.ndarray]) -> float:
    return float(sum(arr.size for arr in feeds.values())) or 1.0


def sample_row(
    inputs: Sequence[TensorSpec], shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, Any]:
    """One request's worth of zeros (ones for masks) when every non-batch dim is known, else {}."""
    shapes = shapes or {}
    feeds: dict[str, Any] = {}
    for spec in inputs:
        if spec.name in shapes:
            dims = [1, *list(shapes[spec.name])[1:]]
        else:
            dims = []
            for axis, d in enumerate(spec.shape):
                if axis == 0 and not isinstance(d, int):
                    dims.append(1)
                elif isinstance(d, int):
                    dims.append(d)
                elif isinstance(d, str) and d in shapes and len(shapes[d]) == 1:
                    dims.append(int(shapes[d][0]))
                else:
                    return {}
        fill = 1 if "mask" in spec.name.lower() else 0
        feeds[spec.name] = np.full(dims, fill, dtype=np.dtype(spec.dtype))
    return feeds
