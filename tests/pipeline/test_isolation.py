"""A stage run in a child process group (optimize/pipeline/isolation.py): its candidates, lines
and errors come back as in-process; an interrupt ends its whole group. The stages are in
tests/pipeline/isolated_stages.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from optimize.errors import UsageError
from optimize.pipeline.isolation import StageProcessFailed, run_in_child
from optimize.stage import StageContext, StageSkipped
from tests.conftest import make_matmul_model
from tests.factories import logged, make_stage_context
from tests.pipeline import isolated_stages as stages


def _context(tmp_path: Path, **kw: object) -> StageContext:
    model = make_matmul_model(tmp_path / "m.onnx")
    return make_stage_context(tmp_path / "work", model, **kw)  # type: ignore[arg-type]


def test_candidates_and_lines_come_back_and_the_stage_works_in_its_workdir(tmp_path: Path) -> None:
    statuses: list[str] = []
    ctx = _context(tmp_path, status=statuses.append, deadline=time.monotonic() + 600)
    (cand,) = run_in_child(stages.WritesAndTalks(), ctx.best_standard, ctx)
    assert cand.label == "written" and cand.model_path == Path("out.onnx")
    assert (ctx.workdir / "out.onnx").is_file()  # relative to the workdir, as the loop expects
    assert cand.details["pid"] != os.getpid()
    assert 0 < cand.details["budget_left_s"] <= 600  # the deadline, rebased in the child
    assert logged(ctx) == ["working in work"] and statuses == ["half way"]


def test_a_skip_and_lto_errors_come_back_as_themselves_saying_where(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    with pytest.raises(StageSkipped, match=r"^the model has no MatMul to tune$"):
        run_in_child(stages.Skips(), ctx.best_standard, ctx)
    with pytest.raises(UsageError) as caught:
        run_in_child(stages.RaisesUsageError(), ctx.best_standard, ctx)
    assert caught.value.one_line() == "tvm-tune option trials=-1 (give a positive number of trials)"
    assert caught.value.where.startswith("isolated_stages.py:")  # type: ignore[attr-defined]


def test_other_errors_come_back_as_stage_process_failed_naming_their_type(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    with pytest.raises(StageProcessFailed) as caught:
        run_in_child(stages.ChecksAccuracy(), ctx.best_standard, ctx)
    error = caught.value
    assert error.message == (
        "the checks-accuracy process failed: RuntimeError: "
        "check_accuracy is not available to a stage run in a child process"
    )
    assert error.type_name == "RuntimeError" and error.where.startswith("isolation.py:")


def test_an_interrupt_ends_the_stage_and_every_worker_it_started(tmp_path: Path) -> None:
    workers: list[int] = []

    def log(line: str) -> None:  # the parent's Ctrl-C, landing once the workers run
        workers.extend(int(pid) for pid in line.split()[1:])
        raise KeyboardInterrupt

    ctx = _context(tmp_path, log=log)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_in_child(stages.StartsWorkers(), ctx.best_standard, ctx)
    assert len(workers) == 2 and time.monotonic() - started < 30
    deadline = time.monotonic() + 5
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in workers if psutil.pid_exists(pid) and not _ended(pid)]
        time.sleep(0.05)
    assert not alive


def _ended(pid: int) -> bool:
    try:
        zombie = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    if zombie:  # orphaned to this test process (a subreaper, see tests/conftest.py): reap it
        os.waitpid(pid, os.WNOHANG)
    return zombie
