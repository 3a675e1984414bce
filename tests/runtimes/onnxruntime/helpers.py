"""Shared by the ONNX Runtime stage tests: the sample models, a stand-in for the pipeline's
accuracy gate, a stage context on a sample model, and checks of what a stage wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from optimize.accuracy import AccuracyResult
from optimize.model.onnx_file import NCHWC_DOMAIN, op_counts, read_model, used_domains
from optimize.runtimes.onnxruntime.backend import OrtBackend
from optimize.stage import Candidate, StageContext
from tests.conftest import SAMPLES
from tests.factories import logged, make_stage_context

BERT = SAMPLES / "bert_tiny.onnx"
RESNET = SAMPLES / "resnet_tiny.onnx"
MLP = SAMPLES / "mlp_small.onnx"
SHAPES = {BERT: {"sequence": (16,)}, RESNET: {}, MLP: {}}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def outputs(cand: Candidate, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return OrtBackend(cand.model_path, cand.runtime_config).run(feeds)


def reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return OrtBackend(model, {}).run(feeds)


class Checker:
    """A stand-in for the pipeline's accuracy gate: cosine per output, optionally failing the first calls."""

    def __init__(self, model: Path, feeds: dict[str, np.ndarray], fail_first: int = 0, min_cos: float = 0.99):
        self.ref = reference(model, feeds)
        self.feeds = feeds
        self.fail_first = fail_first
        self.min_cos = min_cos
        self.calls: list[Candidate] = []

    def __call__(self, cand: Candidate) -> AccuracyResult:
        self.calls.append(cand)
        got = outputs(cand, self.feeds)
        per = {k: {"cosine": cosine(v, got[k])} for k, v in self.ref.items()}
        if len(self.calls) <= self.fail_first:
            return AccuracyResult(False, "forced failure", per)
        ok = all(v["cosine"] >= self.min_cos for v in per.values())
        return AccuracyResult(ok, "" if ok else "cosine too low", per)


def sample_context(
    model: Path,
    workdir: Path,
    options: dict[str, Any] | None = None,
    check: Callable[[Candidate], AccuracyResult] | None = None,
) -> tuple[Candidate, StageContext, list[str]]:
    """(the baseline candidate, a stage context, the lines the stage logs) for `model`, with its
    inputs pinned as SHAPES says and accuracy judged by `check` (default: a Checker at cosine 0.99)."""
    ctx = make_stage_context(workdir, model, shapes=SHAPES.get(model, {}), options=options)
    ctx.check_accuracy = check or Checker(model, dict(ctx.feeds))
    return ctx.best_standard, ctx, logged(ctx)


def assert_opsets_clean(path: Path) -> None:
    model = read_model(path, load_external_data=False)
    declared = {("" if o.domain == "ai.onnx" else o.domain) for o in model.opset_import}
    assert declared == used_domains(model), f"{path.name} declares {declared}"
    assert "ai.onnx.ml" not in declared


def assert_close(cand: Candidate, model: Path, feeds: dict[str, np.ndarray], atol: float = 1e-3) -> None:
    ref, got = reference(model, feeds), outputs(cand, feeds)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=1e-3, err_msg=f"{cand.label}: {name}")


def nchwc_nodes(path: Path) -> int:
    return sum(n for op, n in op_counts(read_model(path, False)).items() if op.startswith(NCHWC_DOMAIN + ":"))
