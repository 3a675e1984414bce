"""Measurement: the engine that times everything lto reports (`engine`), and the `lto bench`
command's sweeps and comparisons built on it (`command`). Nothing else in lto times a model."""

from optimize.bench.apart import compare
from optimize.bench.engine import (
    BenchSettings,
    Comparison,
    Measurement,
    measure,
    measure_where_it_runs,
    median_ci_rel_width,
)

__all__ = [
    "BenchSettings",
    "Comparison",
    "Measurement",
    "compare",
    "measure",
    "measure_where_it_runs",
    "median_ci_rel_width",
]
