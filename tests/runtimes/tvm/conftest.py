"""The TVM tests' shared fixtures."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import make_stage_context
from tests.runtimes.tvm.helpers import FEEDS, TINY, mlp_model


@pytest.fixture(scope="session")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real tuning run (2 trials) on the one-kernel model, shared by the stage and backend tests."""
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import TvmTuneStage

    root = tmp_path_factory.mktemp("tvm")
    model = mlp_model(root / "mlp.onnx")
    cache = root / "cache"
    ctx = make_stage_context(
        root / "run1", model, FEEDS, options={"trials": 2, "cache_dir": str(cache), **TINY}
    )
    stage = TvmTuneStage()
    assert stage.skip_reason(ctx.best_standard, ctx) is None
    candidates = stage.run(ctx.best_standard, ctx)
    return {"model": model, "cache": cache, "candidates": candidates, "ctx": ctx, "root": root}
