"""tvm-tune: compile the model with Apache TVM (Relax) and tune its kernels with MetaSchedule.

The stage proposes one candidate, a tuned TVM library, and only when every kernel in it got a
tuned schedule: untuned TVM code is 100-300x slower than ONNX Runtime (docs/tvm.md#untuned-code).
Whether the candidate is kept is the pipeline's call, like for every stage.

Steps: pick a standard-op ONNX graph (the best standard candidate, else the original: the Relax
frontend cannot read com.microsoft ops) -> import with every dynamic dim pinned to the feeds'
shapes -> the one preprocessing recipe -> fuse -> extract tasks -> look up the tuning cache ->
tune what the budget allows, chunk by chunk, into the cached database -> apply the records
and count scheduled kernels -> build, run once, export a .so with its sidecar.

Options (recipe [stages.tvm-tune] or CLI):
    trials            new measured trials for the whole model (default 64; ~3 s each on 2 cores)
    time_budget_s     wall-clock budget for tuning; ctx.deadline (the stage's budget_s) also holds
    target            'host' (default: LLVM's detection of this CPU), a CPU name such as
                      'x86-64-v3' (a portable AVX2 artifact), or a JSON target dict
    rpc_tracker       HOST:PORT of a TVM RPC tracker: measure candidates on its devices
    rpc_key           the device key registered with that tracker
    cache_dir         tuning-record cache (default $LTO_CACHE_DIR/tvm or ~/.cache/lto/tvm)
    retune            ignore cached records and tune from scratch (default false)
    trials_per_iter, population_size, max_chunk_tasks, build_timeout_s, run_timeout_s,
    num_threads       search/measurement knobs (see optimize.runtimes.tvm.tuning.TuneSettings)
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from optimize.errors import message_line
from optimize.model.onnx_file import iter_nodes
from optimize.options import check_table
from optimize.runtimes.tvm import (
    INSTALL_HINT,
    check_tuning_dependencies,
    import_tvm,
    tvm_available,
    tvm_ffi_version,
    tvm_version,
)
from optimize.runtimes.tvm.cache import TuningCache, cache_key, default_cache_dir
from optimize.runtimes.tvm.cpu_target import resolve_cpu_target
from optimize.runtimes.tvm.relax_build import (
    RECIPE_VERSION,
    TvmImportError,
    build,
    count_scheduled,
    fuse,
    import_onnx,
)
from optimize.runtimes.tvm.sidecar import write_sidecar
from optimize.runtimes.tvm.spec import TUNE_OPTIONS
from optimize.runtimes.tvm.tuning import TuneProgress, TuneSettings, best_latencies_us, task_states, tune
from optimize.stage import Candidate, Stage, StageContext, StageSkipped
from optimize.system.env import machine_fingerprint
from optimize.units import clock_text

if TYPE_CHECKING:
    from optimize.runtimes.tvm.cpu_target import TargetInfo
    from optimize.runtimes.tvm.tuning import TaskState, TuneProgress, TuneSummary

DEFAULT_TRIALS = 64
# Time kept back from the budget for applying records, compiling and exporting.
_RESERVE_BASE_S = 20.0
_RESERVE_PER_TASK_S = 2.0


def _options(raw: dict[str, Any]) -> dict[str, Any]:
    """The stage's options, checked against the schema its spec declares (a recipe was checked
    against it already; options set from flags or by a caller are checked here)."""
    given = {k: v for k, v in raw.items() if k not in ("enabled", "budget_s", "run_when") and v is not None}
    return check_table("tvm-tune option ", "", given, TUNE_OPTIONS)


def compiler_available() -> bool:
    """export_library links with the system C++ compiler; without one it fails with a TypeError
    (docs/tvm.md#packages-and-toolchain)."""
    return bool(os.environ.get("CXX")) or any(shutil.which(c) for c in ("g++", "c++", "clang++", "gcc", "cc"))


def progress_line(p: TuneProgress) -> str:
    """One status line: tasks done/total, trials, best estimated latency, time left."""
    parts = [f"tasks {p.tasks_tuned}/{p.tasks_total} tuned", f"trials {p.trials_done}/{p.trials_planned}"]
    parts.append(f"est. {p.best_ms:.3g} ms" if p.best_ms is not None else "est. –")
    if p.time_left_s is not None:
        parts.append(f"{clock_text(max(0.0, p.time_left_s))} left")
    if p.build_errors or p.run_errors:
        parts.append(f"{p.build_errors} build / {p.run_errors} run errors")
    if p.current:
        parts.append("tuning " + ", ".join(p.current[:3]) + (" …" if len(p.current) > 3 else ""))
    return ", ".join(parts)


class TvmTuneStage(Stage):
    name: ClassVar[str] = "tvm-tune"
    description: ClassVar[str] = "Apache TVM: Relax build tuned with MetaSchedule (XGBoost cost model)"
    # TVM's FFI turns Ctrl-C into a RuntimeError and sometimes crashes on it: tune in a child.
    isolated: ClassVar[bool] = True

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:

        if not tvm_available():
            return f"apache-tvm is not installed ({INSTALL_HINT})"
        problem = check_tuning_dependencies()
        if problem:
            return problem
        if not compiler_available():
            return (
                "no C/C++ compiler on PATH (TVM links the exported library with one); install g++ or set CXX"
            )
        return None

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def source_model(ctx: StageContext) -> tuple[Path, str]:
        """The standard-op ONNX graph to compile, and a word on where it came from."""

        best = ctx.best_standard
        if best is not None and best.standard_ops and best.model_path.suffix == ".onnx":
            import onnx

            model = onnx.load(str(best.model_path), load_external_data=False)
            if all((n.domain or "ai.onnx") in ("ai.onnx", "ai.onnx.ml") for n in iter_nodes(model)):
                return best.model_path, best.label
        return ctx.original_model, "original"

    @staticmethod
    def _status(ctx: StageContext) -> Callable[[str], None]:
        # A live status line when the pipeline lends one (StageContext.status), else the log,
        # throttled so that a long tuning run does not flood it.
        status = getattr(ctx, "status", None)
        if callable(status):
            return status  # type: ignore[no-any-return]
        last = [0.0]

        def throttled(text: str) -> None:
            now = time.monotonic()
            if now - last[0] >= 15.0:
                last[0] = now
                ctx.log(text)

        return throttled

    # -- the run ------------------------------------------------------------------------------

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        opts = _options(ctx.options)

        started = time.monotonic()
        import_tvm(opts.get("num_threads"), for_tuning=True)
        info = resolve_cpu_target(opts.get("target"), opts.get("num_threads"))
        # MetaSchedule's runner workers measure with the thread pool this sets (they inherit it).
        os.environ["TVM_NUM_THREADS"] = str(opts.get("num_threads") or info.num_cores)
        source, source_label = self.source_model(ctx)
        ctx.log(f"compiling {source.name} ({source_label}) for {info.mcpu} ({info.num_cores} cores)")
        try:
            imported = import_onnx(source, ctx.feeds)
        except TvmImportError as exc:
            raise StageSkipped(str(exc)) from exc
        fused = fuse(imported.raw, info.target)
        states = task_states(fused, info.target)
        if not states:
            raise StageSkipped("TVM found no kernels to tune in this model")
        measured_on = f"rpc:{opts['rpc_key']}" if opts.get("rpc_tracker") else _fingerprint()
        key = cache_key(info.key, measured_on, RECIPE_VERSION, tvm_version(), [s.hash for s in states])
        cache_root = Path(opts["cache_dir"]).expanduser() if opts.get("cache_dir") else default_cache_dir()
        db_dir = ctx.workdir / "tuning"
        settings = TuneSettings(
            trials=int(opts.get("trials", DEFAULT_TRIALS)),
            time_budget_s=self._tuning_budget(opts, ctx, len(states)),
            rpc_tracker=opts.get("rpc_tracker"),
            rpc_key=opts.get("rpc_key"),
            num_threads=opts.get("num_threads"),
            seed=0,
        )
        for knob in (
            "trials_per_iter",
            "population_size",
            "max_chunk_tasks",
            "build_timeout_s",
            "run_timeout_s",
        ):
            if knob in opts:
                setattr(settings, knob, opts[knob])
        status = self._status(ctx)

        from tvm.s_tir import meta_schedule as ms

        with TuningCache(cache_root, key, on_wait=ctx.log) as cache:
            cache.checkout(db_dir)
            cached_meta = cache.read_meta()
            reused = cache.has_records() and not opts.get("retune", False)
            if not reused:
                for name in ("database_workload.json", "database_tuning_record.json"):
                    (db_dir / name).write_bytes(b"")
            else:
                cached_tasks_meta = cached_meta.get("tasks") or {}
                for state in states:
                    entry = cached_tasks_meta.get(state.hash) or {}
                    state.trials = int(entry.get("trials", 0))
                    state.budgeted = int(entry.get("budgeted", state.trials))
                best_latencies_us(ms.database.JSONDatabase(work_dir=str(db_dir)), states, info.target)
            cached_tasks = sum(1 for s in states if s.best_us is not None)
            uncovered = len(states) - cached_tasks
            if 0 < settings.trials < uncovered:
                ctx.warn(
                    f"{settings.trials} trials cannot give each of the {uncovered} kernels "
                    "without a record one measurement; the build will not be shipped (raise trials)"
                )
            if reused:
                ctx.log(f"tuning cache {cache.path}: records for {cached_tasks} of {len(states)} kernels")

            def publish(summary: TuneSummary) -> None:
                cache.publish(db_dir, self._meta(info, measured_on, states, summary))
                status(progress_line(_chunk_progress(summary)))

            summary = tune(
                states,
                info.target,
                db_dir,
                settings,
                on_progress=lambda p: status(progress_line(p)),
                on_chunk=publish,
            )
            if summary.chunks:
                # Once more with the final word on why tuning stopped.
                cache.publish(db_dir, self._meta(info, measured_on, states, summary))
        ctx.log(
            f"tuning: {summary.trials_measured} trials in {summary.chunks} chunks, {summary.wall_s:.0f} s "
            f"(stopped: {summary.stopped_by}); "
            f"{summary.build_errors} build errors, {summary.run_errors} run errors"
        )
        database = ms.database.JSONDatabase(work_dir=str(db_dir))
        applied = fuse(imported.raw, info.target, database)
        kernels = count_scheduled(applied)
        if kernels.scheduled < kernels.total:
            more_names = " …" if len(kernels.unscheduled) > 5 else ""
            ctx.warn(
                f"only {kernels.scheduled} of {kernels.total} kernels got a tuned schedule "
                f"(untuned: {', '.join(kernels.unscheduled[:5])}{more_names})"
            )
            if summary.stopped_by == "time":
                more = "the time budget ran out"
            elif summary.build_errors or summary.run_errors:
                more = f"{summary.build_errors} candidates failed to build and {summary.run_errors} to run"
            else:
                more = "the trial budget was too small"
            raise StageSkipped(
                f"{kernels.total - kernels.scheduled} of {kernels.total} TVM kernels have no tuned schedule "
                f"({more}); untuned TVM code is not shipped. The {summary.trials_measured} trials measured "
                f"are cached in {cache_root}: run again with more trials or time to continue"
            )
        ctx.log(f"applied tuned schedules to all {kernels.total} kernels")
        executable = build(applied, info.target)
        out_dir = ctx.workdir / "tvm"
        out_dir.mkdir(parents=True, exist_ok=True)
        library = out_dir / "model.so"
        try:
            executable.export_library(str(library))
        except Exception as exc:
            first = message_line(exc)
            raise StageSkipped(f"exporting the TVM library failed: {first.strip()}") from exc
        tuning_json = {
            **summary.to_json(),
            "cache": {"dir": str(cache_root), "key": key, "reused": reused, "kernels_cached": cached_tasks},
            "measured_on": measured_on,
            "recipe": RECIPE_VERSION,
        }
        sidecar = write_sidecar(
            library,
            inputs=imported.inputs,
            outputs=imported.outputs,
            target=info.spec,
            isa_requires=list(info.isa_requires),
            tvm_version=tvm_version(),
            tuning=tuning_json,
            kernels=kernels.to_json(),
        )
        precision = (
            ctx.best_standard.precision if source_label != "original" and ctx.best_standard else "fp32"
        )
        details = {
            "stage": self.name,
            "source": source_label,
            "target": info.spec,
            "mcpu": info.mcpu,
            "tvm_version": tvm_version(),
            "tvm_ffi_version": tvm_ffi_version(),
            "isa_requires": list(info.isa_requires),
            "kernels": kernels.to_json(),
            "tuning": tuning_json,
            "stage_wall_s": round(time.monotonic() - started, 2),
        }
        return [
            Candidate(
                label=self.name,
                model_path=library,
                backend="tvm",
                runtime_config={"num_threads": info.num_cores if info.host else 0, "process": "isolated"},
                standard_ops=False,
                precision=precision,
                details=details,
                extra_files=[sidecar],
            )
        ]

    @staticmethod
    def _tuning_budget(opts: dict[str, Any], ctx: StageContext, n_tasks: int) -> float | None:
        budget = opts.get("time_budget_s")
        if ctx.deadline is not None:
            left = ctx.deadline - time.monotonic() - (_RESERVE_BASE_S + _RESERVE_PER_TASK_S * n_tasks)
            budget = left if budget is None else min(float(budget), left)
        return None if budget is None else float(budget)

    @staticmethod
    def _meta(
        info: TargetInfo, measured_on: str, states: list[TaskState], summary: TuneSummary
    ) -> dict[str, Any]:
        return {
            "target": info.spec,
            "measured_on": measured_on,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tasks": {
                s.hash: {"name": s.name, "trials": s.trials, "budgeted": s.budgeted, "best_us": s.best_us}
                for s in states
            },
            "last_run": {k: v for k, v in summary.to_json().items() if k != "tasks"},
        }


def _fingerprint() -> str:

    return machine_fingerprint()


def _chunk_progress(summary: TuneSummary) -> TuneProgress:

    return TuneProgress(
        tasks_total=len(summary.tasks),
        tasks_tuned=sum(1 for t in summary.tasks if t.best_us is not None),
        trials_done=summary.trials_measured,
        trials_planned=summary.trials_planned,
        best_ms=summary.estimated_ms(),
        time_left_s=None,
        build_errors=summary.build_errors,
        run_errors=summary.run_errors,
    )
