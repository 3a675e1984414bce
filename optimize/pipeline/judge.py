"""Every keep/reject decision of `lto optimize`, in one place.

The loop measures (through the bench engine) and asks here what the figures mean: whether a
stage runs at all, whether a candidate is kept, whether the final side-by-side comparison sends
the original back, and whether the target is met. Nothing here times or loads anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from optimize.accuracy import AccuracyResult, Evidence, is_lossy
from optimize.pipeline.record import Decision, Figures, StageRecord
from optimize.pipeline.request import OptimizeRequest, stage_disabled_reason
from optimize.recipes import Recipe, StageSpec
from optimize.render.common import modes_sentence
from optimize.stage import LIFT_REFERENCE_KEY, Status
from optimize.stats import percentile_ci

if TYPE_CHECKING:
    from optimize.bench import Comparison
    from optimize.stage import Candidate

EXIT_TARGET_MET = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TARGET_MISSED = 3
# The artifact is written and verified, but faster candidates were left out because the data
# given could not verify them (see unverified_faster): the report says which data would.
EXIT_UNVERIFIED = 4


def target_met(samples_ms: Sequence[float], metric: str, target_ms: float | None, confident: bool) -> bool:
    """Whether latency samples meet the target (`confident`: the whole 95% CI does)."""
    if target_ms is None:
        return False
    value, _, hi = percentile_ci(samples_ms, metric)
    return (hi if confident else value) <= target_ms


def pre_skip_reason(
    spec: StageSpec,
    request: OptimizeRequest,
    recipe: Recipe,
    *,
    stop_reason: str,
    best_latency_ms: float,
    time_left_s: float | None,
) -> str:
    """Why a stage does not run at all ("" when it runs)."""
    if stop_reason:
        return stop_reason
    if not spec.enabled:
        return stage_disabled_reason(spec, request, recipe)
    if time_left_s is not None and time_left_s <= 0:
        return "the --time-budget is used up"
    target = request.target_ms
    if spec.run_when == "above-target" and target is not None and best_latency_ms <= target:
        metric = request.target_percentile
        return (
            f"the best {metric} ({best_latency_ms:.3f} ms, measured alone) already meets the "
            f"{target:g} ms target"
        )
    return ""


# A stage whose recipe names no budget_s weighs this much when the --time-budget is shared out.
DEFAULT_STAGE_WEIGHT_S = 300.0


def stage_time_share(weight_s: float, later_weights_s: Sequence[float], time_left_s: float) -> float:
    """Seconds of the --time-budget left that a stage may use: its recipe budget's share of the
    budgets of the stages still to run, this one included. Without it the first runtime's stages
    spend the whole budget and a later runtime's never run (rapidocr-det, 3 minutes: ONNX
    Runtime's stages used all of it; OpenVINO bf16, 2.3x faster, was skipped). Time a stage
    leaves unused passes to the ones after it; the last one gets all that is left."""
    total = weight_s + sum(later_weights_s)
    if total <= 0 or time_left_s <= 0:
        return max(time_left_s, 0.0)
    return time_left_s * weight_s / total


def share_used_up(deadline: float | None, now: float, measured_in_stage: int) -> bool:
    """Under a --time-budget, whether a stage's next candidate is left unmeasured because the
    stage's share is spent. Its first candidate is always measured: making it was the cost."""
    return deadline is not None and now >= deadline and measured_in_stage > 0


def weigh_evidence(result: AccuracyResult, precision: str, evidence: Evidence | None) -> AccuracyResult:
    """A reduced or quantized candidate that passed on rows that cannot tell is unverified:
    passing proves nothing there (a detector that detects nothing agrees with any candidate). It
    goes on to be measured, and is never shipped. A candidate that failed the gate on the rows is
    inaccurate, whatever the rows: a failure is a measured difference, never offered for
    verification; where the rows cannot tell, the reason says so, since other rows might judge it
    otherwise (bf16 on random bytes: cosine 0.008; right on real ones)."""
    if evidence is None or evidence.can_tell or not is_lossy(precision):
        return result
    if not result.ok:
        return replace(result, reason=f"{result.reason} (on rows that cannot tell: {evidence.why_not()})")
    return replace(result, ok=True, unverified=f"{evidence.why_not()}; on these rows it passed")


def timed_though_inaccurate(cand: Candidate) -> bool:
    """A candidate that fails the gate is not timed, except the one a stage yields to price a
    mixed-precision candidate's lift (the same quantized model with nothing lifted): its speed is
    what the lifted nodes gave up."""
    return bool(cand.details.get(LIFT_REFERENCE_KEY))


def inaccurate(accuracy: AccuracyResult, timed: Decision | None = None) -> Decision:
    """A candidate whose outputs failed the accuracy gate is rejected, before any timing unless
    it prices a lift (`timed`: the judge's decision on its timing, whose figures it keeps)."""
    reason = f"inaccurate: {accuracy.reason}"
    if timed is None or timed.figures is None:
        return Decision(Status.REJECTED, reason, inaccurate=True)
    figures = timed.figures
    speed = (
        f"{figures.speedup:.2f}x over the baseline"
        if figures.speedup is not None
        else f"{figures.ratio:.3f}x the {figures.metric} of {figures.versus.get('label')}"
    )
    speed = f"timed to price the lift: {speed}"
    return Decision(Status.REJECTED, f"{reason}; {speed}", figures=figures, inaccurate=True)


def hold_unverified(decision: Decision, accuracy: AccuracyResult) -> Decision:
    """A candidate measured faster than the best but unverified is recorded, not kept (what data
    would verify it is said once, at the end of the run)."""
    if decision.status != Status.KEPT or not accuracy.unverified:
        return decision
    reason = f"{decision.reason}, but not shipped: unverified ({accuracy.unverified})"
    return replace(decision, status=Status.UNVERIFIED, reason=reason)


def confirm(first: Comparison, confirmation: Decision) -> Decision:
    """A win must repeat on fresh processes: the confirmation's decision stands, and when it does
    not keep the candidate it says that the first measurement's gain did not repeat."""
    if confirmation.status == Status.KEPT:
        return confirmation
    reason = (
        f"the first measurement's gain (ratio {first.ratio:.3f}) did not repeat on fresh "
        f"processes: {confirmation.reason}"
    )
    return replace(confirmation, reason=reason)


def unverified_faster(records: Sequence[StageRecord], shipped_speedup: float) -> list[dict[str, Any]]:
    """The unverified candidates measured faster than what ships, fastest first, one per label."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.status != Status.UNVERIFIED or r.speedup is None or r.speedup <= shipped_speedup:
            continue
        if r.label in out and out[r.label]["speedup"] >= r.speedup:
            continue
        out[r.label] = {
            "label": r.label,
            "stage": r.stage,
            "backend": r.backend,
            "precision": r.precision,
            "numerics": r.numerics,
            "speedup": r.speedup,
            "ratio_vs_best": r.ratio,
            "versus": (r.versus or {}).get("label"),
            "why": (r.accuracy or {}).get("unverified", ""),
        }
    return sorted(out.values(), key=lambda item: -float(item["speedup"]))


def final_exit(
    exit_code: int,
    verdict: str,
    unverified: Sequence[dict[str, Any]],
    *,
    target_ms: float | None = None,
    baseline_ms: float | None = None,
    fail_on_unverified: bool = False,
) -> tuple[str, int]:
    """The verdict and exit code once unverified faster candidates are counted. A written artifact
    is a success (0, or 3 for a missed target); 4 only when a target is given that the artifact
    misses and an unverified candidate would meet (its speedup over `baseline_ms`, the baseline's
    latency in the artifact's own measurement), or with `fail_on_unverified`."""
    if not unverified:
        return verdict, exit_code
    best = unverified[0]
    line = (
        f"{len(unverified)} faster candidate(s) not shipped, unverified "
        f"(fastest: {best['label']} at {best['speedup']:.2f}x)"
    )
    would_meet = [
        c["label"]
        for c in unverified
        if target_ms is not None and baseline_ms and baseline_ms / float(c["speedup"]) <= target_ms
    ]
    if exit_code == EXIT_TARGET_MISSED and would_meet:
        return f"{verdict}; {line}, and {would_meet[0]} would meet the target", EXIT_UNVERIFIED
    if fail_on_unverified and exit_code != EXIT_TARGET_MISSED:
        return f"{verdict}; {line} (--fail-on-unverified)", EXIT_UNVERIFIED
    return f"{verdict}; {line}", exit_code


def search_done(spec: StageSpec, target_ms: float | None, best_ms: float) -> bool:
    """Whether a stage that runs only above the target should stop asking for candidates: the
    best, measured alone, now meets it."""
    return spec.run_when == "above-target" and target_ms is not None and best_ms <= target_ms


def judge_candidate(
    comparison: Comparison,
    versus_baseline: Comparison,
    *,
    label: str,
    metric: str,
    best_label: str,
    min_improvement: float,
    confirmation: bool = False,
) -> Decision:
    """Keep when faster than the best by the recipe's minimum and with 95% confidence; say why not
    otherwise. The speedup recorded is the one measured against the baseline in the same run
    (`versus_baseline`, the same comparison while the best is the baseline), never a product of
    ratios: chained ratios carry every earlier comparison's error and bias into one figure.
    `confirmation`: the comparison is the second, on fresh processes."""
    figures = side_by_side_figures(
        comparison, versus_baseline, label=label, metric=metric, best_label=best_label
    )
    ratio, (lo, hi) = figures.ratio, figures.ratio_ci95
    said = f"{metric} ratio {ratio:.3f}, CI {lo:.3f}–{hi:.3f}"
    two_speeds = modes_of(comparison, best_label, label)
    if two_speeds:
        said += f"; {two_speeds['sentence']}"
    if hi < 1.0 and ratio <= 1.0 - min_improvement:
        reason = f"{1 / ratio:.2f}x faster than {best_label} ({said})"
        if confirmation:
            reason += ", confirmed on fresh processes"
        return Decision(Status.KEPT, reason, figures)
    if lo > 1.0:
        reason = f"slower than {best_label} ({said})"
    elif hi >= 1.0:
        reason = f"not faster than {best_label} with confidence ({said})"
    else:
        reason = f"gain below the recipe's {min_improvement:.0%} minimum ({said})"
    return Decision(Status.REJECTED, reason, figures)


def side_by_side_figures(
    comparison: Comparison, versus_baseline: Comparison, *, label: str, metric: str, best_label: str
) -> Figures:
    """The figures a candidate's row shows: its ratio to the best so far, and its speedup over
    the baseline measured in the same run. Every latency comes from the block pairs its ratio
    comes from (side_ms)."""
    lo, hi = (float(x) for x in comparison.ratio_ci95)
    best_ms, cand_ms = comparison.side_ms
    lat, ref = comparison.b.latency, comparison.a.latency
    base_ratio = float(versus_baseline.ratio)
    base_lo, base_hi = (float(x) for x in versus_baseline.ratio_ci95)
    return Figures(
        latency_ms={"p50": lat["p50"], "p99": lat["p99"], metric: cand_ms},
        versus={"label": best_label, "latency_ms": {"p50": ref["p50"], "p99": ref["p99"], metric: best_ms}},
        ratio=float(comparison.ratio),
        ratio_ci95=(lo, hi),
        speedup=1.0 / base_ratio if base_ratio > 0 else None,
        speedup_ci95=(1.0 / base_hi, 1.0 / base_lo) if base_lo > 0 else None,
        baseline_ms=versus_baseline.side_ms[0],
        metric=metric,
        modes=modes_of(versus_baseline, "baseline", label),
    )


def modes_of(comparison: Comparison, a_label: str, b_label: str) -> dict[str, Any] | None:
    """When a comparison's pair ratios fell in two groups (a side that runs at two speeds): both
    groups' figures and a sentence that says which figure stands; else None."""
    paired = comparison.paired
    if paired is None or not paired.modes:
        return None
    data = paired.to_json()
    low, high = paired.modes
    return {
        "moved": {"A": a_label, "B": b_label}.get(paired.moved, "both sides"),
        "modes": data["modes"],
        "chosen": "low" if paired.figure is low else "high",
        "speedups": sorted((1.0 / low.ratio, 1.0 / high.ratio)),
        "sentence": modes_sentence(data, a_label, b_label),
    }


# A runner-up whose estimated speedup is within this fraction of the best's meets it directly.
RUNOFF_FRACTION = 0.9
RUNOFF_MAX = 2


def runoff_candidates(
    runners_up: Sequence[tuple[Candidate, float | None]], best: Candidate, best_speedup: float
) -> list[Candidate]:
    """Accurate candidates rejected as not faster than an earlier best whose measured speedup
    over the baseline comes within RUNOFF_FRACTION of the final best's: the few worth measuring against it,
    most promising first."""
    close = [
        (speedup, cand)
        for cand, speedup in runners_up
        if speedup is not None and cand is not best and speedup >= RUNOFF_FRACTION * best_speedup
    ]
    close.sort(key=lambda item: item[0], reverse=True)
    return [cand for _, cand in close[:RUNOFF_MAX]]


def original_wins_final(comparison: Comparison) -> bool:
    """Every kept step won its own comparisons, yet side by side with the original the result
    measures slower: ship the original rather than a model measured to lose. The point estimate
    decides, not a confident loss: a thread setting kept while other processes loaded the cores
    can measure 0.8x once they are gone (CI 0.74-1.12 on rapidocr-det), and shipping that
    would make the artifact slower than doing nothing."""
    return float(comparison.ratio) > 1.0


def target_verdict(value_ms: float, target_ms: float | None, metric: str) -> tuple[str, int, bool | None]:
    """(verdict line, exit code, met) for the artifact's latency (its figure in the final
    comparison; the baseline's own measurement when the original ships)."""
    if target_ms is None:
        return "no target given", EXIT_TARGET_MET, None
    if value_ms <= target_ms:
        return f"target met: {metric} {value_ms:.3f} ms <= {target_ms:g} ms", EXIT_TARGET_MET, True
    return f"target missed: best {metric} {value_ms:.3f} ms > {target_ms:g} ms", EXIT_TARGET_MISSED, False


__all__ = [
    "EXIT_FAILURE",
    "EXIT_TARGET_MET",
    "EXIT_TARGET_MISSED",
    "EXIT_UNVERIFIED",
    "EXIT_USAGE",
    "confirm",
    "final_exit",
    "hold_unverified",
    "inaccurate",
    "judge_candidate",
    "modes_of",
    "original_wins_final",
    "pre_skip_reason",
    "runoff_candidates",
    "search_done",
    "share_used_up",
    "side_by_side_figures",
    "stage_time_share",
    "target_met",
    "target_verdict",
    "unverified_faster",
    "weigh_evidence",
]
