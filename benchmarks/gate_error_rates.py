"""How often does `lto gate --rerun` get it wrong on this machine?

Over repeated trials it compares
  * a model with itself: any "regressed" is a false alarm;
  * the model with a copy that does measurably more work (benchmarks/slow_model.py: same
    outputs, +N% MACs): anything but "regressed" is a miss;
and prints both rates with the settings, the verdict counts and the slowdown of the slower
copy as measured side by side in the same runs.

    nice python -m benchmarks.gate_error_rates                      # resnet_tiny, 20 trials, +15%
    nice python -m benchmarks.gate_error_rates --model sample_models/mlp_small.onnx --trials 10
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.slow_model import make_slower
from optimize.data import parse_shape_args
from optimize.gate import (
    REGRESSED,
    GateSettings,
    RerunRequest,
    gate_rerun,
    parse_fraction,
    rerun_bench_settings,
)

ROOT = Path(__file__).resolve().parent.parent


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of a rate from k events in n trials (honest for k = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=ROOT / "sample_models" / "resnet_tiny.onnx")
    parser.add_argument("--shape", action="append", default=[], help="as for lto: NAME=DxD (repeatable)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--extra", default="15%", help="extra compute of the slower copy (MACs)")
    parser.add_argument(
        "--time", type=float, default=3.0, help="seconds per interleaved run (lto gate --time)"
    )
    parser.add_argument("--max-regression", default="5%")
    parser.add_argument("--metric", default="p50")
    args = parser.parse_args()

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    extra = parse_fraction(args.extra, "--extra")
    settings = GateSettings(metric=args.metric, max_regression=parse_fraction(args.max_regression))
    bench = rerun_bench_settings(args.time)
    shapes = parse_shape_args(args.shape) or {"batch": (1,)}
    with tempfile.TemporaryDirectory() as tmp:
        slow = Path(tmp) / f"{args.model.stem}_plus{extra:.0%}.onnx"
        layers = make_slower(args.model, slow, extra)
        same_verdicts: Counter[str] = Counter()
        slow_verdicts: Counter[str] = Counter()
        slow_changes: list[float] = []
        same_changes: list[float] = []
        loads: list[float] = []
        started = time.monotonic()
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("trials", total=args.trials)
            for trial in range(args.trials):
                # Alternate which comparison goes first, so drift over the session hits both alike.
                order = [("same", args.model), ("slow", slow)]
                for kind, candidate in order if trial % 2 == 0 else order[::-1]:
                    request = RerunRequest(args.model, candidate, shapes=shapes, bench=bench)
                    result, _ = gate_rerun(request, GateSettings(**{**settings.to_json(), "seed": trial}))
                    # Every interleaved run's own change, confirmation runs included.
                    changes = [r["change"] for r in result.interleaved_runs if r.get("change") is not None]
                    loads += [r["foreign_cpu_fraction"] for r in result.interleaved_runs
                              if r.get("foreign_cpu_fraction") is not None]  # fmt: skip
                    if kind == "same":
                        same_verdicts[result.verdict] += 1
                        same_changes += changes
                    else:
                        slow_verdicts[result.verdict] += 1
                        slow_changes += changes
                progress.advance(task)
        elapsed = time.monotonic() - started

    n = args.trials
    false_alarms = same_verdicts[REGRESSED]
    misses = n - slow_verdicts[REGRESSED]
    fa_lo, fa_hi = wilson(false_alarms, n)
    mi_lo, mi_hi = wilson(misses, n)
    console.print(f"[bold]lto gate --rerun error rates[/] on {args.model.name}, {n} trials, {elapsed:.0f} s")
    console.print(
        f"settings: metric {settings.metric}, max regression {settings.max_regression:.0%}, "
        f"alpha {settings.alpha}, {settings.resamples} bootstrap resamples, --time {args.time:g} s per run, "
        f"confirmation run on regressed; slower copy = +{extra:.0%} MACs ({layers} extra MatMul+Tanh layers)"
    )
    if loads:
        console.print(
            f"other processes used {np.median(loads):.0%} of the CPU during a run (median; "
            f"range {min(loads):.0%}..{max(loads):.0%}); this script ran under nice: {os.nice(0)}"
        )
    console.print(
        f"model vs itself:     false alarms {false_alarms}/{n} = {false_alarms / n:.0%} "
        f"(95% CI {fa_lo:.0%}..{fa_hi:.0%}); verdicts {dict(same_verdicts)}; "
        f"measured change median {np.median(same_changes):+.1%} "
        f"(range {min(same_changes):+.1%}..{max(same_changes):+.1%})"
    )
    console.print(
        f"model vs +{extra:.0%} copy: misses {misses}/{n} = {misses / n:.0%} "
        f"(95% CI {mi_lo:.0%}..{mi_hi:.0%}); verdicts {dict(slow_verdicts)}; "
        f"measured slowdown median {np.median(slow_changes):+.1%} "
        f"(range {min(slow_changes):+.1%}..{max(slow_changes):+.1%})"
    )


if __name__ == "__main__":
    main()
