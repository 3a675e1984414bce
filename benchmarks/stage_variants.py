"""What each CPU stage's candidates are worth on the sample models, measured side by side.

Every stage runs once from the original model (not chained, unlike `lto optimize`), and each
candidate it proposes is compared with the ORT-default baseline (graph level ALL, default
threads) by `optimize.bench.compare`: interleaved A/B chunks in one process, ratio of medians
with a bootstrap 95% CI. One extra row isolates the layout transform: the baseline with
ORT's NchwcTransformer switched off, against the baseline. Gain > 1 means the candidate is
faster: "p50 gain" is the ratio of medians (with its CI), "min gain" the ratio of the fastest
runs, which foreign load on a shared machine disturbs least. Accuracy is the worst cosine over
the model's outputs against the baseline.

    python -m benchmarks.stage_variants [--time 3] [--models resnet_tiny bert_tiny mlp_small] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from optimize.accuracy import AccuracyResult
from optimize.bench import BenchSettings, compare
from optimize.data import resolve_inputs
from optimize.runtimes.onnxruntime.backend import OrtBackend
from optimize.runtimes.onnxruntime.graph_fusion import GraphFusionStage
from optimize.runtimes.onnxruntime.memory_layout import MemoryLayoutStage
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.runtimes.onnxruntime.quantize import QuantizeStage
from optimize.stage import Candidate, StageContext

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"bert_tiny": {"sequence": (128,)}, "resnet_tiny": {}, "mlp_small": {}}
STAGES = (GraphFusionStage, OperatorFusionStage, MemoryLayoutStage, QuantizeStage)


def worst_cosine(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    values = []
    for name, a in ref.items():
        a64, b64 = a.astype(np.float64).ravel(), got[name].astype(np.float64).ravel()
        values.append(float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64) + 1e-30)))
    return min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=float, default=3.0, help="seconds per comparison")
    parser.add_argument("--models", nargs="*", default=list(SHAPES))
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="pin intra-op threads on both sides (1 isolates kernel speed from thread contention)",
    )
    args = parser.parse_args()
    settings = BenchSettings(warmup=20, min_runs=50, max_time_s=args.time, target_ci_rel=0.01)

    head = f"{'model':12} {'candidate':40} {'p50 gain':>8} {'95% CI':>15} {'min gain':>8} {'cosine':>9}"
    print(head + "  base/cand p50 ms")
    for name in args.models:
        model = ROOT / "sample_models" / f"{name}.onnx"
        _, feeds = resolve_inputs(model, dict(SHAPES[name]), batch=1)
        pin = {} if args.threads is None else {"intra_op_num_threads": args.threads}
        baseline = OrtBackend(model, pin)
        ref = baseline.run(feeds)

        def accept(cand: Candidate, ref: dict[str, np.ndarray] = ref, feeds: dict = feeds) -> AccuracyResult:
            got = OrtBackend(cand.model_path, cand.runtime_config).run(feeds)
            cos = worst_cosine(ref, got)
            return AccuracyResult(cos >= 0.99, "" if cos >= 0.99 else f"cosine {cos:.4f}", {})

        rows: list[tuple[str, Candidate]] = [
            ("ORT ALL minus NchwcTransformer", Candidate("no-layout", model, runtime_config={
                "disabled_optimizers": ["NchwcTransformer"]})),
        ]  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="lto-stage-bench-") as tmp:
            for stage_cls in STAGES:
                stage = stage_cls()
                workdir = Path(tmp) / stage.name
                workdir.mkdir()
                base = Candidate("baseline", model)
                opts = {"calib_samples": 16}
                ctx = StageContext(
                    workdir, model, feeds, opts, base, None, None, None, accept, lambda text: None
                )
                if (reason := stage.skip_reason(base, ctx)) is not None:
                    print(f"{name:12} {stage.name:40} skipped: {reason}")
                    continue
                rows.extend((cand.label, cand) for cand in stage.run(base, ctx))
                if stage.name == "graph-fusion":  # dynamic int8 on the fused graph (QAttention)
                    fused = rows[-1][1]
                    qdir = Path(tmp) / "quantize-fused"
                    qdir.mkdir()
                    qctx = StageContext(
                        qdir, model, feeds, {}, base, None, None, None, accept, lambda text: None
                    )
                    rows.extend((f"{c.label} (on fused graph)", c) for c in QuantizeStage().run(fused, qctx))
            for label, cand in rows:
                backend = OrtBackend(cand.model_path, {**cand.runtime_config, **pin})
                cos = worst_cosine(ref, backend.run(feeds))
                result = compare(baseline, backend, feeds, settings=settings, labels=("baseline", label))
                lo, hi = result.ratio_ci95
                p50 = f"{result.a.latency['p50']:.3f}/{result.b.latency['p50']:.3f}"
                ci = f"[{1 / hi:5.2f}, {1 / lo:5.2f}]"
                # Under foreign load the fastest runs are the least disturbed: show min as well.
                fastest = min(result.a.samples_ms) / min(result.b.samples_ms)
                load = result.a.foreign_cpu_fraction
                row = f"{name:12} {label:40} {1 / result.ratio:7.2f}x  {ci} {fastest:7.2f}x {cos:9.6f}  {p50}"
                print(row + (f"  (foreign load {load:.0%})" if load is not None else ""))
                backend.close()


if __name__ == "__main__":
    main()
