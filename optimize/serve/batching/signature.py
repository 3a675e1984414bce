"""How a model's requests combine into batches, and the row and shape helpers that follow from it.

`ModelSignature` is decided once from the model's inputs and outputs; `assemble` and `split`
build one model call from a batch of requests and cut its outputs back into their answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.serve.batching.outcomes import ModelFailure


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


class BatchPart(Protocol):
    """One request as assembling and splitting a batch see it."""

    feeds: dict[str, np.ndarray]
    rows: int
    seq_len: int | None
    bucket: int | None


def assemble(signature: ModelSignature, batch: Sequence[BatchPart]) -> dict[str, np.ndarray]:
    """One model call's feeds: the requests stacked on axis 0, token inputs padded to the bucket."""
    bucket = batch[0].bucket
    if len(batch) == 1 and (bucket is None or batch[0].seq_len == bucket):
        return batch[0].feeds
    feeds = {}
    for name in batch[0].feeds:
        parts = [r.feeds[name] for r in batch]
        if bucket is not None and name in signature.seq_inputs:
            # Pad ids, token types and mask with 0: a masked position attends to nothing.
            parts = [
                np.pad(p, ((0, 0), (0, bucket - p.shape[1]))) if p.shape[1] != bucket else p for p in parts
            ]
        feeds[name] = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return feeds


def split(
    signature: ModelSignature, batch: Sequence[BatchPart], outputs: Mapping[str, np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """Each request's rows of the batch's outputs; raises ModelFailure when the rows do not add up."""
    bucket = batch[0].bucket
    total = sum(r.rows for r in batch)
    parts: list[dict[str, np.ndarray]] = [{} for _ in batch]
    for name, value in outputs.items():
        if not signature.batchable:
            parts[0][name] = value
            continue
        if value.ndim == 0 or value.shape[0] != total:
            raise ModelFailure(
                f"output {name!r} has {value.shape[0] if value.ndim else 0} rows for a batch of {total}"
            )
        offset = 0
        for i, req in enumerate(batch):
            part = value[offset : offset + req.rows]
            # Outputs that carry the padded sequence axis are cut back to the request's length.
            if bucket is not None and req.seq_len != bucket and name in signature.seq_outputs:
                part = part[:, : req.seq_len]
            parts[i][name] = part
            offset += req.rows
    return parts


def bucket_of(length: int, minimum: int) -> int:
    """The padded length a sequence of `length` tokens batches at: a power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, length - 1).bit_length())


def batch_key(
    feeds: Mapping[str, np.ndarray], bucket: int | None, seq_inputs: Sequence[str]
) -> tuple[Any, ...]:
    """What requests must share to batch together: every input's dtype and non-batch shape
    (token inputs at their bucket's length)."""
    parts = []
    for name, arr in sorted(feeds.items()):
        tail = list(arr.shape[1:])
        if bucket is not None and name in seq_inputs:
            tail[0] = bucket
        parts.append((name, arr.dtype, tuple(tail)))
    return tuple(parts)


def elements_of(feeds: Mapping[str, np.ndarray]) -> float:
    """Input elements over all inputs (at least 1): the measure of a batch's work."""
    return float(sum(arr.size for arr in feeds.values())) or 1.0


class WorkMeasure:
    """A batch's work: its input elements relative to those of one reference row (the calibration
    row, or else the first request's), so that one latency model covers batch size and sequence
    length alike."""

    def __init__(self) -> None:
        self.row_elements: float | None = None

    def reference(self, feeds: Mapping[str, np.ndarray], rows: int) -> None:
        """Take one row of `feeds` (of `rows` rows) as one unit of work, unless a unit is set."""
        self.row_elements = self.row_elements or elements_of(feeds) / rows

    def of(self, feeds: Mapping[str, np.ndarray]) -> float:
        """The work of a model call on `feeds`."""
        return elements_of(feeds) / (self.row_elements or 1.0)

    def of_request(
        self, feeds: Mapping[str, np.ndarray], rows: int, seq_len: int | None, bucket: int | None
    ) -> float:
        """The work a request of `rows` rows adds to its batch, token inputs padded to `bucket`."""
        assert self.row_elements is not None, "reference() first"
        row_elements = elements_of(feeds) / max(1, rows)
        if seq_len and bucket:
            row_elements *= bucket / seq_len  # padded to its bucket
        return rows * row_elements / self.row_elements


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
