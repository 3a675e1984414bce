"""The OpenVINO backend: runs what ONNX Runtime runs with the same outputs, at the precision it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimize.errors import ModelError, UsageError
from optimize.runtimes.backends import open_backend
from tests.runtimes.openvino.helpers import SAMPLES, make_precision_probe

pytest.importorskip("openvino", reason="the openvino extra is not installed")

from optimize.runtimes.openvino.backend import has_bf16


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(float(np.abs(b).max()), 1e-30))


def _bert_feeds(seq: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "input_ids": rng.integers(0, 1000, (1, seq)).astype(np.int64),
        "attention_mask": np.ones((1, seq), np.int64),
        "token_type_ids": np.zeros((1, seq), np.int64),
    }


@pytest.mark.parametrize(
    ("model", "feeds"),
    [
        ("bert_tiny.onnx", _bert_feeds()),
        (
            "resnet_tiny.onnx",
            {"pixel_values": np.random.default_rng(1).standard_normal((1, 3, 64, 64), np.float32)},
        ),
    ],
)
def test_matches_onnxruntime_at_f32(model: str, feeds: dict[str, np.ndarray]) -> None:
    path = SAMPLES / model
    with open_backend("onnxruntime", path) as ort, open_backend("openvino", path) as ov:
        assert [s.name for s in ov.outputs] == [s.name for s in ort.outputs]  # the ONNX names, not inner ones
        assert [(s.name, s.dtype) for s in ov.inputs] == [(s.name, s.dtype) for s in ort.inputs]
        expected, got = ort.run(feeds), ov.run(feeds)
    assert set(got) == set(expected)
    for name, ref in expected.items():
        assert got[name].shape == ref.shape
        assert _rel(got[name], ref) < 1e-4, name


def test_dynamic_dims_keep_their_onnx_names() -> None:
    with open_backend("openvino", SAMPLES / "bert_tiny.onnx") as ov:
        assert ov.inputs[0].shape == ("batch", "sequence")
        # Another batch size and length run without recompiling by hand (dynamic shapes).
        out = ov.run(_bert_feeds(24) | {k: np.repeat(v, 3, axis=0) for k, v in _bert_feeds(24).items()})
        assert out["last_hidden_state"].shape == (3, 24, 128)


def test_f32_hint_really_runs_fp32(tmp_path: Path) -> None:
    """On a CPU with bf16, OpenVINO's default precision is bf16: the backend must ask for f32."""
    path = make_precision_probe(tmp_path / "probe.onnx")
    x = {"x": np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)}
    with open_backend("onnxruntime", path) as ort:
        ref = ort.run(x)["y"]
    with open_backend("openvino", path) as ov:  # the default configuration
        assert ov.describe()["config"]["INFERENCE_PRECISION_HINT"] == "f32"
        assert ov.describe()["compiled_properties"]["INFERENCE_PRECISION_HINT"] == "f32"
        assert _rel(ov.run(x)["y"], ref) < 1e-5
    if has_bf16():  # the same check fails at bf16: the probe does tell the precisions apart
        with open_backend("openvino", path, {"INFERENCE_PRECISION_HINT": "bf16"}) as ov:
            assert _rel(ov.run(x)["y"], ref) > 1e-4


def test_bf16_is_refused_on_a_cpu_without_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optimize.system import env

    monkeypatch.setattr(env, "cpu_isa_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})
    path = make_precision_probe(tmp_path / "probe.onnx")
    with pytest.raises(ModelError, match="no native bf16 instructions"):
        open_backend("openvino", path, {"INFERENCE_PRECISION_HINT": "bf16"})
    with open_backend("openvino", path, {"INFERENCE_PRECISION_HINT": "f32"}) as ov:  # fp32 still runs
        assert ov.outputs[0].name == "y"


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"INFERENCE_PRECISION_HINT": "fp16"}, "INFERENCE_PRECISION_HINT 'fp16' is not supported"),
        ({"num_threads": 2}, "unknown openvino setting 'num_threads'"),
        ({"PERFORMANCE_HINT": "FAST"}, "PERFORMANCE_HINT 'FAST'"),
        ({"INFERENCE_NUM_THREADS": 100_000}, "INFERENCE_NUM_THREADS"),
        ({"NUM_STREAMS": 0}, "NUM_STREAMS"),
    ],
)
def test_bad_settings_are_one_line_usage_errors(config: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError) as info:
        open_backend("openvino", SAMPLES / "mlp_small.onnx", config)
    assert needle in info.value.one_line()
    assert "\n" not in info.value.one_line()


def test_unreadable_model_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match=r"openvino cannot read bad\.onnx"):
        open_backend("openvino", bad)


def test_a_prepared_shape_runs_on_a_model_compiled_for_it_with_the_same_outputs() -> None:
    from tests.conftest import sample_path

    backend = open_backend("openvino", sample_path("resnet_tiny.onnx"), {"INFERENCE_PRECISION_HINT": "f32"})
    rng = np.random.default_rng(2)
    one = {"pixel_values": rng.standard_normal((1, 3, 64, 64), np.float32)}
    four = {"pixel_values": rng.standard_normal((4, 3, 64, 64), np.float32)}
    before = {name: next(iter(backend.run(feeds).values())) for name, feeds in (("one", one), ("four", four))}
    backend.prepare(four)
    backend.prepare(four)  # once per shape
    assert len(backend._static) == 1  # one model compiled for its shape
    after_four = next(iter(backend.run(four).values()))
    after_one = next(iter(backend.run(one).values()))  # an unprepared shape runs on the dynamic model
    np.testing.assert_allclose(after_four, before["four"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(after_one, before["one"], rtol=1e-4, atol=1e-5)
    backend.close()
