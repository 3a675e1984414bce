"""Measurement: the engine that times everything lto reports (`engine`); comparisons with each
side in a worker process of its own (`apart`); the `lto bench` command's sweeps and comparisons
(`command`) and its process-level repetitions (`repeat`); the machine's arithmetic rates, measured
once (`peaks`). Nothing else in lto times a model."""

from optimize.bench.apart import compare
from optimize.bench.engine import (
    BenchSettings,
    Comparison,
    Measurement,
    measure,
    measure_where_it_runs,
)

__all__ = [
    "BenchSettings",
    "Comparison",
    "Measurement",
    "compare",
    "measure",
    "measure_where_it_runs",
]
