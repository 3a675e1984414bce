"""The memory-layout stage (optimize/runtimes/onnxruntime/memory_layout.py) on the sample models:
the session settings and layouts it proposes, and that they still compute the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimize.runtimes.onnxruntime.memory_layout import MemoryLayoutStage
from optimize.stage import StageSkipped
from optimize.system.env import cpu_isa_flags, nchwc_block_width, physical_cores
from tests.runtimes.onnxruntime.helpers import MLP, RESNET, assert_close, nchwc_nodes, sample_context


def test_memory_layout_on_a_cnn(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(RESNET, tmp_path)
    cands = MemoryLayoutStage().run(base, ctx)
    assert 1 <= len(cands) <= 4
    cores = physical_cores()
    for cand in cands:
        cfg = cand.runtime_config
        assert cfg["intra_op_num_threads"] == cores and cfg["inter_op_num_threads"] == 1
        assert cfg["execution_mode"] == "sequential"
        assert_close(cand, RESNET, dict(ctx.feeds), atol=1e-4)
    portable = [c for c in cands if c.details.get("portable", True)]
    assert portable and all(nchwc_nodes(c.model_path) == 0 for c in portable)
    assert all(c.runtime_config["graph_optimization_level"] == "all" for c in portable)
    if cores > 1:
        assert {c.runtime_config["allow_spinning"] for c in portable} == {True, False}
    block = nchwc_block_width(cpu_isa_flags())
    saved = [c for c in cands if not c.details.get("portable", True)]
    if block is None:
        assert saved == []
    else:
        assert len(saved) == len(portable)  # the same spinning choices, layout saved offline
        for cand in saved:
            assert nchwc_nodes(cand.model_path) > 0
            assert cand.details["nchwc_block_width"] == block and cand.details["isa_requires"]
            assert cand.details["isa_exact"] == {"nchwc_block_width": block}
            assert cand.runtime_config["graph_optimization_level"] == "disable"


def test_memory_layout_on_an_mlp_only_proposes_session_settings(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(MLP, tmp_path)
    cands = MemoryLayoutStage().run(base, ctx)
    assert all(c.model_path == MLP for c in cands)
    assert all(c.details["conv_net"] is False for c in cands)
    assert all(c.details["layout"] == "no layout change" for c in cands)
    greedy = MemoryLayoutStage().run(base, sample_context(MLP, tmp_path, options={"threads": 64})[1])
    assert {c.runtime_config["intra_op_num_threads"] for c in greedy} == {
        physical_cores()
    }  # never oversubscribe
    with pytest.raises(StageSkipped):
        MemoryLayoutStage().run(base, sample_context(MLP, tmp_path, options={"search_threads": False})[1])
