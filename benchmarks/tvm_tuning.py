"""What TVM tuning buys on the sample models, at a stated trial budget, side by side with ONNX Runtime.

For each model, in one run:
  - ONNX Runtime (defaults, CPU EP) latency,
  - untuned TVM (Relax `zero` pipeline: legalized + fused, no schedules) latency,
  - tuned TVM latency after the tvm-tune stage with the given budget (fresh tuning cache),
  - the tuning wall time, and the wall time of a second stage run that reuses the database,
  - the largest output difference of the tuned build against ONNX Runtime.

Every engine is measured in its own child process (`optimize.bench.measure` runs inside the
child, so no inter-process overhead is in the latencies): TVM's and ORT's thread pools slow each
other down when they share a process. The IPC column is what one call through the tuned TVM
worker costs on top of the model (median of 200 calls, the child timing backend.run itself); the
pipeline's interleaved comparison pays it (see optimize/runtimes/worker.py).

    nice -n 10 .venv/bin/python -m benchmarks.tvm_tuning                       # all sample models
    nice -n 10 .venv/bin/python -m benchmarks.tvm_tuning --trials-per-task 4 --models mlp_small
    nice -n 10 .venv/bin/python -m benchmarks.tvm_tuning --json reports/tvm_tuning.json

Timings on a shared machine are noisy: read the ratios, and the stability column.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# Inputs pinned for the sample models' dynamic dims (batch 1; BERT at sequence 128).
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "bert_tiny": {"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)},
}


def _ctx(
    workdir: Path, model: Path, feeds: dict[str, np.ndarray], options: dict[str, Any], status: Any
) -> Any:
    from optimize.stage import Candidate, StageContext

    ctx = StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options=options,
        best_standard=Candidate("baseline", model),
        best_latency_ms=None,
        target_ms=None,
        deadline=None,
        check_accuracy=lambda c: None,  # type: ignore[arg-type, return-value]
        log=lambda text: status(text),
    )
    ctx.status = status  # type: ignore[attr-defined]  # the live line the stage updates while tuning
    return ctx


def untuned_library(model: Path, feeds: dict[str, np.ndarray], out_dir: Path) -> Path:
    """Build without any tuning records and export it like the stage does."""
    from optimize.runtimes.tvm import import_tvm, tvm_version
    from optimize.runtimes.tvm.cpu_target import resolve_cpu_target
    from optimize.runtimes.tvm.relax_build import build, count_scheduled, fuse, import_onnx
    from optimize.runtimes.tvm.sidecar import write_sidecar

    import_tvm(for_tuning=True)
    info = resolve_cpu_target()
    imported = import_onnx(model, feeds)
    fused = fuse(imported.raw, info.target)
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / "model.so"
    build(fused, info.target).export_library(str(library))
    write_sidecar(
        library,
        inputs=imported.inputs,
        outputs=imported.outputs,
        target=info.spec,
        isa_requires=list(info.isa_requires),
        tvm_version=tvm_version(),
        tuning=None,
        kernels=count_scheduled(fused).to_json(),
    )
    return library


def bench_one(name: str, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"lto-tvm-bench-{name}-"))
    try:
        return _bench_one(name, args, console, work)
    finally:
        if args.keep:
            console.print(f"{name}: work files (tuning logs, libraries) kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _bench_one(name: str, args: argparse.Namespace, console: Any, work: Path) -> dict[str, Any]:
    from optimize.bench import BenchSettings, measure_where_it_runs
    from optimize.data import resolve_inputs
    from optimize.runtimes.backends import open_in_worker
    from optimize.runtimes.tvm.backend import TvmBackend
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage
    from optimize.stage import StageSkipped

    model = ROOT / "sample_models" / f"{name}.onnx"
    _, feeds = resolve_inputs(model, SHAPES.get(name, {}), None, seed=0, batch=1)
    settings = BenchSettings(
        warmup=5, min_runs=20, max_runs=3000, max_time_s=args.bench_s, target_ci_rel=0.02
    )
    row: dict[str, Any] = {"model": name, "inputs": {k: list(v.shape) for k, v in feeds.items()}}
    cache_dir = work / "cache"  # fresh: the first stage run really tunes

    with console.status(f"{name}: ONNX Runtime") as live:

        def status(text: str) -> None:
            live.update(f"{name}: {text}")

        ort = open_in_worker("onnxruntime", model, {})
        try:
            reference = ort.run(feeds)
            row["ort"] = measure_where_it_runs(ort, feeds, settings, "onnxruntime").to_json()
        finally:
            ort.close()

        status("untuned TVM build")
        untuned = TvmBackend(untuned_library(model, feeds, work / "untuned"), {})
        try:
            row["tvm_untuned"] = measure_where_it_runs(untuned, feeds, settings, "tvm-untuned").to_json()
        finally:
            untuned.close()

        stage = TvmTuneStage()
        options: dict[str, Any] = {"trials": 0, "cache_dir": str(cache_dir)}
        ctx = _ctx(work / "run1", model, feeds, options, status)
        reason = stage.skip_reason(ctx.best_standard, ctx)
        if reason:
            row["skipped"] = reason
            return row
        from optimize.runtimes.tvm import import_tvm
        from optimize.runtimes.tvm.cpu_target import resolve_cpu_target
        from optimize.runtimes.tvm.relax_build import fuse, import_onnx
        from optimize.runtimes.tvm.tuning import task_states

        import_tvm(for_tuning=True)
        info = resolve_cpu_target()
        n_tasks = len(task_states(fuse(import_onnx(model, feeds).raw, info.target), info.target))
        trials = args.trials_per_task * n_tasks
        options.update(trials=trials, trials_per_iter=min(args.trials_per_task, 8))
        if args.population:
            options["population_size"] = args.population
        row["budget"] = {
            "tasks": n_tasks,
            "trials": trials,
            "trials_per_task": args.trials_per_task,
            "population_size": args.population or "default",
        }
        t0 = time.monotonic()
        try:
            cand = stage.run(ctx.best_standard, ctx)[0]
        except StageSkipped as exc:
            row["skipped"] = str(exc)
            return row
        row["tune_wall_s"] = time.monotonic() - t0
        row["tuning"] = {k: v for k, v in cand.details["tuning"].items() if k != "tasks"}

        status("second run (tuning cache)")
        ctx2 = _ctx(work / "run2", model, feeds, dict(options), status)
        t0 = time.monotonic()
        cand2 = stage.run(ctx2.best_standard, ctx2)[0]
        row["second_run_wall_s"] = time.monotonic() - t0
        row["second_run_trials"] = cand2.details["tuning"]["trials_measured"]

        status("tuned TVM")
        tuned = TvmBackend(cand.model_path, cand.runtime_config)
        try:
            outputs = tuned.run(feeds)
            row["max_abs_diff_vs_ort"] = max(
                float(np.max(np.abs(outputs[k].astype(np.float64) - reference[k]))) for k in reference
            )
            row["tvm_tuned"] = measure_where_it_runs(tuned, feeds, settings, "tvm-tuned").to_json()
            # What a call through the worker costs on top of the model (the pipeline's interleaved
            # comparison pays it): paired per call, the child times backend.run itself.
            overheads = []
            for _ in range(200):
                tuned.run(feeds)
                overheads.append(tuned.last_overhead_ms)
            row["ipc_overhead_ms"] = {
                "p50": float(np.median(overheads)),
                "p90": float(np.percentile(overheads, 90)),
            }
        finally:
            tuned.close()
    return row


def _p50(row: dict[str, Any], key: str) -> float | None:
    entry = row.get(key)
    return None if entry is None else float(entry["latency_ms"]["p50"])


def render(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="TVM tuning vs ONNX Runtime (p50 ms, each engine in its own process)")
    for col in ("model", "tasks", "trials", "ORT", "TVM untuned", "TVM tuned", "tuned/ORT",
                "untuned/tuned", "tune wall s", "2nd run s", "max |diff|", "IPC p50 ms"):  # fmt: skip
        table.add_column(col, justify="right" if col != "model" else "left")
    for row in rows:
        ort, untuned, tuned = _p50(row, "ort"), _p50(row, "tvm_untuned"), _p50(row, "tvm_tuned")
        ipc = row.get("ipc_overhead_ms", {}).get("p50")
        budget = row.get("budget", {})
        table.add_row(
            row["model"],
            str(budget.get("tasks", "–")),
            str(row.get("tuning", {}).get("trials_measured", "–")),
            f"{ort:.3f}" if ort else "–",
            f"{untuned:.2f}" if untuned else "–",
            f"{tuned:.3f}" if tuned else "–",
            f"{tuned / ort:.2f}x" if tuned and ort else "–",
            f"{untuned / tuned:.0f}x" if tuned and untuned else "–",
            f"{row['tune_wall_s']:.0f}" if "tune_wall_s" in row else "–",
            f"{row['second_run_wall_s']:.1f}" if "second_run_wall_s" in row else "–",
            f"{row['max_abs_diff_vs_ort']:.1e}" if "max_abs_diff_vs_ort" in row else "–",
            f"{ipc:.3f}" if ipc is not None else "–",
        )
    console.print(table)
    for row in rows:
        if "skipped" in row:
            console.print(f"[yellow]{row['model']}: no tuned build: {row['skipped']}[/]")
        unstable = [
            k for k in ("ort", "tvm_untuned", "tvm_tuned") if k in row and not row[k]["stability"]["stable"]
        ]
        if unstable:
            console.print(f"[yellow]{row['model']}: unstable measurements: {', '.join(unstable)}[/]")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["mlp_small", "resnet_tiny", "bert_tiny"])
    parser.add_argument(
        "--trials-per-task", type=int, default=2, help="trial budget = this x the model's tasks"
    )
    parser.add_argument(
        "--population", type=int, help="evolutionary search population (default: the stage's)"
    )
    parser.add_argument("--bench-s", type=float, default=3.0, help="time cap of each latency measurement")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the work folders (tuning logs, libraries)")
    args = parser.parse_args()
    from rich.console import Console

    console = Console(stderr=True)
    rows = []
    for name in args.models:
        rows.append(bench_one(name, args, console))
        render(rows[-1:], Console(stderr=True, width=200))
    render(rows, Console(width=200))
    if args.json:
        from optimize.files import write_json_atomic

        write_json_atomic(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
