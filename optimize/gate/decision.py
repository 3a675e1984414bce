"""The gate's verdict from two sides' latency samples: the statistics and the budget."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimize.errors import UsageError
from optimize.stats import (
    bootstrap_ratio_ci,
    full_chunks,
    interleaved_ratio_ci,
    metric_value,
    runs_for_percentile,
)

PASS, IMPROVED, REGRESSED, INCONCLUSIVE = "pass", "improved", "regressed", "inconclusive"
EXIT_CODES: dict[str, int] = {PASS: 0, IMPROVED: 10, REGRESSED: 11, INCONCLUSIVE: 12}
METRICS = ("p50", "p90", "p99", "throughput")
# Fewest chunk pairs an interleaved comparison needs before its chunk bootstrap means anything.
MIN_CHUNKS = 6

# Input-spec keys that describe where data came from, not what it is: two runs on the same
# .npz at different paths (or the same generator with a reworded note) are the same inputs.
_INPUT_KEYS_IGNORED = {"data_file", "note"}


@dataclass(frozen=True)
class GateSettings:
    """How the gate decides. `max_regression` is a fraction: 0.05 = 5%."""

    metric: str = "p50"
    max_regression: float = 0.05
    # None = same as max_regression: changes smaller than the budget either way are "pass".
    min_improvement: float | None = None
    alpha: float = 0.01  # Mann-Whitney significance level (one-sided)
    resamples: int = 2000  # bootstrap resamples for the ratio CI
    seed: int = 0  # bootstrap seed: the same inputs always give the same verdict
    min_samples: int = 10
    # Reports compared with each other: fewest process-level repetitions a side (lto bench
    # --repeat), and the largest difference in other processes' share of the CPU between them.
    min_repetitions: int = 5
    max_load_difference: float = 0.25

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UsageError(f"unknown metric {self.metric!r}", f"choose one of: {', '.join(METRICS)}")
        if not 0 <= self.max_regression < 10:
            raise UsageError(f"--max-regression must be between 0% and 1000%, not {self.max_regression:.0%}")
        if self.min_improvement is not None and not 0 <= self.min_improvement < 1:
            raise UsageError("--min-improvement must be between 0% and 100%")
        if not 0 < self.alpha < 0.5:
            raise UsageError(f"--alpha must be between 0 and 0.5, not {self.alpha}")
        if self.min_repetitions < 4:
            # 4 a side is the fewest whose Hodges-Lehmann interval can reach 95% (1/70 < 2.5%).
            raise UsageError(f"--min-repetitions must be at least 4, not {self.min_repetitions}")

    @property
    def improvement_threshold(self) -> float:
        return self.max_regression if self.min_improvement is None else self.min_improvement

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "max_regression": self.max_regression,
            "min_improvement": self.improvement_threshold,
            "alpha": self.alpha,
            "resamples": self.resamples,
            "seed": self.seed,
            "min_samples": self.min_samples,
            "min_repetitions": self.min_repetitions,
            "max_load_difference": self.max_load_difference,
        }


def parse_fraction(text: str | float, option: str = "--max-regression") -> float:
    """'5%' -> 0.05, '0.05' -> 0.05. A bare number above 1 is refused: '5' is ambiguous."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = text.strip()
        match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)", raw)
        if not match:
            raise UsageError(f"bad {option} {text!r}", "write a percentage like 5% or a fraction like 0.05")
        value = float(match.group(1))
        if match.group(2):
            value /= 100.0
        elif value > 1:
            raise UsageError(
                f"ambiguous {option} {text!r}",
                f"write {raw}% for a percentage or {value / 100:g} as a fraction",
            )
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"bad {option} {text!r}: it must be zero or more")
    return value


@dataclass
class Side:
    """One side of a comparison: raw samples plus what makes two sides comparable."""

    name: str  # where it came from, for people: a report path, a model path
    label: str  # the measurement's label in its report
    samples_ms: np.ndarray
    batch_size: int = 1
    fingerprint: str | None = None
    input_spec: Mapping[str, Any] | None = None
    # Interleaved runs: the samples are `chunks` consecutive blocks of `chunk_runs` runs (the
    # last may be cut short), block i of both sides measured back to back. None when plain.
    chunks: int | None = None
    chunk_runs: int | None = None
    # Saved reports: the runs of each process-level repetition (lto bench --repeat), in order.
    # None for a report of one process.
    repetitions: list[np.ndarray] | None = None
    # The measurement's stability as recorded (a repeated one's is about its repetitions).
    stability: Mapping[str, Any] | None = None
    # The measurement itself, as found in its report (for the gate report and its plots).
    measurement: Mapping[str, Any] | None = None

    @property
    def repetition_count(self) -> int:
        return len(self.repetitions) if self.repetitions else 1

    def repetition_values(self, stat: str) -> np.ndarray:
        """The statistic (p50, p90, p99, mean) of each repetition's runs: the run-level sample."""

        parts = self.repetitions or [self.samples_ms]
        return np.asarray([float(metric_value(p, stat)) for p in parts], dtype=np.float64)

    def load(self) -> float | None:
        value = (self.stability or {}).get("foreign_cpu_fraction")
        return float(value) if isinstance(value, (int, float)) else None

    def blocks(self) -> np.ndarray | None:
        """The complete chunks as a (chunks, runs per chunk) array, or None when not interleaved."""

        if self.chunk_runs:
            return full_chunks(self.samples_ms, self.chunk_runs)
        if not self.chunks or self.chunks < 2 or self.samples_ms.size % self.chunks:
            return None
        return self.samples_ms.reshape(self.chunks, -1)

    @classmethod
    def from_measurement(
        cls,
        measurement: Mapping[str, Any],
        *,
        name: str,
        fingerprint: str | None,
        input_spec: Mapping[str, Any] | None,
        chunks: int | None = None,
        chunk_runs: int | None = None,
    ) -> Side:
        samples = measurement.get("samples_ms")
        if not samples:
            raise UsageError(
                f"{name}: measurement {measurement.get('label', '?')!r} has no raw samples (samples_ms)",
                "the gate needs the samples: produce the report with `lto bench` or `lto optimize`",
            )
        data = np.asarray(samples, dtype=np.float64)
        if data.ndim != 1 or not np.all(np.isfinite(data)) or np.any(data < 0):
            raise UsageError(f"{name}: samples_ms must be finite latencies in ms, none negative")
        repetitions = None
        reps = measurement.get("repetitions")
        if reps:
            counts = [int(r.get("runs", 0)) for r in reps if isinstance(r, Mapping)]
            if len(counts) != len(reps) or min(counts) < 1 or sum(counts) != data.size:
                raise UsageError(
                    f"{name}: the runs of its {len(reps)} repetitions do not add up to its samples_ms",
                    "the report was edited or cut: measure it again with lto bench --repeat",
                )
            repetitions = np.split(data, np.cumsum(counts)[:-1])
        stability = measurement.get("stability")
        return cls(
            name=name,
            label=str(measurement.get("label", "")),
            samples_ms=data,
            batch_size=int(measurement.get("batch_size", 1) or 1),
            fingerprint=fingerprint,
            input_spec=input_spec,
            chunks=chunks,
            chunk_runs=chunk_runs,
            repetitions=repetitions,
            stability=stability if isinstance(stability, Mapping) else None,
            measurement=measurement,
        )

    def metric(self, metric: str) -> float:
        if metric == "throughput":
            return self.batch_size * 1000.0 / float(np.mean(self.samples_ms))

        return float(metric_value(self.samples_ms, metric))


@dataclass
class GateResult:
    """The decision and every figure behind it."""

    verdict: str
    reason: str
    settings: GateSettings
    baseline: Side | None = None
    candidate: Side | None = None
    baseline_value: float | None = None
    candidate_value: float | None = None
    # metric(candidate) / metric(baseline); for interleaved runs balanced over the AB/BA orders
    ratio: float | None = None
    ratio_ci95: tuple[float, float] | None = None
    change: float | None = None  # signed fraction: + means worse (slower or less throughput)
    change_ci95: tuple[float, float] | None = None
    p_slower: float | None = None  # Mann-Whitney: candidate's latencies stochastically larger
    p_faster: float | None = None
    ci_method: str | None = None
    interleaved_runs: list[dict[str, Any]] = field(default_factory=list)  # --rerun: one per run
    baseline_file: str | None = None
    baseline_written: str | None = None
    # Saved reports: the metric of each repetition, per side (the run-level sample decided on).
    repetition_values: dict[str, list[float]] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        def side(s: Side | None) -> dict[str, Any] | None:
            if s is None:
                return None
            stability = s.stability or {}
            return {
                "name": s.name,
                "label": s.label,
                "runs": int(s.samples_ms.size),
                "repetitions": s.repetition_count,
                "batch_size": s.batch_size,
                "fingerprint": s.fingerprint,
                "stable": bool(stability.get("stable", True)),
                "unstable_reasons": list(stability.get("reasons") or []),
                "foreign_cpu_fraction": s.load(),
            }

        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "metric": self.settings.metric,
            "settings": self.settings.to_json(),
            "baseline": side(self.baseline),
            "candidate": side(self.candidate),
            "baseline_value": self.baseline_value,
            "candidate_value": self.candidate_value,
            "unit": "per_s" if self.settings.metric == "throughput" else "ms",
            "ratio": self.ratio,
            "ratio_ci95": list(self.ratio_ci95) if self.ratio_ci95 else None,
            "change": self.change,
            "change_ci95": list(self.change_ci95) if self.change_ci95 else None,
            "ci_method": self.ci_method,
            "mann_whitney": {"p_slower": self.p_slower, "p_faster": self.p_faster},
            "interleaved_runs": self.interleaved_runs,
            "repetition_values": self.repetition_values,
            "baseline_file": self.baseline_file,
            "baseline_written": self.baseline_written,
        }


def _comparable_inputs(spec: Mapping[str, Any] | None) -> Any:
    if spec is None:
        return None

    def strip(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: strip(v) for k, v in obj.items() if k not in _INPUT_KEYS_IGNORED}
        if isinstance(obj, (list, tuple)):
            return [strip(v) for v in obj]
        return obj

    return strip(spec)


def _input_difference(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str | None:
    """None when the two input specs describe the same inputs, else a short description."""
    ca, cb = _comparable_inputs(a), _comparable_inputs(b)
    if ca == cb:
        return None
    if ca is None or cb is None:
        return "one side records no input spec"
    if not isinstance(ca, dict) or not isinstance(cb, dict):
        return "the input specs differ"
    tensors_a = {t.get("name"): t for t in ca.get("inputs", []) if isinstance(t, dict)}
    tensors_b = {t.get("name"): t for t in cb.get("inputs", []) if isinstance(t, dict)}
    if set(tensors_a) != set(tensors_b):
        return f"input names differ ({', '.join(map(str, tensors_a))} vs {', '.join(map(str, tensors_b))})"
    for tname, ta in tensors_a.items():
        tb = tensors_b[tname]
        for key in sorted(set(ta) | set(tb)):
            if ta.get(key) != tb.get(key):
                return f"input {tname!r} {key} differs ({ta.get(key)} vs {tb.get(key)})"
    for key in sorted(set(ca) | set(cb)):
        if key != "inputs" and ca.get(key) != cb.get(key):
            return f"input {key} differs ({ca.get(key)} vs {cb.get(key)})"
    return "the input specs differ"


def _share(x: float) -> str:
    """0.05 -> '5%', 0.025 -> '2.5%'."""
    return f"{x * 100:.3g}%"


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _p(p: float) -> str:
    """'p=0.012' or 'p<1e-4' for a reason line."""
    return f"p={p:.2g}" if p >= 1e-4 else "p<1e-4"


def _ratio_ci(
    baseline: Side, candidate: Side, stat: str, settings: GateSettings
) -> tuple[float, float, float, str]:
    """metric(candidate) / metric(baseline) with a bootstrap 95% CI, and how the CI was made.

    Two separate reports have no pairing: their runs are resampled independently. Interleaved
    samples are resampled by whole chunk pairs with the AB/BA crossover that cancels the run
    order (`optimize.stats.interleaved_ratio_ci` explains why both matter on a loaded machine).
    """

    a, b = baseline.blocks(), candidate.blocks()
    if a is None or b is None or min(a.shape[0], b.shape[0]) < 4:
        r, lo, hi = bootstrap_ratio_ci(
            baseline.samples_ms, candidate.samples_ms, stat, n=settings.resamples, seed=settings.seed
        )
        return r, lo, hi, "bootstrap over runs"
    chunks = min(a.shape[0], b.shape[0])
    r, lo, hi = interleaved_ratio_ci(a[:chunks], b[:chunks], stat, n=settings.resamples, seed=settings.seed)
    return r, lo, hi, f"AB/BA bootstrap over {chunks} interleaved chunk pairs"


def decide(baseline: Side, candidate: Side, settings: GateSettings | None = None) -> GateResult:
    """Compare candidate with baseline on `settings.metric`; see the module docstring for the rules."""
    settings = settings or GateSettings()
    result = GateResult(INCONCLUSIVE, "", settings, baseline, candidate)

    # Comparability first: numbers from different machines or inputs are not evidence either way.
    if baseline.fingerprint != candidate.fingerprint:
        if baseline.fingerprint is None or candidate.fingerprint is None:
            result.reason = "one side records no environment fingerprint, so the machines cannot be matched"
        else:
            result.reason = (
                f"different machines (environment fingerprint {baseline.fingerprint} vs "
                f"{candidate.fingerprint}): compare on one machine, keep baselines per machine, "
                "or use --rerun"
            )
        return result
    difference = _input_difference(baseline.input_spec, candidate.input_spec)
    if difference:
        result.reason = f"different inputs: {difference}"
        return result
    if baseline.batch_size != candidate.batch_size:
        result.reason = f"different batch sizes ({baseline.batch_size} vs {candidate.batch_size})"
        return result
    fewest = min(baseline.samples_ms.size, candidate.samples_ms.size)
    if fewest < settings.min_samples:
        result.reason = f"too few samples ({fewest}; the gate needs at least {settings.min_samples} per side)"
        return result
    interleaved = baseline.chunks is not None or candidate.chunks is not None
    if interleaved and min(baseline.chunks or 0, candidate.chunks or 0) < MIN_CHUNKS:
        result.reason = (
            f"too few interleaved chunks ({min(baseline.chunks or 0, candidate.chunks or 0)}; the gate needs "
            f"{MIN_CHUNKS} to tell a change from the machine's drift): measure longer with --time"
        )
        return result
    if not interleaved:
        # Shown whatever the verdict: the figure each repetition contributes.
        stat = "mean" if settings.metric == "throughput" else settings.metric
        result.repetition_values = {
            "baseline": [float(v) for v in baseline.repetition_values(stat)],
            "candidate": [float(v) for v in candidate.repetition_values(stat)],
        }
        refusal = _reports_refusal(baseline, candidate, settings)
        if refusal:
            result.reason = refusal
            return result

    from scipy.stats import mannwhitneyu

    metric = settings.metric
    result.baseline_value = baseline.metric(metric)
    result.candidate_value = candidate.metric(metric)
    # throughput = batch / mean latency, so its ratio is the inverse of the mean-latency ratio.
    stat = "mean" if metric == "throughput" else metric
    if interleaved:
        r, lo, hi, result.ci_method = _ratio_ci(baseline, candidate, stat, settings)
        # Latency samples: "greater" = the candidate's latencies are stochastically larger (slower).
        tested_base, tested_cand = baseline.samples_ms, candidate.samples_ms
    else:
        # Two reports measured at different times: the unit of evidence is the repetition (one
        # process each), never the run, so both the interval and the test are at run level.
        tested_base, tested_cand = baseline.repetition_values(stat), candidate.repetition_values(stat)
        r, lo, hi = hodges_lehmann_ratio(tested_base, tested_cand)
        result.ci_method = (
            f"Hodges-Lehmann over {tested_base.size} x {tested_cand.size} repetitions "
            "(distribution-free, inverts the Mann-Whitney test)"
        )
    if metric == "throughput":
        result.ratio, result.ratio_ci95 = 1.0 / r, (1.0 / hi, 1.0 / lo)
        # "worse" is a throughput drop: change = 1 - ratio.
        change, change_lo, change_hi = 1.0 - 1.0 / r, 1.0 - 1.0 / lo, 1.0 - 1.0 / hi
    else:
        result.ratio, result.ratio_ci95 = r, (lo, hi)
        change, change_lo, change_hi = r - 1.0, lo - 1.0, hi - 1.0
    result.change, result.change_ci95 = change, (change_lo, change_hi)
    result.p_slower = float(mannwhitneyu(tested_cand, tested_base, alternative="greater").pvalue)
    result.p_faster = float(mannwhitneyu(tested_cand, tested_base, alternative="less").pvalue)

    worse_word, better_word = ("lower", "higher") if metric == "throughput" else ("slower", "faster")
    budget = settings.max_regression
    improvement = settings.improvement_threshold
    what = f"{metric} {abs(change) * 100:.1f}% {worse_word if change > 0 else better_word}"
    ci_text = f"95% CI of the change {pct(change_lo)}..{pct(change_hi)}"

    if change_lo > budget:
        if result.p_slower < settings.alpha:
            result.verdict = REGRESSED
            result.reason = (
                f"{what} ({ci_text}), beyond the {_share(budget)} budget; Mann-Whitney {_p(result.p_slower)}"
            )
        else:
            result.reason = (
                f"{what} ({ci_text}) but the latency distribution is not significantly shifted "
                f"(Mann-Whitney {_p(result.p_slower)}): tail noise, measure again"
            )
    elif change_hi <= budget:
        if result.p_faster < settings.alpha and change_hi < -improvement:
            result.verdict = IMPROVED
            result.reason = (
                f"{what} ({ci_text}), more than the {_share(improvement)} minimum improvement; "
                f"Mann-Whitney {_p(result.p_faster)}"
            )
        else:
            result.verdict = PASS
            # Both tests must agree: the rank test alone over-reads runs that share a chunk's load.
            significant = (result.p_slower < settings.alpha and change_lo > 0) or (
                result.p_faster < settings.alpha and change_hi < 0
            )
            note = "a significant change, but" if significant else "no significant change,"
            result.reason = f"{what} ({ci_text}): {note} within the {_share(budget)} budget"
    else:
        result.reason = (
            f"too noisy to decide: {what} but the {ci_text} straddles the {_share(budget)} budget; "
            + (
                "measure longer (--time)"
                if interleaved
                else _more_repetitions_hint(tested_base, tested_cand, budget)
            )
        )
    return result


def _reports_refusal(baseline: Side, candidate: Side, settings: GateSettings) -> str | None:
    """Why two saved reports cannot be compared, or None: each must hold enough process-level
    repetitions, neither may be unstable, and the machine's load must have been alike."""
    counts = {"baseline": baseline.repetition_count, "candidate": candidate.repetition_count}
    short = {k: n for k, n in counts.items() if n < settings.min_repetitions}
    if short:
        which = " and ".join(f"the {k} has {n}" for k, n in short.items())
        return (
            f"too few repetitions: {which}; comparing two reports needs at least "
            f"{settings.min_repetitions} a side, each a fresh process (lto bench --repeat "
            f"{settings.min_repetitions}), because runs inside one process are not independent: "
            "or compare both side by side with --rerun"
        )
    if settings.metric in ("p90", "p99"):
        # Each repetition's own tail is the figure compared: it needs the runs to estimate it.

        needed = runs_for_percentile(float(settings.metric[1:]))
        fewest = min(min(p.size for p in s.repetitions or [s.samples_ms]) for s in (baseline, candidate))
        if fewest < needed:
            return (
                f"too few runs per repetition for its {settings.metric}: {fewest} in the shortest, "
                f"{needed} needed for a 95% interval inside the data; measure with --min-runs {needed}"
            )
    for name, s in (("baseline", baseline), ("candidate", candidate)):
        stability = s.stability or {}
        if not stability.get("stable", True):
            reasons = "; ".join(stability.get("reasons") or []) or "flagged unstable"
            return f"the {name} report is unstable ({reasons}): measure it again on a quieter machine"
    load_b, load_c = baseline.load(), candidate.load()
    if load_b is not None and load_c is not None and abs(load_b - load_c) > settings.max_load_difference:
        return (
            f"the machine's load differed between the reports: other processes used {load_b:.0%} of "
            f"the CPU during the baseline, {load_c:.0%} during the candidate; measure both on a "
            "machine in the same state, or side by side with --rerun"
        )
    return None


def _more_repetitions_hint(base: np.ndarray, cand: np.ndarray, budget: float) -> str:
    """How many repetitions a side would resolve a change of twice the budget at this spread."""
    spread = np.concatenate([np.log(base) - np.median(np.log(base)), np.log(cand) - np.median(np.log(cand))])
    sigma = 1.4826 * float(np.median(np.abs(spread)))
    if budget <= 0 or sigma <= 0:
        return "add repetitions (lto bench --repeat)"
    # A two-sample comparison with 95% confidence and 95% power, at a margin of the budget.
    needed = math.ceil(2 * ((1.96 + 1.645) * sigma / math.log1p(budget)) ** 2)
    return (
        f"add repetitions: at this spread between processes ({sigma:.1%}) about {max(needed, 5)} a side "
        "would resolve a change of twice the budget (lto bench --repeat), or compare with --rerun"
    )


def _exact_mann_whitney_lower(m: int, n: int, level: float = 0.95) -> int:
    """The largest k with P(U < k) <= (1 - level) / 2 under the null, U the Mann-Whitney
    statistic of samples of sizes m and n (its exact distribution, counted by dynamic
    programming: the coefficients of the Gaussian binomial coefficient [m+n choose m])."""
    # counts[j] = number of arrangements of i x-values and j y-values with each U, for the current i
    counts = [np.ones(1, dtype=np.float64) for _ in range(n + 1)]
    for _ in range(1, m + 1):
        new = [np.ones(1, dtype=np.float64)]
        for j in range(1, n + 1):
            a, b = counts[j], new[j - 1]
            shifted = np.concatenate([np.zeros(j), a])  # the new x-value is above all j y-values
            size = max(shifted.size, b.size)
            new.append(np.pad(shifted, (0, size - shifted.size)) + np.pad(b, (0, size - b.size)))
        counts = new
    dist = counts[n] / counts[n].sum()
    cdf = np.cumsum(dist)
    alpha = (1.0 - level) / 2.0
    # P(U <= k - 1) <= alpha  <=>  cdf[k - 1] <= alpha
    k = int(np.searchsorted(cdf, alpha, side="right"))
    return max(k, 0)


def hodges_lehmann_ratio(
    baseline: np.ndarray, candidate: np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """candidate / baseline as the median of all pairwise ratios, with its distribution-free CI.

    The Hodges-Lehmann estimate of the shift of log latency between the two sets of
    repetitions; the interval holds the shifts the two-sided Mann-Whitney test does not reject
    at 1 - level (order statistics k and mn + 1 - k of the pairwise log ratios, k from U's
    exact null distribution). One odd repetition moves neither much. With too few repetitions
    for the level (3 x 3 at 95%), the interval is (0, inf): nothing can be claimed.
    """
    logs_b, logs_c = np.log(np.asarray(baseline, dtype=np.float64)), np.log(np.asarray(candidate))
    diffs = np.sort((logs_c[None, :] - logs_b[:, None]).ravel())
    k = _exact_mann_whitney_lower(logs_b.size, logs_c.size, level)
    if k < 1:  # too few repetitions: no interval at this level exists, so claim none
        return float(np.exp(np.median(diffs))), 0.0, math.inf
    lo_i = min(max(k - 1, 0), (diffs.size - 1) // 2)  # 1-based order statistic k is index k - 1
    hi_i = diffs.size - 1 - lo_i
    return float(np.exp(np.median(diffs))), float(np.exp(diffs[lo_i])), float(np.exp(diffs[hi_i]))


# ---------------------------------------------------------------------------------------------
# Reports
