"""Robust statistics for latency samples: percentiles, bootstrap intervals, ratios."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    """95% interval of the q-th percentile (q in percent): a bootstrap on few samples, the
    order-statistic interval (normal approximation of the binomial ranks) on many."""
    if data.size <= BOOTSTRAP_MAX_SAMPLES:
        return bootstrap_ci(data, stat=lambda x, axis=None: np.percentile(x, q, axis=axis), n=resamples)
    p, n = q / 100.0, data.size
    half = NormalDist().inv_cdf(0.5 + level / 2.0) * math.sqrt(n * p * (1.0 - p))
    lo_rank = max(0, math.floor(n * p - half) - 1)
    hi_rank = min(n - 1, math.ceil(n * p + half))
    ordered = np.partition(data, (lo_rank, hi_rank))
    return float(ordered[lo_rank]), float(ordered[hi_rank])


def median_ci_width_rel(samples: Sequence[float] | np.ndarray, n: int = 400) -> float:
    """Relative width of the median's 95% CI: (hi - lo) / median. Cheap enough for an adaptive stop."""
    data = np.asarray(samples, dtype=np.float64)
    lo, hi = quantile_ci(data, 50.0, resamples=n)
    med = float(np.median(data))
    return (hi - lo) / med if med > 0 else float("inf")


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


TAIL_PERCENTILES = {"p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def tail_flags(runs: int) -> dict[str, int]:
    """{percentile key: runs it needs} for every reported tail that `runs` runs cannot estimate."""
    needed = {key: runs_for_percentile(q) for key, q in TAIL_PERCENTILES.items()}
    return {key: n for key, n in needed.items() if runs < n}
