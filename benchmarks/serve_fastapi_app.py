"""The server `benchmarks/serve_compare.py` measures lto serve against: FastAPI on uvicorn, one
ONNX Runtime session, one request per model call (no batching), as a user would write it.

It speaks the same KServe v2 protocol (JSON and binary tensors, through lto's codec), so the
same load generator and requests drive it. The model and thread count come from the
environment, since uvicorn imports the app by name:

    LTO_BENCH_MODEL=model.onnx LTO_BENCH_THREADS=1 python -m uvicorn benchmarks.serve_fastapi_app:app
"""

from __future__ import annotations

import os
import time
from typing import Any

import onnxruntime as ort
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from optimize.backend import TensorSpec
from optimize.errors import InputError
from optimize.serve.protocol import HEADER_LENGTH, decode_request, encode_response

_ORT_TO_NUMPY = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32"}


def _session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("LTO_BENCH_THREADS", "1"))
    options.inter_op_num_threads = 1
    return ort.InferenceSession(os.environ["LTO_BENCH_MODEL"], options, providers=["CPUExecutionProvider"])


session = _session()
inputs = [
    TensorSpec(i.name, _ORT_TO_NUMPY[i.type], tuple(d if isinstance(d, int) else None for d in i.shape))
    for i in session.get_inputs()
]
outputs = [TensorSpec(o.name, _ORT_TO_NUMPY[o.type], tuple(o.shape)) for o in session.get_outputs()]
app = FastAPI()


@app.get("/v2/health/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}


@app.get("/v2/health/live")
def live() -> dict[str, bool]:
    return {"live": True}


@app.post("/v2/models/{model}/infer")
async def infer(model: str, request: Request) -> Response:
    body = await request.body()
    header = request.headers.get(HEADER_LENGTH)
    try:
        parsed = decode_request(body, int(header) if header is not None else None, inputs)
    except InputError as exc:
        return JSONResponse({"error": exc.one_line()}, status_code=400)
    # A plain (sync) model call: the usual way, one request per call, on the loop's thread pool.
    from starlette.concurrency import run_in_threadpool

    result, model_ms = await run_in_threadpool(_timed_run, parsed.feeds)
    payload, head_len = encode_response(
        model, "1", parsed, {o.name: r for o, r in zip(outputs, result, strict=True)}, outputs
    )
    # The model's own time, as lto serve reports it, so the benchmark can tell the server's cost
    # from the model's speed in this process.
    timing = {"Server-Timing": f"model;dur={model_ms:.3f}"}
    if head_len is None:
        return Response(payload, media_type="application/json", headers=timing)
    return Response(
        payload, media_type="application/octet-stream", headers={HEADER_LENGTH: str(head_len), **timing}
    )


def _timed_run(feeds: dict[str, Any]) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    result = session.run(None, feeds)
    return result, (time.perf_counter() - t0) * 1e3
