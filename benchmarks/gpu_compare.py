"""TensorRT vs ONNX Runtime CUDA vs ONNX Runtime CPU on one model, measured side by side in one run.

    python -m benchmarks.gpu_compare [--model sample_models/resnet_tiny.onnx] [--batch 1]
                                     [--out reports/gpu-check/gpu-compare.json] [--require-gpu]

Builds fp32 and fp16 TensorRT engines (fp16 = the graph converted to float16, float32 I/O kept),
then compares each GPU backend against ONNX Runtime on the CPU with `optimize.bench.compare`
(interleaved chunks, bootstrap CI of the median ratio) and checks its outputs against the CPU's.
Every GPU latency includes the host<->device copies of inputs and outputs.

A backend that cannot run here (no GPU, onnxruntime-gpu missing, TensorRT missing) is recorded
with its reason; `--require-gpu` makes a missing TensorRT or ONNX Runtime CUDA result exit code 1
(scripts/gpu_check.sh uses it). ONNX Runtime's TensorRT EP is measured when it loads, never required.
Prints a table of medians and speed-ups over the CPU, and writes a `compare` report (JSON + Markdown).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from optimize.bench import BenchSettings, compare, measure
from optimize.data import resolve_inputs
from optimize.errors import LtoError
from optimize.files import write_text_atomic
from optimize.render.markdown import render_markdown
from optimize.report import new_report, write_report
from optimize.runtimes.backends import open_backend
from optimize.system.gpu import gpu_status

ROOT = Path(__file__).resolve().parent.parent


def output_agreement(want: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out = {}
    for name, ref in want.items():
        a = ref.astype(np.float64).ravel()
        b = got[name].astype(np.float64).ravel()
        denom = float(np.linalg.norm(a) * np.linalg.norm(b))
        out[name] = {
            "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0,
            "cosine": float(a @ b / denom) if denom else 1.0,
        }
    return out


def build_engines(
    model: Path, feeds: dict[str, np.ndarray], work: Path
) -> tuple[dict[str, Path], dict[str, str]]:
    """fp32 and fp16 engines for the benchmark shapes; failures are returned as reasons."""
    from optimize.runtimes.tensorrt.build_stage import convert_fp16, default_cache_dir
    from optimize.runtimes.tensorrt.engine import (
        BuildSettings,
        ShapeRange,
        build_engine,
        import_runtime,
        timing_cache_file,
    )

    engines: dict[str, Path] = {}
    failed: dict[str, str] = {}
    try:
        trt, runtime = import_runtime("auto")
    except LtoError as exc:
        return engines, {"tensorrt-fp32": exc.one_line(), "tensorrt-fp16": exc.one_line()}
    status = gpu_status()
    profile = {name: ShapeRange(a.shape, a.shape, a.shape) for name, a in feeds.items()}
    cache = timing_cache_file(default_cache_dir({}), runtime, str(trt.__version__), status)
    sources = {"fp32": model}
    try:
        convert_fp16(model, work / "model_fp16.onnx")
        sources["fp16"] = work / "model_fp16.onnx"
    except Exception as exc:  # the converter raises whatever its graph walk hits
        failed["tensorrt-fp16"] = f"fp16 conversion failed: {exc}"
    for precision, src in sources.items():
        started = time.perf_counter()
        try:
            result = build_engine(src, work / f"model_{precision}.engine", profile,
                                  BuildSettings(runtime=runtime, timing_cache=cache, precision=precision),
                                  status, log_path=work / f"tensorrt_{precision}.log")  # fmt: skip
        except LtoError as exc:
            failed[f"tensorrt-{precision}"] = exc.one_line()
            continue
        took = time.perf_counter() - started
        print(f"built {precision} engine with {runtime} {trt.__version__} in {took:.1f} s")
        engines[precision] = result.engine_path
    return engines, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "sample_models" / "resnet_tiny.onnx")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-time-s", type=float, default=12.0, help="time budget of each comparison")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu-check" / "gpu-compare.json")
    ap.add_argument("--require-gpu", action="store_true", help="exit 1 unless every GPU backend ran")
    args = ap.parse_args()

    work = args.out.parent / "work"
    work.mkdir(parents=True, exist_ok=True)
    spec, feeds = resolve_inputs(args.model, {}, batch=args.batch)
    settings = BenchSettings(warmup=20, min_runs=50, max_time_s=args.max_time_s, target_ci_rel=0.01)
    status = gpu_status()
    print(f"GPU: {status.device.name + ' (sm ' + status.device.sm + ')' if status.device else status.reason}")

    engines, unavailable = build_engines(args.model, feeds, work)
    candidates: list[tuple[str, str, Path, dict[str, Any]]] = [
        ("onnxruntime-cuda", "onnxruntime-cuda", args.model, {"allow_cpu_nodes": True}),
        ("onnxruntime-trt", "onnxruntime-trt", args.model, {"allow_cpu_nodes": True}),
    ]
    for precision, path in engines.items():
        candidates.append((f"tensorrt-{precision}", "tensorrt", path, {}))
        candidates.append((f"tensorrt-{precision}+graph", "tensorrt", path, {"cuda_graph": True}))

    cpu = open_backend("onnxruntime", args.model, {})
    reference = cpu.run(feeds)
    results: list[dict[str, Any]] = []
    baseline = measure(cpu, feeds, settings, label="onnxruntime-cpu")
    baseline.extra = {"describe": cpu.describe()}
    results.append(baseline.to_json())
    rows = [("onnxruntime-cpu", baseline.latency["p50"], 1.0, None, "")]
    comparisons = []
    for label, kind, path, config in candidates:
        try:
            backend = open_backend(kind, path, config)
        except LtoError as exc:
            unavailable[label] = exc.one_line()
            print(f"{label}: unavailable: {exc.one_line()}")
            continue
        with backend:
            agreement = output_agreement(reference, backend.run(feeds))
            cmp = compare(
                cpu, backend, feeds, settings=settings, labels=(f"onnxruntime-cpu (vs {label})", label)
            )
            cmp.b.extra = {"describe": backend.describe(), "agreement_with_cpu": agreement}
        results += [cmp.a.to_json(), cmp.b.to_json()]
        comparisons.append({**cmp.to_json(), "agreement_with_cpu": agreement})
        worst = max(v["max_abs"] for v in agreement.values())
        rows.append((label, cmp.b.latency["p50"], 1.0 / cmp.ratio, cmp.ratio_ci95, f"max|diff| {worst:.2g}"))

    # A `compare` report's headline is the fastest GPU backend against the CPU; all pairs are in gpu_compare.
    kind = "compare" if comparisons else "bench"
    report = new_report(kind, model_path=args.model, input_spec=spec.to_json(), settings=settings.to_json())
    report["results"] = results
    if comparisons:
        report["comparison"] = min(comparisons, key=lambda c: c["ratio"])
    report["gpu_compare"] = {
        "baseline": "onnxruntime-cpu",
        "gpu": status.to_json(),
        "comparisons": comparisons,
        "unavailable": unavailable,
        "host_device_copies_in_timing": True,
    }
    write_report(args.out, report)
    md = render_markdown(report)
    table = [
        "",
        "## GPU comparison",
        "",
        "| backend | p50 ms | speed-up vs CPU (95% CI) | outputs |",
        "|---|---|---|---|",
    ]
    for label, p50, speedup, ci, note in rows:
        ci_text = f" ({1.0 / ci[1]:.2f}-{1.0 / ci[0]:.2f})" if ci else ""
        table.append(f"| {label} | {p50:.3f} | {speedup:.2f}x{ci_text} | {note} |")
    for label, reason in unavailable.items():
        table.append(f"| {label} | - | unavailable | {reason} |")
    write_text_atomic(args.out.with_suffix(".md"), md + "\n".join(table) + "\n")
    print("\n".join(table[2:]))
    print(f"report: {args.out} and {args.out.with_suffix('.md')}")
    # ONNX Runtime's TensorRT EP is reported but not required: onnxruntime-gpu links one TensorRT
    # major version (10 for 1.31) and the machine may well have another.
    missing = sorted(label for label in unavailable if label != "onnxruntime-trt")
    if args.require_gpu and missing:
        print(f"error: GPU backend(s) did not run: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
