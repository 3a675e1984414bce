"""Comparisons with each side in its own worker process (optimize.bench.apart)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from optimize.backend import Backend
from optimize.bench import BenchSettings, compare
from optimize.bench.apart import compare_apart, process_cpu_s, wait_until_idle
from optimize.data import resolve_inputs
from optimize.runtimes.backends import open_backend, open_in_worker
from tests.conftest import sample_path

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")

QUICK = BenchSettings(warmup=3, min_runs=10, max_runs=2000, max_time_s=1.5, target_ci_rel=None, block_s=0.04)


@pytest.fixture(scope="module")
def resnet() -> tuple[Path, dict[str, np.ndarray]]:
    model = sample_path("resnet_tiny.onnx")
    _, feeds = resolve_inputs(model, {}, None, 0, 1)
    return model, feeds


@pytest.fixture
def workers(resnet: tuple[Path, dict[str, np.ndarray]]) -> Iterator[list[Backend]]:
    model, _ = resnet
    opened = [
        open_in_worker("onnxruntime", model, {}),
        open_in_worker("onnxruntime", model, {"allow_spinning": False}),
    ]
    yield opened
    for backend in opened:
        backend.close()


@pytest.mark.slow
def test_compare_of_two_workers_times_each_side_in_its_own_process(
    workers: list[Backend], resnet: tuple[Path, dict[str, np.ndarray]]
) -> None:
    _, feeds = resnet
    result = compare(workers[0], workers[1], feeds, feeds, QUICK, labels=("spin", "no-spin"))
    data = result.to_json()
    assert data["process"] == "own worker per side" and result.isolation is not None
    assert data["labels"] == ["spin", "no-spin"]
    assert result.chunks >= 4
    lo, hi = result.ratio_ci95
    assert lo <= result.ratio <= hi
    # Every block is whole: chunk i holds runs [i*chunk_runs, (i+1)*chunk_runs) of each side.
    for measurement, runs in zip((result.a, result.b), result.chunk_runs, strict=True):
        assert len(measurement.samples_ms) == result.chunks * runs
        assert measurement.extra["process"] == "own worker"
    # The parent ran no model: while the blocks ran it waited, using next to no CPU.
    timed_ms = sum(result.a.samples_ms) + sum(result.b.samples_ms)
    assert result.isolation["parent_cpu_during_blocks_ms"] < 0.05 * timed_ms


# timing: whether a spin is over is read from the CPU time the pool gets; a test beside it on
# the other core starves the spinning thread, which then looks idle while it still has spin left.
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="ONNX Runtime has no pool to spin on one core")
@pytest.mark.slow
@pytest.mark.timing
def test_a_spinning_pool_is_waited_out_and_reported(
    workers: list[Backend], resnet: tuple[Path, dict[str, np.ndarray]]
) -> None:
    _, feeds = resnet
    run = compare_apart(workers, [feeds, feeds], QUICK, ["spin", "no-spin"])
    iso = run.isolation()
    after = iso["cpu_after_own_block_ms"]
    # ONNX Runtime's pool keeps spinning after its block; with spinning off it parks at once.
    assert after["spin"]["max"] > after["no-spin"]["max"]
    assert iso["blocks_not_idle_after_wait"] == 0
    # Its spin was over before the other side's blocks began.
    assert iso["idle_workers_cpu_during_blocks_ms"] < after["spin"]["median"] * run.rounds


@pytest.mark.slow
def test_three_sides_give_every_pair_from_one_run(
    workers: list[Backend], resnet: tuple[Path, dict[str, np.ndarray]]
) -> None:
    model, feeds = resnet
    third = open_in_worker("onnxruntime", model, {"intra_op_num_threads": 1})
    try:
        run = compare_apart([*workers, third], [feeds] * 3, QUICK, ["base", "best", "cand"])
    finally:
        third.close()
    versus_best, versus_base = run.comparison(1, 2), run.comparison(0, 2)
    assert [versus_best.a.label, versus_best.b.label] == ["best", "cand"]
    assert [versus_base.a.label, versus_base.b.label] == ["base", "cand"]
    assert versus_best.b.samples_ms == versus_base.b.samples_ms  # the same runs of the candidate
    assert all(len(s) == run.rounds * n for s, n in zip(run.samples, run.block_runs, strict=True))


def test_in_process_backends_are_refused(resnet: tuple[Path, dict[str, np.ndarray]]) -> None:
    model, feeds = resnet
    backend = open_backend("onnxruntime", model, {})
    try:
        with pytest.raises(ValueError, match="worker processes"):
            compare_apart([backend, backend], [feeds, feeds], QUICK)
    finally:
        backend.close()


# timing: it reads how much CPU a busy process gets, which a parallel test run takes away.
@pytest.mark.slow
@pytest.mark.timing
def test_wait_until_idle_tells_a_busy_process_from_an_idle_one() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)  # both started
        before = process_cpu_s(busy.pid)
        settle = wait_until_idle([busy.pid], max_s=0.2)
        assert settle is not None and not settle.idle
        assert settle.waited_s >= 0.2 and settle.cpu_s > 0.05
        assert (process_cpu_s(busy.pid) or 0.0) > (before or 0.0)
        quiet = wait_until_idle([idle.pid], max_s=1.0)
        assert quiet is not None and quiet.idle and quiet.waited_s < 0.5
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    assert process_cpu_s(busy.pid) is None  # gone: unreadable, not zero
