"""The MLServer side of `benchmarks/serve_compare.py`: a custom runtime running the same ONNX
file with ONNX Runtime (one intra-op thread), as MLServer's docs show for a model it has no
built-in runtime for. Loaded by MLServer from its own virtual environment (mlserver pins
versions of fastapi and uvicorn that lto's do not allow), so it imports nothing from lto."""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = int((self.settings.parameters.extra or {}).get("threads", 1))
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(self.settings.parameters.uri), options, providers=["CPUExecutionProvider"]
        )
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        results = self._session.run(None, feeds)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(n, v) for n, v in zip(self._outputs, results, strict=True)],
        )
