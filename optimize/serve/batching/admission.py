"""What a request must pass to be queued, and the answers of a batcher that cannot take it.

Input checks run before batching, since a bad request would fail every request batched with it.
The overload answers come at once, with a retry hint: the queue is full, or the request could
meet its deadline alone but not behind the work already queued and running (fail fast, rather
than wait to expire).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from optimize.backend import Backend
from optimize.errors import InputError
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.estimators import LatencyModel
from optimize.serve.batching.outcomes import Overloaded
from optimize.serve.batching.signature import ModelSignature


def check_request(
    feeds: Mapping[str, np.ndarray], backend: Backend, signature: ModelSignature, max_queue: int, full: bool
) -> int:
    """Raise InputError naming what is wrong; return the request's rows. `full=False` skips the
    per-input name/dtype/shape checks (`backend.check_feeds`) and checks only what batching needs."""
    if full:
        backend.check_feeds(feeds)
    if not signature.batchable:
        return 1
    rows = {name: arr.shape[0] for name, arr in feeds.items()}
    if len(set(rows.values())) > 1:
        raise InputError(
            f"inputs disagree on the batch size (axis 0): {rows}", "give every input the same rows"
        )
    n = next(iter(rows.values()))
    if n < 1:
        raise InputError("a request needs at least one row (axis 0 is 0)")
    if n > max_queue:
        raise InputError(
            f"a request of {n} rows can never fit the queue of {max_queue} rows",
            "split it, or raise --max-queue",
        )
    if signature.seq_inputs:
        lengths = {name: feeds[name].shape[1] for name in signature.seq_inputs}
        if len(set(lengths.values())) > 1:
            raise InputError(
                f"token inputs disagree on the sequence length (axis 1): {lengths}",
                "give ids and mask the same length",
            )
    return n


def check_values(
    feeds: Mapping[str, np.ndarray],
    value_limits: Mapping[str, int],
    max_sequence: int | None,
    seq_inputs: tuple[str, ...],
) -> None:
    """Token ids beyond the vocabulary (`value_limits`: input -> rows of its embedding table),
    token types beyond their table and sequences beyond the position table (`max_sequence`) fail
    inside the model: refuse them here, naming the input."""
    for name, limit in value_limits.items():
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
    if max_sequence is not None:
        for name in value_limits or seq_inputs:
            arr = feeds.get(name)
            if arr is not None and arr.ndim >= 2 and arr.shape[1] > max_sequence:
                raise InputError(
                    f"input {name!r} has {arr.shape[1]} positions, the model's position table has "
                    f"{max_sequence}",
                    f"truncate sequences to {max_sequence} tokens",
                )


def retry_after_s(latency: LatencyModel, queued_rows: int, instances: int) -> int:
    """Seconds a shed client should wait: the predicted time to clear the backlog, at least 1."""
    backlog_ms = latency.predict(queued_rows * 1.0) / max(1, instances)
    return max(1, math.ceil(backlog_ms / 1e3))


def queue_full(queued_rows: int, rows: int, config: BatcherConfig, retry_s: int) -> Overloaded | None:
    """The answer to a request of `rows` rows when the queue cannot take them."""
    if queued_rows + rows <= config.max_queue:
        return None
    return Overloaded(
        f"queue full ({queued_rows} rows waiting, limit {config.max_queue})", retry_after_s=retry_s
    )


def predicted_wait_ms(
    busy_ms: float, queued_work: float, unit: float, latency: LatencyModel, served_ms_per_work: float | None,
    instances: int,
) -> float:  # fmt: skip
    """How long a request queued now would wait for its batch to start: what the running (and
    standby) batches have left (`busy_ms`, all instances together), plus the queued work in batches
    of `unit` work (the most efficient size) shared among the instances, or at the rate the server
    has been delivering under backlog when that is slower."""
    queued_ms = queued_work * latency.predict(unit) / unit / instances
    if served_ms_per_work is not None:
        queued_ms = max(queued_ms, queued_work * served_ms_per_work)
    return busy_ms / instances + queued_ms


def behind_the_queue(
    now: float, work: float, deadline: float, unit: float, wait_ms: float, latency: LatencyModel, retry_s: int
) -> Overloaded | None:
    """The answer to a request that could meet its deadline alone but not behind the work ahead
    of it, which waits `wait_ms` and then runs in a batch of the efficient size (`unit` work), not
    alone: admitting only what can finish in such a batch leaves the queue room to batch.
    (Admitting up to the alone time filled the queue to the deadline, every batch then had to
    shrink to one row to meet it, and the PP-OCR cls lost 45% of its capacity.)"""
    needs_ms = latency.predict(work)
    batched_ms = latency.upper(max(work, unit))
    if not now + needs_ms / 1e3 <= deadline < now + (wait_ms + batched_ms) / 1e3:
        return None
    return Overloaded(
        f"overloaded: about {wait_ms:.0f} ms of work is ahead of this request, "
        f"its deadline is {(deadline - now) * 1e3:.0f} ms away",
        retry_after_s=retry_s,
    )
