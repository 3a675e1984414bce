"""The committed sample models: reproducible builds, valid graphs, and the structure stages rely on."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
NAMES = ("bert_tiny.onnx", "resnet_tiny.onnx", "mlp_small.onnx")


def _session(path: Path | str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _bert_feeds(batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2 + 2 :] = 0  # one right-padded row
    token_types = np.zeros((batch, seq), np.int64)
    token_types[:, seq // 2 :] = 1
    return {
        "input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": token_types,
    }


def _build(out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SAMPLES / "build.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_build_is_byte_identical_and_matches_committed_files(tmp_path: Path) -> None:
    _build(tmp_path / "a")
    _build(tmp_path / "b")
    for name in NAMES:
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes(), f"{name} differs between two builds"
        assert first == (SAMPLES / name).read_bytes(), (
            f"committed {name} is stale: run sample_models/build.py"
        )
    total = sum((SAMPLES / n).stat().st_size for n in NAMES)
    assert total < 8_000_000, f"sample models grew to {total} bytes"


@pytest.mark.parametrize("name", NAMES)
def test_sample_is_valid_opset17_ir8_and_says_weights_are_random(name: str) -> None:
    model = onnx.load(str(SAMPLES / name))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert {p.key: p.value for p in model.metadata_props}["weights"] == "seeded random, not trained"
    assert "not trained" in model.doc_string


def test_bert_runs_with_dynamic_batch_and_sequence() -> None:
    sess = _session(SAMPLES / "bert_tiny.onnx")
    for batch, seq in ((1, 8), (3, 40)):
        hidden, pooled = sess.run(None, _bert_feeds(batch, seq))
        assert hidden.shape == (batch, seq, 128)
        assert pooled.shape == (batch, 128)
        assert np.isfinite(hidden).all() and np.isfinite(pooled).all()
        # LayerNorm output: per-token mean near beta's mean, spread near gamma's (~1).
        assert 0.5 < float(hidden.std()) < 2.0


def test_bert_attention_mask_hides_padded_tokens() -> None:
    sess = _session(SAMPLES / "bert_tiny.onnx")
    feeds = _bert_feeds(batch=1, seq=12)
    feeds["attention_mask"][0, 8:] = 0
    base = sess.run(["last_hidden_state"], feeds)[0]
    changed = {k: v.copy() for k, v in feeds.items()}
    changed["input_ids"][0, 8:] = (changed["input_ids"][0, 8:] + 17) % 1000
    other = sess.run(["last_hidden_state"], changed)[0]
    # Masked-out tokens must not influence the visible ones; they do change their own rows.
    np.testing.assert_allclose(other[0, :8], base[0, :8], atol=1e-5)
    assert np.abs(other[0, 8:] - base[0, 8:]).max() > 1e-2
    # Without the mask the same change reaches every token.
    feeds["attention_mask"][:] = 1
    changed["attention_mask"][:] = 1
    unmasked = sess.run(["last_hidden_state"], feeds)[0] - sess.run(["last_hidden_state"], changed)[0]
    assert np.abs(unmasked[0, :8]).max() > 1e-3


def test_bert_fuses_with_onnxruntime_transformers_and_matches(tmp_path: Path) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(
        str(SAMPLES / "bert_tiny.onnx"), model_type="bert", num_heads=4, hidden_size=128, opt_level=0
    )
    stats = fused.get_fused_operator_statistics()
    assert stats["Attention"] == 2
    assert stats["SkipLayerNormalization"] == 4
    assert stats["Gelu"] + stats["BiasGelu"] == 2
    assert stats["EmbedLayerNormalization"] == 1
    ops = Counter(n.op_type for n in fused.model.graph.node)
    assert ops["Softmax"] == 0 and ops["Erf"] == 0 and ops["LayerNormalization"] == 0
    out = tmp_path / "bert_fused.onnx"
    fused.save_model_to_file(str(out))

    feeds = _bert_feeds(batch=2, seq=24)
    expected = _session(SAMPLES / "bert_tiny.onnx").run(None, feeds)
    got = _session(out).run(None, feeds)
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_allclose(have, want, atol=1e-4, rtol=0)


def test_resnet_keeps_batchnorm_and_residual_blocks() -> None:
    model = onnx.load(str(SAMPLES / "resnet_tiny.onnx"))
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["BatchNormalization"] == ops["Conv"] == 11
    assert ops["Add"] == 4  # one residual Add per basic block
    assert ops["MaxPool"] == ops["GlobalAveragePool"] == ops["Gemm"] == 1
    conv_weights = {i.name: tuple(i.dims) for i in model.graph.initializer if i.name.endswith("conv.weight")}
    assert max(d[0] for d in conv_weights.values()) == 128  # widths reach 128
    assert sum(1 for d in conv_weights.values() if d[2:] == (1, 1)) == 2  # two 1x1 projections

    sess = _session(SAMPLES / "resnet_tiny.onnx")
    x = np.random.default_rng(0).standard_normal((3, 3, 64, 64)).astype(np.float32)
    (logits,) = sess.run(None, {"pixel_values": x})
    assert logits.shape == (3, 100)
    assert np.isfinite(logits).all()
    # Different images give different predictions (the network is not degenerate).
    assert np.abs(logits[0] - logits[1]).max() > 1e-2


def test_mlp_matches_numpy_reference() -> None:
    from onnx import numpy_helper

    model = onnx.load(str(SAMPLES / "mlp_small.onnx"))
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0)
    h = np.maximum(h @ w["fc2.weight"] + w["fc2.bias"], 0)
    want = h @ w["fc3.weight"].T + w["fc3.bias"]
    (got,) = _session(SAMPLES / "mlp_small.onnx").run(None, {"features": x})
    assert got.shape == (4, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
