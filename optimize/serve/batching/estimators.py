"""What the batcher learns while it runs, each estimate fading old data so it follows the machine.

`LatencyModel` predicts a batch's model time from its work ("work": input elements relative to
one calibration row, so one model covers batch size and sequence length alike). `LoadEstimates`
follows the traffic and the server around the model: how far apart requests arrive, how long an
instance idles between calls while work waits (hand-offs), and the rate delivered under backlog.
"""

from __future__ import annotations

import itertools
import math
from typing import Any


class LatencyModel:
    """Predicted model latency (ms) for a batch of `work`, learned from measured (work, ms) pairs.

    Two views of the same observations, both fading old data so they follow the machine:
    - a line, intercept + slope·work, fitted by exponentially weighted least squares: it
      extrapolates beyond the sizes measured so far;
    - a table of mean latency per power-of-two size class, interpolated: it captures what a
      line cannot, e.g. a runtime whose batch-1 kernel is much faster per row than its batched
      one (measured: resnet_tiny on ORT, 2.3 ms at batch 1, 5+ ms per row at batch 2..32).
    `predict` trusts the table inside the measured range and the line beyond it; `upper` adds
    two residual deviations, which is what deadline decisions use: a deadline is a promise.
    `most_efficient_work` is the size with the most rows per ms that fits a latency budget.
    """

    def __init__(self, decay: float = 0.98, class_decay: float = 0.8) -> None:
        self.decay = decay
        self.class_decay = class_decay
        self.n = 0
        self._s0 = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._var = 0.0  # EW mean squared residual
        self.intercept = 0.0
        self.slope = 0.0
        self._classes: dict[int, tuple[float, float]] = {}  # log2 class -> (EW work, EW ms)
        # Sorted once per observation, not on each of the several predictions a request asks for.
        self._sorted: list[tuple[float, float]] = []

    def observe(self, work: float, latency_ms: float) -> None:
        if self.n:
            expected = self.predict(work)
            # A thread descheduled by a busy machine can take 10x longer once; clip such spikes
            # so that one of them cannot make every later prediction (and deadline) pessimistic.
            latency_ms = min(latency_ms, 3.0 * expected) if expected > 0 else latency_ms
            resid = latency_ms - expected
            self._var = self.decay * self._var + (1 - self.decay) * resid * resid
        d = self.decay
        self._s0 = d * self._s0 + 1.0
        self._sx = d * self._sx + work
        self._sy = d * self._sy + latency_ms
        self._sxx = d * self._sxx + work * work
        self._sxy = d * self._sxy + work * latency_ms
        self.n += 1
        self._fit()
        key = round(math.log2(max(work, 1e-6)))
        if key in self._classes:
            w0, m0 = self._classes[key]
            c = self.class_decay
            self._classes[key] = (c * w0 + (1 - c) * work, c * m0 + (1 - c) * latency_ms)
        else:
            self._classes[key] = (work, latency_ms)
        self._sorted = sorted(self._classes.values())

    def _fit(self) -> None:
        mx, my = self._sx / self._s0, self._sy / self._s0
        var_x = self._sxx / self._s0 - mx * mx
        if var_x <= 1e-9 * max(1.0, mx * mx):
            # Only one work level seen: assume no gain from batching (latency ∝ work),
            # the safe guess until a bigger batch has been measured.
            self.intercept, self.slope = 0.0, my / mx if mx > 0 else 0.0
            return
        slope = (self._sxy / self._s0 - mx * my) / var_x
        if slope < 0:  # noise; bigger batches are never faster
            self.intercept, self.slope = my, 0.0
            return
        intercept = my - slope * mx
        if intercept < 0:
            self.intercept, self.slope = 0.0, self._sxy / self._sxx
            return
        self.intercept, self.slope = intercept, slope

    def _points(self) -> list[tuple[float, float]]:
        return self._sorted

    def predict(self, work: float) -> float:
        line = self.intercept + self.slope * work
        points = self._points()
        if not points:
            return line
        if work <= points[0][0]:
            w0, m0 = points[0]
            # Below the smallest measured size: no faster than the line, no slower than that size.
            return min(m0, max(line, m0 * work / w0 if w0 > 0 else m0))
        for (w0, m0), (w1, m1) in itertools.pairwise(points):
            if work <= w1:
                return m0 + (m1 - m0) * (work - w0) / (w1 - w0) if w1 > w0 else m1
        w_last, m_last = points[-1]
        return m_last + max(self.slope, m_last / w_last if w_last > 0 else 0.0) * (work - w_last)

    def upper(self, work: float) -> float:
        return self.predict(work) + 2.0 * math.sqrt(self._var)

    def most_efficient_work(
        self, budget_ms: float, per_batch_ms: float = 0.0, least_work: float = 0.0
    ) -> tuple[float, bool] | None:
        """(work, is_largest_measured) of the size class with the most work per ms within budget;
        `per_batch_ms`: what each batch costs besides the model call (hand-offs), which favours
        larger batches when work waits. Only classes of at least `least_work` compete: smaller
        ones cannot be formed (one request is that much), and the warm-up measured them on an
        idle machine, so beside sizes measured under load they would always look the best."""
        floor = least_work * (1.0 - 1e-6)
        points = [p for p in self._points() if p[1] <= budget_ms and p[1] > 0 and p[0] >= floor]
        if not points:
            return None
        best = max(points, key=lambda p: p[0] / (p[1] + per_batch_ms))
        return best[0], best == self._points()[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "intercept_ms": self.intercept,
            "slope_ms_per_row": self.slope,
            "residual_ms": math.sqrt(self._var),
            "observations": self.n,
            "by_size": [{"work": round(w, 3), "ms": round(m, 4)} for w, m in self._points()],
        }


class LoadEstimates:
    """Exponentially weighted estimates of the traffic and of the server around the model."""

    def __init__(self) -> None:
        self.last_arrival: float | None = None
        self.arrival_gap_s: float | None = None  # EW mean time between arrivals
        # Instance -> when its last model call ended; and the EW mean idle time of an instance
        # between calls while work already waited for it (hand-offs to and from its thread).
        self._last_end: dict[int, float] = {}
        self.batch_gap_ms = 0.0
        # Wall ms per unit of work between batch completions while work waited: what the server
        # really delivers, hand-offs and contention included, not only the model's time.
        self.served_ms_per_work: float | None = None
        self._last_finish: float | None = None

    def arrival(self, now: float) -> None:
        """A request arrived at `now`."""
        if self.last_arrival is not None:
            gap = now - self.last_arrival
            self.arrival_gap_s = gap if self.arrival_gap_s is None else 0.9 * self.arrival_gap_s + 0.1 * gap
        self.last_arrival = now

    def observe_gap(self, instance: int, earliest_enqueued: float, t_run: float, t_end: float) -> None:
        """Learn how long an instance sits idle between calls although work waits for it."""
        last, self._last_end[instance] = self._last_end.get(instance), t_end
        if last is None or earliest_enqueued > last or t_run < last:
            return  # the instance had nothing to do: an idle gap, not a hand-off
        gap_ms = min((t_run - last) * 1e3, 10.0)  # a descheduled thread is not a hand-off
        self.batch_gap_ms = 0.9 * self.batch_gap_ms + 0.1 * gap_ms

    def observe_service(self, t_back: float, work: float, backlog: bool) -> None:
        """Learn the delivered rate from completions that follow each other under backlog."""
        last, self._last_finish = self._last_finish, t_back
        if last is None or not backlog or work <= 0:
            return
        ms = (t_back - last) * 1e3 / work
        old = self.served_ms_per_work
        self.served_ms_per_work = ms if old is None else 0.9 * old + 0.1 * ms
