"""How often does `lto gate` get it wrong when it compares two saved reports?

The dedicated-runner workflow: a baseline report is stored, and a later report is gated
against it. Each trial measures, one after the other, each in its own `lto bench --repeat N`
report (every repetition a fresh process):
  * the baseline: the model;
  * "same": the model again, so any "regressed" is a false alarm;
  * "slow": a copy that does more work (benchmarks/slow_model.py: the same outputs), sized by
    measurement to run 15% slower, so anything but "regressed" is a miss;
and gates "same" and "slow" against the baseline with `gate_reports` (what `lto gate
--baseline A.json --candidate B.json` runs). "same" and "slow" swap order every trial, so
drift over the session hits both alike. Prints both rates with 95% intervals, the verdicts,
the reasons of inconclusive ones, the slowdown the gate measured and the machine's load.

    nice -n 5 python -m benchmarks.gate_report_error_rates                 # resnet_tiny, 20 trials
    nice -n 5 python -m benchmarks.gate_report_error_rates --model sample_models/mlp_small.onnx
    python -m benchmarks.gate_report_error_rates --model PP-LCNET.onnx --shape x=1x3x48x192 --repeat 10
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.gate_error_rates import wilson
from benchmarks.slow_model import make_slower, shape_args
from optimize.bench import BenchSettings
from optimize.bench.command import BenchRequest, run_bench
from optimize.data import parse_shape_args
from optimize.gate import REGRESSED, GateSettings, gate_reports, parse_fraction
from optimize.report import write_report

ROOT = Path(__file__).resolve().parent.parent


def slower_by_time(
    model: Path,
    out: Path,
    extra: float,
    dims: dict[str, int],
    inputs: dict[str, tuple[int, ...]],
    shapes: dict[str, tuple[int, ...]],
    overrides: dict[str, object],
    rounds: int = 4,
) -> tuple[int, float]:
    """Write a copy of `model` that runs `extra` slower in time, not only in MACs: a MatMul
    chain runs at a better rate per MAC than a depthwise CNN, so on PP-LCNet +15% MACs is a
    few % of time. The MAC share is rescaled from interleaved measurements until the measured
    p50 slowdown is within a fifth of `extra`. Returns (chain layers, measured slowdown)."""
    from optimize.bench.command import run_compare

    macs, layers, measured = extra, 0, 0.0
    for _ in range(rounds):
        layers = make_slower(model, out, macs, dims, inputs)
        request = BenchRequest(
            model,
            compare_with=out,
            shapes=shapes,
            settings=BenchSettings(max_time_s=4.0, target_ci_rel=0.01),
            runtime_overrides=overrides,
        )
        measured = float(run_compare(request)["comparison"]["ratio"]) - 1.0
        if abs(measured - extra) <= 0.2 * extra:
            break
        macs *= extra / max(measured, 0.01)
    return layers, measured


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=ROOT / "sample_models" / "resnet_tiny.onnx")
    parser.add_argument("--shape", action="append", default=[], help="as for lto: NAME=DxD (repeatable)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per report (lto bench --repeat)")
    parser.add_argument("--time", type=float, default=0.5, help="seconds of timed runs per repetition")
    parser.add_argument("--extra", default="15%", help="extra compute of the slower copy (MACs)")
    parser.add_argument("--max-regression", default="5%")
    parser.add_argument("--metric", default="p50")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (lto bench --threads)")
    parser.add_argument(
        "--baseline-attempts", type=int, default=3, help="re-measure an unstable baseline up to this often"
    )
    args = parser.parse_args()

    extra = parse_fraction(args.extra, "--extra")
    settings = GateSettings(metric=args.metric, max_regression=parse_fraction(args.max_regression))
    bench = BenchSettings(max_time_s=args.time, target_ci_rel=None, max_runs=1_000_000)
    shapes = parse_shape_args(args.shape) or {"batch": (1,)}
    verdicts: dict[str, Counter[str]] = {"same": Counter(), "slow": Counter()}
    reasons: dict[str, Counter[str]] = {"same": Counter(), "slow": Counter()}
    changes: dict[str, list[float]] = {"same": [], "slow": []}
    loads: list[float] = []
    spreads: list[float] = []
    unstable_baselines: list[int] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        slow = Path(tmp) / f"{args.model.stem}_plus{extra:.0%}.onnx"
        dims, inputs = shape_args(args.shape)
        overrides = {} if args.threads is None else {"intra_op_num_threads": args.threads}
        layers, measured = slower_by_time(args.model, slow, extra, dims, inputs, shapes, overrides)
        print(f"slower copy: {layers} extra MatMul+Tanh layers, measured {measured:+.1%} p50 (target "
              f"{extra:+.0%}), interleaved with the model", flush=True)  # fmt: skip

        def report(model: Path, name: str) -> Path:
            request = BenchRequest(
                model, shapes=shapes, settings=bench, repeat=args.repeat, runtime_overrides=overrides
            )
            data = run_bench(request)
            stability = data["results"][0]["stability"]
            if stability.get("foreign_cpu_fraction") is not None:
                loads.append(stability["foreign_cpu_fraction"])
            spreads.append(stability.get("repetition_spread", 0.0))
            path = Path(tmp) / f"{name}.json"
            write_report(path, data)
            return path

        def stored_baseline() -> Path:
            # `lto gate --update-baseline` never stores an unstable report, so the stored
            # baseline is always a stable one: measure until one is (as main's next job would).
            for _ in range(args.baseline_attempts):
                path = report(args.model, "baseline")
                data = json.loads(path.read_text())
                if data["results"][0]["stability"]["stable"]:
                    return path
                unstable_baselines.append(1)
            return path

        for trial in range(args.trials):
            baseline = stored_baseline()
            order = [("same", args.model), ("slow", slow)]
            for kind, model in order if trial % 2 == 0 else order[::-1]:
                result = gate_reports(report(model, kind), baseline_file=baseline, settings=settings)
                verdicts[kind][result.verdict] += 1
                if result.change is not None:
                    changes[kind].append(result.change)
                if result.verdict == "inconclusive":
                    reasons[kind][result.reason.split(":")[0].split("(")[0].strip()] += 1
            elapsed = time.monotonic() - started
            print(f"trial {trial + 1}/{args.trials}: same {dict(verdicts['same'])}, ", end="")
            print(f"slow {dict(verdicts['slow'])} ({elapsed:.0f} s)", flush=True)
    elapsed = time.monotonic() - started

    n = args.trials
    false_alarms = verdicts["same"][REGRESSED]
    misses = n - verdicts["slow"][REGRESSED]
    fa_lo, fa_hi = wilson(false_alarms, n)
    mi_lo, mi_hi = wilson(misses, n)

    def spread_text(values: list[float]) -> str:
        if not values:
            return "none measured"
        return f"median {np.median(values):+.1%} (range {min(values):+.1%}..{max(values):+.1%})"

    print(f"\nlto gate on saved reports: {args.model.name}, {n} trials, {elapsed:.0f} s")
    print(
        f"settings: metric {settings.metric}, max regression {settings.max_regression:.0%}, alpha "
        f"{settings.alpha}, {args.repeat} repetitions per report (each a fresh process) of {args.time:g} s "
        f"of timed runs, intra-op threads {args.threads or 'ORT default'}; slower copy measured "
        f"{measured:+.1%} p50 ({layers} extra MatMul+Tanh layers)"
    )
    if loads:
        print(
            f"other processes used {np.median(loads):.0%} of the CPU during a report (median; "
            f"range {min(loads):.0%}..{max(loads):.0%}); this script ran under nice {os.nice(0)}"
        )
    print(
        f"spread of the repetitions' p50 within a report: median {np.median(spreads):.1%} "
        f"(max {max(spreads):.1%}); unstable baselines measured again: {len(unstable_baselines)}"
    )
    print(
        f"model vs itself:  false alarms {false_alarms}/{n} = {false_alarms / n:.0%} "
        f"(95% CI {fa_lo:.0%}..{fa_hi:.0%}); verdicts {dict(verdicts['same'])}; "
        f"change measured {spread_text(changes['same'])}"
    )
    print(
        f"model vs +{extra:.0%} copy: misses {misses}/{n} = {misses / n:.0%} "
        f"(95% CI {mi_lo:.0%}..{mi_hi:.0%}); verdicts {dict(verdicts['slow'])}; "
        f"slowdown measured {spread_text(changes['slow'])}"
    )
    for kind in ("same", "slow"):
        if reasons[kind]:
            print(f"inconclusive ({kind}): " + "; ".join(f"{k}: {v}" for k, v in reasons[kind].items()))


if __name__ == "__main__":
    main()
