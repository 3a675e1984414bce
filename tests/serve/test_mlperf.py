"""MLPerf LoadGen as `lto load`'s scheduler: its scenarios, its verdict read back from its log, the
rows it picks, and the floor (the model behind one greedy worker in-process).

Latency bounds are one-sided where the machine can only make things slower (a 2 ms sleep never
takes less than 2 ms), so a loaded 2-core machine cannot fail them.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "mlperf_loadgen", reason="lto load schedules with MLPerf LoadGen: pip install mlcommons-loadgen"
)

from optimize.serve import mlperf
from optimize.serve.app import LoadOptions
from optimize.serve.floor import FloorEndpoint, throughput_alone
from optimize.serve.loadgen import Endpoint, LoadSettings, Outcome
from tests.serve.helpers import SleepBackend


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


class SleepEndpoint(Endpoint):
    """Answers after `ms` of sleep; counts the rows it was asked for."""

    def __init__(self, ms: float, rows: int = 5) -> None:
        self.ms = ms
        self.rows = rows
        self.asked: Counter[int] = Counter()

    async def infer(self, row: int | None = None) -> Outcome:
        self.asked[self._take(row)] += 1
        await asyncio.sleep(self.ms / 1e3)
        return Outcome("ok", {"model": self.ms, "total": self.ms}, 1)


def test_a_server_run_is_judged_by_loadgen_and_its_figures_are_loadgens(tmp_path: Path) -> None:
    target = SleepEndpoint(2.0)
    settings = LoadSettings(qps=400, requests=500, slo_ms=1000.0, warmup=2)
    result = run(mlperf.run_loadgen(target, settings, mlperf.SERVER, log_dir=tmp_path / "logs"))
    lg = result.loadgen
    assert lg["scenario"] == "Server" and lg["validity"] == "VALID" and lg["queries"] == 500
    assert (tmp_path / "logs" / "mlperf_log_summary.txt").is_file() and lg["log_dir"].endswith("logs")
    assert lg["latency_ms"]["p50"] >= 2.0  # a 2 ms sleep never takes less
    summary, verdict = result.summary(), result.verdict()
    # One measurement: every figure comes from LoadGen's own per-query latencies (its trace).
    assert len(result.samples_ms) == 500 and max(result.samples_ms) == pytest.approx(lg["latency_ms"]["max"])
    assert min(result.samples_ms) == pytest.approx(lg["latency_ms"]["min"])
    assert summary["latency_ms"]["p50"] == pytest.approx(lg["latency_ms"]["p50"], rel=0.05)
    assert (
        verdict["passed"] and verdict["loadgen_valid"] and verdict["value_ms"] == summary["latency_ms"]["p99"]
    )
    assert "Server scenario" in summary["scheduler"] and result.completed == 500
    # LoadGen picks the rows (its sample indexes): every one of the endpoint's rows was sent.
    assert set(target.asked) == set(range(5)) and sum(target.asked.values()) == 500 + 2


def test_a_missed_slo_is_invalid_and_fails_with_loadgens_reason() -> None:
    settings = LoadSettings(qps=300, requests=500, slo_ms=0.5, warmup=0)
    result = run(mlperf.run_loadgen(SleepEndpoint(2.0), settings, mlperf.SERVER))
    assert result.loadgen["validity"] == "INVALID"
    assert "the latency percentile missed its target" in result.loadgen["invalid_because"]
    verdict = result.verdict()
    assert not verdict["passed"] and any(r.startswith("LoadGen: INVALID") for r in verdict["reasons"])


def test_too_few_queries_say_how_many_more_loadgen_needs() -> None:
    settings = LoadSettings(requests=100, slo_ms=1000.0, warmup=0)
    result = run(mlperf.run_loadgen(SleepEndpoint(0.2), settings, mlperf.SINGLE_STREAM))
    assert result.loadgen["validity"] == "INVALID"
    reason = result.verdict()["reasons"][0]
    assert "too few queries" in reason and "need to process at least" in reason
    # Without an SLO nothing is claimed: the same run passes and says what LoadGen thinks of it.
    free = run(
        mlperf.run_loadgen(SleepEndpoint(0.2), LoadSettings(requests=100, warmup=0), mlperf.SINGLE_STREAM)
    )
    assert free.verdict()["passed"] and any("LoadGen calls this run INVALID" in w for w in free.warnings())


def test_scenarios_follow_the_flags_and_a_closed_loop_of_many_runs_ltos_own() -> None:
    assert mlperf.scenario_for(LoadSettings(qps=10)) == mlperf.SERVER
    assert mlperf.scenario_for(LoadSettings()) == mlperf.SINGLE_STREAM
    assert mlperf.scenario_for(LoadSettings(), offline=True) == mlperf.OFFLINE
    assert mlperf.scenario_for(LoadSettings(concurrency=4)) is None
    said: list[str] = []
    runner = LoadOptions(LoadSettings(concurrency=4, requests=40, warmup=0)).runner(said.append)
    result = run(runner(SleepEndpoint(1.0), LoadSettings(concurrency=4, requests=40, warmup=0)))
    assert result.loadgen is None and result.summary()["scheduler"] == "lto's own closed loop"
    assert said and "no scenario that keeps 4 queries in flight" in said[0]


def test_offline_issues_everything_at_once() -> None:
    target = SleepEndpoint(1.0)
    result = run(mlperf.run_loadgen(target, LoadSettings(requests=64, warmup=0), mlperf.OFFLINE))
    assert result.loadgen["scenario"] == "Offline" and result.completed == 64


def test_the_detail_log_reader_keeps_records_and_skips_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "detail.txt"
    log.write_text(
        ':::MLLOG {"key": "result_validity", "value": "INVALID"}\n'
        "garbage line\n"
        ':::MLLOG {"key": "result_validity", "value": "VALID"}\n'
        ":::MLLOG {not json\n"
        ':::MLLOG {"key": "result_99.00_percentile_latency_ns", "value": 2500000}\n'
    )
    values = mlperf.read_detail_log(log)
    assert values == {"result_validity": "VALID", "result_99.00_percentile_latency_ns": 2500000}
    assert mlperf.summarize_log(values, "Server")["latency_ms"] == {"p99": 2.5}


# --- the floor -------------------------------------------------------------------------------------


def _rows(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((1, 4), i, np.float32)} for i in range(n)]


def test_the_floor_runs_whatever_waits_as_one_batch_in_arrival_order() -> None:
    gate = threading.Event()
    gate.set()  # open() runs each batch shape once ...
    backend = SleepBackend(base_ms=1.0, gate=gate)
    floor = FloorEndpoint(backend, _rows(6), max_batch=8)

    async def main() -> list[Outcome]:
        await floor.open()
        assert backend.calls == list(range(1, 9))  # every batch it may form, 1 to 8 requests
        backend.calls.clear()
        gate.clear()  # ... then runs wait on the gate
        try:
            tasks = [asyncio.ensure_future(floor.infer(0))]
            await asyncio.sleep(0.05)  # the first holds the worker (its run waits on the gate) ...
            tasks += [asyncio.ensure_future(floor.infer(i)) for i in range(1, 6)]
            await asyncio.sleep(0.05)  # ... while five arrive and wait
            gate.set()
            return list(await asyncio.gather(*tasks))
        finally:
            await floor.close()

    outcomes = run(main())
    assert [o.kind for o in outcomes] == ["ok"] * 6
    assert backend.calls == [1, 5]  # the first alone, then every request that had arrived
    assert [o.batch_rows for o in outcomes] == [1, 5, 5, 5, 5, 5]
    assert outcomes[1].phases["queue"] >= outcomes[5].phases["queue"] - 1.0  # FIFO: the oldest waited longest


def test_a_fixed_batch_model_runs_one_request_at_a_time_and_failures_are_answered() -> None:
    backend = SleepBackend(base_ms=0.5, batchable=False, fail_rows=1)
    floor = FloorEndpoint(backend, _rows(2))
    assert floor.max_batch == 1

    async def main() -> Outcome:
        await floor.open()
        try:
            return await floor.infer()
        finally:
            await floor.close()

    assert run(main()).kind == "error"


def test_throughput_alone_is_requests_per_second_back_to_back() -> None:
    rate = throughput_alone(SleepBackend(base_ms=5.0), _rows(2), seconds=0.3)
    assert 0 < rate <= 200.0  # a 5 ms call never runs more than 200 times a second
