"""Hand an artifact to the servers users already run: a Triton model folder and a KServe
InferenceService, carrying the runtime settings lto chose and batching derived from what it measured.

    model_io.py   the model file's declared inputs and outputs (ONNX, OpenVINO IR, TensorRT engine)
    runtimes.py   lto runtime -> Triton platform/backend and parameters; what is lost; what is refused
    batching.py   the batch-latency profile and the rule that turns it and an SLO into dynamic batching
    pbtxt.py      protobuf text format from plain data
    kserve.py     the InferenceService YAML
    triton.py     checks, derives and writes REPO/<name>/ atomically
"""

from __future__ import annotations

from optimize.export.triton import ExportRequest, ExportResult, export_triton

__all__ = ["ExportRequest", "ExportResult", "export_triton"]
