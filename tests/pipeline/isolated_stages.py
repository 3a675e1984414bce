"""Stages tests/pipeline/test_isolation.py runs in a child process group: importable by the
child (a module, not a test file), each doing one thing a real isolated stage may do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from optimize.errors import UsageError
from optimize.stage import Candidate, Stage, StageContext, StageSkipped


class WritesAndTalks(Stage):
    """Writes its candidate under the current directory (the stage's workdir), logs, sets status."""

    name = "writes-and-talks"
    isolated: ClassVar[bool] = True

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        ctx.log(f"working in {Path.cwd().name}")
        assert ctx.status is not None
        ctx.status("half way")
        Path("out.onnx").write_bytes(Path(candidate.model_path).read_bytes())
        left_s = None if ctx.deadline is None else ctx.deadline - time.monotonic()
        details = {"pid": os.getpid(), "budget_left_s": left_s}
        return [Candidate("written", Path("out.onnx"), details=details)]


class Skips(Stage):
    name = "skips"
    isolated: ClassVar[bool] = True

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        raise StageSkipped("the model has no MatMul to tune")


class RaisesUsageError(Stage):
    name = "raises-usage-error"
    isolated: ClassVar[bool] = True

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        raise UsageError("tvm-tune option trials=-1", "give a positive number of trials")


class ChecksAccuracy(Stage):
    """Asks for the accuracy check, which a stage in a child process is not lent."""

    name = "checks-accuracy"
    isolated: ClassVar[bool] = True

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        ctx.check_accuracy(candidate)
        return [candidate]


class StartsWorkers(Stage):
    """Starts two workers (as MetaSchedule's builder and runner do), logs their ids, works on."""

    name = "starts-workers"
    isolated: ClassVar[bool] = True

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        code = "import time; time.sleep(120)"
        workers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
        ctx.log("workers " + " ".join(str(w.pid) for w in workers))
        time.sleep(120)
        return []
