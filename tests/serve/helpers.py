"""Helpers for the serve tests: a fake backend with a known latency, a tiny token model, and a tiny
artifact as `lto optimize` writes one."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optimize.backend import Backend, TensorSpec
from tests.serve.fake_clock import FakeClock


class SleepBackend(Backend):
    """y = 2x + 1 and s = row sums of x[batch, 4], after sleeping `base_ms + per_row_ms * rows`.

    With a `clock`, the call lets that much fake time pass on it instead of sleeping.
    Records the rows of every call. `gate` (a threading.Event) blocks calls until set, to hold a
    batch in flight; `fail_rows` makes a call with that many rows raise, `poison` a call with
    that value anywhere in x (like a token id beyond the vocabulary).
    """

    kind: ClassVar[str] = "fake"

    def __init__(
        self,
        base_ms: float = 1.0,
        per_row_ms: float = 0.0,
        batchable: bool = True,
        gate: threading.Event | None = None,
        fail_rows: int | None = None,
        poison: float | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        super().__init__("fake.onnx", {})
        self.base_ms = base_ms
        self.per_row_ms = per_row_ms
        self.batchable = batchable
        self.gate = gate
        self.fail_rows = fail_rows
        self.poison = poison
        self.clock = clock
        self.calls: list[int] = []
        self.lock = threading.Lock()

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", "float32", ("batch" if self.batchable else 1, 4))]

    @property
    def outputs(self) -> list[TensorSpec]:
        b = "batch" if self.batchable else 1
        return [TensorSpec("y", "float32", (b, 4)), TensorSpec("s", "float32", (b,))]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feeds["x"]
        if self.gate is not None:
            self.gate.wait(timeout=30)
        with self.lock:
            self.calls.append(x.shape[0])
        if self.fail_rows is not None and x.shape[0] == self.fail_rows:
            raise RuntimeError(f"injected failure on a batch of {x.shape[0]}")
        if self.poison is not None and bool((x == self.poison).any()):
            raise RuntimeError(f"injected failure: x holds {self.poison}")
        seconds = (self.base_ms + self.per_row_ms * x.shape[0]) / 1e3
        if self.clock is not None:
            self.clock.pass_time(seconds)
        else:
            time.sleep(seconds)
        return {"y": x * 2 + 1, "s": x.sum(axis=1)}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind}


def make_token_model(path: Path, vocab: int = 50, hidden: int = 8, seed: int = 0) -> Path:
    """input_ids/attention_mask int64[batch, sequence] -> hidden[batch, sequence, H] (masked
    embeddings) and pooled[batch, H] (mean over unmasked tokens): padding with mask 0 changes
    nothing for the real tokens, like a transformer with an attention mask."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "E")
    axes = numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2")
    axis1 = numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["tok"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["tok", "mask3"], ["hidden"]),
        helper.make_node("ReduceSum", ["hidden", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["pooled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", hidden]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", hidden]),
        ],
        [emb, axes, axis1],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="lto-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class LocalClient:
    """An aiohttp session bound to a server running in this process on 127.0.0.1 (the real
    socket and HTTP layer, as clients see them); `get`/`post`/`request` take paths."""

    def __init__(self, server: Any) -> None:
        self.server = server  # an InferenceServer
        self.running: Any = None
        self.session: Any = None
        self.port = 0

    async def start(self) -> LocalClient:
        import aiohttp

        from optimize.serve.http_layer import HttpServer

        self.http = HttpServer(self.server, self.server.config.http_limits())
        self.port = await self.http.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession(f"http://127.0.0.1:{self.port}")
        return self

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return await self.session.request(method, path, **kwargs)

    async def get(self, path: str, **kwargs: Any) -> Any:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> Any:
        return await self.request("POST", path, **kwargs)

    async def close(self) -> None:
        await self.session.close()
        await self.http.stop(timeout_s=5.0)


def write_matmul_artifact(tmp_path: Path, batch: int = 1) -> Path:
    """An artifact of a 16 -> 4 MatMul model on ONNX Runtime with one thread, measured at `batch`."""
    from optimize.artifact import write_artifact
    from optimize.data import resolve_inputs
    from optimize.stage import Candidate
    from tests.conftest import make_matmul_model

    model = make_matmul_model(tmp_path / "m.onnx", features=16, out=4)
    spec, _ = resolve_inputs(model, {}, None, batch=batch)
    return write_artifact(
        tmp_path / "art",
        candidate=Candidate(label="baseline", model_path=model, runtime_config={"intra_op_num_threads": 1}),
        input_spec=spec.to_json(),
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
        history=[],
        accuracy={"ok": True},
        chain_details=[],
        report={"kind": "optimize"},
        report_md="# report\n",
    )
