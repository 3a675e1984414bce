"""The load generator: statistics on targets of known latency, errors by kind, SLO verdicts, the
max-QPS search, the report, and the `lto load` / `lto serve --validate` commands.

Latency bounds are one-sided where the machine could only make things slower (a 10 ms sleep
never takes less than 10 ms; a serial 10 ms server never completes more than 100 requests/s),
and generous on the other side, so a loaded 2-core machine cannot fail them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.report import validate_report
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.loadgen import (
    Endpoint,
    InProcessEndpoint,
    LoadResult,
    LoadSettings,
    Outcome,
    find_max_qps,
    load_report,
    parse_server_timing,
    run_load,
)
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model
from tests.serve.helpers import SleepBackend, write_matmul_artifact

LONG = 60_000.0


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=240))


class PatternEndpoint(Endpoint):
    """Every 10th request sleeps 50 ms, every 25th fails with "overloaded", the rest sleep 5 ms."""

    name = "pattern"

    def __init__(self) -> None:
        self.n = 0

    async def infer(self) -> Outcome:
        self.n += 1
        if self.n % 25 == 0:
            return Outcome("overloaded")
        await asyncio.sleep(0.05 if self.n % 10 == 0 else 0.005)
        phases = {"decode": 0.1, "queue": 1.0, "batch": 0.2, "model": 2.0, "encode": 0.1, "total": 3.4}
        return Outcome("ok", phases, 4)


def serial_target(ms: float) -> tuple[Batcher, InProcessEndpoint]:
    """A server that runs one request at a time taking `ms` each: capacity 1000/ms requests/s."""
    batcher = Batcher([SleepBackend(base_ms=ms, batchable=False)], BatcherConfig(target_latency_ms=LONG))
    return batcher, InProcessEndpoint(batcher, {"x": np.zeros((1, 4), np.float32)})


@pytest.mark.slow
def test_statistics_errors_and_breakdown_on_a_target_of_known_latency() -> None:
    settings = LoadSettings(concurrency=1, requests=200, warmup=0, slo_ms=LONG, percentile=99)
    result: LoadResult = run(run_load(PatternEndpoint(), settings))
    assert result.issued == 200
    assert result.errors == {"overloaded": 8}  # every 25th
    assert result.completed == 192
    assert result.error_rate == pytest.approx(8 / 200)
    summary = result.summary()
    lat = summary["latency_ms"]
    # ~90% of requests sleep 5 ms, ~10% 50 ms: the median is a short one, the p99 a long one.
    assert 5.0 <= lat["p50"] < 45.0
    assert lat["p99"] >= 50.0
    assert lat["max"] >= lat["p999"] >= lat["p99"] >= lat["p90"] >= lat["p50"]
    assert summary["requests_by_batch_rows"] == {"4": 192}
    assert summary["batches_by_rows"] == {"4": 48.0}
    breakdown = summary["breakdown_ms"]
    assert breakdown["model"]["mean"] == pytest.approx(2.0)
    assert breakdown["queue"]["p50"] == pytest.approx(1.0)
    # The client saw at least the sleep; the server claimed 3.4 ms of it; the rest is network+HTTP.
    assert breakdown["network_http"]["p50"] >= 5.0 - 3.4
    # 8 errors in 200 exceed the default 1% allowance.
    verdict = result.verdict()
    assert not verdict["passed"] and "error rate" in verdict["reasons"][0]


def test_closed_loop_on_a_serial_server_of_known_latency() -> None:
    async def main() -> LoadResult:
        batcher, target = serial_target(10.0)
        await batcher.start()
        result = await run_load(target, LoadSettings(concurrency=2, requests=60, warmup=2))
        await batcher.drain()
        return result

    result = run(main())
    assert result.issued == 60 and result.completed == 60 and not result.errors
    assert result.latency_at(50) >= 10.0  # one sleep at least
    assert result.throughput <= 1000 / 10.0 * 1.05  # one request at a time, 10 ms each
    assert result.throughput > 5.0
    assert set(result.batch_rows) == {1}
    model = result.breakdown()["model"]
    assert model["p50"] >= 10.0


@pytest.mark.slow
def test_open_loop_keeps_the_poisson_schedule_and_reports_queueing() -> None:
    async def main() -> tuple[LoadResult, float]:
        batcher, target = serial_target(2.0)
        await batcher.start()
        settings = LoadSettings(qps=100, requests=100, warmup=0, seed=3)
        result = await run_load(target, settings)
        await batcher.drain()
        gaps = np.random.default_rng(3).exponential(1 / 100, size=100)
        return result, float(gaps.sum())

    result, schedule_s = run(main())
    assert result.issued == 100 and result.completed == 100
    # The last request cannot be sent before its scheduled time.
    assert result.wall_s >= schedule_s * 0.999
    assert result.wall_s < schedule_s + 30
    assert len(result.lag_ms) == 100
    assert result.stopped_by == "requests"


def test_duration_runs_until_the_minimum_query_count() -> None:
    settings = LoadSettings(concurrency=4, duration_s=0.01, min_queries=40, warmup=0)
    result = run(run_load(PatternEndpoint(), settings))
    assert result.issued >= 40
    assert result.stopped_by == "duration"
    assert LoadSettings(percentile=99).effective_min_queries() == 1000
    assert LoadSettings(percentile=99.9).effective_min_queries() == 10000


def test_slo_verdict_passes_and_fails_on_the_percentile() -> None:
    async def main(slo: float) -> dict[str, Any]:
        batcher, target = serial_target(5.0)
        await batcher.start()
        result = await run_load(target, LoadSettings(concurrency=1, requests=30, warmup=0, slo_ms=slo))
        await batcher.drain()
        return result.verdict()

    failed = run(main(1.0))  # a 5 ms model cannot answer in 1 ms
    assert not failed["passed"] and "above the SLO of 1 ms" in failed["reasons"][0]
    passed = run(main(LONG))
    assert passed["passed"] and passed["value_ms"] >= 5.0


@pytest.mark.slow
@pytest.mark.timing
def test_find_max_qps_brackets_the_capacity_of_a_serial_server() -> None:
    async def main() -> Any:
        batcher, target = serial_target(10.0)  # capacity: 100 requests/s
        await batcher.start()
        settings = LoadSettings(requests=60, warmup=0, slo_ms=150, percentile=90, max_error_rate=0.0)
        search = await find_max_qps(target, settings, start_qps=20, bisect_steps=2)
        await batcher.drain()
        return search

    search = run(main())
    assert search.max_qps is not None
    assert 2.0 <= search.max_qps <= 160  # cannot sustain much beyond 100/s within 150 ms
    curve = search.to_json()["curve"]
    assert any(p["passed"] for p in curve) and any(not p["passed"] for p in curve)
    offered = [p["offered_qps"] for p in curve]
    assert offered == sorted(offered)


def test_saturation_warning_and_server_timing_parsing() -> None:
    result = LoadResult(
        LoadSettings(requests=10), "x", samples_ms=[1.0] * 10, issued=10, wall_s=1.0, cpu_s=0.95
    )
    assert any("load generator used 95% of a core" in w for w in result.warnings())
    lagging = LoadResult(LoadSettings(requests=10), "x", samples_ms=[1.0] * 10, issued=10, wall_s=1.0,
                         lag_ms=[10.0] * 10)  # fmt: skip
    assert any("fell behind its schedule" in w for w in lagging.warnings())
    phases, rows = parse_server_timing(
        'decode;dur=0.120, queue;dur=1.5, model;dur=2, total;dur=3.9, rows;desc="8"'
    )
    assert phases == {"decode": 0.12, "queue": 1.5, "model": 2.0, "total": 3.9}
    assert rows == 8
    assert parse_server_timing(None) == (None, None)


def test_report_is_valid_in_the_shared_schema() -> None:
    settings = LoadSettings(concurrency=2, requests=50, warmup=0, slo_ms=LONG)
    target = PatternEndpoint()
    result = run(run_load(target, settings))
    report = load_report([result], target=target, backend="fake", model_path=None, input_spec=None,
                         settings=settings)  # fmt: skip
    validate_report(report)
    assert report["kind"] == "load"
    assert report["results"][0]["runs"] == result.completed
    assert report["load"]["runs"][0]["errors"] == {"overloaded": 2}
    assert report["load"]["verdict"]["passed"] is False  # 4% errors


@pytest.mark.slow
def test_lto_load_in_process_writes_a_report_and_exits_with_the_verdict(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    report_path = tmp_path / "load.json"
    ok = run_cli(
        "load", model, "--concurrency", "4", "--requests", "200", "--slo-ms", "60000", "-o", report_path
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verdict: PASS" in ok.stdout
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["kind"] == "load" and report["load"]["runs"][0]["completed_ok"] == 200
    assert report["load"]["server"]["signature"]["batchable"] is True

    fail = run_cli("load", model, "--requests", "50", "--slo-ms", "0.0001")
    assert fail.returncode == 1
    assert "verdict: FAIL" in fail.stdout and "above the SLO" in fail.stdout

    bad = run_cli("load", model, "--qps", "-3", "--requests", "5")
    assert bad.returncode == 2 and "--qps must be positive" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_lto_serve_validate_runs_load_over_http_and_exits_with_the_verdict(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    report_path = tmp_path / "validate.json"
    # 500 queries: the fewest with which LoadGen's early stopping can bound a p99 (459 when none
    # is over the target).
    proc = run_cli("serve", model, "--port", "0", "--validate", "--qps", "400", "--requests", "500",
                   "--slo-ms", "60000", "--output", report_path, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: PASS" in proc.stdout and "drained" in proc.stdout
    assert "Server scenario" in proc.stdout and "LoadGen result: VALID" in proc.stdout
    report = json.loads(report_path.read_text())
    validate_report(report)
    run0 = report["load"]["runs"][0]
    assert run0["completed_ok"] == 500 and run0["mode"] == "poisson"
    assert run0["mlperf_loadgen"]["validity"] == "VALID" and run0["mlperf_loadgen"]["queries"] == 500
    assert {"decode", "queue", "model", "encode", "network_http"} <= set(run0["breakdown_ms"])

    fail = run_cli("serve", model, "--port", "0", "--validate", "--requests", "30", "--slo-ms", "0.0001",
                   timeout=240)  # fmt: skip
    assert fail.returncode == 1 and "verdict: FAIL" in fail.stdout


def test_lto_load_drives_an_artifact_in_process(tmp_path: Path) -> None:
    from optimize.serve.loading import calibration_row, open_instances, resolve_served

    art = write_matmul_artifact(tmp_path, batch=8)
    served = resolve_served(None, art)
    assert served.label == "art" and served.runtime_config == {"intra_op_num_threads": 1}
    backends = open_instances(served, 1)
    row, why = calibration_row(served, backends[0])
    assert why is None and row is not None and row["x"].shape == (1, 16)  # one row of the spec's batch 8

    report_path = tmp_path / "load.json"
    # 700 queries: SingleStream's early stopping bounds a p99 from 662 on.
    proc = run_cli("load", "--artifact", art, "--requests", "700", "--slo-ms", "60000", "-o", report_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["model"]["path"].endswith("model.onnx")
    run0 = report["load"]["runs"][0]
    assert run0["completed_ok"] == 700 and run0["mlperf_loadgen"]["scenario"] == "SingleStream"
    floor = report["load"]["floor"]  # the artifact itself behind one worker, at the same load
    assert floor["model"].endswith("model.onnx") and floor["run"]["completed_ok"] == 700
    assert floor["throughput_alone_per_s"] > 0 and floor["endpoint"]["max_batch"] == 8


@pytest.mark.slow
def test_lto_load_and_serve_refuse_bad_targets_with_one_line(tmp_path: Path) -> None:
    from tests.cli_helpers import assert_clean_error

    assert_clean_error(run_cli("load", "http://127.0.0.1:9", "--requests", "5"), 3, "cannot reach")
    assert_clean_error(run_cli("load", tmp_path / "missing.onnx", "--requests", "5"), 2, "model not found")
    assert_clean_error(run_cli("serve"), 2, "give a MODEL.onnx or --artifact")
    model = make_matmul_model(tmp_path / "m.onnx")
    assert_clean_error(run_cli("serve", model, "--qps", "5"), 2, "apply to --validate")


def test_instances_split_the_cores_even_when_the_artifact_was_tuned_alone(tmp_path: Path) -> None:
    from optimize.serve.loading import open_instances, resolve_served
    from optimize.system.env import physical_cores

    cores = physical_cores()
    if cores < 2:
        pytest.skip("one core: nothing to split")
    model = make_matmul_model(tmp_path / "m.onnx", features=16, out=4)
    served = resolve_served(model, None)
    served.runtime_config["intra_op_num_threads"] = cores  # as tuned for the whole machine
    backends = open_instances(served, 2)
    assert [b.config["intra_op_num_threads"] for b in backends] == [cores // 2] * 2
    for b in backends:
        b.close()
    (one,) = open_instances(served, 1, threads=1)
    assert one.config["intra_op_num_threads"] == 1
    one.close()
