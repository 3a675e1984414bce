"""--rerun: both sides measured here, interleaved, and a regression confirmed by a second run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from optimize.bench import BenchSettings
from optimize.bench.command import BenchRequest, run_compare
from optimize.gate.decision import (
    INCONCLUSIVE,
    REGRESSED,
    GateResult,
    GateSettings,
    Side,
    decide,
    pct,
)

RunProgress = Callable[[str, int, float], None]


@dataclass
class RerunRequest:
    """Two models or artifact directories to measure interleaved, with the inputs to feed both."""

    baseline: Path
    candidate: Path
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: Path | None = None
    batch: int | None = None
    bench: Any = None  # optimize.bench.BenchSettings; None = rerun_bench_settings()
    confirm: bool = True  # confirm a "regressed" verdict with a second independent run


def rerun_bench_settings(time_s: float = 10.0) -> Any:
    """Benchmark settings for --rerun: spend the whole time budget, in short blocks.

    The decision rests on block pairs (see _ratio_ci): many short blocks pair A and B runs
    that saw nearly the same machine state, and give the bootstrap many units to resample.
    Measured on a loaded 2-core machine, 5 ms chunks gave 95% CIs several times narrower than
    50 ms ones for the same time budget. Stopping early on the medians' CI would leave too few.
    """

    # Each side runs in its own worker (optimize.bench.apart) and a block starts once the other
    # side's threads are idle (a wait of 5 ms or more). 10 ms blocks keep many block pairs; the run
    # cap is 100,000 a side so that a sub-0.1 ms model still gets a hundred or more pairs (at
    # 20,000, mlp_small's 0.026 ms runs filled 10 blocks and the CI spanned ±18%).
    return BenchSettings(
        max_time_s=time_s, target_ci_rel=None, max_runs=100_000, chunk_s=0.005, settle_s=0.0, block_s=0.01
    )


def gate_rerun(
    request: RerunRequest, settings: GateSettings | None = None, progress: RunProgress | None = None
) -> tuple[GateResult, dict[str, Any]]:
    """Measure baseline and candidate interleaved (A/B/A/B) and decide on that.

    Interleaving cancels the machine's drift between the two sides. A "regressed" verdict is
    confirmed by a second, independent interleaved run (fresh sessions, fresh samples): the
    verdict stays "regressed" only if both runs say so, otherwise it becomes "inconclusive".
    Returns the result and the last run's compare report (for --output).
    """
    settings = settings or GateSettings()
    first, report = _interleaved_run(request, settings, 1, progress)
    if not (request.confirm and first.verdict == REGRESSED):
        return first, report
    second, report = _interleaved_run(request, replace(settings, seed=settings.seed + 1), 2, progress)
    second.interleaved_runs = first.interleaved_runs + second.interleaved_runs
    if second.verdict == REGRESSED:
        second.reason = (
            f"{second.reason} (confirmed by a second interleaved run: {pct(first.change or 0)} in run 1)"
        )
    else:
        second.reason = (
            f"regression not confirmed: run 1 said regressed ({pct(first.change or 0)}), "
            f"run 2 said {second.verdict} ({pct(second.change or 0)}): "
            f"noise on this machine, measure again"
        )
        second.verdict = INCONCLUSIVE
    return second, report


def _interleaved_run(
    request: RerunRequest, settings: GateSettings, index: int, progress: RunProgress | None
) -> tuple[GateResult, dict[str, Any]]:

    bench_request = BenchRequest(
        model=request.baseline,
        compare_with=request.candidate,
        shapes=dict(request.shapes),
        input_data=request.input_data,
        batches=[request.batch] if request.batch else [],
        settings=request.bench or rerun_bench_settings(),
    )
    tick = (lambda label, n, t: progress(f"run {index}", n, t)) if progress else None
    report = run_compare(bench_request, tick)
    env = report.get("environment") or {}
    base_m, cand_m = report["results"][0], report["results"][1]
    # run_compare feeds both sides the same values (it refuses models with different inputs).
    spec = report.get("input_spec")
    comparison = report.get("comparison") or {}
    chunks = int(comparison.get("chunks") or 0)
    runs_a, runs_b = comparison.get("chunk_runs") or (None, None)
    base = Side.from_measurement(
        base_m,
        name=str(request.baseline),
        fingerprint=env.get("fingerprint"),
        input_spec=spec,
        chunks=chunks,
        chunk_runs=runs_a,
    )
    cand = Side.from_measurement(
        cand_m,
        name=str(request.candidate),
        fingerprint=env.get("fingerprint"),
        input_spec=spec,
        chunks=chunks,
        chunk_runs=runs_b,
    )
    result = decide(base, cand, settings)
    result.interleaved_runs = [
        {
            "run": index,
            "verdict": result.verdict,
            "change": result.change,
            "change_ci95": list(result.change_ci95) if result.change_ci95 else None,
            "samples": [int(base.samples_ms.size), int(cand.samples_ms.size)],
            # other processes' share of the CPU during the run: context for a noisy verdict
            "foreign_cpu_fraction": (base_m.get("stability") or {}).get("foreign_cpu_fraction"),
            "chunks": (report.get("comparison") or {}).get("chunks"),
        }
    ]
    return result, report
