"""Robust statistics for latency samples: percentiles, bootstrap intervals, ratios."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def median_ci_width_rel(samples: Sequence[float] | np.ndarray, n: int = 400) -> float:
    """Relative width of the median's 95% CI: (hi - lo) / median. Cheap enough for an adaptive stop."""
    lo, hi = bootstrap_ci(samples, n=n)
    med = float(np.median(np.asarray(samples)))
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
    lo, hi = bootstrap_ci(data, n=ci_resamples)
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
