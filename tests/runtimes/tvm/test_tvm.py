"""The tvm-tune stage, TvmBackend and the process-isolated backend host.

Tuning tests use tiny models and budgets of a few trials (each trial is one LLVM build plus one
measurement), so the whole file runs in a few minutes on 2 cores. Tests that need apache-tvm
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

from optimize.errors import BackendUnavailable, LtoError, UsageError
from optimize.stage import Candidate, StageContext, StageSkipped

# Knobs that keep a tuning run to seconds per task: one search round of 2 candidates, a small
# evolutionary population. Far too small to find fast kernels; enough to exercise every path.
TINY = {"trials_per_iter": 2, "population_size": 16}


# -- models and contexts -----------------------------------------------------------------------


def mlp_model(path: Path, two_kernels: bool = False) -> Path:
    """x[batch, 32] -> Relu(x @ W1 + B1) (one fused kernel), optionally @ W2 (a second kernel)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, "W1"),
        numpy_helper.from_array(rng.standard_normal((32,)).astype(np.float32), "B1"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["y" if not two_kernels else "h3"]),
    ]
    out_dim = 32
    if two_kernels:
        inits.append(numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "W2"))
        nodes.append(helper.make_node("MatMul", ["h3", "W2"], ["y"]))
        out_dim = 8
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dim])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


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


def make_ctx(workdir: Path, model: Path, feeds: dict[str, np.ndarray], **options: Any) -> StageContext:
    workdir.mkdir(parents=True, exist_ok=True)
    logs: list[str] = []
    ctx = StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options=options,
        best_standard=Candidate("baseline", model),
        best_latency_ms=None,
        target_ms=None,
        deadline=None,
        check_accuracy=lambda c: pytest.fail("the stage must not check accuracy itself"),  # type: ignore[arg-type,return-value]
        log=logs.append,
    )
    ctx.logs = logs  # type: ignore[attr-defined]
    return ctx


def ort_outputs(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


FEEDS = {"x": np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real tuning run (2 trials) on the one-kernel model, shared by the tests below."""
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    root = tmp_path_factory.mktemp("tvm")
    model = mlp_model(root / "mlp.onnx")
    cache = root / "cache"
    ctx = make_ctx(root / "run1", model, FEEDS, trials=2, cache_dir=str(cache), **TINY)
    stage = TvmTuneStage()
    assert stage.skip_reason(ctx.best_standard, ctx) is None
    candidates = stage.run(ctx.best_standard, ctx)
    return {"model": model, "cache": cache, "candidates": candidates, "ctx": ctx, "root": root}


# -- the stage ---------------------------------------------------------------------------------


def test_skipped_with_reason_when_tvm_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import optimize.runtimes.tvm as support
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    monkeypatch.setattr(support, "tvm_available", lambda: False)
    model = mlp_model(tmp_path / "m.onnx")
    ctx = make_ctx(tmp_path / "w", model, FEEDS)
    reason = TvmTuneStage().skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "apache-tvm is not installed" in reason and "lto[tvm]" in reason


def test_skipped_when_the_ffi_pin_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    import optimize.runtimes.tvm as support

    monkeypatch.setattr(support, "tvm_ffi_version", lambda: "0.1.15.post2")
    problem = support.check_tuning_dependencies()
    assert problem is not None and "0.1.14.post1" in problem and "segfault" in problem


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    from optimize.runtimes.tvm.tune_stage import _options

    with pytest.raises(UsageError, match="unknown tvm-tune option 'trails'"):
        _options({"trails": 3})
    with pytest.raises(UsageError, match="trials must be int"):
        _options({"trials": "many"})
    assert _options({"trials": 4, "time_budget_s": 5, "enabled": True}) == {"trials": 4, "time_budget_s": 5.0}


def test_import_failure_is_skipped_naming_the_op(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    model = lstm_model(tmp_path / "lstm.onnx")
    feeds = {"x": np.zeros((5, 1, 3), np.float32)}
    ctx = make_ctx(tmp_path / "w", model, feeds, trials=2, cache_dir=str(tmp_path / "cache"))
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
    ctx = make_ctx(tmp_path / "w", original, FEEDS)
    ctx.best_standard = Candidate("operator-fusion", tmp_path / "fused.onnx", standard_ops=True)
    assert TvmTuneStage.source_model(ctx) == (original, "original")
    ctx.best_standard = Candidate("graph-opt", original)
    assert TvmTuneStage.source_model(ctx) == (original, "graph-opt")


def test_tuned_build_matches_onnxruntime(tuned: dict[str, Any]) -> None:
    from optimize.runtimes import open_backend

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
    ctx = make_ctx(tmp_path / "run2", tuned["model"], FEEDS, trials=2, cache_dir=str(tuned["cache"]), **TINY)
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
    ctx = make_ctx(tmp_path / "w", model, feeds, trials=6, cache_dir=str(tmp_path / "cache"), **TINY)
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
    ctx = make_ctx(tmp_path / "w", model, FEEDS, trials=40, time_budget_s=1.0, cache_dir=str(cache), **TINY)
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
    assert any("only 1 of 2 kernels" in line for line in ctx.logs)  # type: ignore[attr-defined]


def test_plan_covers_every_task_before_deepening() -> None:
    from optimize.runtimes.tvm.tuning import TaskState, TuneSettings, plan

    states = [TaskState(f"t{i}", f"{i:016x}", 1, 100.0 - i) for i in range(3)]
    work = plan(states, TuneSettings(trials=12, trials_per_iter=2))
    assert [(s.name, n) for s, n in work[:3]] == [("t0", 2), ("t1", 2), ("t2", 2)]
    assert sum(n for _, n in work) == 12
    # Trials allotted in earlier runs (from the cache) count toward each task's share, even where
    # the search measured fewer candidates than allotted: nothing left to plan.
    for s in states:
        s.budgeted, s.trials, s.best_us = 4, 3, 1.0
    assert plan(states, TuneSettings(trials=12, trials_per_iter=2)) == []
    # A bigger budget continues where the last run stopped.
    assert sum(n for _, n in plan(states, TuneSettings(trials=24, trials_per_iter=2))) == 12


# -- targets and the artifact ------------------------------------------------------------------


def test_target_detection_and_validation() -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.cpu_target import resolve_target

    host = resolve_target()
    assert host.host and host.mcpu not in ("generic", "native") and host.spec["kind"] == "llvm"
    assert "sse2" in host.isa_requires or "asimd" in host.isa_requires
    with pytest.raises(UsageError, match="'native' silently compiles generic code"):
        resolve_target("native")
    with pytest.raises(UsageError, match="does not know the CPU 'znver99'"):
        resolve_target("znver99")
    with pytest.raises(UsageError, match="no longer parses target strings"):
        resolve_target("llvm -mcpu=skylake")
    if host.triple.startswith("x86_64"):
        portable = resolve_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
        assert {"avx2", "fma"} <= set(portable.isa_requires) and "avx512f" not in portable.isa_requires


def test_artifact_files_and_refusal_on_a_cpu_without_the_isa(
    tuned: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import optimize.env
    from optimize.runtimes.tvm.backend import TvmBackend
    from optimize.runtimes.tvm.sidecar import SIDECAR_NAME

    (cand,) = tuned["candidates"]
    sidecar = cand.model_path.parent / SIDECAR_NAME
    assert cand.extra_files == [sidecar]
    data = json.loads(sidecar.read_text())
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 32]}]
    assert data["outputs"] == [{"name": "y", "dtype": "float32", "shape": [2, 32]}]
    assert data["isa_requires"] == cand.details["isa_requires"] and data["target"]["kind"] == "llvm"
    assert data["tvm_version"] and data["tuning"]["trials_measured"] >= 1
    # A CPU that lacks one of the flags the target used: refused with the reason, no SIGILL.
    required = set(data["isa_requires"])
    dropped = "avx2" if "avx2" in required else sorted(required)[0]
    monkeypatch.setattr(optimize.env, "cpu_isa_flags", lambda: set(required) - {dropped})
    with pytest.raises(BackendUnavailable, match=f"uses instructions this CPU lacks: {dropped}"):
        TvmBackend(cand.model_path, {"process": "inline"})


def test_library_for_a_bigger_cpu_is_refused_here(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    import optimize.env
    from optimize.runtimes.tvm.backend import TvmBackend
    from optimize.runtimes.tvm.cpu_target import resolve_target
    from optimize.runtimes.tvm.relax_build import build, count_scheduled, fuse, import_onnx
    from optimize.runtimes.tvm.sidecar import write_sidecar

    host = resolve_target()
    if not host.triple.startswith("x86_64") or "avx512f" in optimize.env.cpu_isa_flags():
        pytest.skip("needs an x86 CPU without AVX-512")
    info = resolve_target("x86-64-v4")  # AVX-512: an artifact built on a bigger machine
    imported = import_onnx(mlp_model(tmp_path / "m.onnx"), FEEDS)
    fused = fuse(imported.raw, info.target)
    library = tmp_path / "out" / "model.so"
    library.parent.mkdir()
    build(fused, info.target).export_library(str(library))
    write_sidecar(library, inputs=imported.inputs, outputs=imported.outputs, target=info.spec,
                  isa_requires=list(info.isa_requires), tvm_version="test", tuning=None,
                  kernels=count_scheduled(fused).to_json())  # fmt: skip
    with pytest.raises(BackendUnavailable, match=r"compiled for x86-64-v4 .* lacks: .*avx512f"):
        TvmBackend(library, {})


def test_missing_sidecar_and_bad_settings(tuned: dict[str, Any], tmp_path: Path) -> None:
    from optimize.errors import ModelError
    from optimize.runtimes.tvm.backend import TvmBackend

    (cand,) = tuned["candidates"]
    lonely = tmp_path / "model.so"
    lonely.write_bytes(cand.model_path.read_bytes())
    with pytest.raises(ModelError, match=r"no tvm_module\.json beside it"):
        TvmBackend(lonely, {})
    with pytest.raises(UsageError, match="unknown tvm setting 'threads'"):
        TvmBackend(cand.model_path, {"threads": 2})


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
        ctx = make_ctx(tmp_path / "w", model, FEEDS, trials=2, cache_dir=str(tmp_path / "cache"),
                       rpc_tracker=f"127.0.0.1:{port}", rpc_key="lto-test", **TINY)  # fmt: skip
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


def test_rpc_options_are_checked() -> None:
    from optimize.runtimes.tvm.tuning import parse_tracker

    assert parse_tracker("10.0.0.5:9190") == ("10.0.0.5", 9190)
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        parse_tracker("10.0.0.5")


# -- the process-isolated host (no TVM needed) -------------------------------------------------


def test_subprocess_backend_matches_in_process(tmp_path: Path) -> None:
    from optimize.bench import BenchSettings
    from optimize.runtimes import open_backend
    from optimize.runtimes.subprocess import SubprocessBackend

    model = mlp_model(tmp_path / "m.onnx")
    hosted = SubprocessBackend(model, {"intra_op_num_threads": 1}, hosted_kind="onnxruntime")
    try:
        with open_backend("onnxruntime", model, {"intra_op_num_threads": 1}) as local:
            assert hosted.inputs == local.inputs and hosted.outputs == local.outputs
            np.testing.assert_array_equal(hosted.run(FEEDS)["y"], local.run(FEEDS)["y"])
        assert hosted.last_overhead_ms is not None and hosted.last_overhead_ms >= 0.0
        assert hosted.describe()["process"] == "isolated" and hosted.pid != __import__("os").getpid()
        measurement = hosted.measure(FEEDS, BenchSettings(warmup=1, min_runs=5, max_runs=5), "child")
        assert measurement.label == "child" and len(measurement.samples_ms) == 5
        with pytest.raises(LtoError, match=r"onnxruntime worker process failed: .*double"):
            hosted._call("run", {"x": FEEDS["x"].astype(np.float64)})
    finally:
        hosted.close()


def test_subprocess_backend_reports_load_errors_and_death(tmp_path: Path) -> None:
    import os
    import signal

    from optimize.errors import ModelError
    from optimize.runtimes.subprocess import SubprocessBackend

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelError, match=r"onnxruntime cannot load bad\.onnx"):
        SubprocessBackend(bad, {}, hosted_kind="onnxruntime")
    hosted = SubprocessBackend(mlp_model(tmp_path / "m.onnx"), {}, hosted_kind="onnxruntime")
    try:
        os.kill(hosted.pid, signal.SIGKILL)
        hosted._proc.wait(timeout=10)  # fully gone: the request now fails on send, not on receive
        with pytest.raises(LtoError, match=r"worker process died \(signal 9\)"):
            hosted.run(FEEDS)
    finally:
        hosted.close()
