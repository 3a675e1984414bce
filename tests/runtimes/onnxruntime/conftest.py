"""The ONNX Runtime stage tests' shared fixtures."""

from __future__ import annotations

import pytest

from optimize.runtimes.onnxruntime.graph_fusion import GraphFusionStage
from optimize.stage import Candidate, StageContext
from tests.runtimes.onnxruntime.helpers import BERT, sample_context


@pytest.fixture(scope="session")
def bert_fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Candidate, StageContext]:
    base, ctx, _ = sample_context(BERT, tmp_path_factory.mktemp("graph-fusion"))
    assert GraphFusionStage().skip_reason(base, ctx) is None
    (cand,) = GraphFusionStage().run(base, ctx)
    return cand, ctx
