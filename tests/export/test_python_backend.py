"""The python-backend model lto exports (optimize/export/templates/model.py), driven as Triton drives
it, with a stand-in for Triton's triton_python_backend_utils: one model run per dynamic batch, each
request's rows back to it, an error for every request of a batch that failed."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.export.triton import PYTHON_MODEL
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors: list[_Tensor] | None = None, error: Any = None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors or []}
        self.error = error


@pytest.fixture
def model_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    utils = types.ModuleType("triton_python_backend_utils")
    utils.Tensor = _Tensor  # type: ignore[attr-defined]
    utils.InferenceResponse = _Response  # type: ignore[attr-defined]
    utils.TritonError = str  # type: ignore[attr-defined]
    utils.get_input_tensor_by_name = lambda request, name: _Tensor(name, request[name])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    # Loaded from its file, as Triton loads it: it is package data, not a module of lto's.
    spec = importlib.util.spec_from_file_location("triton_model", PYTHON_MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exported(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    recipe = tmp_path / "r.toml"
    recipe.write_text('order = ["operator-fusion"]\n[stages.operator-fusion]\nenabled = false\n')
    proc = run_cli("optimize", model, "--recipe", recipe, "-o", tmp_path / "art")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export", tmp_path / "art", "--triton", tmp_path / "repo", "--name", "m", "--backend",
                   "python", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)["config"]
    return tmp_path / "repo" / "m", {**config, "max_batch_size": 8, "input": [{"name": "x"}],
                                     "output": [{"name": "y"}]}  # fmt: skip


def test_a_dynamic_batch_is_one_run_and_each_request_gets_its_rows(
    model_module: types.ModuleType, tmp_path: Path
) -> None:
    folder, config = _exported(tmp_path)
    model = model_module.TritonPythonModel()
    model.initialize(
        {"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1"}
    )
    runs: list[int] = []
    real_run = model.backend.run
    model.backend.run = lambda feeds: runs.append(feeds["x"].shape[0]) or real_run(feeds)
    rng = np.random.default_rng(0)
    requests = [{"x": rng.standard_normal((rows, 16)).astype(np.float32)} for rows in (1, 3, 2)]
    responses = model.execute(requests)
    assert runs == [6]  # one run of the stacked batch
    for request, response in zip(requests, responses, strict=True):
        assert response.error is None
        np.testing.assert_allclose(response.outputs["y"], real_run(request)["y"], rtol=1e-6)
    # Requests whose rows do not stack run one at a time.
    runs.clear()
    odd = [{"x": np.ones((1, 16), np.float32)}, {"x": np.ones((1, 8), np.float32)}]
    model.backend.run = lambda feeds: runs.append(feeds["x"].shape[0]) or {"y": np.zeros((1, 4), np.float32)}
    assert len(model.execute(odd)) == 2 and runs == [1, 1]
    # A batch that fails: every request of it gets the error, and the model stays up.
    model.backend.run = lambda feeds: (_ for _ in ()).throw(RuntimeError("boom"))
    failed = model.execute(requests)
    assert [r.error for r in failed] == ["RuntimeError: boom"] * 3
    model.backend.run = real_run
    model.finalize()


def test_the_export_holds_the_model_and_the_whole_artifact(tmp_path: Path) -> None:
    folder, _ = _exported(tmp_path)
    assert (folder / "1" / "model.py").read_text() == PYTHON_MODEL.read_text()
    manifest = json.loads((folder / "1" / "artifact" / "manifest.json").read_text())
    assert all((folder / "1" / "artifact" / rel).is_file() for rel in manifest["files"])
    marker = json.loads((folder / "lto-export.json").read_text())
    assert marker["config"]["backend"] == "python" and "1/model.py" in marker["files"]
    assert "NumPy 1.x" in " ".join(marker["warnings"])


def test_initialize_prepares_and_runs_every_batch_size_triton_can_hand_it(
    model_module: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `lto serve` does at start: each batch shape once, through Backend.prepare (OpenVINO compiles
    a static model per shape) and a run, from one request made from the artifact's input spec."""
    folder, exported = _exported(tmp_path)
    prepared: list[tuple[int, ...]] = []
    ran: list[tuple[int, ...]] = []
    open_model = model_module.open_model

    def spied_open(*args: Any, **kwargs: Any) -> Any:
        backend = open_model(*args, **kwargs)
        prepare, run = backend.prepare, backend.run
        backend.prepare = lambda feeds: prepared.append(feeds["x"].shape) or prepare(feeds)
        backend.run = lambda feeds: ran.append(feeds["x"].shape) or run(feeds)
        return backend

    monkeypatch.setattr(model_module, "open_model", spied_open)
    cases = [
        ({"max_batch_size": 4}, [1, 2, 3, 4]),  # every size the dynamic batcher can form
        # Preferred sizes first, then the others: the batcher forms any size when its delay runs out.
        (
            {"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [8, 2, 4]}},
            [2, 4, 8, 1, 3, 5, 6, 7],
        ),
        ({"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [16]}}, [1, 2, 3, 4]),  # none fit
        ({"max_batch_size": 0}, [1]),  # no batching: the request's own shape
    ]
    for batching, sizes in cases:
        config = {key: value for key, value in exported.items() if key != "dynamic_batching"}
        model = model_module.TritonPythonModel()
        prepared.clear()
        ran.clear()
        model.initialize(
            {"model_config": json.dumps({**config, **batching}), "model_repository": str(folder),
             "model_version": "1"}
        )  # fmt: skip
        assert prepared == ran == [(size, 16) for size in sizes], batching
        model.finalize()
