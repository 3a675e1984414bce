"""Robust statistics for latency samples: percentiles, bootstrap intervals, ratios."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def percentile(samples: Sequence[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def bootstrap_ci(
    samples: Sequence[float] | np.ndarray,
    stat: Callable[[np.ndarray], Any] = np.median,
    n: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of `stat` (vectorised over resamples)."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 2:
        value = float(stat(data)) if data.size else float("nan")
        return value, value
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(n, data.size))
    values = stat(data[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1.0 - alpha))


# Above this many samples a quantile's 95% interval comes from order statistics, not from a
# bootstrap: 2,000 resamples of 112,000 runs (a fast model under --min-time) held 1.8 GB of
# indices and took 20 s; the order-statistic interval is distribution-free, exact as n grows,
# and costs one partial sort.
BOOTSTRAP_MAX_SAMPLES = 5000


def quantile_ci(
    data: np.ndarray, q: float, level: float = 0.95, resamples: int = 2000
) -> tuple[float, float]:
    """95% interval of the q-th percentile (q in percent). The median's is median_interval's, at
    any size; another percentile's is a bootstrap on few samples and the order-statistic interval
    (normal approximation of the binomial ranks) on many."""
    if q == 50.0:
        _, lo, hi = median_interval(data, level)
        return lo, hi
    if data.size <= BOOTSTRAP_MAX_SAMPLES:
        return bootstrap_ci(data, stat=lambda x, axis=None: np.percentile(x, q, axis=axis), n=resamples)
    p, n = q / 100.0, data.size
    half = NormalDist().inv_cdf(0.5 + level / 2.0) * math.sqrt(n * p * (1.0 - p))
    lo_rank = max(0, math.floor(n * p - half) - 1)
    hi_rank = min(n - 1, math.ceil(n * p + half))
    ordered = np.partition(data, (lo_rank, hi_rank))
    return float(ordered[lo_rank]), float(ordered[hi_rank])


def summarize(samples_ms: Sequence[float] | np.ndarray, ci_resamples: int = 2000) -> dict[str, Any]:
    """The latency block of a measurement."""
    data = np.asarray(samples_ms, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples to summarize")
    mean = float(data.mean())
    stdev = float(data.std(ddof=1)) if data.size > 1 else 0.0
    out: dict[str, Any] = {"min": float(data.min()), "mean": mean}
    for key, q in PERCENTILES.items():
        out[key] = percentile(data, q)
    lo, hi = quantile_ci(data, 50.0, resamples=ci_resamples)
    out.update(
        {
            "max": float(data.max()),
            "stdev": stdev,
            "cv": stdev / mean if mean > 0 else 0.0,
            "median_ci95": [lo, hi],
        }
    )
    return out


def metric_value(samples: np.ndarray, metric: str, axis: int | None = None) -> Any:
    """p50/p90/p95/p99/p999/mean/min of samples (along `axis` for vectorised bootstrap)."""
    if metric in PERCENTILES:
        return np.percentile(samples, PERCENTILES[metric], axis=axis)
    if metric == "mean":
        return np.mean(samples, axis=axis)
    if metric == "min":
        return np.min(samples, axis=axis)
    raise ValueError(f"unknown metric {metric!r}")


def bootstrap_ratio_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    metric: str = "p50",
    n: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio metric(b) / metric(a) with a percentile-bootstrap CI, resampling each side independently."""
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    ratio = float(metric_value(xb, metric) / metric_value(xa, metric))
    rng = np.random.default_rng(seed)
    ra = metric_value(xa[rng.integers(0, xa.size, size=(n, xa.size))], metric, axis=1)
    rb = metric_value(xb[rng.integers(0, xb.size, size=(n, xb.size))], metric, axis=1)
    ratios = rb / ra
    alpha = (1.0 - level) / 2.0
    return ratio, float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1.0 - alpha))


def interleaved_ratio_ci(
    blocks_a: np.ndarray,
    blocks_b: np.ndarray,
    metric: str = "p50",
    n: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """metric(B) / metric(A) for runs measured interleaved in chunk pairs, with a 95% CI.

    `blocks_a[i]` and `blocks_b[i]` are chunk i's runs of each side, measured back to back, with
    A first in even chunks and B first in odd ones (as `optimize.bench.compare` alternates).

    * Runs inside a chunk share the machine's state (another job's burst), so they are not
      independent: resampling single runs gives a CI far too narrow, which is how noise turns
      into false "faster"/"slower" claims. Whole chunk pairs are resampled instead.
    * On a loaded machine the side that runs second in a chunk can be much slower (the first
      side's threads still spin, the scheduler slice is used up). The ratio is estimated within
      each order and the two are combined by their geometric mean (an AB/BA crossover), which
      cancels the order effect.
    * A percentile bootstrap over few clusters is too narrow; it is widened in log space by the
      factor that turns a normal interval into a Student-t one with chunks - 2 degrees of freedom.
    """
    from scipy.stats import norm, t

    a = np.asarray(blocks_a, dtype=np.float64)
    b = np.asarray(blocks_b, dtype=np.float64)
    chunks = a.shape[0]
    if chunks != b.shape[0] or chunks < 4:
        raise ValueError("need at least 4 chunk pairs, the same number on both sides")
    strata = [np.arange(0, chunks, 2), np.arange(1, chunks, 2)]  # A first, B first

    def crossover(idx_by_order: list[np.ndarray]) -> np.ndarray:
        log_ratio: np.ndarray | float = 0.0
        for idx in idx_by_order:
            m = idx.shape[0]
            ra = metric_value(a[idx].reshape(m, -1), metric, axis=1)
            rb = metric_value(b[idx].reshape(m, -1), metric, axis=1)
            log_ratio = log_ratio + np.log(rb / ra)
        return np.exp(np.asarray(log_ratio) / len(idx_by_order))

    ratio = float(crossover([s[None, :] for s in strata])[0])
    rng = np.random.default_rng(seed)
    per_batch = max(1, 4_000_000 // (a.size + b.size))  # bounded memory for long runs
    draws: list[np.ndarray] = []
    done = 0
    while done < n:
        m = min(per_batch, n - done)
        draws.append(crossover([s[rng.integers(0, s.size, size=(m, s.size))] for s in strata]))
        done += m
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.concatenate(draws), [alpha, 1.0 - alpha])
    dof = chunks - len(strata)
    widen = float(t.ppf(1.0 - alpha, dof) / norm.ppf(1.0 - alpha)) * np.sqrt(chunks / dof)
    return ratio, float(ratio * (lo / ratio) ** widen), float(ratio * (hi / ratio) ** widen)


def full_chunks(samples: np.ndarray | list[float], chunk_runs: int) -> np.ndarray:
    """The complete chunks of an interleaved side as a (chunks, chunk_runs) array."""
    data = np.asarray(samples, dtype=np.float64)
    full = data.size // chunk_runs if chunk_runs > 0 else 0
    return data[: full * chunk_runs].reshape(full, chunk_runs)


def percentile_ci(samples: Sequence[float], percentile: str) -> tuple[float, float, float]:
    """Point estimate and 95% CI of a percentile ("p50", "p99" ...) of latency samples."""
    q = PERCENTILES[percentile]
    data = np.asarray(samples, dtype=np.float64)
    lo, hi = quantile_ci(data, q, resamples=1000)
    return float(np.percentile(data, q)), lo, hi


def runs_for_percentile(q: float) -> int:
    """Fewest runs whose 95% interval of the q-th percentile (q in percent) ends inside the data.

    The distribution-free interval of a quantile is bounded by order statistics; its upper end
    exists within n runs only when 1 - (q/100)^n >= 0.975. Below that, the sample's largest
    runs lie inside the percentile's interval: the figure is a bound, not an estimate. p90 needs
    36 runs, p99 368, p99.9 3,688.
    """
    return math.ceil(math.log(0.025) / math.log(q / 100.0))


TAIL_PERCENTILES = {key: q for key, q in PERCENTILES.items() if q > 50.0}


def tail_flags(runs: int) -> dict[str, int]:
    """{percentile key: runs it needs} for every reported tail that `runs` runs cannot estimate."""
    needed = {key: runs_for_percentile(q) for key, q in TAIL_PERCENTILES.items()}
    return {key: n for key, n in needed.items() if runs < n}


# --- one estimator for a side-by-side comparison ----------------------------------------------
#
# A comparison's figure is the median of its per-pair ratios: each round of a comparison times a
# block of A and a block of B back to back, so the ratio of the two blocks' medians cancels what
# the machine did in those seconds (a host phase at half speed hits both). Its interval is the
# distribution-free one of a median, from the order statistics of the same pair ratios: the point
# estimate lies inside it by construction, whatever shape the ratios take. Where the ratios fall
# in two separate groups (a side that runs at two speeds, across processes or blocks), the groups
# are reported apart and the figure is the group nearest "no difference": the one a user can count
# on, never the lucky draw.

# A group of pair ratios is a mode only with at least this share of the pairs and MODE_MIN_GROUP
# pairs, out of at least MODE_MIN_PAIRS: fewer cannot tell two speeds from a few unlucky blocks.
MODE_MIN_SHARE = 0.15
MODE_MIN_GROUP = 3
MODE_MIN_PAIRS = 10
# Two groups are two modes only when their medians differ by at least this factor and the gap
# between them is wider than twice the spread inside either...
MODE_MIN_FACTOR = 1.15
_MODE_GAP_SPREADS = 2.0
_MODE_GAP_SHARE = 0.3  # ... and at least this share of the distance between their medians
_MODE_MIN_SPREAD = 0.01  # log units: a group of near-identical ratios still has this much spread


# Cached: the measuring loop asks for the same few sizes at each of its stop checks.
@functools.lru_cache(maxsize=1024)
def _median_rank(n: int, level: float = 0.95) -> int:
    """The largest k (1-based, at least 1) whose order statistics [k, n + 1 - k] of n values still
    cover the median at `level` (binomial ranks); with too few values, 1: the whole range."""
    from scipy.stats import binom

    alpha = (1.0 - level) / 2.0
    k = int(binom.ppf(alpha, n, 0.5))
    while k >= 1 and binom.cdf(k - 1, n, 0.5) > alpha:
        k -= 1
    return max(k, 1)


def median_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): the sample median and the distribution-free interval of the median, from
    the order statistics whose binomial ranks cover `level`. With too few values for `level`
    (under 6 at 95%) the interval is the whole range. The median lies inside by construction.

    lto's one interval of a median: a comparison's pair ratios, a repeated measurement's
    per-process medians and the measuring loop's stop rule all take it from here."""
    data = np.sort(np.asarray(values, dtype=np.float64))
    n = data.size
    if n == 0:
        nan = float("nan")
        return nan, nan, nan
    k = _median_rank(n, level)
    return float(np.median(data)), float(data[k - 1]), float(data[n - k])


def median_interval_coverage(n: int, level: float = 0.95) -> float:
    """The coverage of median_interval's interval over n values (below 0.95 under 6 values)."""
    from scipy.stats import binom

    if n < 2:
        return 0.0
    return float(1.0 - 2.0 * binom.cdf(_median_rank(n, level) - 1, n, 0.5))


def median_interval_rel_width(values: Sequence[float] | np.ndarray, level: float = 0.95) -> float:
    """The width of median_interval's interval relative to the median; infinite where the values
    are too few for an interval at `level` (under 6 at 95%) or the median is not positive."""
    if median_interval_coverage(len(values), level) < level:
        return math.inf
    median, lo, hi = median_interval(values, level)
    return (hi - lo) / median if median > 0 else math.inf


@dataclass(frozen=True)
class RatioFigure:
    """metric(B) / metric(A) over a set of block pairs, with each side's latency in those pairs."""

    ratio: float  # the median of the per-pair ratios
    ci95: tuple[float, float]  # the median's distribution-free interval over the same pairs
    pairs: int
    a_ms: float  # A's latency in these pairs (their typical level split by the ratio; see _figure)
    b_ms: float
    groups: tuple[int, ...] = ()  # the process sets these pairs came from
    a_ci95: tuple[float, float] = (math.nan, math.nan)  # the medians' intervals, as the ratio's
    b_ci95: tuple[float, float] = (math.nan, math.nan)

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "ratio_ci95": list(self.ci95),
            "speedup": 1.0 / self.ratio if self.ratio > 0 else None,
            "pairs": self.pairs,
            "a_ms": self.a_ms,
            "b_ms": self.b_ms,
            "a_ms_ci95": list(self.a_ci95),
            "b_ms_ci95": list(self.b_ci95),
            "process_sets": list(self.groups),
        }


@dataclass(frozen=True)
class PairedRatio:
    """A comparison's one figure (`figure`), the figure over every pair (`overall`), and, when the
    pair ratios fall in two groups, both groups (`modes`, faster B first) and the side whose
    latency moved between them (`moved`: "A", "B" or "both")."""

    figure: RatioFigure
    overall: RatioFigure
    modes: tuple[RatioFigure, ...] = ()
    moved: str = ""
    coverage: float = 0.95

    @property
    def ratio(self) -> float:
        return self.figure.ratio

    @property
    def ci95(self) -> tuple[float, float]:
        """The figure's interval; the span of both modes' intervals where the two disagree on
        which side is faster (no claim of a difference a process draw could reverse), or where the
        figure's mode has too few pairs for a 95% interval of its own."""
        if len(self.modes) == 2:
            low, high = self.modes
            if low.ratio < 1.0 < high.ratio or median_interval_coverage(self.figure.pairs) < 0.95:
                return min(low.ci95[0], high.ci95[0]), max(low.ci95[1], high.ci95[1])
        return self.figure.ci95

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "figure": self.figure.to_json(),
            "ratio_ci95": list(self.ci95),
            "coverage": self.coverage,
        }
        if self.modes:
            out["overall"] = self.overall.to_json()
            out["modes"] = [m.to_json() for m in self.modes]
            out["moved"] = self.moved
        return out


def _figure(
    ratios: np.ndarray, a: np.ndarray, b: np.ndarray, groups: np.ndarray, idx: np.ndarray
) -> RatioFigure:
    """The figure over the pairs `idx`. Each side's latency is the pairs' typical level (the
    median of each pair's geometric mean) split by the figure's ratio: the two divide into the
    ratio exactly, and on pairs that agree they are each side's median block. Medians taken per
    side would not divide into it: on pairs from processes or moments at different speeds, each
    side's median comes from other pairs (an A/A comparison over 3 process sets read 1.006 from
    the pairs and 1.082 from the two sides' medians)."""
    ratio, lo, hi = median_interval(ratios[idx])
    level, level_lo, level_hi = median_interval(np.sqrt(a[idx] * b[idx]))
    half = math.sqrt(ratio)
    return RatioFigure(
        ratio, (lo, hi), int(idx.size), level / half, level * half,
        tuple(sorted({int(g) for g in groups[idx]})),
        (level_lo / half, level_hi / half), (level_lo * half, level_hi * half),
    )  # fmt: skip


def split_modes(log_ratios: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Indices of the low and the high group when the log pair ratios form two clearly separate
    groups (MODE_MIN_SHARE, MODE_MIN_FACTOR, a gap wider than twice either group's spread), else
    None. The split is the one that maximises the between-group variance (Otsu's)."""
    x = np.asarray(log_ratios, dtype=np.float64)
    n = x.size
    smallest = max(MODE_MIN_GROUP, math.ceil(MODE_MIN_SHARE * n))
    if n < max(MODE_MIN_PAIRS, 2 * smallest):
        return None
    order = np.argsort(x, kind="stable")
    xs = x[order]
    best_m, best_score = -1, -1.0
    for m in range(smallest, n - smallest + 1):
        score = m * (n - m) * (xs[m:].mean() - xs[:m].mean()) ** 2
        if score > best_score:
            best_m, best_score = m, score
    low, high = xs[:best_m], xs[best_m:]
    separation = float(np.median(high) - np.median(low))
    if separation < math.log(MODE_MIN_FACTOR):
        return None

    def spread(group: np.ndarray) -> float:
        return max(1.4826 * float(np.median(np.abs(group - np.median(group)))), _MODE_MIN_SPREAD)

    gap = float(high[0] - low[-1])
    # Halves of one noisy group also have medians apart and small spreads of their own; what
    # they lack is an empty stretch between them as wide as a good part of that distance.
    if gap < _MODE_GAP_SPREADS * max(spread(low), spread(high)) or gap < _MODE_GAP_SHARE * separation:
        return None
    return order[:best_m], order[best_m:]


def paired_ratio(
    a_blocks: Sequence[float] | np.ndarray,
    b_blocks: Sequence[float] | np.ndarray,
    groups: Sequence[int] | np.ndarray | None = None,
) -> PairedRatio:
    """B against A from per-block figures (a_blocks[i] and b_blocks[i] timed back to back in round
    i; `groups[i]`: the process set of round i). See the comment above for the method."""
    a = np.asarray(a_blocks, dtype=np.float64)
    b = np.asarray(b_blocks, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("need the same number of blocks on both sides, at least one")
    g = np.zeros(a.size, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    ratios = b / a
    everything = np.arange(a.size)
    overall = _figure(ratios, a, b, g, everything)
    coverage = median_interval_coverage(a.size)
    split = split_modes(np.log(ratios))
    if split is None:
        split = _split_by_a_side(a, b, ratios)
    if split is None:
        return PairedRatio(overall, overall, coverage=coverage)
    low_idx, high_idx = sorted(split, key=lambda idx: float(np.median(ratios[idx])))
    low, high = _figure(ratios, a, b, g, low_idx), _figure(ratios, a, b, g, high_idx)
    # The side whose own latency differs between the groups is the one running at two speeds.
    moved_a = abs(math.log(float(np.median(a[high_idx])) / float(np.median(a[low_idx]))))
    moved_b = abs(math.log(float(np.median(b[high_idx])) / float(np.median(b[low_idx]))))
    moved = "A" if moved_a > 2 * moved_b else "B" if moved_b > 2 * moved_a else "both"
    # The figure a user can count on: the group whose ratio is nearest no difference.
    figure = min((low, high), key=lambda f: abs(math.log(f.ratio)))
    return PairedRatio(figure, overall, (low, high), moved, coverage=median_interval_coverage(figure.pairs))


def _split_by_a_side(
    a: np.ndarray, b: np.ndarray, ratios: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the ratios alone show no two groups but one side's own latency does (ONNX Runtime's
    pool at 3 ms in some blocks and 9 ms in others, the other side slowed less by the same
    moments, which smears the ratios into one wide spread): those groups, when their ratios
    differ by at least MODE_MIN_FACTOR with intervals apart; the side that differs more wins."""
    best: tuple[float, tuple[np.ndarray, np.ndarray]] | None = None
    for side in (a, b):
        split = split_modes(np.log(side))
        if split is None:
            continue
        (r1, lo1, hi1), (r2, lo2, hi2) = (median_interval(ratios[idx]) for idx in split)
        apart = abs(math.log(r2 / r1))
        disjoint = hi1 < lo2 or hi2 < lo1
        if apart >= math.log(MODE_MIN_FACTOR) and disjoint and (best is None or apart > best[0]):
            best = (apart, split)
    return None if best is None else best[1]


BLOCK_STATISTICS = ("p50", "mean", "min")  # per-block figures a paired ratio is taken over


def block_figures(blocks: np.ndarray, metric: str) -> np.ndarray:
    """Each block's figure (rows of `blocks`) for a paired ratio: its median, mean or minimum."""
    if metric not in BLOCK_STATISTICS:
        raise ValueError(f"a paired ratio is taken over {', '.join(BLOCK_STATISTICS)}, not {metric!r}")
    return np.asarray(metric_value(blocks, metric, axis=1), dtype=np.float64)
