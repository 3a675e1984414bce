"""The process-isolated backend host (optimize/runtimes/worker.py); no TVM needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimize.errors import LtoError
from tests.runtimes.tvm.helpers import FEEDS, mlp_model


def test_subprocess_backend_matches_in_process(tmp_path: Path) -> None:
    from optimize.bench import BenchSettings, measure_where_it_runs
    from optimize.runtimes.backends import open_backend, open_in_worker

    model = mlp_model(tmp_path / "m.onnx")
    hosted = open_in_worker("onnxruntime", model, {"intra_op_num_threads": 1})
    try:
        with open_backend("onnxruntime", model, {"intra_op_num_threads": 1}) as local:
            assert hosted.inputs == local.inputs and hosted.outputs == local.outputs
            np.testing.assert_array_equal(hosted.run(FEEDS)["y"], local.run(FEEDS)["y"])
        assert hosted.last_overhead_ms is not None and hosted.last_overhead_ms >= 0.0
        assert hosted.describe()["process"] == "isolated" and hosted.pid != __import__("os").getpid()
        settings = BenchSettings(warmup=1, min_runs=5, max_runs=5)
        measurement = measure_where_it_runs(hosted, FEEDS, settings, "child")  # timed inside the child
        assert measurement.label == "child" and len(measurement.samples_ms) == 5
        with pytest.raises(LtoError, match=r"onnxruntime worker process failed: .*double"):
            hosted._call("run", {"x": FEEDS["x"].astype(np.float64)})
    finally:
        hosted.close()


def test_subprocess_backend_reports_load_errors_and_death(tmp_path: Path) -> None:
    import os
    import signal

    from optimize.errors import ModelError
    from optimize.runtimes.backends import open_in_worker

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelError, match=r"onnxruntime cannot load bad\.onnx"):
        open_in_worker("onnxruntime", bad, {})
    hosted = open_in_worker("onnxruntime", mlp_model(tmp_path / "m.onnx"), {})
    try:
        os.kill(hosted.pid, signal.SIGKILL)
        hosted._proc.wait(timeout=10)  # fully gone: the request now fails on send, not on receive
        with pytest.raises(LtoError, match=r"worker process died \(signal 9\)"):
            hosted.run(FEEDS)
    finally:
        hosted.close()


# timing: it bounds how fast the worker ends in wall-clock seconds, which a test beside it stretches.
@pytest.mark.timing
def test_an_interrupted_request_ends_the_worker_at_once(tmp_path: Path) -> None:
    """Ctrl-C reaches lto's whole group: the worker ignores it, and lto, interrupted while the
    worker is busy, ends it rather than waiting for it to finish and read "close"."""
    import os
    import signal
    import threading
    import time

    from optimize.runtimes.backends import open_in_worker

    hosted = open_in_worker("onnxruntime", mlp_model(tmp_path / "m.onnx"), {})

    def ctrl_c() -> None:
        time.sleep(0.5)
        os.kill(hosted.pid, signal.SIGINT)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    try:
        threading.Thread(target=ctrl_c, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            hosted.call_in_child("tests.child_targets:sleep_in_worker", 60.0)
        assert hosted._proc.poll() is None  # still busy: SIGINT is lto's to act on
    finally:
        started = time.monotonic()
        hosted.close()
    assert time.monotonic() - started < 3.0 and hosted._proc.returncode == -signal.SIGTERM
