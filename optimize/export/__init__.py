"""Hand an artifact to the servers users already run: a Triton model folder and a KServe
InferenceService, carrying the runtime settings lto chose and batching derived from what it measured.

    triton.py     checks, derives and writes REPO/<name>/ atomically
    batching.py   the batch-latency profile and the rule that turns it and an SLO into dynamic batching
    kserve.py     the InferenceService YAML
    templates/    the Triton python-backend model (package data, copied as 1/model.py)

Triton's vocabulary (model I/O, pbtxt) lives in optimize.triton; each runtime's mapping onto a
Triton backend in its own folder (runtimes/<runtime>/triton.py).
"""

from __future__ import annotations

from optimize.export.triton import ExportRequest, ExportResult, export_triton

__all__ = ["ExportRequest", "ExportResult", "export_triton"]
