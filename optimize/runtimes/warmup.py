"""Warming a backend up for the batch shapes a server will form, before its first request.

A runtime's first run of a shape is set-up, not serving: OpenVINO compiles each new input shape on
first sight (17-36 ms for a 1.6 ms CNN), and `Backend.prepare` compiles a static model per shape
(docs/serving.md, "Under load"). So every server lto runs a model in warms each batch shape it can
form once at start, within WARM_BUDGET_S: `lto serve`'s batcher, the floor of `lto load`, and the
model `lto export --backend python` writes for Triton's python backend.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from optimize.backend import Backend
from optimize.data import InputSpec, feeds_from_spec, resolve_inputs
from optimize.errors import InputError
from optimize.model.runtime_model import RuntimeModel

WARM_BUDGET_S = 10.0  # start-up time spent running every batch shape once, at most, per instance


def rows_of(feeds: Mapping[str, np.ndarray]) -> int:
    """A request's rows: axis 0 of its first input."""
    for arr in feeds.values():
        return int(arr.shape[0]) if arr.ndim else 1
    return 1


def batch_shapes(rows_per_request: int, max_rows: int) -> list[int]:
    """The batch sizes (in rows) a batcher forms from requests of `rows_per_request` rows."""
    per = max(1, rows_per_request)
    return list(range(per, max(per, max_rows) + 1, per)) if max_rows >= per else [per]


def warm_shapes(backend: Backend, row: Mapping[str, np.ndarray], sizes: Sequence[int]) -> int:
    """Prepare and run `row` stacked to each size once (until WARM_BUDGET_S); how many sizes ran."""
    per = rows_of(row)
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


def one_request(
    model: RuntimeModel, backend: Backend, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, np.ndarray]:
    """One request's feeds for `model` as `backend` runs it: from the artifact's input spec when it
    has one and no `shapes` are given, else generated for `shapes`; one row on every input whose
    batch axis is free. Raises InputError when no inputs can be made (a dim nobody pins).

    Warm-up and calibration time the model, so only shapes and dtypes matter: when the spec's data
    file is gone (an artifact copied to another host), its shapes are kept and values generated."""
    feeds = None
    if model.input_spec and not shapes:
        try:
            feeds = feeds_from_spec(InputSpec.from_json(model.input_spec))
        except (TypeError, KeyError, ValueError, InputError):
            # An older or partial spec, or its data file is gone: keep its shapes, generate values.
            shapes = {t["name"]: tuple(t["shape"]) for t in model.input_spec.get("inputs", [])}
    if feeds is None:
        _, feeds = resolve_inputs(model.model_path, dict(shapes or {}), None, batch=1, specs=backend.inputs)
    fixed = {s.name for s in backend.inputs if s.shape and isinstance(s.shape[0], int)}
    return {k: v if k in fixed or not v.ndim else np.ascontiguousarray(v[:1]) for k, v in feeds.items()}
