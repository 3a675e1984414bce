"""A load generator in the manner of MLPerf LoadGen: open-loop Poisson or closed-loop, with an SLO verdict.

Open loop (LoadGen's Server scenario) issues requests at Poisson arrival times whatever the
server does, and measures each latency from the *scheduled* arrival, so a slow server cannot
hide its queueing by slowing the generator down (no coordinated omission). Closed loop keeps
`concurrency` requests outstanding. The server's own phases come back in `Server-Timing`;
what is left of the client's latency is the network and HTTP handling.
"""

from __future__ import annotations

import asyncio
import math
import re
import resource
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimize.errors import UsageError
from optimize.report import new_report
from optimize.serve.batching.outcomes import ServeError
from optimize.serve.http_client import HttpClient, HttpClientError
from optimize.serve.protocol import HEADER_LENGTH, encode_request
from optimize.stats import summarize

PHASES = ("decode", "queue", "batch", "model", "encode")
_TIMING = re.compile(r"([A-Za-z_][\w-]*)\s*;\s*dur=([0-9.]+)")
_ROWS = re.compile(r'rows\s*;\s*desc="?(\d+)')

# The generator warns it may have been the bottleneck beyond these.
SATURATED_CPU = 0.85  # of one core: the generator is one asyncio thread
SATURATED_LAG_MS = 2.0  # p99 of (actual send - scheduled send) in open loop


@dataclass
class Outcome:
    """One request as the generator saw it."""

    kind: str  # "ok" or an error kind
    phases: dict[str, float] | None = None  # server phases, ms
    batch_rows: int | None = None


class Endpoint(ABC):
    """What the generator sends requests to."""

    name: str = "target"
    # What the client's latency minus the server's own total is made of.
    remainder: str = "network_http"

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    rows: int = 1  # how many different requests it sends in turn
    row_feeds: list[dict[str, np.ndarray]]  # their inputs
    _next: int = 0

    @abstractmethod
    async def infer(self, row: int | None = None) -> Outcome:
        """One request: row `row` of those it holds, or the next in turn."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def _take(self, row: int | None) -> int:
        """The row to send: the one asked for, else the next in turn."""
        if row is not None:
            return row % self.rows
        index = self._next
        self._next = (self._next + 1) % self.rows
        return index


def parse_server_timing(header: str | None) -> tuple[dict[str, float] | None, int | None]:
    if not header:
        return None, None
    phases = {m.group(1): float(m.group(2)) for m in _TIMING.finditer(header)}
    rows = _ROWS.search(header)
    return phases or None, int(rows.group(1)) if rows else None


_STATUS_KINDS = {400: "bad_request", 404: "not_found", 413: "too_large", 503: "overloaded", 504: "timeout"}


class HttpEndpoint(Endpoint):
    """A KServe v2 server over HTTP, sending binary tensors (what a production client would), each
    request encoded once before the clock starts, so that the client costs the same per request
    and as little as it can (optimize/serve/http_client.py)."""

    def __init__(
        self,
        url: str,
        model: str,
        feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
        timeout_s: float = 30.0,
    ) -> None:
        """`feeds`: one request's inputs, or many, sent in turn (rows of a file replayed)."""
        self.url = url.rstrip("/")
        self.model = model
        self.name = f"{self.url} model {model}"
        rows = [feeds] if isinstance(feeds, Mapping) else list(feeds)
        self.row_feeds = [dict(row) for row in rows]
        self.client = HttpClient(self.url, timeout_s)
        self.requests: list[bytes] = []
        for row in rows:
            body, head_len = encode_request(row, binary=True, binary_outputs=True)
            headers = {HEADER_LENGTH: str(head_len), "Content-Type": "application/octet-stream"}
            self.requests.append(self.client.encode("POST", f"/v2/models/{model}/infer", headers, body))
        self.rows = len(self.requests)
        self._next = 0

    async def open(self) -> None:
        pass  # connections open as requests need them

    async def close(self) -> None:
        await self.client.close()

    async def get(self, path: str) -> int:
        """A plain GET on the same connections (health checks; the HTTP stack's floor)."""
        return (await self.client.send(self.client.encode("GET", path, {}))).status

    async def infer(self, row: int | None = None) -> Outcome:
        try:
            answer = await self.client.send(self.requests[self._take(row)])
        except TimeoutError:
            return Outcome("client_timeout")
        except HttpClientError:
            return Outcome("connection")
        if answer.status != 200:
            return Outcome(_STATUS_KINDS.get(answer.status, f"http_{answer.status}"))
        phases, rows = parse_server_timing(answer.headers.get("server-timing"))
        return Outcome("ok", phases, rows)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": "http",
            "url": self.url,
            "model": self.model,
            "rows": self.rows,
        }


class InProcessEndpoint(Endpoint):
    """The batcher called directly, no HTTP: what the runtime itself costs."""

    def __init__(
        self,
        batcher: Any,
        feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
        name: str = "in-process",
    ) -> None:
        """`feeds`: one request's inputs, or many, sent in turn (rows of a file replayed)."""
        self.batcher = batcher
        self.rows_list = [dict(feeds)] if isinstance(feeds, Mapping) else [dict(f) for f in feeds]
        self.row_feeds = self.rows_list
        self.feeds = self.rows_list[0]
        self.rows = len(self.rows_list)
        self._next = 0
        self.name = name
        self.remainder = "event_loop"

    async def infer(self, row: int | None = None) -> Outcome:
        feeds = self.rows_list[self._take(row)]
        try:
            result = await self.batcher.submit(feeds)
        except ServeError as exc:
            return Outcome(exc.kind)
        phases = {"queue": result.queue_ms, "batch": result.batch_ms, "model": result.model_ms}
        phases["total"] = sum(phases.values())
        return Outcome("ok", phases, result.batch_rows)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "transport": "in-process", "rows": self.rows}


@dataclass
class LoadSettings:
    qps: float | None = None  # open loop when set
    concurrency: int = 1  # closed loop otherwise
    duration_s: float | None = 10.0
    requests: int | None = None  # exact count; overrides duration
    min_queries: int | None = None  # default: ten samples beyond the SLO percentile
    warmup: int = 20
    slo_ms: float | None = None
    percentile: float = 99.0
    max_error_rate: float = 0.01
    seed: int = 0

    @property
    def mode(self) -> str:
        return "poisson" if self.qps is not None else "closed"

    def validate(self) -> None:
        if self.qps is not None and self.qps <= 0:
            raise UsageError("--qps must be positive")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.requests is None and (self.duration_s is None or self.duration_s <= 0):
            raise UsageError("give a positive --duration or --requests")
        if self.requests is not None and self.requests < 1:
            raise UsageError("--requests must be at least 1")
        if not 0 < self.percentile < 100:
            raise UsageError("--percentile must be between p0 and p100, e.g. p99")
        if self.slo_ms is not None and self.slo_ms <= 0:
            raise UsageError("--slo-ms must be positive")

    def effective_min_queries(self) -> int:
        if self.min_queries is not None:
            return self.min_queries
        # Ten samples beyond the percentile, so that it is not decided by one or two requests.
        return math.ceil(round(1000.0 / (100.0 - self.percentile), 6))

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "mode": self.mode, "min_queries": self.effective_min_queries()}


@dataclass
class LoadResult:
    settings: LoadSettings
    label: str
    samples_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    batch_rows: Counter[int] = field(default_factory=Counter)
    phases: dict[str, list[float]] = field(default_factory=dict)
    issued: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    lag_ms: list[float] = field(default_factory=list)
    stopped_by: str = "duration"
    # When MLPerf LoadGen scheduled the run: its scenario, verdict (VALID/INVALID, and why) and
    # figures (optimize/serve/mlperf.py). None when lto's own loop ran.
    loadgen: dict[str, Any] | None = None

    @property
    def scheduler(self) -> str:
        if self.loadgen is not None:
            name = " ".join(x for x in ("MLPerf LoadGen", self.loadgen.get("version")) if x)
            return f"{name}, {self.loadgen['scenario']} scenario"
        return f"lto's own {'open' if self.settings.qps is not None else 'closed'} loop"

    @property
    def completed(self) -> int:
        return len(self.samples_ms)

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / self.issued if self.issued else 0.0

    @property
    def throughput(self) -> float:
        """Answered per second: LoadGen's completed rate where it ran (its own clock and span)."""
        if self.loadgen is not None and self.loadgen.get("completed_per_s"):
            return float(self.loadgen["completed_per_s"])
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_fraction(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def latency_at(self, percentile: float) -> float | None:
        """The latency percentile over the samples: LoadGen's own per-query latencies where it ran
        (read from its trace), so the verdict, the tables and the plots are one measurement."""
        return float(np.percentile(self.samples_ms, percentile)) if self.samples_ms else None

    def invalid_because(self) -> str:
        return "; ".join((self.loadgen or {}).get("invalid_because") or []) or "see its log"

    def warnings(self) -> list[str]:
        out = []
        if (
            self.loadgen is not None
            and self.loadgen.get("validity") != "VALID"
            and self.settings.slo_ms is None
        ):
            out.append(f"LoadGen calls this run {self.loadgen.get('validity')}: {self.invalid_because()}")
        if self.cpu_fraction >= SATURATED_CPU:
            out.append(
                f"load generator used {self.cpu_fraction:.0%} of a core: it may have been the bottleneck; "
                "run it on another machine or lower the rate"
            )
        if self.lag_ms and float(np.percentile(self.lag_ms, 99)) > SATURATED_LAG_MS:
            out.append(
                f"load generator fell behind its schedule (p99 lag {np.percentile(self.lag_ms, 99):.1f} ms): "
                "latencies include that lag"
            )
        p = self.settings.percentile
        tail = self.completed * (100.0 - p) / 100.0
        if self.completed and tail < 10:
            out.append(f"p{p:g} rests on {tail:.1f} samples beyond it; run more requests for a firm figure")
        return out

    def verdict(self) -> dict[str, Any]:
        s = self.settings
        value = self.latency_at(s.percentile)
        reasons = []
        if not self.samples_ms:
            reasons.append("no request succeeded")
        if self.error_rate > s.max_error_rate:
            reasons.append(f"error rate {self.error_rate:.2%} above {s.max_error_rate:.2%}")
        if s.slo_ms is not None and value is not None and value > s.slo_ms:
            reasons.append(f"p{s.percentile:g} {value:.2f} ms above the SLO of {s.slo_ms:g} ms")
        valid = None
        if self.loadgen is not None:
            valid = self.loadgen.get("validity") == "VALID"
            # With an SLO the run claims that the percentile holds, and LoadGen's validity is the
            # evidence for that claim; without one it is reported (and warned of), not a failure.
            if not valid and s.slo_ms is not None:
                reasons.append(
                    f"LoadGen: {self.loadgen.get('validity', 'no result')} ({self.invalid_because()})"
                )
        return {
            "passed": not reasons,
            "loadgen_valid": valid,
            "percentile": s.percentile,
            "value_ms": value,
            "slo_ms": s.slo_ms,
            "reasons": reasons,
        }

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Where a request's time went, phase by phase (mean and p50/p99 over successful requests)."""
        out: dict[str, dict[str, float]] = {}
        for name, values in self.phases.items():
            if values:
                arr = np.asarray(values)
                out[name] = {
                    "mean": float(arr.mean()),
                    "p50": float(np.percentile(arr, 50)),
                    "p99": float(np.percentile(arr, 99)),
                }
        return out

    def summary(self) -> dict[str, Any]:
        lat = {}
        if self.samples_ms:
            arr = np.asarray(self.samples_ms)
            lat = {
                "mean": float(arr.mean()),
                "p50": float(np.percentile(arr, 50)),
                "p90": float(np.percentile(arr, 90)),
                "p99": float(np.percentile(arr, 99)),
                "p999": float(np.percentile(arr, 99.9)),
                "max": float(arr.max()),
            }
        rows = dict(sorted(self.batch_rows.items()))
        return {
            "label": self.label,
            "scheduler": self.scheduler,
            "mode": self.settings.mode,
            "offered_qps": self.settings.qps,
            "concurrency": self.settings.concurrency if self.settings.qps is None else None,
            "issued": self.issued,
            "completed_ok": self.completed,
            "errors": dict(self.errors),
            "error_rate": self.error_rate,
            "throughput_per_s": self.throughput,
            "wall_s": self.wall_s,
            "stopped_by": self.stopped_by,
            "latency_ms": lat,
            # How many requests ran in a batch of each size, and the batches that implies.
            "requests_by_batch_rows": {str(k): v for k, v in rows.items()},
            "batches_by_rows": {str(k): round(v / k, 1) for k, v in rows.items()},
            "breakdown_ms": self.breakdown(),
            "mlperf_loadgen": self.loadgen,
            "loadgen": {
                "cpu_fraction_of_core": self.cpu_fraction,
                "schedule_lag_p99_ms": float(np.percentile(self.lag_ms, 99)) if self.lag_ms else None,
            },
            "warnings": self.warnings(),
            "verdict": self.verdict(),
        }

    def to_measurement(self, backend: str) -> dict[str, Any] | None:
        """The schema's measurement object (None when nothing succeeded)."""
        if not self.samples_ms:
            return None

        warnings = self.warnings()
        return {
            "label": self.label,
            "backend": backend,
            "batch_size": 1,
            "latency_ms": summarize(self.samples_ms, ci_resamples=500),
            "throughput_per_s": self.throughput,
            "runs": self.completed,
            "warmup_runs": self.settings.warmup,
            "wall_s": self.wall_s,
            "stopped_by": self.stopped_by,
            "stability": {
                "stable": not any("load generator" in w for w in warnings),
                "reasons": warnings,
                "foreign_cpu_fraction": None,
            },
            "extra": {k: v for k, v in self.summary().items() if k not in ("latency_ms", "label")},
            "samples_ms": [round(x, 4) for x in self.samples_ms],
        }


def cpu_now() -> float:
    """CPU seconds of the calling thread (the generator's own cost)."""
    usage = resource.getrusage(
        resource.RUSAGE_THREAD if hasattr(resource, "RUSAGE_THREAD") else resource.RUSAGE_SELF
    )
    return usage.ru_utime + usage.ru_stime


def record_outcome(result: LoadResult, target: Endpoint, outcome: Outcome, latency_ms: float) -> None:
    """Count one request's outcome, latency and server phases into `result`."""
    if outcome.kind != "ok":
        result.errors[outcome.kind] += 1
        return
    result.samples_ms.append(latency_ms)
    if outcome.batch_rows is not None:
        result.batch_rows[outcome.batch_rows] += 1
    if outcome.phases:
        total = outcome.phases.get("total")
        for name in PHASES:
            if name in outcome.phases:
                result.phases.setdefault(name, []).append(outcome.phases[name])
        if total is not None:
            # What the server did not account for: the network, HTTP parsing, the client.
            result.phases.setdefault(target.remainder, []).append(max(0.0, latency_ms - total))


def _label(settings: LoadSettings) -> str:
    return (
        f"poisson {settings.qps:.1f} qps"
        if settings.qps is not None
        else f"closed loop x{settings.concurrency}"
    )


async def run_load(
    target: Endpoint, settings: LoadSettings, progress: Callable[[int, int | None], None] | None = None
) -> LoadResult:
    """Drive `target` (already opened) as `settings` say and collect every request's outcome."""
    settings.validate()
    for _ in range(settings.warmup):
        await target.infer()
    result = LoadResult(settings, _label(settings))
    min_q = settings.effective_min_queries()
    loop = asyncio.get_running_loop()
    start = loop.time()
    cpu0 = cpu_now()

    def keep_issuing(issued: int) -> bool:
        if settings.requests is not None:
            return issued < settings.requests
        assert settings.duration_s is not None
        return loop.time() - start < settings.duration_s or issued < min_q

    async def one(scheduled: float) -> None:
        outcome = await target.infer()
        record_outcome(result, target, outcome, (loop.time() - scheduled) * 1e3)
        if progress is not None:
            progress(result.completed, settings.requests)

    if settings.qps is not None:
        rng = np.random.default_rng(settings.seed)
        pending: set[asyncio.Task[None]] = set()
        next_at = start
        while keep_issuing(result.issued):
            next_at += float(rng.exponential(1.0 / settings.qps))
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            result.lag_ms.append(max(0.0, (loop.time() - next_at) * 1e3))
            task = loop.create_task(one(next_at))
            pending.add(task)
            task.add_done_callback(pending.discard)
            result.issued += 1
        if pending:
            await asyncio.gather(*pending)
    else:

        async def worker() -> None:
            while keep_issuing(result.issued):
                result.issued += 1
                await one(loop.time())

        await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    result.wall_s = loop.time() - start
    result.cpu_s = cpu_now() - cpu0
    result.stopped_by = "requests" if settings.requests is not None else "duration"
    return result


@dataclass
class MaxQpsSearch:
    max_qps: float | None
    curve: list[LoadResult]

    def to_json(self) -> dict[str, Any]:
        points = []
        for r in sorted(self.curve, key=lambda r: r.settings.qps or 0):
            v = r.verdict()
            points.append(
                {
                    "offered_qps": r.settings.qps,
                    "throughput_per_s": r.throughput,
                    "p50_ms": r.latency_at(50),
                    f"p{r.settings.percentile:g}_ms": v["value_ms"],
                    "error_rate": r.error_rate,
                    "mean_batch_rows": _mean_rows(r.batch_rows),
                    "passed": v["passed"],
                }
            )
        return {"max_qps": self.max_qps, "curve": points}


def _mean_rows(rows: Counter[int]) -> float | None:
    n = sum(rows.values())
    return sum(k * v for k, v in rows.items()) / n if n else None


async def find_max_qps(
    target: Endpoint,
    settings: LoadSettings,
    start_qps: float | None = None,
    bisect_steps: int = 3,
    max_qps: float = 1e6,
    progress: Callable[[str], None] | None = None,
    run: Callable[[Endpoint, LoadSettings], Awaitable[LoadResult]] | None = None,
    min_qps: float | None = None,
) -> MaxQpsSearch:
    """Highest Poisson rate whose latency percentile meets the SLO: double until a rate fails,
    then bisect between the last pass and the first failure. Every point is kept as the curve.
    Below `min_qps` (by default a sixteenth of the first rate) the search stops with no answer: a
    configuration search asks only whether a rate above the best so far is held."""
    if settings.slo_ms is None:
        raise UsageError("--find-max-qps needs --slo-ms", "e.g. --slo-ms 10 --percentile p99")
    curve: list[LoadResult] = []

    async def trial(qps: float) -> bool:
        step = LoadSettings(**{**settings.__dict__, "qps": qps, "warmup": 0})
        res = await (run or run_load)(target, step)
        curve.append(res)
        ok = bool(res.verdict()["passed"])
        if progress is not None:
            tail = res.latency_at(settings.percentile)
            tail_ms = tail if tail is not None else float("nan")
            progress(
                f"{qps:9.1f} qps: p{settings.percentile:g} {tail_ms:.2f} ms, "
                f"{res.throughput:.1f}/s, errors {res.error_rate:.1%} -> {'pass' if ok else 'fail'}"
            )
        await asyncio.sleep(0.2)  # let the server's queue empty between steps
        return ok

    for _ in range(settings.warmup):
        await target.infer()
    if start_qps is None:
        # Half of what one request at a time achieves: a rate the server surely sustains.
        probe = LoadSettings(concurrency=1, requests=20, warmup=0)
        res = await run_load(target, probe)
        p50 = res.latency_at(50)
        start_qps = 0.5 * 1e3 / p50 if p50 else 10.0
    qps = float(start_qps)
    # Below this the server is hopeless for the SLO (or no better than what it is compared with).
    floor = min_qps if min_qps is not None else qps / 16
    passed: float | None = None
    failed: float | None = None
    while qps >= floor and passed is None:
        if await trial(qps):
            passed = qps
        else:
            failed = qps
            qps /= 2
    if passed is None:
        return MaxQpsSearch(None, curve)
    while failed is None and passed * 2 <= max_qps:
        if await trial(passed * 2):
            passed *= 2
        else:
            failed = passed * 2
    if failed is not None:
        for _ in range(bisect_steps):
            mid = (passed + failed) / 2
            if await trial(mid):
                passed = mid
            else:
                failed = mid
    return MaxQpsSearch(passed, curve)


def load_report(
    results: list[LoadResult],
    *,
    target: Endpoint,
    backend: str,
    model_path: str | None,
    input_spec: dict[str, Any] | None,
    settings: LoadSettings,
    search: MaxQpsSearch | None = None,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A report of kind "load" in the shared schema; its verdict is the last (or searched) run's."""

    report = new_report("load", model_path=model_path, input_spec=input_spec, settings=settings.to_json())
    for res in results:
        measurement = res.to_measurement(backend)
        if measurement is not None:
            report["results"].append(measurement)
    if search is not None:
        passed = search.max_qps is not None
        verdict = {
            "passed": passed,
            "reasons": [] if passed else [f"no rate met p{settings.percentile:g} <= {settings.slo_ms:g} ms"],
        }
    else:
        verdict = results[-1].verdict() if results else {"passed": False, "reasons": ["nothing ran"]}
    report["load"] = {
        "target": target.describe(),
        "server": server,
        "runs": [r.summary() for r in results],
        "max_qps": search.to_json() if search is not None else None,
        "verdict": verdict,
    }
    return report
