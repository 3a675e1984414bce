"""The model.py of a `lto export --triton REPO --backend python` model: the artifact served by lto's
own runtime inside Triton's python backend, batched by Triton's dynamic batcher.

Triton copies nothing and imports this file from REPO/<name>/1/model.py; the artifact it runs is
beside it in 1/artifact/, verified (file hashes, this CPU) when the model loads. The serving
Triton's Python must import lto and the artifact's runtime (pip install 'lto-onnx[openvino]' for an
OpenVINO artifact, say) and NumPy 1.x (the backend's stub is built against it: a NumPy 2 tensor
reaches Triton empty), or $LTO_PYTHONPATH must name where they are. Every setting lto measured
applies as lto applied it, including those Triton's native backends cannot express (OpenVINO with
fused subgraphs off, ONNX Runtime with spinning off).

Each model instance is a process of its own (Triton's python backend): with several instances, each
takes its share of the cores, as `lto serve --instances` does. Like `lto serve`, each warms up before
its first request: every batch size Triton's dynamic batcher can hand it (1 to max_batch_size, the
preferred sizes first when the config names some) is prepared (`Backend.prepare`: OpenVINO compiles
the model for that shape) and run once, within lto serve's time budget (optimize/runtimes/warmup.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Triton's python backend embeds an interpreter that ignores PYTHONPATH: $LTO_PYTHONPATH, when set,
# names where lto and its runtimes are installed (a virtual environment's site-packages, say).
sys.path[:0] = [path for path in os.environ.get("LTO_PYTHONPATH", "").split(os.pathsep) if path]

import numpy as np  # noqa: E402  (after the path above)
import triton_python_backend_utils as pb_utils  # noqa: E402

from optimize.artifact import resolve_model  # noqa: E402
from optimize.backend import Backend  # noqa: E402
from optimize.errors import InputError  # noqa: E402
from optimize.export.triton import ARTIFACT_FOLDER  # noqa: E402
from optimize.runtimes.backends import open_model, shared_cores  # noqa: E402
from optimize.runtimes.warmup import batch_shapes, one_request, rows_of, warm_shapes  # noqa: E402


def batch_sizes(config: dict[str, Any], rows: int) -> list[int]:
    """The batch sizes (rows) `execute` is handed, from requests of `rows` rows: Triton's preferred
    batch sizes first when the config names them, then every other size its dynamic batcher can
    form up to max_batch_size (it forms any size when the queue delay runs out); `rows` alone when
    the model does not batch (max_batch_size 0)."""
    max_batch = int(config.get("max_batch_size", 0))
    if max_batch <= 0:
        return [rows]
    preferred = config.get("dynamic_batching", {}).get("preferred_batch_size", [])
    first = sorted({int(size) for size in preferred if 0 < int(size) <= max_batch and int(size) % rows == 0})
    return first + [size for size in batch_shapes(rows, max_batch) if size not in first]


def split_rows(outputs: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    """One batched run's outputs split back into each request's rows, in order."""
    parts: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, array in outputs.items():
        start = 0
        for part, size in zip(parts, sizes, strict=True):
            part[name] = np.ascontiguousarray(array[start : start + size])
            start += size
    return parts


class TritonPythonModel:
    """Triton's python-backend model interface: initialize, execute (a list of requests), finalize."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"] / ARTIFACT_FOLDER
        model = resolve_model(folder)  # refuses changed files and a CPU that lacks the ISA it needs
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        self.backend: Backend = open_model(
            model, shared_cores(model.backend, model.runtime_config, instances)
        )
        self.inputs = [str(tensor["name"]) for tensor in config["input"]]
        self.outputs = [str(tensor["name"]) for tensor in config["output"]]
        self.batched = int(config.get("max_batch_size", 0)) > 0
        try:
            row = one_request(model, self.backend)  # from the artifact's input spec
        except InputError:
            return  # no inputs to warm up with (a dim nobody pins): the first requests pay the set-up
        warm_shapes(self.backend, row, batch_sizes(config, rows_of(row)))

    def execute(self, requests: list[Any]) -> list[Any]:
        feeds = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            for request in requests
        ]
        try:
            results = self._run_all(feeds)
        except Exception as exc:  # every request of the batch gets the error; the model stays up
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, np.ascontiguousarray(result[name])) for name in self.outputs
                ]
            )
            for result in results
        ]

    def _run_all(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """One model run for the whole dynamic batch where the requests stack, else one each."""
        if not self.batched or len(feeds) == 1:
            return [self.backend.run(f) for f in feeds]
        shapes = {name: {f[name].shape[1:] for f in feeds} for name in self.inputs}
        if any(len(tails) > 1 for tails in shapes.values()):
            return [self.backend.run(f) for f in feeds]
        stacked = {name: np.concatenate([f[name] for f in feeds]) for name in self.inputs}
        sizes = [int(f[self.inputs[0]].shape[0]) for f in feeds]
        return split_rows(self.backend.run(stacked), sizes)

    def finalize(self) -> None:
        self.backend.close()
