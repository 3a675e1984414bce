"""`lto optimize`: baseline, stages in recipe order, a measured keep/reject after each, an artifact.

The pipeline is the one place that measures and decides (STYLE.md): a stage only proposes
candidates. After every candidate:

1. it is loaded as its own backend from its files with its runtime configuration;
2. its outputs on every accuracy sample are checked against the baseline's (`optimize.accuracy`);
3. it is benchmarked interleaved with the best so far (`optimize.bench.compare`) and kept only when
   the ratio candidate/best at the target percentile is below 1 - min_improvement AND the upper
   end of its 95% CI is below 1 (faster with confidence).

A stage that raises is recorded as failed and one that cannot handle the model as skipped; the
run goes on with the best so far, and always ends with the best accurate candidate (the original
model, on ONNX Runtime defaults, when nothing won).

Speedups in the per-stage table are chained: the best-so-far's speedup times 1/ratio of the
candidate against it (each ratio measured interleaved). The final line compares the artifact
with the baseline directly, side by side, in the same run.

Exit codes: 0 target met (or no target), 3 the best artifact misses the target (TARGET_MISSED),
1 failure, 2 usage errors.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from optimize.accuracy import accuracy_json, check
from optimize.errors import LtoError, UsageError
from optimize.files import check_output_dir, check_output_file
from optimize.pipeline.isolation import run_in_child
from optimize.recipes import Recipe, StageSpec
from optimize.runtimes.base import Backend
from optimize.stage import AccuracyResult, Candidate, Stage, StageContext, StageSkipped

EXIT_TARGET_MET = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TARGET_MISSED = 3
PERCENTILES = ("p50", "p90", "p95", "p99")
QUANTIZE_MODES = ("auto", "always", "never")

MeasureFn = Callable[..., Any]  # optimize.bench.measure's signature
CompareFn = Callable[..., Any]  # optimize.bench.compare's signature
StageFactory = Callable[[str], Stage]


@dataclass
class OptimizeRequest:
    model_path: Path
    target_ms: float | None = None
    target_percentile: str = "p50"
    recipe: str | None = None  # name or path; None: picked by model kind
    quantize: str = "auto"  # auto (recipe decides) | always | never
    calib_data: Path | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # `--shape NAME=MIN:OPT:MAX` strings: optimization-profile ranges for stages that build
    # for a range of shapes (TensorRT); the benchmark runs at OPT, which `shapes` holds.
    shape_ranges: list[str] = field(default_factory=list)
    # tvm-tune options given as flags (--tvm-target, --tvm-trials, --rpc-tracker, --rpc-key).
    tvm_options: dict[str, Any] = field(default_factory=dict)
    input_data: Path | None = None
    # A dynamic leading dim nothing else pins runs at this batch (real-time latency: 1).
    batch: int | None = 1
    out_dir: Path | None = None
    # Replace an out_dir that looks like a damaged artifact (fsio.check_output_dir).
    force: bool = False
    time_budget_s: float | None = None
    stop_at_target: bool = False
    enable: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    seed: int = 0

    def validate(self) -> None:
        if self.target_ms is not None and not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            raise UsageError(f"--target-ms must be a positive number, got {self.target_ms}")
        if self.target_percentile not in PERCENTILES:
            raise UsageError(
                f"--target-percentile {self.target_percentile!r} is not supported",
                f"choose one of: {', '.join(PERCENTILES)}",
            )
        if self.quantize not in QUANTIZE_MODES:
            raise UsageError(f"--quantize {self.quantize!r}", f"choose one of: {', '.join(QUANTIZE_MODES)}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise UsageError("--time-budget must be positive")
        if self.batch is not None and self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.calib_data is not None and not Path(self.calib_data).is_file():
            raise UsageError(f"--calib-data file not found: {self.calib_data}")
        if self.stop_at_target and self.target_ms is None:
            raise UsageError("--stop-at-target needs --target-ms")
        if self.out_dir is not None:
            # Before any work: a run that ends by refusing to write its artifact wastes the user's time.
            inputs = [self.model_path, self.calib_data, self.input_data]
            check_output_dir(self.out_dir, inputs=inputs, force=self.force)
            check_output_file(partial_report_path(Path(self.out_dir)), flag="-o")


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m' -> seconds."""
    import re

    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", value)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != value.replace(" ", ""):
        raise UsageError(f"bad duration {text!r}", "write e.g. 90s, 10m or 1h30m")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@dataclass
class StageRecord:
    """One row of the final table: a baseline, a candidate, or a stage that produced none."""

    stage: str
    label: str
    status: str  # baseline | kept | rejected | skipped | failed
    reason: str = ""
    latency_ms: dict[str, float] | None = None  # p50, p99 and the target percentile
    ratio: float | None = None  # metric(candidate) / metric(best so far)
    ratio_ci95: tuple[float, float] | None = None
    speedup: float | None = None  # vs baseline (chained, see module docstring)
    accuracy: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    runtime_config: dict[str, Any] | None = None
    precision: str | None = None
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.label,
            "status": self.status,
            "reason": self.reason,
            "latency_ms": self.latency_ms,
            "ratio_vs_best": self.ratio,
            "ratio_ci95": list(self.ratio_ci95) if self.ratio_ci95 else None,
            "speedup_vs_baseline": self.speedup,
            "accuracy": self.accuracy,
            "details": _json_safe(self.details),
            "backend": self.backend,
            "runtime_config": self.runtime_config,
            "precision": self.precision,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass
class PipelineResult:
    report: dict[str, Any]
    records: list[StageRecord]
    best: Candidate
    exit_code: int
    artifact_dir: Path
    verdict: str


class Progress:
    """What the pipeline tells a display while it runs. The default shows nothing."""

    def status(self, text: str) -> None:
        pass

    def record(self, record: StageRecord) -> None:
        pass

    def log(self, text: str) -> None:
        pass


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _first_line(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, LtoError) else str(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line}" if not isinstance(exc, LtoError) else line


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def percentile_ci(samples: Sequence[float], percentile: str) -> tuple[float, float, float]:
    """Point estimate and bootstrap 95% CI of a percentile of latency samples."""
    from optimize.stats import PERCENTILES as QS
    from optimize.stats import bootstrap_ci

    q = QS[percentile]
    data = np.asarray(samples, dtype=np.float64)
    lo, hi = bootstrap_ci(data, stat=lambda x, axis=None: np.percentile(x, q, axis=axis), n=1000)
    return float(np.percentile(data, q)), lo, hi


def default_out_dir(model_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{model_path.stem}-{stamp}"


def partial_report_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".partial-report.json")


def choose_recipe(request: OptimizeRequest, known_stages: Sequence[str] | None = None) -> tuple[Recipe, str]:
    """The recipe to run (request.recipe, or the one for the model's kind) and the model kind."""
    from optimize.model import load_model
    from optimize.recipes import detect_model_kind, load_recipe, recipe_for_kind

    model = load_model(request.model_path, load_external_data=False)
    kind = detect_model_kind(model)
    del model
    recipe = load_recipe(request.recipe or recipe_for_kind(kind), known_stages=known_stages)
    return recipe, kind


def apply_overrides(recipe: Recipe, request: OptimizeRequest) -> list[str]:
    """Fold --enable/--disable/--quantize into the recipe; returns notes for the report."""
    notes: list[str] = []
    names = {s.name for s in recipe.stages}
    for name in [*request.enable, *request.disable]:
        if name not in names:
            raise UsageError(
                f"stage {name!r} is not in recipe {recipe.name}",
                f"its stages: {', '.join(s.name for s in recipe.stages)}",
            )
    for spec in recipe.stages:
        if spec.name in request.enable:
            spec.enabled = True
            notes.append(f"{spec.name} enabled on the command line")
        if spec.name in request.disable:
            spec.enabled = False
            notes.append(f"{spec.name} disabled on the command line")
    tvm = recipe.stage("tvm-tune")
    if tvm is not None:
        for key, value in request.tvm_options.items():
            tvm.options[key] = value
            notes.append(f"tvm-tune {key}={value} from the command line")
    trt = recipe.stage("tensorrt-build")
    if trt is not None and request.shape_ranges:
        trt.options["shapes"] = list(request.shape_ranges)
        notes.append("tensorrt-build profile ranges from --shape: " + ", ".join(request.shape_ranges))
    quant = recipe.stage("quantize")
    if quant is not None:
        if request.quantize == "never":
            quant.enabled = False
        elif request.quantize == "always":
            quant.enabled = True
            quant.run_when = "always"
        if request.calib_data is not None:
            quant.options["calib_data"] = str(Path(request.calib_data).absolute())
    if request.calib_data is not None:
        from optimize.inputs import check_data_file

        # Checked before any stage runs (0 rows is an error; NaN/inf a warning in the report):
        # the quantize stage reads the file only late in the run.
        notes += check_data_file(request.calib_data, "--calib-data")
    return notes


def _stage_disabled_reason(spec: StageSpec, request: OptimizeRequest, recipe: Recipe) -> str:
    if spec.name == "quantize" and request.quantize == "never":
        return "--quantize never"
    if spec.name in request.disable:
        return "disabled with --disable"
    return f"disabled in recipe {recipe.name} (turn on with --enable {spec.name})"


class Pipeline:
    """One run of `lto optimize`. Measuring and stage loading are injectable for tests."""

    def __init__(
        self,
        request: OptimizeRequest,
        recipe: Recipe,
        *,
        model_kind: str = "default",
        stage_factory: StageFactory | None = None,
        measure_fn: MeasureFn | None = None,
        compare_fn: CompareFn | None = None,
        progress: Progress | None = None,
        recipe_notes: Sequence[str] = (),
    ) -> None:
        from optimize import bench
        from optimize.runtimes import load_stage

        self.request = request
        self.recipe = recipe
        self.model_kind = model_kind
        self.stage_factory = stage_factory or load_stage
        self.measure_fn = measure_fn or bench.measure
        self.compare_fn = compare_fn or bench.compare
        self.progress = progress or Progress()
        self.settings = bench.BenchSettings(**recipe.bench)
        self.metric = request.target_percentile
        self.records: list[StageRecord] = []
        self.warnings: list[str] = list(recipe_notes)
        self.logs: list[str] = []
        self.out_dir = Path(request.out_dir) if request.out_dir else default_out_dir(request.model_path)
        self._started = time.monotonic()
        self._deadline = self._started + request.time_budget_s if request.time_budget_s else None
        self._results: list[dict[str, Any]] = []

    # -- helpers --------------------------------------------------------------------------------

    def _log(self, text: str) -> None:
        self.logs.append(text)
        if "warning" in text.lower():  # e.g. calibration on generated inputs: the report must say so
            self.warnings.append(text)
        self.progress.log(text)

    def _open(self, candidate: Candidate) -> Backend:
        from optimize.runtimes import open_backend

        return open_backend(candidate.backend, candidate.model_path, candidate.runtime_config)

    def _outputs_of(self, backend: Backend) -> list[dict[str, np.ndarray]]:
        return [backend.run(sample) for sample in self.samples]

    def _check_backend(self, backend: Backend) -> AccuracyResult:
        expected = {(s.name, s.dtype) for s in self.baseline_inputs}
        got = {(s.name, s.dtype) for s in backend.inputs}
        if got != expected:
            missing = sorted(n for n, _ in expected - got)
            extra = sorted(n for n, _ in got - expected)
            what = "; ".join(
                x
                for x in (
                    f"lost {', '.join(missing)}" if missing else "",
                    f"added {', '.join(extra)}" if extra else "",
                )
                if x
            )
            return AccuracyResult(False, f"the candidate changed the model's inputs ({what})", {})
        return check(self.reference, self._outputs_of(backend), self.recipe.accuracy)

    def check_accuracy(self, candidate: Candidate) -> AccuracyResult:
        """The service stages get through ctx.check_accuracy (quantization back-off)."""
        backend = self._open(candidate)
        try:
            return self._check_backend(backend)
        finally:
            backend.close()

    def _latency(self, measurement: Any) -> dict[str, float]:
        lat = measurement.latency
        return {"p50": lat["p50"], "p99": lat["p99"], self.metric: lat[self.metric]}

    def _target_met(self, measurement: Any, confident: bool) -> bool:
        if self.request.target_ms is None:
            return False
        value, _, hi = percentile_ci(measurement.samples_ms, self.metric)
        return (hi if confident else value) <= self.request.target_ms

    def _time_left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _bench_progress(self, what: str) -> Callable[[int, float], None]:
        return lambda runs, elapsed: self.progress.status(f"{what}: {runs} runs, {elapsed:.1f} s")

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> PipelineResult:
        from optimize.onnx_utils import file_has_external_data

        self.request.validate()
        model_path = Path(self.request.model_path)
        self.external_data = file_has_external_data(model_path)
        work_parent = self.out_dir.parent
        work_parent.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f".lto-work-{model_path.stem}-", dir=work_parent)
        ).absolute()
        try:
            return self._run(model_path)
        except BaseException as exc:
            self._write_partial(exc)
            raise
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _prepare_inputs(self, model_path: Path) -> None:
        from optimize.inputs import generate_feeds, resolve_inputs

        self.progress.status("resolving inputs")
        self.input_spec, self.feeds = resolve_inputs(
            model_path,
            self.request.shapes,
            self.request.input_data,
            seed=self.request.seed,
            batch=self.request.batch,
        )
        # More samples for the accuracy check, generated with the same meaning and shapes (token
        # ids inside the vocabulary, masks of ones ...) even when the bench input came from a file.
        n_extra = max(0, self.recipe.accuracy.samples - 1)
        samples: list[dict[str, np.ndarray]] = [dict(self.feeds)]
        if n_extra:
            gen_spec, _ = resolve_inputs(model_path, self.input_spec.shapes(), None, seed=self.request.seed)
            samples += [generate_feeds(gen_spec, self.request.seed + 1 + i) for i in range(n_extra)]
        self.samples = samples

    def _run(self, model_path: Path) -> PipelineResult:
        self._prepare_inputs(model_path)
        # Absolute: stages run inside their scratch directory (see _run_stage).
        baseline = Candidate(
            label="baseline", model_path=model_path.absolute(), backend="onnxruntime", runtime_config={}
        )
        self.progress.status("baseline: loading the original model on ONNX Runtime defaults")
        t0 = time.monotonic()
        base_backend = self._open(baseline)
        try:
            base_backend.check_feeds(self.feeds)
            self.baseline_inputs = base_backend.inputs
            self.outputs_spec = [o.to_json() for o in base_backend.outputs]
            self.progress.status("baseline: reference outputs")
            self.reference = self._outputs_of(base_backend)
            repeat = check(self.reference[0], base_backend.run(self.samples[0]), self.recipe.accuracy)
            if not repeat.ok:
                self.warnings.append(
                    f"the original model is not deterministic on the same input ({repeat.reason}); "
                    "accuracy checks compare against one run of it"
                )
            base_meas = self.measure_fn(
                base_backend, self.feeds, self.settings, "baseline",
                progress=self._bench_progress("baseline: measuring"),
            )  # fmt: skip
        finally:
            base_backend.close()
        self._results.append(base_meas.to_json())
        base_record = StageRecord(
            stage="baseline",
            label="baseline",
            status="baseline",
            reason="original model, ONNX Runtime default settings",
            latency_ms=self._latency(base_meas),
            speedup=1.0,
            accuracy={"ok": True, "reason": "reference", "per_output": {}, "worst": {}},
            backend="onnxruntime",
            runtime_config={},
            precision="fp32",
            elapsed_s=time.monotonic() - t0,
        )
        self._add(base_record)

        best, best_meas, best_speedup = baseline, base_meas, 1.0
        best_standard = baseline
        best_accuracy: AccuracyResult = AccuracyResult(True, "", {})
        kept_chain: list[dict[str, Any]] = []
        best_backend = self._open(best)
        stop_reason = ""
        if self.request.stop_at_target and self._target_met(base_meas, confident=True):
            stop_reason = "the baseline already meets the target (--stop-at-target)"
        try:
            for spec in self.recipe.stages:
                t_stage = time.monotonic()
                reason = self._pre_skip_reason(spec, stop_reason, best_meas)
                if reason:
                    self._add(StageRecord(spec.name, spec.name, "skipped", reason))
                    continue
                candidates, failure = self._run_stage(spec, best, best_standard, best_meas)
                if failure is not None:
                    failure.elapsed_s = time.monotonic() - t_stage
                    self._add(failure)
                    continue
                for cand in candidates:
                    left = self._time_left()
                    if left is not None and left <= 0:
                        reason = "the --time-budget was used up before it could be measured"
                        self._add(StageRecord(spec.name, cand.label, "skipped", reason, details=cand.details))
                        continue
                    outcome = self._evaluate(spec, cand, best, best_backend, best_speedup)
                    record, cand_backend, comparison, accuracy = outcome
                    record.elapsed_s = time.monotonic() - t_stage
                    self._add(record)
                    if record.status == "kept" and cand_backend is not None and comparison is not None:
                        best_backend.close()
                        best, best_backend, best_meas = cand, cand_backend, comparison.b
                        best_speedup = record.speedup or best_speedup
                        best_accuracy = accuracy
                        kept_chain.append({"stage": cand.label, **cand.details})
                        if cand.standard_ops:
                            best_standard = cand
                    else:
                        if comparison is not None:
                            best_meas = comparison.a  # the freshest measurement of the best
                        if cand_backend is not None:
                            cand_backend.close()
                if (
                    self.request.stop_at_target
                    and not stop_reason
                    and self._target_met(best_meas, confident=True)
                ):
                    stop_reason = f"target met with 95% confidence after {spec.name} (--stop-at-target)"
        finally:
            best_backend.close()
        return self._finish(baseline, base_meas, best, best_accuracy, kept_chain)

    def _add(self, record: StageRecord) -> None:
        if record.status == "failed" and self.external_data and "external data" not in record.reason.lower():
            # The report must say when a stage may have failed on a model with its weights in side files.
            record.reason += " (the model keeps its weights as external data)"
        self.records.append(record)
        self.progress.record(record)

    def _pre_skip_reason(self, spec: StageSpec, stop_reason: str, best_meas: Any) -> str:
        if stop_reason:
            return stop_reason
        if not spec.enabled:
            return _stage_disabled_reason(spec, self.request, self.recipe)
        left = self._time_left()
        if left is not None and left <= 0:
            return "the --time-budget is used up"
        if spec.run_when == "above-target" and self.request.target_ms is not None:
            value = self._latency(best_meas)[self.metric]
            if value <= self.request.target_ms:
                target = self.request.target_ms
                return f"the best {self.metric} ({value:.3f} ms) already meets the {target:g} ms target"
        return ""

    def _run_stage(
        self, spec: StageSpec, best: Candidate, best_standard: Candidate, best_meas: Any
    ) -> tuple[list[Candidate], StageRecord | None]:
        self.progress.status(f"{spec.name}: loading")
        try:
            stage = self.stage_factory(spec.name)
        except StageSkipped as exc:
            return [], StageRecord(spec.name, spec.name, "skipped", str(exc) or "not available")
        workdir = self.workdir / spec.name
        workdir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + spec.budget_s if spec.budget_s else None
        if self._deadline is not None:
            deadline = min(deadline, self._deadline) if deadline is not None else self._deadline
        ctx = StageContext(
            workdir=workdir,
            original_model=Path(self.request.model_path).absolute(),
            feeds=self.feeds,
            options=dict(spec.options),
            best_standard=best_standard,
            best_latency_ms=self._latency(best_meas)[self.metric],
            target_ms=self.request.target_ms,
            deadline=deadline,
            check_accuracy=self.check_accuracy,
            log=lambda text: self._log(f"{spec.name}: {text}"),
            status=lambda text: self.progress.status(f"{spec.name}: {text}"),
        )
        try:
            reason = stage.skip_reason(best, ctx)
            if reason:
                return [], StageRecord(spec.name, spec.name, "skipped", reason)
            self.progress.status(f"{spec.name}: running")
            # Some libraries write side files into the current directory (onnxruntime.quantization
            # names external data "<uuid>.data" there): keep them in the stage's scratch space.
            with _working_directory(workdir):
                candidates = run_in_child(stage, best, ctx) if stage.isolated else stage.run(best, ctx)
            for cand in candidates:  # a path relative to the stage's directory stays valid outside it
                cand.model_path = workdir / cand.model_path
                cand.extra_files = [workdir / Path(f) for f in cand.extra_files]
        except StageSkipped as exc:
            return [], StageRecord(spec.name, spec.name, "skipped", str(exc) or "does not apply")
        except (KeyboardInterrupt, SystemExit):
            raise
        except MemoryError:
            return [], StageRecord(spec.name, spec.name, "failed", "ran out of memory")
        except Exception as exc:
            # A stage bug or an unsupported model must not end the run: record it and go on.
            tb = traceback.extract_tb(exc.__traceback__)
            where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
            where = getattr(exc, "where", None) or where  # an isolated stage says where it raised
            details = {"exception": type(exc).__name__, "where": where}
            return [], StageRecord(spec.name, spec.name, "failed", _first_line(exc), details=details)
        if not candidates:
            return [], StageRecord(spec.name, spec.name, "skipped", "the stage produced no candidate")
        return list(candidates), None

    def _evaluate(
        self, spec: StageSpec, cand: Candidate, best: Candidate, best_backend: Backend, best_speedup: float
    ) -> tuple[StageRecord, Backend | None, Any, AccuracyResult]:
        record = StageRecord(
            stage=spec.name,
            label=cand.label,
            status="failed",
            details=dict(cand.details),
            backend=cand.backend,
            runtime_config=dict(cand.runtime_config),
            precision=cand.precision,
        )
        no_acc = AccuracyResult(False, "", {})
        self.progress.status(f"{cand.label}: loading the candidate")
        try:
            backend = self._open(cand)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            record.reason = f"the candidate does not load: {_first_line(exc)}"
            return record, None, None, no_acc
        try:
            self.progress.status(f"{cand.label}: checking accuracy on {len(self.samples)} samples")
            accuracy = self._check_backend(backend)
        except (KeyboardInterrupt, SystemExit):
            backend.close()
            raise
        except Exception as exc:
            backend.close()
            record.reason = f"the candidate does not run: {_first_line(exc)}"
            return record, None, None, no_acc
        record.accuracy = accuracy_json(accuracy)
        if not accuracy.ok:
            record.status = "rejected"
            record.reason = f"inaccurate: {accuracy.reason}"
            backend.close()
            return record, None, None, accuracy
        self.progress.status(f"{cand.label}: benchmarking against {best.label}")
        try:
            comparison = self._compare(best_backend, backend, best.label, cand.label)
        except (KeyboardInterrupt, SystemExit):
            backend.close()
            raise
        except Exception as exc:
            backend.close()
            record.reason = f"benchmarking failed: {_first_line(exc)}"
            return record, None, None, accuracy
        record.details["comparison"] = comparison.to_json()
        self._judge(record, comparison, best.label, best_speedup)
        if record.status != "kept":
            return record, backend, comparison, accuracy

        # Two sessions of the same model can differ by a few percent for the life of the process
        # (memory placement), and that bias is invisible to one comparison's CI. A win must
        # therefore repeat on a fresh pair of sessions before the candidate is kept.
        first = comparison
        backend.close()
        self.progress.status(f"{cand.label}: confirming on fresh sessions")
        fresh_best: Backend | None = None
        try:
            fresh_best = self._open(best)
            backend = self._open(cand)
            comparison = self._compare(fresh_best, backend, best.label, cand.label)
        except (KeyboardInterrupt, SystemExit):
            backend.close()
            raise
        except Exception as exc:
            backend.close()
            record.status, record.reason = "failed", f"confirmation benchmark failed: {_first_line(exc)}"
            return record, None, None, accuracy
        finally:
            if fresh_best is not None:
                fresh_best.close()
        record.details["confirmation"] = comparison.to_json()
        self._judge(record, comparison, best.label, best_speedup)
        if record.status != "kept":
            record.reason = (
                f"the first measurement's gain (ratio {first.ratio:.3f}) did not repeat on fresh sessions: "
                + record.reason
            )
        return record, backend, comparison, accuracy

    def _compare(self, a: Backend, b: Backend, label_a: str, label_b: str) -> Any:
        return self.compare_fn(
            a, b, self.feeds, self.feeds, self.settings,
            labels=(label_a, label_b), metric=self.metric,
            progress=self._bench_progress(f"{label_b} vs {label_a}"),
        )  # fmt: skip

    def _judge(self, record: StageRecord, comparison: Any, best_label: str, best_speedup: float) -> None:
        """Keep when faster by the recipe's minimum and with 95% confidence; say why not otherwise."""
        ratio = float(comparison.ratio)
        lo, hi = (float(x) for x in comparison.ratio_ci95)
        record.latency_ms = self._latency(comparison.b)
        record.ratio, record.ratio_ci95 = ratio, (lo, hi)
        record.speedup = best_speedup / ratio if ratio > 0 else None
        figures = f"{self.metric} ratio {ratio:.3f}, CI {lo:.3f}–{hi:.3f}"
        if hi < 1.0 and ratio <= 1.0 - self.recipe.min_improvement:
            record.status = "kept"
            record.reason = f"{1 / ratio:.2f}x faster than {best_label} ({figures})"
            if "confirmation" in record.details:
                record.reason += ", confirmed on fresh sessions"
            return
        record.status = "rejected"
        if lo > 1.0:
            record.reason = f"slower than {best_label} ({figures})"
        elif hi >= 1.0:
            record.reason = f"not faster than {best_label} with confidence ({figures})"
        else:
            record.reason = f"gain below the recipe's {self.recipe.min_improvement:.0%} minimum ({figures})"

    # -- the end --------------------------------------------------------------------------------

    def _finish(
        self,
        baseline: Candidate,
        base_meas: Any,
        best: Candidate,
        best_accuracy: AccuracyResult,
        kept_chain: list[dict[str, Any]],
    ) -> PipelineResult:
        from optimize.artifact import write_artifact
        from optimize.report import new_report, render_markdown, write_report

        final: dict[str, Any] | None = None
        if best is baseline:
            best_meas = base_meas
            speedup, speedup_ci = 1.0, (1.0, 1.0)
        else:
            # The headline number: the artifact against the baseline, interleaved, in this run.
            self.progress.status(f"final: {best.label} vs baseline, side by side")
            base_backend = self._open(baseline)
            best_backend = self._open(best)
            try:
                comparison = self.compare_fn(
                    base_backend, best_backend, self.feeds, self.feeds, self.settings,
                    labels=("baseline", best.label), metric=self.metric,
                    progress=self._bench_progress("final comparison"),
                )  # fmt: skip
            finally:
                base_backend.close()
                best_backend.close()
            best_meas = comparison.b
            final = comparison.to_json()
            speedup = 1.0 / comparison.ratio
            lo, hi = comparison.ratio_ci95
            speedup_ci = (1.0 / hi, 1.0 / lo)
            self._results += [comparison.a.to_json(), comparison.b.to_json()]
            self._results[-2]["label"] = "baseline (final comparison)"
            self._results[-1]["label"] = f"{best.label} (final comparison)"
            if lo > 1.0:
                # Every kept step won its own comparisons, yet side by side with the original the
                # result is slower: ship the original rather than a model we measured to lose.
                self.warnings.append(
                    f"{best.label} measured slower than the baseline in the final side-by-side comparison "
                    f"(speedup {speedup:.2f}x, CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}); "
                    "the artifact is the original model"
                )
                best, best_meas, best_accuracy, kept_chain = baseline, comparison.a, best_accuracy, []
                speedup, speedup_ci = 1.0, (1.0, 1.0)

        if best is not baseline:
            # The target verdict is about what the user's application gets: the artifact alone in
            # its process. Interleaved with another session (the comparisons above) the two thread
            # pools spin against each other on few cores, which inflates both sides' latency; that
            # cancels in a ratio but not in an absolute number.
            self.progress.status(f"final: {best.label} alone, for the target verdict")
            alone = self._open(best)
            try:
                best_meas = self.measure_fn(
                    alone, self.feeds, self.settings, best.label,
                    progress=self._bench_progress("final, alone"),
                )  # fmt: skip
            finally:
                alone.close()
            self._results.append({**best_meas.to_json(), "label": f"{best.label} (alone, for the target)"})

        target = self.request.target_ms
        value, lo_v, hi_v = percentile_ci(best_meas.samples_ms, self.metric)
        if target is None:
            verdict, exit_code, met = "no target given", EXIT_TARGET_MET, None
        elif value <= target:
            verdict, exit_code, met = (
                f"target met: {self.metric} {value:.3f} ms <= {target:g} ms",
                EXIT_TARGET_MET,
                True,
            )
        else:
            verdict, exit_code, met = (
                f"target missed: best {self.metric} {value:.3f} ms > {target:g} ms",
                EXIT_TARGET_MISSED,
                False,
            )

        accuracy = (
            accuracy_json(best_accuracy)
            if best is not baseline
            else accuracy_json(check(self.reference, self.reference, self.recipe.accuracy))
        )
        section = {
            "partial": False,
            "recipe": self.recipe.to_json(),
            "model_kind": self.model_kind,
            "target": {
                "ms": target,
                "percentile": self.metric,
                "batch_size": self.input_spec.batch_size,
                "met": met,
                "best_ms": value,
                "best_ms_ci95": [lo_v, hi_v],
            },
            "verdict": verdict,
            "exit_code": exit_code,
            "best": {
                "label": best.label,
                "backend": best.backend,
                "runtime_config": best.runtime_config,
                "precision": best.precision,
                "kept_stages": [c["stage"] for c in kept_chain],
            },
            "speedup": speedup,
            "speedup_ci95": list(speedup_ci),
            "final_comparison": final,
            "baseline": self.records[0].latency_ms,
            "stages": [r.to_json() for r in self.records],
            "accuracy": accuracy,
            "accuracy_samples": len(self.samples),
            "external_data": self.external_data,
            "artifact": str(self.out_dir),
            "warnings": self.warnings + list(getattr(self.input_spec, "warnings", [])),
            "log": self.logs[-200:],
            "elapsed_s": round(time.monotonic() - self._started, 3),
        }
        settings = {
            "bench": self.settings.to_json(),
            "recipe": self.recipe.name,
            "target_ms": target,
            "target_percentile": self.metric,
            "quantize": self.request.quantize,
            "time_budget_s": self.request.time_budget_s,
            "stop_at_target": self.request.stop_at_target,
        }
        report = new_report(
            "optimize",
            model_path=self.request.model_path,
            input_spec=self.input_spec.to_json(),
            settings=settings,
        )
        report["results"] = list(self._results)
        report["optimize"] = _json_safe(section)
        report_md = render_markdown(report)
        self.progress.status(f"writing the artifact to {self.out_dir}")
        write_artifact(
            self.out_dir,
            candidate=best,
            input_spec=self.input_spec.to_json(),
            outputs=self.outputs_spec,
            history=[r.to_json() for r in self.records],
            accuracy=section["accuracy"],
            chain_details=kept_chain,
            report=report,
            report_md=report_md,
            extra={
                "source_model": report["model"],
                "target": section["target"],
                "speedup": speedup,
                "speedup_ci95": list(speedup_ci),
                "recipe": self.recipe.name,
            },
            report_writer=write_report,
            force=self.request.force,
        )
        partial_report_path(self.out_dir).unlink(missing_ok=True)
        return PipelineResult(report, self.records, best, exit_code, self.out_dir, verdict)

    def _best_so_far(self) -> dict[str, Any] | None:
        """The best accurate candidate when the run stopped (the last kept one, else the
        baseline), with its figures and how to get it without the rest of the run."""
        kept = [r for r in self.records if r.status in ("kept", "baseline")]
        if not kept:
            return None
        best = kept[-1]
        p50 = (best.latency_ms or {}).get("p50")
        figures = ", ".join(
            x
            for x in (
                f"{best.speedup:.2f}x vs the baseline" if best.speedup else "",
                f"p50 {p50:.3f} ms" if p50 is not None else "",
                f"accuracy {accuracy_cell(best.accuracy)}" if best.status == "kept" else "",
            )
            if x
        )
        if best.status == "baseline":
            summary = "no candidate had beaten the original model yet"
        else:
            summary = (
                f"best accurate candidate so far: {best.label} ({figures}); to get it, rerun with "
                f"--stop-at-target or a --time-budget that ends after {best.stage}"
            )
        return {**best.to_json(), "summary": summary}

    def _write_partial(self, exc: BaseException) -> None:
        """Ctrl-C or a crash: no artifact, but a report of what was done, beside where it would be."""
        from optimize import interrupts
        from optimize.files import write_json_atomic

        if isinstance(exc, UsageError) and not self.records:
            return  # bad inputs found before the baseline ran: the one-line error says it all
        path = partial_report_path(self.out_dir)
        reason = interrupts.describe(exc) if isinstance(exc, KeyboardInterrupt) else _first_line(exc)
        best = self._best_so_far()
        section = {
            "partial": True,
            "stopped_by": reason,
            "best_so_far": best,
            "recipe": self.recipe.to_json(),
            "stages": [r.to_json() for r in self.records],
            "warnings": self.warnings,
            "log": self.logs[-200:],
            "elapsed_s": round(time.monotonic() - self._started, 3),
        }
        with contextlib.suppress(Exception):
            from optimize.report import new_report, write_report

            spec = getattr(self, "input_spec", None)
            report = new_report(
                "optimize",
                model_path=self.request.model_path,
                input_spec=spec.to_json() if spec is not None else None,
                settings={"recipe": self.recipe.name, "target_ms": self.request.target_ms},
            )
            report["results"] = list(self._results)
            report["optimize"] = _json_safe(section)
            write_report(path, report)
            self.progress.log(f"no artifact written; partial report: {path}")
            if best is not None:
                self.progress.log(best["summary"])
            return
        with contextlib.suppress(Exception):  # the schema or environment failed: keep the facts anyway
            write_json_atomic(path, {"kind": "optimize", "optimize": _json_safe(section)})
            self.progress.log(f"no artifact written; partial report: {path}")


def optimize(
    request: OptimizeRequest,
    *,
    progress: Progress | None = None,
    stage_factory: StageFactory | None = None,
    measure_fn: MeasureFn | None = None,
    compare_fn: CompareFn | None = None,
    known_stages: Sequence[str] | None = None,
) -> PipelineResult:
    """Run `lto optimize` for `request`: choose the recipe, run the pipeline, write the artifact."""
    request.validate()
    recipe, kind = choose_recipe(request, known_stages=known_stages)
    notes = apply_overrides(recipe, request)
    pipeline = Pipeline(
        request,
        recipe,
        model_kind=kind,
        stage_factory=stage_factory,
        measure_fn=measure_fn,
        compare_fn=compare_fn,
        progress=progress,
        recipe_notes=notes,
    )
    return pipeline.run()


# -- rendering -----------------------------------------------------------------------------------


def _fmt_ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def accuracy_cell(acc: Mapping[str, Any] | None) -> str:
    if not acc:
        return "–"
    worst = acc.get("worst") or {}
    if acc.get("reason") == "reference":
        return "reference"
    if not worst:
        return "–"
    parts = []
    if "cosine" in worst:
        cos = worst["cosine"]
        parts.append(f"cos {cos:.6f}" if isinstance(cos, float) else f"cos {cos}")
    if "top1_agreement" in worst:
        strict, tolerant = (
            worst["top1_agreement"],
            worst.get("top1_agreement_tolerant", worst["top1_agreement"]),
        )
        parts.append(
            f"top1 {strict:.2f}"
            if tolerant == strict
            else f"top1 {tolerant:.2f} outside near-ties ({strict:.2f} strict)"
        )
    if "max_abs" in worst:
        mab = worst["max_abs"]
        parts.append(f"abs {mab:.2g}" if isinstance(mab, float) else f"abs {mab}")
    return ", ".join(parts)


def table_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the final table: stage, status, p50, p99, speedup, accuracy, reason."""
    rows = []
    for r in section.get("stages", []):
        lat = r.get("latency_ms") or {}
        speed = r.get("speedup_vs_baseline")
        rows.append(
            [
                r["label"],
                r["status"],
                _fmt_ms(lat.get("p50")),
                _fmt_ms(lat.get("p99")),
                f"{speed:.2f}x" if isinstance(speed, (int, float)) else "–",
                accuracy_cell(r.get("accuracy")),
                r.get("reason", ""),
            ]
        )
    return rows


TABLE_HEADER = ["stage", "status", "p50 ms", "p99 ms", "speedup", "accuracy", "reason"]
TABLE_NOTE = (
    "p50/p99 come from each candidate's own interleaved comparison and carry the machine's load at that "
    "moment; compare rows by speedup: the baseline's speedup chained through each candidate's ratio "
    "against the best so far. A candidate is kept only when it is accurate and faster by the recipe's "
    "minimum with its ratio's 95% CI below 1, twice (the second time on fresh sessions)."
)


def render_markdown_section(section: Mapping[str, Any]) -> str:
    """The optimize part of report.md (called by optimize.report.render_markdown)."""
    lines = ["## Optimization", ""]
    if section.get("partial"):
        lines += [f"**Partial report: the run stopped early ({section.get('stopped_by', 'unknown')}).** "
                  "No artifact was written.", ""]  # fmt: skip
        best = section.get("best_so_far")
        if best:
            lines += [f"- {best['summary']}", ""]
    recipe = section.get("recipe") or {}
    if recipe:
        kind = section.get("model_kind", "?")
        lines.append(f"- recipe: `{recipe.get('name')}` ({recipe.get('source')}); model kind: {kind}")
    if "verdict" in section:
        target = section["target"]
        lo, hi = target["best_ms_ci95"]
        lines.append(
            f"- verdict: **{section['verdict']}** (exit code {section['exit_code']}); best "
            f"{target['percentile']} {target['best_ms']:.3f} ms (95% CI {lo:.3f}–{hi:.3f}) "
            f"at batch {target['batch_size']}"
        )
        slo, shi = section["speedup_ci95"]
        lines.append(
            f"- artifact: `{section['best']['label']}` on {section['best']['backend']}, "
            f"**{section['speedup']:.2f}x** vs the ONNX Runtime default baseline "
            f"(95% CI {slo:.2f}–{shi:.2f}, measured side by side)"
        )
        acc = section.get("accuracy") or {}
        samples = section.get("accuracy_samples")
        lines.append(f"- accuracy of the artifact on {samples} input samples: {accuracy_cell(acc)}")
        if section.get("external_data"):
            lines.append("- the model stores its weights as external data; the artifact carries them")
    lines += ["", "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for row in table_rows(section):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines += [
        "",
        TABLE_NOTE,
    ]
    warnings = section.get("warnings") or []
    if warnings:
        lines += ["", "Warnings:", *[f"- {w}" for w in warnings]]
    return "\n".join(lines) + "\n"


__all__ = [
    "EXIT_FAILURE",
    "EXIT_TARGET_MET",
    "EXIT_TARGET_MISSED",
    "EXIT_USAGE",
    "OptimizeRequest",
    "Pipeline",
    "PipelineResult",
    "Progress",
    "StageRecord",
    "optimize",
    "parse_duration",
    "render_markdown_section",
    "table_rows",
]
