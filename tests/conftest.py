"""Shared fixtures: the sample models and tiny models built on the fly."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.render import plots

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"

# lto optimize orders its stages partly by this machine's past runs (optimize/pipeline/order.py):
# the tests' runs must neither read nor add to it, or one test would order another's stages.
# Set for every process the tests start; the history's own tests set it to a file of their own.
os.environ["LTO_HISTORY"] = "off"
# Nor measure the machine's arithmetic rates in every run with a fresh cache (optimize/bench/peaks.py):
# the class then comes from the ISA flags; the rates' own tests turn it back on.
os.environ["LTO_PEAKS"] = "off"


def make_matmul_model(
    path: Path, features: int = 16, out: int = 4, extra_work: int = 0, seed: int = 0
) -> Path:
    """x[batch, features] -> Relu(x @ W + b). `extra_work` adds MatMul chains whose result is
    multiplied by zero and added, so the outputs stay the same while the model does more work."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((features, out)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((out,)).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], ["pre"]),
    ]
    inits = [w, b]
    last = "pre"
    if extra_work:
        sq = numpy_helper.from_array(
            rng.standard_normal((features, features)).astype(np.float32) * 0.01, "Sq"
        )
        zero = numpy_helper.from_array(np.zeros((1,), dtype=np.float32), "Zero")
        inits += [sq, zero]
        cur = "x"
        for i in range(extra_work):
            nodes.append(helper.make_node("MatMul", [cur, "Sq"], [f"e{i}"]))
            cur = f"e{i}"
        nodes.append(helper.make_node("MatMul", [cur, "W"], ["e_out"]))
        nodes.append(helper.make_node("Mul", ["e_out", "Zero"], ["e_zero"]))
        nodes.append(helper.make_node("Add", ["pre", "e_zero"], ["pre2"]))
        last = "pre2"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="lto-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# A PNG's signature: enough for code that stores or embeds a plot's bytes.
PNG_STANDIN = b"\x89PNG\r\n\x1a\n"
# The tests that draw real images and check them.
DRAWS_PLOTS = ROOT / "tests" / "render"


@pytest.fixture(autouse=True)
def _plots_built_but_not_rasterized(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every artifact and `-o` report holds its plots; drawing them into PNG bytes was a third of a
    pipeline test's time, and only tests/render reads the pixels. Elsewhere the plots are built
    (their data and captions) but not rasterized; tests/render draws and checks real images."""
    if not Path(request.node.path).is_relative_to(DRAWS_PLOTS):
        monkeypatch.setattr(plots, "_png", lambda fig: PNG_STANDIN)


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return make_matmul_model(tmp_path / "tiny.onnx")


@pytest.fixture
def sample(request: pytest.FixtureRequest) -> Path:
    return SAMPLES / request.param


def sample_path(name: str) -> Path:
    path = SAMPLES / name
    if not path.exists():
        pytest.skip(f"{path} not built (python sample_models/build.py)")
    return path


# -- the suite cleans up after itself ---------------------------------------------------------------

# Python's own helper processes that end with the interpreter, not with a test.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Make the test process a subreaper (Linux): a process orphaned by a test (a server's
    worker whose parent was terminated) is then re-parented here, where the check below sees
    it, instead of to init, where it would outlive the run unnoticed."""
    import ctypes
    import ctypes.util

    pr_set_child_subreaper = 36
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when tests leave processes behind (servers, tuners, TVM's popen workers):
    each costs memory and CPU on a 2-core machine and outlives `make test`."""
    import psutil

    me = psutil.Process()
    leftovers = []
    for proc in me.children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue  # ended, only not yet reaped
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if not any(helper in cmdline for helper in _INTERPRETER_HELPERS):
            leftovers.append((proc, cmdline))
    if not leftovers:
        return
    _, alive = psutil.wait_procs([p for p, _ in leftovers], timeout=10)
    if not alive:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"  pid {p.pid}: {cmd[:160]}" for p, cmd in leftovers if p in alive]
    message = "tests left child processes running (ended now):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_line(message, red=True)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
