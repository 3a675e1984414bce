"""The tvm-tune stage (optimize/runtimes/tvm/tune_stage.py): when it skips, what it builds, how
it reuses its tuning cache and keeps to its time budget, and tuning over RPC.

Tuning tests use tiny models and budgets of a few trials (each trial is one LLVM build plus one
measurement), so they run in a few minutes on 2 cores. Tests that need apache-tvm
call `pytest.importorskip("tvm")`; the rest run on the base install.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.errors import UsageError
from optimize.stage import Candidate, StageSkipped
from tests.factories import logged, make_stage_context
from tests.runtimes.tvm.helpers import FEEDS, TINY, mlp_model, ort_outputs

pytestmark = pytest.mark.tvm


def lstm_model(path: Path) -> Path:
    """A model with an op the Relax ONNX frontend does not convert (LSTM)."""
    rng = np.random.default_rng(0)
    hidden, feat = 4, 3
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, feat)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32), "R"),
    ]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["", "y"], hidden_size=hidden)
    graph = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, feat])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def embedding_model(path: Path) -> Path:
    """ids[1, 8] (int64) -> Relu(Gather(table[50, 16], ids)): an embedding lookup."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_skipped_with_reason_when_tvm_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import optimize.runtimes.tvm.tune_stage as tune_stage
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    monkeypatch.setattr(tune_stage, "tvm_available", lambda: False)
    model = mlp_model(tmp_path / "m.onnx")
    ctx = make_stage_context(tmp_path / "w", model, FEEDS)
    reason = TvmTuneStage().skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "apache-tvm is not installed" in reason and "lto-onnx[tvm]" in reason


def test_skipped_when_the_ffi_pin_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    import optimize.runtimes.tvm as support

    monkeypatch.setattr(support, "tvm_ffi_version", lambda: "0.1.15.post2")
    problem = support.check_tuning_dependencies()
    assert problem is not None and "0.1.14.post1" in problem and "segfault" in problem


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    from optimize.runtimes.tvm.tune_stage import _options

    with pytest.raises(UsageError, match="tvm-tune option trails: unknown key"):
        _options({"trails": 3})
    with pytest.raises(UsageError, match="trials: expected an integer"):
        _options({"trials": "many"})
    assert _options({"trials": 4, "time_budget_s": 5, "enabled": True}) == {"trials": 4, "time_budget_s": 5.0}


def test_import_failure_is_skipped_naming_the_op(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    model = lstm_model(tmp_path / "lstm.onnx")
    feeds = {"x": np.zeros((5, 1, 3), np.float32)}
    ctx = make_stage_context(
        tmp_path / "w", model, feeds, options={"trials": 2, "cache_dir": str(tmp_path / "cache")}
    )
    with pytest.raises(StageSkipped, match="does not support LSTM"):
        TvmTuneStage().run(ctx.best_standard, ctx)


def test_com_microsoft_best_candidate_falls_back_to_the_original(tmp_path: Path) -> None:
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    original = mlp_model(tmp_path / "orig.onnx")
    fused = onnx.load(str(original))
    fused.graph.node[0].domain = "com.microsoft"
    fused.graph.node[0].op_type = "FusedMatMul"
    fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(fused, str(tmp_path / "fused.onnx"))
    ctx = make_stage_context(tmp_path / "w", original, FEEDS)
    ctx.best_standard = Candidate("operator-fusion", tmp_path / "fused.onnx", standard_ops=True)
    assert TvmTuneStage.source_model(ctx) == (original, "original")
    ctx.best_standard = Candidate("graph-opt", original)
    assert TvmTuneStage.source_model(ctx) == (original, "graph-opt")


def test_tuned_build_matches_onnxruntime(tuned: dict[str, Any]) -> None:
    from optimize.runtimes.backends import open_backend

    (cand,) = tuned["candidates"]
    assert cand.backend == "tvm" and cand.model_path.suffix == ".so" and cand.model_path.is_file()
    assert not cand.standard_ops
    kernels = cand.details["kernels"]
    assert kernels["total"] >= 1 and kernels["scheduled"] == kernels["total"]
    assert cand.details["tuning"]["trials_measured"] >= 1
    assert all(t["best_us"] is not None for t in cand.details["tuning"]["tasks"])
    expected = ort_outputs(tuned["model"], FEEDS)
    with open_backend(cand.backend, cand.model_path, cand.runtime_config) as backend:
        assert [s.name for s in backend.inputs] == ["x"] and [s.name for s in backend.outputs] == ["y"]
        backend.check_feeds(FEEDS)
        got = backend.run(FEEDS)
        assert backend.describe()["process"] == "isolated"
    np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-4, atol=1e-4)


def test_second_run_reuses_the_database_without_tuning(
    tuned: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optimize.runtimes.tvm.tuning as tuning
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    class NoTuning:
        def __init__(self, *a: Any, **k: Any) -> None:
            raise AssertionError("the second run must not tune")

    monkeypatch.setattr(tuning, "Tuner", NoTuning)
    ctx = make_stage_context(
        tmp_path / "run2",
        tuned["model"],
        FEEDS,
        options={"trials": 2, "cache_dir": str(tuned["cache"]), **TINY},
    )
    (cand,) = TvmTuneStage().run(ctx.best_standard, ctx)
    info = cand.details["tuning"]
    assert (
        info["cache"]["reused"] and info["trials_measured"] == 0 and info["stopped_by"] == "nothing-to-tune"
    )
    assert cand.details["kernels"]["scheduled"] == cand.details["kernels"]["total"]
    first = tuned["candidates"][0].details["tuning"]["cache"]["key"]
    assert info["cache"]["key"] == first
    expected = ort_outputs(tuned["model"], FEEDS)
    from optimize.runtimes.tvm.backend import TvmBackend

    with TvmBackend(cand.model_path, {"process": "inline"}) as backend:
        np.testing.assert_allclose(backend.run(FEEDS)["y"], expected["y"], rtol=1e-4, atol=1e-4)


def test_gather_kernels_are_measured_with_valid_indices(tmp_path: Path) -> None:
    """MetaSchedule's default runner fills index tensors with random bits: a gather then reads out
    of bounds and the measurement crashes, so the kernel never gets a schedule."""
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    model = embedding_model(tmp_path / "emb.onnx")
    feeds = {"ids": np.array([[0, 3, 7, 49, 1, 2, 2, 10]], dtype=np.int64)}
    ctx = make_stage_context(
        tmp_path / "w", model, feeds, options={"trials": 6, "cache_dir": str(tmp_path / "cache"), **TINY}
    )
    (cand,) = TvmTuneStage().run(ctx.best_standard, ctx)
    assert any("take" in t["name"] for t in cand.details["tuning"]["tasks"])
    assert cand.details["tuning"]["run_errors"] == 0
    assert cand.details["kernels"]["scheduled"] == cand.details["kernels"]["total"]
    from optimize.runtimes.tvm.backend import TvmBackend

    with TvmBackend(cand.model_path, {"process": "inline"}) as backend:
        np.testing.assert_allclose(
            backend.run(feeds)["y"], ort_outputs(model, feeds)["y"], rtol=1e-5, atol=1e-6
        )


def test_time_budget_is_honoured_and_records_are_kept(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.cache import META_FILE
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    model = mlp_model(tmp_path / "mlp2.onnx", two_kernels=True)
    cache = tmp_path / "cache"
    # 1 s cannot hold two tasks: the first chunk (one task, one round) runs to completion to
    # measure what a trial costs; the next one does not fit and is never started.
    ctx = make_stage_context(
        tmp_path / "w",
        model,
        FEEDS,
        options={"trials": 40, "time_budget_s": 1.0, "cache_dir": str(cache), **TINY},
    )
    started = time.monotonic()
    with pytest.raises(
        StageSkipped, match=r"1 of 2 TVM kernels have no tuned schedule \(the time budget ran out\)"
    ):
        TvmTuneStage().run(ctx.best_standard, ctx)
    assert time.monotonic() - started < 600
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    records = [
        json.loads(line) for line in (entry / "database_tuning_record.json").read_text().splitlines() if line
    ]
    assert len(records) >= 1  # what the chunk measured survived
    meta = json.loads((entry / META_FILE).read_text())
    assert meta["last_run"]["stopped_by"] == "time"
    trials = sorted(t["trials"] for t in meta["tasks"].values())
    assert trials[0] == 0 and trials[1] >= 1  # one task tuned, the other never started
    assert any("only 1 of 2 kernels" in line for line in logged(ctx))


# -- RPC ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rpc_tuning_on_loopback(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    pytest.importorskip("tornado")  # the tracker needs it
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    port = _free_port()
    tracker = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
         "--port", str(port), "--port-end", str(port + 1), "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    server = None
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
             "--tracker", f"127.0.0.1:{port}", "--key", "lto-test", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        from tvm import rpc

        deadline = time.monotonic() + 120
        while True:
            try:
                summary = rpc.connect_tracker("127.0.0.1", port).summary()
                if summary.get("queue_info", {}).get("lto-test", {}).get("free", 0) >= 1:
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the RPC server did not register with the tracker within 120 s")
            time.sleep(1)
        model = mlp_model(tmp_path / "m.onnx")
        rpc = {"rpc_tracker": f"127.0.0.1:{port}", "rpc_key": "lto-test"}
        ctx = make_stage_context(
            tmp_path / "w",
            model,
            FEEDS,
            options={"trials": 2, "cache_dir": str(tmp_path / "cache"), **rpc, **TINY},
        )
        (cand,) = TvmTuneStage().run(ctx.best_standard, ctx)
        info = cand.details["tuning"]
        assert info["measured_on"] == "rpc:lto-test"
        assert info["trials_measured"] >= 1 and info["run_errors"] == 0
        assert all(t["best_us"] is not None for t in info["tasks"])
    finally:
        # Each in a group of its own, ended whole: the server's popen workers outlive a
        # terminate() of the server alone.
        for proc in (server, tracker):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
