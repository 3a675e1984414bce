"""`lto bench --repeat N`: N independent measurements, each in a fresh process and session.

Runs measured inside one process share its page placement, thread placement and the state the
machine was in while it ran: between processes the median moves by ~10% on a quiet machine,
far more than the CI of any single process says. A report meant as a gate's baseline therefore
carries several process-level repetitions, and the gate compares the distribution of their
per-repetition figures (as benchstat does), not the pooled runs.

Each repetition is a child process (optimize.system.child: a fresh interpreter, never a fork) that runs
`run_bench` and sends its report back, with progress ticks; its errors come back as lto's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from optimize.bench.engine import UNSTABLE_CV, UNSTABLE_FOREIGN_LOAD
from optimize.errors import LtoError
from optimize.stats import median_interval, summarize, tail_flags
from optimize.system.child import PROGRESS, ParentLink, start_child

Progress = Callable[[str, int, float], None]
# One measurement of a request, with progress ticks: optimize.bench.command.run_bench.
RunOnce = Callable[[Any, Progress], dict[str, Any]]

# Fewest repetitions a report needs before the gate compares it with another report: with 5 a
# side, the Mann-Whitney test can reach p = 1/252 and the ratio's 95% interval exists.
MIN_REPETITIONS = 5
# The repetitions of one report disagree when their medians spread wider than this (robust
# coefficient of variation: 1.4826 x MAD / median): the limit on runs within one measurement
# (UNSTABLE_CV), applied to processes. A quiet machine shows ~10% between processes.
UNSTABLE_REPETITION_SPREAD = UNSTABLE_CV
# /proc/stat counts in 10 ms ticks: a repetition shorter than this says little about the load.
MIN_LOAD_WINDOW_S = 0.2

# How long a repetition's process that has sent its report has to exit before it is ended.
_EXIT_WAIT_S = 2.0


def _repetition(link: ParentLink, run_once: RunOnce, request: Any) -> dict[str, Any]:
    """The child: one measurement, with progress ticks."""

    def tick(label: str, runs: int, elapsed: float) -> None:
        link.progress((label, runs, elapsed))

    return run_once(request, tick)


def _one_repetition(run_once: RunOnce, request: Any, on_tick: Progress | None) -> dict[str, Any]:
    def said(kind: str, value: Any) -> None:
        if kind == PROGRESS and on_tick is not None:
            on_tick(*value)

    # Leaving the block ends the child: interrupted or failed, it has no reason to finish its --time.
    with start_child(_repetition, run_once, request, what="a repetition's process") as child:
        report = child.result(said)
        child.wait(_EXIT_WAIT_S)
    return dict(report)


def run_repeated(request: Any, run_once: RunOnce, progress: Progress | None = None) -> dict[str, Any]:
    """`request.repeat` measurements by `run_once` (a module-level function: the child imports
    it by name), each in a fresh process; one report holding them all."""
    count = request.repeat
    single = replace(request, repeat=1)
    reports: list[dict[str, Any]] = []
    for index in range(count):
        tick: Progress | None = None
        if progress is not None:
            done = index

            def tick(label: str, runs: int, elapsed: float, done: int = done) -> None:
                progress(f"{label} (repetition {done + 1}/{count})", runs, elapsed)

        reports.append(_one_repetition(run_once, single, tick))
    return merge_repetitions(reports)


def robust_spread(values: Sequence[float]) -> float:
    """1.4826 x MAD / median: a coefficient of variation that one odd value does not inflate."""
    data = np.asarray(values, dtype=np.float64)
    median = float(np.median(data))
    if data.size < 2 or median <= 0:
        return 0.0
    return 1.4826 * float(np.median(np.abs(data - median))) / median


def typical_load(repetitions: Sequence[Mapping[str, Any]]) -> float | None:
    """Other processes' share of the CPU over the repetitions, weighted by their duration
    (repetitions too short for /proc/stat's ticks left out); None when none was long enough."""
    pairs = [
        (float(r["foreign_cpu_fraction"]), float(r.get("wall_s") or 0.0))
        for r in repetitions
        if r.get("foreign_cpu_fraction") is not None and float(r.get("wall_s") or 0.0) >= MIN_LOAD_WINDOW_S
    ]
    total = sum(w for _, w in pairs)
    return sum(f * w for f, w in pairs) / total if total > 0 else None


def repetition_stability(repetitions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stability of a repeated measurement: do its repetitions agree? Each repetition keeps its
    own flags (CV, other processes' load): on a machine that is busy all the time every one is
    "disturbed" yet they agree, and two such reports can be compared if the load was alike
    (the gate checks that); repetitions that disagree make any comparison meaningless."""
    reasons: list[str] = []
    p50s = [float(r["latency_ms"]["p50"]) for r in repetitions]
    spread = robust_spread(p50s)
    if spread > UNSTABLE_REPETITION_SPREAD:
        reasons.append(
            f"the repetitions disagree: p50 {min(p50s):.3g}..{max(p50s):.3g} ms across {len(p50s)} "
            f"processes (spread {spread:.0%} > {UNSTABLE_REPETITION_SPREAD:.0%})"
        )
    load = typical_load(repetitions)
    return {
        "stable": not reasons,
        "reasons": reasons,
        "foreign_cpu_fraction": load,
        "repetitions": len(repetitions),
        "repetition_spread": spread,
        "busy_machine": load is not None and load > UNSTABLE_FOREIGN_LOAD,
    }


def _repetition_summary(index: int, m: Mapping[str, Any]) -> dict[str, Any]:
    lat = m["latency_ms"]
    stability = m.get("stability") or {}
    return {
        "index": index,
        "runs": int(m["runs"]),
        "latency_ms": {k: lat[k] for k in ("min", "mean", "p50", "p90", "p99", "p999", "max")},
        "stopped_by": m.get("stopped_by"),
        "wall_s": m.get("wall_s"),
        "stable": bool(stability.get("stable", True)),
        "reasons": list(stability.get("reasons") or []),
        "foreign_cpu_fraction": stability.get("foreign_cpu_fraction"),
    }


def merge_measurements(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One measurement from its repetitions (the same label in each): pooled runs for the
    distribution, the repetitions' own figures for the gate and for people."""
    first = parts[0]
    pooled = np.concatenate([np.asarray(p["samples_ms"], dtype=np.float64) for p in parts])
    # The pooled runs' median CI would resample runs as if independent, which is exactly the
    # mistake repetitions exist to avoid: the CI is over the repetitions' medians instead.
    latency = summarize(pooled, ci_resamples=1)
    repetitions = [_repetition_summary(i, p) for i, p in enumerate(parts)]
    _, lo, hi = median_interval([r["latency_ms"]["p50"] for r in repetitions])
    latency["median_ci95"] = [lo, hi]
    stopped = Counter(str(p.get("stopped_by", "runs")) for p in parts).most_common(1)[0][0]
    mean = latency["mean"]
    return {
        "label": first["label"],
        "backend": first["backend"],
        "batch_size": first["batch_size"],
        "latency_ms": latency,
        "throughput_per_s": first["batch_size"] * 1000.0 / mean if mean > 0 else 0.0,
        "runs": int(pooled.size),
        "warmup_runs": first.get("warmup_runs", 0),
        "wall_s": float(sum(float(p.get("wall_s") or 0.0) for p in parts)),
        "stopped_by": stopped,
        "stability": repetition_stability(repetitions),
        "too_few_runs_for": tail_flags(int(pooled.size)),
        "repetitions": repetitions,
        "samples_ms": [round(float(s), 6) for s in pooled],
    }


def merge_repetitions(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The report of N repetitions: the first one's header, one merged measurement per label."""
    merged = dict(reports[0])
    labels = [m["label"] for m in reports[0]["results"]]
    for other in reports[1:]:
        if [m["label"] for m in other["results"]] != labels:
            raise LtoError("the repetitions measured different things (their labels differ)")
    merged["results"] = [merge_measurements([r["results"][i] for r in reports]) for i in range(len(labels))]
    settings = dict(merged.get("settings") or {})
    settings["repeat"] = len(reports)
    merged["settings"] = settings
    warnings = list(dict.fromkeys(w for r in reports for w in r.get("warnings") or []))
    if warnings:
        merged["warnings"] = warnings
    return merged
