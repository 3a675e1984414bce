"""Run `lto optimize` on the sample models and print what each artifact gains over plain ONNX Runtime.

For every sample model this script:
1. runs `lto optimize MODEL --json` (no target, so every enabled stage is tried);
2. reads the pipeline's own final figure: artifact vs the ORT-default baseline, interleaved, same run;
3. re-measures independently: loads the artifact through `load_artifact` (hash + CPU checks) with its
   stored runtime configuration and compares it with the original model on ORT defaults, interleaved
   A/B in this process (optimize.bench.compare);
4. prints the accuracy figures the pipeline recorded for the artifact.

    .venv/bin/python -m benchmarks.optimize_speedups [--models resnet_tiny,bert_tiny,mlp_small] [--time 5]

Numbers are ratios of medians measured side by side; on a shared machine absolute milliseconds drift,
ratios much less.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
MODELS: dict[str, list[str]] = {
    "resnet_tiny": [],
    "bert_tiny": ["--shape", "sequence=128"],
    "mlp_small": [],
}


def run_optimize(name: str, extra: list[str], out_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "optimize", "optimize", str(SAMPLES / f"{name}.onnx"), *extra,
           "-o", str(out_dir), "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"lto optimize {name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def remeasure(name: str, extra: list[str], out_dir: Path, max_time_s: float) -> tuple[float, float, float]:
    """Artifact vs original on ORT defaults, interleaved here; returns speedup and its 95% CI."""
    from optimize.artifact import load_artifact
    from optimize.bench import BenchSettings, compare
    from optimize.data import parse_shape_args, resolve_inputs
    from optimize.runtimes.backends import open_backend

    shapes = parse_shape_args([extra[i + 1] for i, a in enumerate(extra) if a == "--shape"])
    model = SAMPLES / f"{name}.onnx"
    _, feeds = resolve_inputs(model, shapes, None, batch=1)
    art = load_artifact(out_dir)
    base = open_backend("onnxruntime", model, {})
    best = open_backend(art.backend, art.model_path, art.runtime_config)
    try:
        settings = BenchSettings(
            warmup=20, min_runs=200, max_runs=100_000, max_time_s=max_time_s, target_ci_rel=0.01
        )
        result = compare(base, best, feeds, feeds, settings, labels=("ort-default", "artifact"))
    finally:
        base.close()
        best.close()
    lo, hi = result.ratio_ci95
    return 1.0 / result.ratio, 1.0 / hi, 1.0 / lo


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated sample model names")
    parser.add_argument("--time", type=float, default=5.0, help="seconds per independent re-measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench-optimize")
    args = parser.parse_args()

    rows = []
    for name in args.models.split(","):
        if not (SAMPLES / f"{name}.onnx").exists():
            print(f"{name}: sample model missing (python sample_models/build.py)", file=sys.stderr)
            continue
        out_dir = args.out / name
        print(f"[{name}] lto optimize ...", file=sys.stderr, flush=True)
        report = run_optimize(name, MODELS[name], out_dir)
        section = report["optimize"]
        print(f"[{name}] independent side-by-side re-measurement ...", file=sys.stderr, flush=True)
        speedup, lo, hi = remeasure(name, MODELS[name], out_dir, args.time)
        worst = section["accuracy"].get("worst", {})
        rows.append(
            {
                "model": name,
                "recipe": section["recipe"]["name"],
                "artifact": section["best"]["label"],
                "kept": ", ".join(section["best"]["kept_stages"]) or "(none)",
                "baseline_p50": section["baseline"]["p50"],
                "pipeline_speedup": section["speedup"],
                "pipeline_ci": section["speedup_ci95"],
                "speedup": speedup,
                "ci": (lo, hi),
                "cosine": worst.get("cosine"),
                "max_abs": worst.get("max_abs"),
                "top1": worst.get("top1_agreement"),
                "top1_tolerant": worst.get("top1_agreement_tolerant"),
                "stages": [(s["label"], s["status"], s["reason"]) for s in section["stages"]],
            }
        )

    print()
    print(
        "| model | recipe | artifact | stages kept | speedup (pipeline, 95% CI) "
        "| speedup (re-measured, 95% CI) | worst cosine | max abs | top-1 outside near-ties (strict) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        top1 = "–"
        if isinstance(r["top1"], float):
            top1 = f"{r['top1_tolerant']:.2f} ({r['top1']:.2f})"
        cos = f"{r['cosine']:.6f}" if isinstance(r["cosine"], float) else str(r["cosine"])
        mab = f"{r['max_abs']:.3g}" if isinstance(r["max_abs"], float) else str(r["max_abs"])
        print(
            f"| {r['model']} | {r['recipe']} | {r['artifact']} | {r['kept']} | "
            f"{r['pipeline_speedup']:.2f}x ({r['pipeline_ci'][0]:.2f}–{r['pipeline_ci'][1]:.2f}) | "
            f"{r['speedup']:.2f}x ({r['ci'][0]:.2f}–{r['ci'][1]:.2f}) | {cos} | {mab} | {top1} |"
        )
    print()
    for r in rows:
        print(f"{r['model']}:")
        for label, status, reason in r["stages"]:
            print(f"  {status:>8}  {label}: {reason}")


if __name__ == "__main__":
    main()
