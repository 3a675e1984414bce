"""How much does lto's benchmark harness add to what it measures?

For each sample model, in one process and one run, alternate rounds of
  bare:  a plain `session.run` loop timed as a whole (what a user would write), and
  lto:   `optimize.bench.measure` with the same session, inputs and run count,
and print the ratio of lto's per-run time (wall time of its timed loop / runs) to the bare
loop's, with a bootstrap 95% CI over rounds. 1.00 means no overhead; the goal is < 1.05.

    python -m benchmarks.bench_overhead [--rounds 20] [--runs 200]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from optimize.bench import BenchSettings, measure
from optimize.data import resolve_inputs
from optimize.runtimes.backends import open_backend
from optimize.stats import bootstrap_ci

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "mlp_small.onnx": {},
    "resnet_tiny.onnx": {},
    "bert_tiny.onnx": {"sequence": (128,)},
}


def bare_loop(session, feeds: dict, runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    return (time.perf_counter() - start) / runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    settings = BenchSettings(
        warmup=0, min_runs=args.runs, max_runs=args.runs, max_time_s=1e9, target_ci_rel=None
    )
    print(f"{'model':<18} {'bare ms/run':>12} {'lto ms/run':>12} {'lto/bare':>9}  95% CI")
    for name, shapes in MODELS.items():
        path = ROOT / "sample_models" / name
        _, feeds = resolve_inputs(path, shapes, batch=1)
        with open_backend("onnxruntime", path) as backend:
            session = backend.session
            for _ in range(50):
                session.run(None, feeds)
            ratios, bare_all, lto_all = [], [], []
            for i in range(args.rounds):
                # Alternate which goes first so drift within a round cancels out.
                if i % 2 == 0:
                    bare = bare_loop(session, feeds, args.runs)
                    m = measure(backend, feeds, settings)
                else:
                    m = measure(backend, feeds, settings)
                    bare = bare_loop(session, feeds, args.runs)
                ours = m.wall_s / len(m.samples_ms)
                ratios.append(ours / bare)
                bare_all.append(bare)
                lto_all.append(ours)
        lo, hi = bootstrap_ci(np.array(ratios))
        print(
            f"{name:<18} {np.median(bare_all) * 1e3:>12.4f} {np.median(lto_all) * 1e3:>12.4f} "
            f"{np.median(ratios):>9.3f}  [{lo:.3f}, {hi:.3f}]"
        )


if __name__ == "__main__":
    main()
