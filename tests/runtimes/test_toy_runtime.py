"""Adding a runtime is a folder and one line in optimize/runtimes/registry.py.

The test copies the package, adds a toy runtime's folder (a spec, a backend, a stage) and its one
registry line, and runs the real `lto` from the copy: the stage's declared options are checked in
the recipe, its candidate is checked, timed in worker processes of its own and shipped, `lto bench`
runs the artifact, and `lto export --triton` refuses it, naming the runtime. Nothing else in the
package is edited.

The toy runtime memoizes: it runs the model with ONNX Runtime once per distinct input and answers
repeats from memory, so its outputs are the original's and repeated timings are much faster.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import sample_path

ROOT = Path(__file__).resolve().parents[2]

SPEC = """
from optimize.options import integer
from optimize.runtimes.spec import BackendInfo, RuntimeSpec, StageInfo

SPEC = RuntimeSpec(
    name="toy",
    title="Toy",
    backends=(BackendInfo("toy", "optimize.runtimes.toy.backend:MemoBackend", "toy"),),
    stages=(StageInfo("toy-memo", "optimize.runtimes.toy.stage:MemoStage", {"max_entries": integer(1)}),),
)
"""

BACKEND = """
from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort

from optimize.backend import Backend, TensorSpec


class MemoBackend(Backend):
    kind: ClassVar[str] = "toy"

    def __init__(self, model_path, config=None) -> None:
        super().__init__(model_path, config)
        self.config = self.config_with_defaults({"max_entries": 64})
        self.session = ort.InferenceSession(str(self.model_path), providers=["CPUExecutionProvider"])
        self.memo: dict[tuple, dict[str, np.ndarray]] = {}

    def _specs(self, values) -> list[TensorSpec]:
        dtype = {"tensor(float)": "float32", "tensor(int64)": "int64"}
        return [TensorSpec(v.name, dtype[v.type], tuple(v.shape)) for v in values]

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._specs(self.session.get_inputs())

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._specs(self.session.get_outputs())

    def run(self, feeds):
        key = tuple((name, feeds[name].tobytes()) for name in sorted(feeds))
        found = self.memo.get(key)
        if found is None:
            names = [o.name for o in self.session.get_outputs()]
            found = dict(zip(names, self.session.run(None, dict(feeds)), strict=True))
            if len(self.memo) < self.config["max_entries"]:
                self.memo[key] = found
        return found

    def describe(self) -> dict[str, Any]:
        return {"runtime": "toy", "memo_entries": len(self.memo), **self.config}
"""

STAGE = """
from optimize.stage import Candidate, Stage


class MemoStage(Stage):
    name = "toy-memo"

    def run(self, candidate, ctx):
        config = {"max_entries": int(ctx.options.get("max_entries", 64))}
        yield Candidate(label="toy-memo", model_path=ctx.original_model, backend="toy", runtime_config=config)
"""

RECIPE = """
order = ["toy-memo"]
[stages.toy-memo]
max_entries = {entries}
[accuracy]
samples = 4
[bench]
warmup = 5
min_runs = 50
max_runs = 2000
max_time_s = 0.5
"""


def _add_toy_runtime(package: Path) -> list[str]:
    """The toy folder and the registry's one line; returns the registry's diff."""
    folder = package / "runtimes" / "toy"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""A toy runtime that memoizes."""\n')
    (folder / "spec.py").write_text(SPEC)
    (folder / "backend.py").write_text(BACKEND)
    (folder / "stage.py").write_text(STAGE)
    registry = package / "runtimes" / "registry.py"
    before = registry.read_text().splitlines()
    after = []
    for line in before:
        after.append(line)
        if line.strip() == '"tensorrt",':
            after.append('    "toy",')
    registry.write_text("\n".join(after) + "\n")
    changed = difflib.unified_diff(before, after, lineterm="", n=0)
    return [d for d in changed if d[:1] in "+-" and d[:3] not in ("---", "+++")]


def _lto(copy: Path, *args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("LTO_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args)],
        capture_output=True, text=True, timeout=600, cwd=copy, env=env, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_a_runtime_is_a_folder_and_one_registry_line(tmp_path: Path) -> None:
    copy = tmp_path / "lto"
    shutil.copytree(ROOT / "optimize", copy / "optimize", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "recipes", copy / "recipes")
    diff = _add_toy_runtime(copy / "optimize")
    assert diff == ['+    "toy",'], diff  # the registry's one line, nothing else

    model = sample_path("mlp_small.onnx")
    bad = tmp_path / "bad.toml"
    bad.write_text(RECIPE.format(entries=0))
    proc = _lto(copy, "optimize", model, "--recipe", bad, "-o", tmp_path / "never")
    assert proc.returncode == 2, proc.stderr
    assert "stages.toy-memo.max_entries: must be at least 1" in proc.stderr  # the stage's schema

    recipe = tmp_path / "toy.toml"
    recipe.write_text(RECIPE.format(entries=8))
    out = tmp_path / "toy-artifact"
    proc = _lto(copy, "optimize", model, "--recipe", recipe, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["optimize"]
    (row,) = [r for r in report["stages"] if r["stage"] == "toy-memo"]
    assert row["backend"] == "toy" and row["status"] == "kept", row["reason"]
    assert row["accuracy"]["ok"] and row["speedup_vs_baseline"] > 1.0
    assert "confirmation" in row["details"]  # timed twice, each side in a worker process of its own
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "toy" and manifest["runtime_config"] == {"max_entries": 8}

    proc = _lto(copy, "bench", "--artifact", out, "--time", "0.3", "--json")
    assert proc.returncode == 0, proc.stderr
    (measured,) = json.loads(proc.stdout)["results"]
    assert measured["backend"] == "toy" and measured["runs"] > 0

    proc = _lto(copy, "export", out, "--triton", tmp_path / "repo")
    assert proc.returncode == 2 and "Triton has no Toy backend" in proc.stderr, proc.stderr
    assert not (tmp_path / "repo" / out.name).exists()
