"""The one interface every pipeline stage implements.

A stage turns the best candidate so far into zero or more new candidates. It never times
itself and never decides whether its output is kept: the pipeline benchmarks every
candidate the same way, checks its accuracy against the reference, and keeps or rejects
it. That way every number in a report was produced by one piece of code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.accuracy import AccuracyResult
from optimize.model.runtime_model import RuntimeModel

# What a stage proposes is a model in a runtime like any other.
Candidate = RuntimeModel


class TextEnum(str, Enum):
    """An enum whose members are their words: equal to, hashed, printed and formatted as the
    string, so reports, JSON and string keys read them as written."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Status(TextEnum):
    """A row of `lto optimize`'s table: what became of the baseline, a candidate, or a stage that
    produced none. Its values are the words reports write, so a report reads the same whichever
    layer named the status: the pipeline for what it measured, a stage for a point of its search
    it did not yield (StageContext.note_point)."""

    BASELINE = "baseline"
    KEPT = "kept"
    REJECTED = "rejected"
    SKIPPED = "skipped"
    FAILED = "failed"
    # kept, then sent back by the final side-by-side comparison with the original
    REVERTED = "reverted"
    # reduced or quantized, measured faster, but the rows could not verify its accuracy: never shipped
    UNVERIFIED = "unverified"


class Outcome(TextEnum):
    """What the pipeline decided about a candidate a stage yielded (StageContext.outcomes): a
    stage that searches reads it to prune what cannot win."""

    KEPT = "kept"
    SLOWER = "slower"  # accurate, not faster than the best
    UNVERIFIED = "unverified"  # faster, but the rows could not verify a reduced or quantized candidate
    INACCURATE = "inaccurate"
    FAILED = "failed"


# In a candidate's details: the label of the mixed-precision candidate whose lift it prices (the
# same quantized model with nothing lifted). The pipeline times such a candidate though it fails
# the accuracy gate, and never keeps it: the report says what lifting cost in speed.
LIFT_REFERENCE_KEY = "lift_reference_for"


@dataclass
class StageContext:
    """What a stage may read, and the services the pipeline lends it."""

    workdir: Path  # a private scratch directory for this stage
    original_model: Path  # the user's model, unchanged
    feeds: Mapping[str, np.ndarray]  # the benchmark inputs (dynamic dims pinned)
    options: dict[str, Any]  # this stage's options from the recipe
    best_standard: Candidate  # the best standard-op candidate so far (for TVM / TensorRT)
    best_latency_ms: float | None  # the best measured latency so far at the target percentile
    target_ms: float | None
    deadline: float | None  # time.monotonic() by which the stage must return
    # Checks a candidate against the reference outputs; a stage that searches (quantization
    # back-off) uses it instead of keeping its own notion of accuracy.
    check_accuracy: Callable[[Candidate], AccuracyResult]
    log: Callable[[str], None]
    # A live one-line status for long work (tuning progress); replaces the previous line.
    status: Callable[[str], None] | None = None
    # What the pipeline decided about each candidate this stage yielded so far, by label. A
    # stage that yields candidates one at a time (a search) reads it to prune what cannot win.
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    # A warning for the report (calibrating on generated inputs, say); None: it is logged.
    warn_fn: Callable[[str], None] | None = None
    # Records a point of a search the pipeline will not measure as a row of the report:
    # (label, Status.SKIPPED | FAILED | REJECTED, reason, details).
    note_point_fn: Callable[[str, Status, str, dict[str, Any]], None] | None = None

    def note_point(
        self, label: str, status: Status, reason: str, details: dict[str, Any] | None = None
    ) -> None:
        if self.note_point_fn is not None:
            self.note_point_fn(label, status, reason, details or {})

    def skip_point(self, label: str, reason: str, details: dict[str, Any] | None = None) -> None:
        self.note_point(label, Status.SKIPPED, reason, details)

    def warn(self, text: str) -> None:
        """Something the user must read in the report, not only in the log."""
        if self.warn_fn is not None:
            self.warn_fn(text)
        else:
            self.log(f"warning: {text}")


class StageSkipped(Exception):
    """Raised by a stage that finds, once running, that it cannot handle this model."""


class Stage(ABC):
    name: ClassVar[str]
    description: ClassVar[str] = ""
    # Run `run` in a child process group (optimize.pipeline.isolation): for stages that spend
    # minutes in native code that swallows or crashes on signals. Such a stage gets no
    # ctx.check_accuracy.
    isolated: ClassVar[bool] = False

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        """Why this stage does not apply to `candidate` (None: it applies)."""
        return None

    @abstractmethod
    def run(self, candidate: Candidate, ctx: StageContext) -> Iterable[Candidate]:
        """Produce candidates derived from `candidate`, written under ctx.workdir.

        A list, or a generator: the pipeline then checks and times each candidate as it is
        yielded, updates ctx.outcomes and ctx.best_latency_ms before asking for the next, and
        stops asking once the target is met or the budget is spent.
        """


class OnnxRuntimeStage(Stage):
    """A stage that rewrites ONNX files for ONNX Runtime: it cannot work on a TVM or TensorRT candidate."""

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        if candidate.backend != "onnxruntime" or candidate.model_path.suffix != ".onnx":
            return f"needs an ONNX model on onnxruntime, got {candidate.backend}"
        return None
