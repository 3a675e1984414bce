"""Latency regression gates that hold on noisy machines.

The gate compares the raw latency samples of a baseline and a candidate, never two single
numbers. It asks two questions and needs both answered before it fails a build:

* is the candidate's distribution shifted at all? A one-sided Mann-Whitney U test on the
  samples (rank based, so a handful of 10x outliers cannot fake a shift);
* is the shift bigger than the budget? A bootstrap 95% CI of the ratio candidate/baseline of
  the chosen metric must lie wholly beyond the budget. The budget is the minimum effect
  size: a significant 0.3% slowdown passes a 5% budget, and a noisy comparison whose CI
  straddles the budget is "inconclusive", never "regressed".

Two reports measured at different times are compared repetition against repetition: each
report holds several process-level repetitions (`lto bench --repeat N`), and the test and the
CI are drawn from the repetitions' figures (as benchstat does), since runs inside one process
share its state and are not independent. Too few repetitions, an unstable report or a machine
loaded differently during the two reports make the verdict "inconclusive". With --rerun both
sides are measured here, interleaved in short chunks; the CI then resamples whole chunk
pairs (runs inside a chunk share the machine's load, so they are not independent), and a
"regressed" verdict must be confirmed by a second, independent interleaved run.

Verdicts and exit codes (chosen not to collide with the CLI's 1 = failure, 2 = usage):

=============  ====  ==========================================================
pass              0  the whole CI lies within the budget
improved         10  significantly faster, by more than the minimum improvement
regressed        11  significantly slower, the whole CI beyond the budget
inconclusive     12  too noisy to decide, or the two sides are not comparable
                     (different machines, inputs or batch sizes; no baseline)
=============  ====  ==========================================================
"""

from optimize.gate.decision import (
    EXIT_CODES,
    IMPROVED,
    INCONCLUSIVE,
    METRICS,
    PASS,
    REGRESSED,
    GateResult,
    GateSettings,
    Side,
    decide,
    hodges_lehmann_ratio,
    parse_fraction,
)
from optimize.gate.reports import (
    baseline_name,
    baseline_path,
    baseline_refusal,
    gate_report,
    gate_reports,
    pick_measurement,
    side_from_report,
    store_baseline,
)
from optimize.gate.rerun import RerunRequest, gate_rerun, rerun_bench_settings

__all__ = [
    "EXIT_CODES",
    "IMPROVED",
    "INCONCLUSIVE",
    "METRICS",
    "PASS",
    "REGRESSED",
    "GateResult",
    "GateSettings",
    "RerunRequest",
    "Side",
    "baseline_name",
    "baseline_path",
    "baseline_refusal",
    "decide",
    "gate_report",
    "gate_reports",
    "gate_rerun",
    "hodges_lehmann_ratio",
    "parse_fraction",
    "pick_measurement",
    "rerun_bench_settings",
    "side_from_report",
    "store_baseline",
]
