"""MLPerf LoadGen as `lto load`'s scheduler and judge.

LoadGen (the `mlcommons-loadgen` package) is the reference load generator of MLPerf Inference: it
schedules queries for a scenario, times each from its scheduled issue to its completion, and says
whether the run is VALID (long enough, enough queries, the latency percentile met, its early-stopping
estimate met). lto hands it the endpoint (`lto serve` or any KServe v2 server over HTTP, or an
artifact in-process) as the system under test and reads its verdict and figures back from its log.

Scenarios, from `lto load`'s flags:
- `--qps R`: **Server**, Poisson arrivals at R per second, the percentile held to `--slo-ms`;
- `--concurrency 1` (the default without --qps): **SingleStream**, one query at a time;
- `--offline` (in-process): **Offline**, every query at once, throughput only.
LoadGen has no scenario that keeps N > 1 queries in flight; `--concurrency N` runs lto's own closed
loop (optimize/serve/loadgen.py) and the report says which scheduler ran.

LoadGen calls back on its own thread; the endpoint's requests run on the asyncio loop that called
`run_loadgen`, which LoadGen's issue callback feeds through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.serve.loadgen import Endpoint, LoadResult, LoadSettings, cpu_now, record_outcome

SERVER, SINGLE_STREAM, OFFLINE = "Server", "SingleStream", "Offline"
# LoadGen's percentiles in its log, and the names lto's summary gives them.
_PERCENTILES = {
    "50.00": "p50",
    "90.00": "p90",
    "95.00": "p95",
    "97.00": "p97",
    "99.00": "p99",
    "99.90": "p999",
}
# Without an SLO LoadGen still needs a latency bound: one nothing reaches, so only the run's length,
# its query count and its early-stopping estimate decide validity.
_NO_SLO_NS = 3_600 * 10**9
# LoadGen stops issuing after this many times the asked duration, so that an overloaded server
# does not hold the run for ever (its queries still complete and count).
_MAX_DURATION_FACTOR = 3


def available() -> bool:
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("mlcommons-loadgen")
    except PackageNotFoundError:
        return None


def scenario_for(settings: LoadSettings, offline: bool = False) -> str | None:
    """LoadGen's scenario for these settings, or None where it has none (a closed loop of N > 1)."""
    if offline:
        return OFFLINE
    if settings.qps is not None:
        return SERVER
    return SINGLE_STREAM if settings.concurrency == 1 else None


def _test_settings(lg: Any, settings: LoadSettings, scenario: str, expected_ms: float) -> Any:
    ts = lg.TestSettings()
    ts.mode = lg.TestMode.PerformanceOnly
    target_ns = int(settings.slo_ms * 1e6) if settings.slo_ms is not None else _NO_SLO_NS
    quantile = settings.percentile / 100.0
    if scenario == SERVER:
        assert settings.qps is not None
        ts.scenario = lg.TestScenario.Server
        ts.server_target_qps = float(settings.qps)
        ts.server_target_latency_ns = target_ns
        ts.server_target_latency_percentile = quantile
    elif scenario == SINGLE_STREAM:
        ts.scenario = lg.TestScenario.SingleStream
        ts.single_stream_expected_latency_ns = max(1, int(expected_ms * 1e6))
        ts.single_stream_target_latency_percentile = quantile
    else:
        ts.scenario = lg.TestScenario.Offline
        ts.offline_expected_qps = max(1.0, 1e3 / max(expected_ms, 1e-3))
    if settings.requests is not None:
        ts.min_duration_ms = 0
        ts.min_query_count = settings.requests
        ts.max_query_count = settings.requests
    else:
        assert settings.duration_s is not None
        ts.min_duration_ms = int(settings.duration_s * 1e3)
        ts.min_query_count = settings.effective_min_queries()
        # The cap leaves room for the minimum query count at the rate asked (at 7/s, 1000 queries
        # take 143 s): a cap below that would make every slow run INVALID for its length alone.
        rate = settings.qps if scenario == SERVER else 1e3 / max(expected_ms, 1e-3)
        needed_s = ts.min_query_count / max(rate or 1.0, 1e-6)
        ts.max_duration_ms = int(max(settings.duration_s, needed_s) * 1e3 * _MAX_DURATION_FACTOR)
    # Seeds from --seed, so that a run's arrivals and sample order can be repeated.
    ts.qsl_rng_seed = settings.seed
    ts.sample_index_rng_seed = settings.seed + 1
    ts.schedule_rng_seed = settings.seed + 2
    return ts


_SAMPLE_DONE = re.compile(r'"name":"Sample".*?"ph":"b".*?"sample_seq":(\d+).*?"complete_ns":(\d+)')


def read_sample_latencies(path: Path) -> list[float]:
    """Every query's latency in ms as LoadGen timed it (scheduled issue to completion), in issue
    order, from its trace. Read line by line: the trace is not strict JSON (its LogDetail keys
    carry doubled quotes)."""
    found = []
    with path.open(errors="replace") as lines:
        for line in lines:
            match = _SAMPLE_DONE.search(line)
            if match:
                found.append((int(match.group(1)), int(match.group(2)) / 1e6))
    return [ms for _, ms in sorted(found)]


def read_detail_log(path: Path) -> dict[str, Any]:
    """The `:::MLLOG {json}` records of LoadGen's detail log, key -> value (the last one wins)."""
    values: dict[str, Any] = {}
    for line in path.read_text(errors="replace").splitlines():
        head, _, body = line.partition(":::MLLOG ")
        if not body or head.strip():
            continue
        try:
            record = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "key" in record:
            values[str(record["key"])] = record.get("value")
    return values


def summarize_log(values: dict[str, Any], scenario: str) -> dict[str, Any]:
    """What lto keeps of LoadGen's results: its verdict, why, and its figures in ms and per s."""
    reasons = []
    if values.get("result_min_duration_met") is False:
        reasons.append("the run was shorter than its minimum duration")
    if values.get("result_min_queries_met") is False:
        reasons.append("fewer queries than its minimum")
    if values.get("result_perf_constraints_met") is False:
        reasons.append("the latency percentile missed its target")
    if values.get("early_stopping_met") is False:
        need = next(
            (ln for ln in _lines(values.get("early_stopping_result")) or [] if "need" in ln.lower()), ""
        )
        reasons.append(
            "too few queries to bound the percentile within the target (LoadGen's early stopping"
            + (f": {' '.join(need.split()).rstrip('.').lower()})" if need else ")")
        )
    latency = {}
    for label, name in _PERCENTILES.items():
        ns = values.get(f"result_{label}_percentile_latency_ns")
        if isinstance(ns, (int, float)):
            latency[name] = ns / 1e6
    for key in ("min", "max", "mean"):
        ns = values.get(f"result_{key}_latency_ns")
        if isinstance(ns, (int, float)):
            latency[key] = ns / 1e6
    summary: dict[str, Any] = {
        "scheduler": "mlperf-loadgen",
        "version": values.get("loadgen_version") or version(),
        "scenario": scenario,
        "validity": values.get("result_validity", "unknown"),
        "invalid_because": reasons,
        "latency_ms": latency,
        "scheduled_per_s": values.get("result_scheduled_samples_per_sec"),
        "completed_per_s": values.get("result_completed_samples_per_sec"),
        "samples_per_s": values.get("result_samples_per_second"),
        "early_stopping": _lines(values.get("early_stopping_result")),
        "over_latency_queries": values.get("result_overlatency_query_count"),
        "queries": values.get("result_query_count"),
    }
    return {k: v for k, v in summary.items() if v is not None}


def _lines(text: Any) -> list[str] | None:
    """LoadGen's early-stopping text (" * a.  * b.") as its lines, each once."""
    if not isinstance(text, str):
        return None
    return list(dict.fromkeys(part.strip() for part in text.split(" * ") if part.strip()))


async def run_loadgen(
    target: Endpoint,
    settings: LoadSettings,
    scenario: str,
    *,
    log_dir: Path | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> LoadResult:
    """Drive `target` (already opened) with LoadGen in `scenario`; the result carries LoadGen's
    verdict and figures (`result.loadgen`) beside lto's own per-request phases."""
    import mlperf_loadgen as lg

    settings.validate()
    loop = asyncio.get_running_loop()
    expected_ms = 1.0
    for i in range(max(settings.warmup, 1 if scenario != SERVER else 0)):
        t0 = time.perf_counter()
        await target.infer(i % target.rows)
        expected_ms = (time.perf_counter() - t0) * 1e3
    label = {SERVER: f"loadgen server {settings.qps or 0:.1f} qps", SINGLE_STREAM: "loadgen single stream",
             OFFLINE: "loadgen offline"}[scenario]  # fmt: skip
    result = LoadResult(settings, label)
    pending: set[asyncio.Task[None]] = set()

    async def one(sample_id: int, index: int, issued_at: float) -> None:
        outcome = await target.infer(index)
        latency_ms = (time.perf_counter() - issued_at) * 1e3
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])
        record_outcome(result, target, outcome, latency_ms)
        if progress is not None:
            progress(result.completed, settings.requests)

    def start(samples: list[tuple[int, int]], issued_at: float) -> None:
        for sample_id, index in samples:
            task = loop.create_task(one(sample_id, index, issued_at))
            pending.add(task)
            task.add_done_callback(pending.discard)
        result.issued += len(samples)

    def issue(query_samples: Any) -> None:  # on LoadGen's thread
        issued_at = time.perf_counter()
        loop.call_soon_threadsafe(start, [(s.id, s.index) for s in query_samples], issued_at)

    def flush() -> None:
        pass

    rows = max(1, target.rows)
    sut = lg.ConstructSUT(issue, flush)
    qsl = lg.ConstructQSL(rows, rows, lambda samples: None, lambda samples: None)
    with tempfile.TemporaryDirectory(prefix="lto-loadgen-") as tmp:
        out = Path(log_dir) if log_dir is not None else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = str(out)
        log_settings.log_output.copy_summary_to_stdout = False
        # The trace holds each query's latency as LoadGen timed it: the report's percentiles, CI and
        # plots are computed from those, so they agree with LoadGen's own summary.
        log_settings.enable_trace = True
        test = _test_settings(lg, settings, scenario, expected_ms)
        start_wall, cpu0 = time.perf_counter(), cpu_now()
        try:
            await loop.run_in_executor(None, lg.StartTestWithLogSettings, sut, qsl, test, log_settings)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        if pending:
            await asyncio.gather(*pending)
        result.wall_s = time.perf_counter() - start_wall
        result.cpu_s = cpu_now() - cpu0
        detail = out / "mlperf_log_detail.txt"
        if not detail.is_file():
            raise UsageError(f"LoadGen wrote no log in {out}", "check that the folder is writable")
        result.loadgen = summarize_log(read_detail_log(detail), scenario)
        trace = out / "mlperf_log_trace.json"
        timed = read_sample_latencies(trace) if trace.is_file() else []
        if len(timed) == result.completed and not result.errors:
            # lto's own clock started when LoadGen's callback ran; LoadGen's at the scheduled issue.
            result.samples_ms = timed
        if log_dir is not None:
            result.loadgen["log_dir"] = str(out)
    result.stopped_by = "requests" if settings.requests is not None else "duration"
    return result
