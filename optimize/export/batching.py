"""Triton's dynamic-batching settings, derived from lto's measured batch-latency profile and an SLO.

The profile is what `lto bench ARTIFACT --batch 1,2,4,8,...` measures: latency samples per batch
size, on this artifact with its runtime configuration. The rule, for one SLO at one percentile:

- A request may wait in Triton's queue up to `max_queue_delay`, then behind a batch already
  running (up to L(B)), then for its own batch (up to L(B)): so D + 2·L(B) <= SLO, where L(b) is
  the measured latency of batch b at the SLO's percentile.
- `max_batch_size` B: of the measured batches with 2·L(b) <= SLO (within what the model file
  accepts), the one with the most rows per millisecond. A bigger batch that runs fewer rows per ms
  only adds latency (on 2 cores, BERT at batch 1 beats batch 8), and an unmeasured one is not
  promised. `preferred_batch_size` is [B]: Triton then forms B-row batches whenever it can.
- `max_queue_delay_microseconds` D: what the SLO leaves after 2·L(B), and at most L(B): waiting
  longer than one batch takes gathers no more company than the next batch would.
- B = 1 (batching does not pay, or the SLO leaves no room): no dynamic batching block.

Triton's latency is not lto's: it adds its own queueing and (de)serialization, runs on another
machine, and shares cores among instances. These settings start from measured figures; check them
with Triton's perf_analyzer on the serving hosts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.bench import BenchSettings
from optimize.bench.command import BenchRequest, run_bench
from optimize.errors import UsageError
from optimize.report import load_report


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    samples_ms: tuple[float, ...]

    def latency_ms(self, percentile: float) -> float:
        return float(np.percentile(np.asarray(self.samples_ms, dtype=np.float64), percentile))


@dataclass(frozen=True)
class BatchProfile:
    """Latency samples per batch size, for one model on one machine."""

    points: tuple[BatchPoint, ...]
    source: str  # "measured now" or the bench report's path
    fingerprint: str | None = None  # the machine that measured

    @classmethod
    def from_bench_report(cls, report: Mapping[str, Any], source: str) -> BatchProfile:
        by_batch: dict[int, BatchPoint] = {}
        for result in report.get("results", []):
            samples = tuple(float(s) for s in result.get("samples_ms") or [])
            if samples:
                batch = int(result["batch_size"])
                by_batch[batch] = BatchPoint(batch, samples)
        if not by_batch:
            raise UsageError(f"{source} holds no latency samples", "give a report written by lto bench")
        env = report.get("environment") or {}
        return cls(tuple(by_batch[b] for b in sorted(by_batch)), source, env.get("fingerprint"))

    def to_json(self, percentile: float) -> dict[str, Any]:
        return {
            "source": self.source,
            "fingerprint": self.fingerprint,
            "percentile": percentile,
            "latency_ms": {str(p.batch): round(p.latency_ms(percentile), 4) for p in self.points},
        }


@dataclass
class BatchingPlan:
    """What goes into config.pbtxt, and why (one line per decision, for people)."""

    max_batch_size: int
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_us: int | None = None  # None: no dynamic_batching block (B = 1)
    why: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_batch_size": self.max_batch_size,
            "preferred_batch_size": self.preferred_batch_size,
            "max_queue_delay_microseconds": self.max_queue_delay_us,
            "why": self.why,
        }


def plan_batching(
    profile: BatchProfile,
    slo_ms: float,
    percentile: float,
    batch_limit: int | None = None,
) -> BatchingPlan:
    """The rule in this module's docstring, applied to `profile`."""
    pct = f"p{percentile:g}"
    points = [p for p in profile.points if batch_limit is None or p.batch <= batch_limit]
    if not points:
        raise UsageError(
            f"the batch profile measured no size the model accepts (at most {batch_limit})",
            f"measure sizes up to {batch_limit}",
        )
    lat = {p.batch: p.latency_ms(percentile) for p in points}
    rate = {b: b / ms if ms > 0 else 0.0 for b, ms in lat.items()}
    fitting = [b for b in lat if 2 * lat[b] <= slo_ms]
    warnings: list[str] = []
    why: list[str] = []
    if fitting:
        # Most rows per ms; on a tie the smaller batch (same throughput, less latency).
        best = max(fitting, key=lambda b: (rate[b], -b))
        why.append(
            f"max_batch_size {best}: of the measured batches with 2 x {pct} within the {slo_ms:g} ms SLO "
            f"({', '.join(str(b) for b in sorted(fitting))}), the one with the highest throughput "
            f"({rate[best] * 1000:.4g} rows/s at {pct})"
        )
        bigger = [b for b in fitting if b > best]
        if bigger:
            why.append(
                f"larger batches fit the SLO but have lower throughput here "
                f"(batch {max(bigger)}: {rate[max(bigger)] * 1000:.4g} rows/s), so Triton will not form them"
            )
    else:
        best = min(lat)
        if lat[best] > slo_ms:
            warnings.append(
                f"the SLO cannot be met: batch {best} alone takes {lat[best]:.3g} ms at {pct} "
                f"(SLO {slo_ms:g} ms)"
            )
        else:
            warnings.append(
                f"the {slo_ms:g} ms SLO leaves no room to batch: batch {best} takes "
                f"{lat[best]:.3g} ms at {pct}, a request queued behind one would miss it"
            )
        why.append(f"max_batch_size {best}: the smallest measured batch (none fits the SLO twice)")
    if best == 1:
        why.append("no dynamic batching: batching does not pay for this model on the machine that measured")
        return BatchingPlan(max_batch_size=1, why=why, warnings=warnings)
    delay_ms = max(0.0, min(slo_ms - 2 * lat[best], lat[best]))
    delay_us = math.floor(delay_ms * 1000)
    why.append(
        f"max_queue_delay_microseconds {delay_us}: what the SLO leaves after 2 x L({best}) = "
        f"{2 * lat[best]:.3g} ms, at most L({best})"
    )
    return BatchingPlan(
        max_batch_size=best,
        preferred_batch_size=[best],
        max_queue_delay_us=delay_us,
        why=why,
        warnings=warnings,
    )


def profile_from_report(path: Path, model_sha256: str) -> BatchProfile:
    """The profile in a `lto bench` report, refused unless it measured this very model file."""

    report = load_report(path)
    if report.get("kind") != "bench":
        raise UsageError(
            f"{path} is a {report.get('kind')!r} report, not a batch profile",
            "write one with lto bench ARTIFACT --batch 1,2,4,8,16,32 -o bench.json",
        )
    measured = (report.get("model") or {}).get("sha256")
    if measured != model_sha256:
        raise UsageError(
            f"{path} measured another model than this artifact's "
            f"(sha256 {str(measured)[:12]} vs {model_sha256[:12]})",
            "measure the artifact itself: lto bench ARTIFACT --batch 1,2,4,8,16,32 -o bench.json",
        )
    return BatchProfile.from_bench_report(report, str(path))


def measure_profile(
    artifact: Path,
    batches: list[int],
    max_time_s: float,
    progress: Callable[[str, int, float], None] | None = None,
) -> BatchProfile:
    """Measure the artifact at each batch size now, through lto bench's engine, on this machine."""

    request = BenchRequest(
        model=artifact,
        batches=batches,
        settings=BenchSettings(max_time_s=max_time_s),
    )
    report = run_bench(request, progress)
    return BatchProfile.from_bench_report(report, f"measured now by lto export (batches {batches})")


__all__ = [
    "BatchPoint",
    "BatchProfile",
    "BatchingPlan",
    "measure_profile",
    "plan_batching",
    "profile_from_report",
]
