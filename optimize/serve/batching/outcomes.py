"""What a request or a batch ends with: outputs and where the time went, or a `ServeError`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
