"""The Python API: optimize, measure and run models from a script or a notebook.

The same work as `lto optimize`, `lto bench` and `lto serve`'s runtime, without the command line.
Heavy libraries (onnxruntime, onnx, TVM, TensorRT) are imported inside the functions, so that
`import optimize` stays as quick as `lto --help`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from optimize.artifact import load_artifact
from optimize.bench import BenchSettings
from optimize.bench.command import BenchRequest, run_bench, run_compare
from optimize.data import InputSpec, feeds_from_spec, parse_shape_args, split_shape_args
from optimize.errors import UsageError
from optimize.model.onnx_file import load_model
from optimize.model.runtime_model import BASELINE_BACKEND
from optimize.pipeline import OptimizeRequest, optimize
from optimize.pipeline.request import DEFAULT_TIME_BUDGET_S
from optimize.runtimes.backends import open_backend
from optimize.units import NO_LIMIT_WORDS, parse_duration, parse_percentile_key

# time_budget not given: the default bound, as on the command line.
DEFAULT_BUDGET = object()

if TYPE_CHECKING:
    import numpy as np

    from optimize.backend import Backend, TensorSpec
    from optimize.pipeline import PipelineResult, Progress

Shapes = Mapping[str, Sequence[int]] | Iterable[str]


def _shape_args(shapes: Shapes | None) -> list[str]:
    """`{"input_ids": (1, 128)}` or `["input_ids=1x128"]` as `--shape` strings."""
    if shapes is None:
        return []
    if isinstance(shapes, Mapping):
        return [f"{name}={'x'.join(str(int(d)) for d in dims)}" for name, dims in shapes.items()]
    if isinstance(shapes, str):
        return [shapes]
    return [str(arg) for arg in shapes]


def optimize_model(
    model: str | Path,
    target_ms: float | None = None,
    output: str | Path | None = None,
    *,
    progress: Progress | None = None,
    **options: Any,
) -> PipelineResult:
    """Optimize an ONNX model as `lto optimize` does and write the artifact to `output`.

    `options` are `lto optimize`'s flags as keywords: target_percentile ("p99"), recipe,
    quantize, calib_data, shapes ({"input_ids": (1, 128)} or ["input_ids=1x128"]), input_data,
    eval_data, data (a folder of images, a text file, wav files) with preprocess and tokenizer,
    batch, force, time_budget ("10m" or seconds; default 2 minutes, None for the full search),
    stop_at_target, fail_on_unverified, enable, disable, stage_options ({stage: {option: value}}),
    seed. `output` defaults to reports/<model>-<time>/. The result has `artifact_dir`, `verdict`,
    `exit_code` (0 written and the target met or none given, 3 missed, 4 missed where an
    unverified candidate would meet it, or any left unverified with fail_on_unverified), `records` (one per
    stage) and the full `report`.

    Example::

        result = optimize.optimize_model("model.onnx", target_ms=5, output="out/model",
                                         shapes={"sequence": [128]}, time_budget="10m")
        print(result.verdict, result.report["optimize"]["speedup"])
    """
    from dataclasses import fields

    known = {f.name for f in fields(OptimizeRequest)} - {
        "model_path",
        "target_ms",
        "out_dir",
        "default_budget",
    }
    known |= {"time_budget"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"optimize_model() got unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    if "shapes" in options:
        # NAME=MIN:OPT:MAX ranges (TensorRT profiles) run at OPT, as on the command line
        pins, ranges = split_shape_args(_shape_args(options.pop("shapes")))
        options["shapes"] = pins
        options["shape_ranges"] = [*options.get("shape_ranges", []), *ranges]
    time_budget = options.pop("time_budget", DEFAULT_BUDGET)
    if time_budget is DEFAULT_BUDGET:
        options["time_budget_s"], options["default_budget"] = DEFAULT_TIME_BUDGET_S, True
    elif time_budget is None or str(time_budget).strip().lower() in NO_LIMIT_WORDS:
        options["time_budget_s"] = None
    else:
        options["time_budget_s"] = parse_duration(time_budget, "time_budget")
    if "target_percentile" in options:
        options["target_percentile"] = parse_percentile_key(options["target_percentile"], "target_percentile")
    for key in ("calib_data", "input_data", "eval_data", "data", "tokenizer"):
        if options.get(key) is not None:
            options[key] = Path(options[key])
    request = OptimizeRequest(
        model_path=Path(model),
        target_ms=target_ms,
        out_dir=Path(output) if output is not None else None,
        **options,
    )
    return optimize(request, progress=progress)


def bench_model(
    model: str | Path,
    *,
    time: str | float = "10s",
    batch: int | Sequence[int] | None = None,
    shapes: Shapes | None = None,
    input_data: str | Path | None = None,
    compare: str | Path | None = None,
    backend: str | None = None,
    runtime: Mapping[str, Any] | None = None,
    warmup: int = 10,
    min_runs: int = 20,
    max_runs: int = 5000,
    ci_target: float | Literal["auto"] | None = "auto",
    seed: int = 0,
    min_time: str | float = 0.0,
    repeat: int = 1,
) -> dict[str, Any]:
    """Measure a model file or an artifact directory as `lto bench` does; returns the report.

    `time` bounds the timed runs per measurement ("2s", "1m" or seconds) and `min_time` is the
    least they take (a minimum wins over `time` and `max_runs`); `batch` is one size or a sweep;
    `compare` measures against another model or artifact interleaved (a "compare" report);
    `runtime` overrides runtime settings (e.g. {"intra_op_num_threads": 2}); `repeat` > 1 takes
    that many measurements, each in a fresh process, as `lto bench --repeat` does (the report
    `lto gate --baseline/--candidate` compares). `ci_target` "auto" stops a single measurement
    once its median's CI is within 2%, and lets each repetition spend its `time`.
    Latencies are in ms under report["results"][i]["latency_ms"] (p50, p90, p99, p999, mean ...).

    Example::

        report = optimize.bench_model("out/model", time="5s")
        print(report["results"][0]["latency_ms"]["p50"])
        baseline = optimize.bench_model("out/model", time="2s", repeat=10)
    """

    batches = [batch] if isinstance(batch, int) else list(batch or [])
    if any(b < 1 for b in batches):
        raise UsageError("batch sizes must be at least 1")
    if repeat < 1:
        raise UsageError(f"repeat={repeat}: give at least 1")
    max_time_s = parse_duration(time, "time", minimum=0.01)
    min_time_s = parse_duration(min_time, "min_time", minimum=0.0) if min_time else 0.0
    if min_time_s > max_time_s:
        raise UsageError(f"min_time {min_time_s:g}s is more than time {max_time_s:g}s", "raise time")
    if ci_target == "auto":
        ci_target = None if repeat > 1 else 0.02
    request = BenchRequest(
        model=Path(model),
        compare_with=Path(compare) if compare is not None else None,
        backend=backend,
        shapes=parse_shape_args(_shape_args(shapes)),
        input_data=Path(input_data) if input_data is not None else None,
        batches=batches,
        seed=seed,
        runtime_overrides=dict(runtime or {}),
        settings=BenchSettings(
            warmup=warmup,
            min_runs=min(min_runs, max_runs),
            max_runs=max_runs,
            max_time_s=max_time_s,
            min_time_s=min_time_s,
            target_ci_rel=ci_target or None,
        ),
        repeat=repeat,
    )
    return (run_compare if compare is not None else run_bench)(request)


class LoadedModel:
    """An artifact (or an ONNX file) opened in its runtime: `run` it, then `close` it.

    Also a context manager. `inputs`/`outputs` list name, dtype and shape of each tensor;
    `backend` names the runtime; `manifest` is the artifact's (None for a plain file).
    """

    def __init__(self, backend: Backend, manifest: Mapping[str, Any] | None, warnings: list[str]) -> None:
        self._backend = backend
        self.backend: str = backend.kind
        self.manifest = dict(manifest) if manifest is not None else None
        self.warnings = warnings

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._backend.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._backend.outputs

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run one batch: {input name: array} -> {output name: array}. Inputs are checked first."""
        import numpy as np

        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        self._backend.check_feeds(arrays)
        return self._backend.run(arrays)

    def example_inputs(self) -> dict[str, np.ndarray]:
        """The inputs the artifact was optimized and measured with (generated ones re-created)."""

        if self.manifest is None:
            raise UsageError("a plain model file records no inputs", "build feeds from .inputs")
        return feeds_from_spec(InputSpec.from_json(self.manifest["input_spec"]))

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(spec.name for spec in self.inputs)
        return f"<LoadedModel {self._backend.model_path} on {self.backend}, inputs: {names}>"


def load(artifact: str | Path) -> LoadedModel:
    """Open an artifact written by `lto optimize` (its files verified first) in its runtime.

    A plain .onnx file is opened on ONNX Runtime defaults instead.

    Example::

        with optimize.load("out/model") as model:
            outputs = model.run({"input": batch})   # {"logits": array, ...}
    """

    path = Path(artifact)
    if path.is_dir():
        loaded = load_artifact(path)
        backend = open_backend(loaded.backend, loaded.model_path, loaded.runtime_config)
        return LoadedModel(backend, loaded.manifest, list(loaded.warnings))
    if not path.is_file():
        raise UsageError(f"artifact not found: {path}", "give the directory lto optimize wrote")

    load_model(path, load_external_data=False)  # a clear error for a file that is not ONNX
    return LoadedModel(open_backend(BASELINE_BACKEND, path), None, [])


__all__ = ["LoadedModel", "bench_model", "load", "optimize_model"]
