"""`lto bench`: measure one target, sweep batch sizes, or compare two targets interleaved."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.artifact import resolve_model
from optimize.backend import Backend
from optimize.bench.apart import PROCESS_SETS, compare, compare_in_process_sets, worker_of
from optimize.bench.engine import BenchSettings, Comparison, Measurement, measure
from optimize.bench.repeat import run_repeated
from optimize.data import InputSpec, check_memory, feeds_from_spec, resolve_inputs
from optimize.errors import InputError, UsageError
from optimize.model.runtime_model import RuntimeModel
from optimize.report import new_report
from optimize.runtimes.backends import open_model, open_model_in_worker
from optimize.runtimes.registry import backend_info

Progress = Callable[[str, int, float], None]


@dataclass
class BenchRequest:
    model: Path
    compare_with: Path | None = None
    backend: str | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: Path | None = None
    batches: list[int] = field(default_factory=list)
    seed: int = 0
    runtime_overrides: dict[str, Any] = field(default_factory=dict)
    settings: BenchSettings = field(default_factory=BenchSettings)
    # Independent measurements, each in a fresh process and session (optimize.bench.repeat).
    repeat: int = 1
    # --compare: fresh sets of worker processes the comparison is pooled over, as lto optimize
    # measures its artifact (optimize.bench.apart.compare_in_process_sets).
    process_sets: int = PROCESS_SETS


def parse_batches(text: str | None) -> list[int]:
    if not text:
        return []
    parts = text.split(",")
    if any(not part.strip() for part in parts):
        # "1,,8" is a typo, not a request for two sizes: say so rather than guess.
        raise UsageError(f"bad --batch {text!r}: empty size between commas", "e.g. --batch 1,8,32")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise UsageError(
            f"bad --batch {text!r}", "give sizes separated by commas, e.g. --batch 1,8,32"
        ) from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"bad --batch {text!r}: sizes must be at least 1")
    return values


@contextmanager
def opened(target: RuntimeModel, overrides: dict[str, Any], in_worker: bool = False) -> Iterator[Backend]:
    backend = open_model_in_worker(target, overrides) if in_worker else open_model(target, overrides)
    try:
        yield backend
    finally:
        backend.close()


def target_inputs(
    target: RuntimeModel, backend: Backend, request: BenchRequest, batch: int | None
) -> tuple[InputSpec, dict[str, np.ndarray]]:
    """Inputs for a target: explicit flags win; an artifact's stored spec otherwise."""
    explicit = bool(request.shapes) or request.input_data is not None
    if target.input_spec is not None and not explicit:
        spec = InputSpec.from_json(target.input_spec)
        if batch is None or batch == spec.batch_size:
            # A manifest's shapes are data too: an edited one must not allocate past memory.
            check_memory([(t.name, t.dtype, t.shape) for t in spec.tensors], target.model_path)
            return spec, feeds_from_spec(spec)
        # A batch sweep on an artifact: keep the stored shapes but the requested batch.
        shapes = {t.name: (batch, *t.shape[1:]) for t in spec.tensors}
        return resolve_inputs(target.model_path, shapes, None, spec.seed, batch, specs=backend.inputs)
    specs = None if target.model_path.suffix == ".onnx" else backend.inputs
    # A dynamic leading dim defaults to batch 1 (the documented --batch default); any other
    # unpinned dim is an error that names it.
    batch = 1 if batch is None and request.input_data is None else batch
    return resolve_inputs(
        target.model_path, request.shapes, request.input_data, request.seed, batch, specs=specs
    )


def run_bench(request: BenchRequest, progress: Progress | None = None) -> dict[str, Any]:
    """Measure a target (or a batch sweep of it) and return a report of kind 'bench'.

    With `request.repeat` > 1, every repetition runs in a fresh process (see optimize.bench.repeat).
    """
    if request.repeat > 1:
        return run_repeated(request, run_bench, progress)
    target = resolve_model(request.model, request.backend)
    overrides = dict(request.runtime_overrides)
    if backend_info(target.backend).own_worker:
        # Alone in this process, a runtime that would isolate itself (TVM) has no thread pool to
        # fight: run it here, so the timings carry no inter-process cost. (--compare keeps it in
        # its own process next to ORT.)
        overrides.setdefault("process", "inline")
    measurements: list[Measurement] = []
    spec_json: dict[str, Any] | None = None
    describe: dict[str, Any] = {}
    warnings: list[str] = []
    with opened(target, overrides) as backend:
        describe = backend.describe()
        for batch in request.batches or [None]:
            spec, feeds = target_inputs(target, backend, request, batch)
            spec_json = spec_json or spec.to_json()
            warnings += [w for w in spec.warnings if w not in warnings]
            label = f"{target.label}@b{spec.batch_size}"
            tick = (lambda n, t, lab=label: progress(lab, n, t)) if progress else None
            measurements.append(measure(backend, feeds, request.settings, label, spec.batch_size, tick))
    report = new_report(
        "bench",
        model_path=target.model_path,
        input_spec=spec_json,
        settings={"bench": request.settings.to_json(), "runtime": describe, "artifact": _artifact(target)},
    )
    report["results"] = [m.to_json() for m in measurements]
    if warnings:
        report["warnings"] = warnings
    return report


def run_compare(request: BenchRequest, progress: Progress | None = None) -> dict[str, Any]:
    """Measure two targets interleaved (A B B A ...) and report the ratio with its CI. Each runs
    in a worker process of its own (optimize.bench.apart), as each would be deployed: two
    runtimes, or two thread-pool settings, in one process slow each other unevenly."""
    assert request.compare_with is not None
    if request.repeat > 1:
        raise UsageError(
            "--repeat applies to a single target, not to --compare",
            "--compare already measures both sides interleaved in one run",
        )
    target_a = resolve_model(request.model, request.backend, label="A")
    target_b = resolve_model(request.compare_with, request.backend, label="B")
    batch = request.batches[0] if request.batches else None
    if len(request.batches) > 1:
        raise UsageError("--compare measures one batch size", "give a single --batch with --compare")
    overrides = request.runtime_overrides
    with opened(target_a, overrides, in_worker=True) as a, opened(target_b, overrides, in_worker=True) as b:
        spec_a, feeds_a = _compare_inputs(target_a, a, target_b, b, request, batch)
        spec_b, feeds_b = _compare_inputs(target_b, b, target_a, a, request, batch)
        if spec_a.shapes() != spec_b.shapes():
            raise InputError(
                f"the two models take different inputs ({spec_a.shapes()} vs {spec_b.shapes()})",
                "compare models with the same inputs",
            )
        # Same values for both, so the comparison is of the models and nothing else.
        feeds_b = {k: feeds_a[k] for k in feeds_b} if set(feeds_a) == set(feeds_b) else feeds_b
        tick = (lambda n, t: progress("A/B", n, t)) if progress else None
        labels = (f"A:{Path(request.model).name}", f"B:{Path(request.compare_with).name}")
        result: Comparison
        if worker_of(a) is not None and worker_of(b) is not None:
            run = compare_in_process_sets(
                [lambda: open_model_in_worker(target_a, overrides),
                 lambda: open_model_in_worker(target_b, overrides)],
                [feeds_a, feeds_b], request.settings, labels, sets=request.process_sets,
                progress=tick, first=(a, b),
            )  # fmt: skip
            result = run.comparison(0, 1)
        else:
            result = compare(a, b, feeds_a, feeds_b, request.settings, labels, progress=tick)
        runtime = {"A": a.describe(), "B": b.describe()}
    report = new_report(
        "compare",
        model_path=target_a.model_path,
        input_spec=spec_a.to_json(),
        settings={
            "bench": request.settings.to_json(),
            "runtime": runtime,
            "compare_with": str(target_b.model_path),
        },
    )
    report["results"] = [result.a.to_json(), result.b.to_json()]
    report["comparison"] = result.to_json()
    warnings = list(dict.fromkeys([*spec_a.warnings, *spec_b.warnings]))
    if warnings:
        report["warnings"] = warnings
    return report


def _compare_inputs(
    target: RuntimeModel,
    backend: Backend,
    other: RuntimeModel,
    other_backend: Backend,
    request: BenchRequest,
    batch: int | None,
) -> tuple[InputSpec, dict[str, np.ndarray]]:
    """A side's inputs for --compare. Without flags, a model file takes the inputs the other side,
    an artifact, stored: `--artifact ART --compare ORIGINAL` measures both on what ART was
    optimized for, even when the original's dims are dynamic."""
    explicit = bool(request.shapes) or request.input_data is not None
    if target.input_spec is None and other.input_spec is not None and not explicit:
        spec, feeds = target_inputs(other, other_backend, request, batch)
        backend.check_feeds(feeds)
        return spec, feeds
    return target_inputs(target, backend, request, batch)


def _artifact(target: RuntimeModel) -> dict[str, Any] | None:
    if target.artifact_dir is None:
        return None
    return {"dir": str(target.artifact_dir), "verified": True}
