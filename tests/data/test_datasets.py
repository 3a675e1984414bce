"""`--data PATH`: images, text lines and wav files become model rows (optimize/data/datasets.py)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.data import RealRows, batch_axes, model_input_specs, resolve_inputs
from optimize.data.datasets import parse_preprocess, read_data
from optimize.errors import InputError, UsageError
from tests.cli_helpers import assert_clean_error, run_cli

PIL = pytest.importorskip("PIL", reason="--data of images needs Pillow: pip install lto-onnx[data]")
from PIL import Image  # noqa: E402


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="lto-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def image_model(path: Path, shape: list[int | str]) -> Path:
    return _save(
        path,
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c"])],
    )


def _read(model: Path, data: Path, **kw: object) -> RealRows:
    specs = model_input_specs(model)
    _, feeds = resolve_inputs(model, {}, batch=1)
    return read_data(data, model, specs, feeds, batch_axes(specs), **kw)  # type: ignore[arg-type]


def _images(folder: Path, count: int, size: tuple[int, int] = (40, 30)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        colour = (255, 0, 0) if i % 2 == 0 else (0, 0, 255)
        Image.new("RGB", size, colour).save(folder / f"img{i:02d}.png")
    return folder


def test_a_folder_of_images_becomes_one_row_per_image_preprocessed_as_asked(tmp_path: Path) -> None:
    model = image_model(tmp_path / "m.onnx", [1, 3, 16, 16])
    rows = _read(model, _images(tmp_path / "photos", 18), preprocess="imagenet")
    assert len(rows.samples) == 18 and rows.flag == "--data" and rows.restacked
    # How many samples the images became is information for the log, not a warning.
    assert rows.notes == ["rows: --data photos: 18 image(s) became 18 samples"]
    assert not any("became" in w for w in rows.warnings)
    red = rows.samples[0]["x"]
    assert red.shape == (1, 3, 16, 16) and red.dtype == np.float32
    # Pure red with ImageNet mean/std: (1 - 0.485) / 0.229 on R, (0 - mean) / std elsewhere.
    assert np.allclose(red[0, 0], (1 - 0.485) / 0.229, atol=1e-4)
    assert np.allclose(red[0, 2], (0 - 0.406) / 0.225, atol=1e-4)
    bgr = _read(model, tmp_path / "photos", preprocess="unit,bgr").samples[0]["x"]
    assert np.allclose(bgr[0, 2], 1.0) and np.allclose(bgr[0, 0], 0.0)  # red lands on the last channel


def test_letterbox_pads_with_grey_and_channels_last_inputs_are_filled(tmp_path: Path) -> None:
    model = image_model(tmp_path / "m.onnx", [1, 16, 16, 3])
    Path(tmp_path / "wide").mkdir()
    Image.new("RGB", (32, 8), (255, 255, 255)).save(tmp_path / "wide" / "a.png")
    x = _read(model, tmp_path / "wide", preprocess="yolo").samples[0]["x"]
    assert x.shape == (1, 16, 16, 3)
    assert np.allclose(x[0, 0, :, :], 114 / 255, atol=1e-6)  # the band above the picture
    assert np.allclose(x[0, 8, :, :], 1.0)  # the picture itself


def test_image_problems_are_one_line_errors(tmp_path: Path) -> None:
    photos = _images(tmp_path / "photos", 4)
    with pytest.raises(InputError, match="has 4 channels on axis 1"):
        _read(image_model(tmp_path / "c4.onnx", [1, 4, 16, 16]), photos, preprocess="unit")
    with pytest.raises(UsageError, match="needs --preprocess"):
        _read(image_model(tmp_path / "m.onnx", [1, 3, 16, 16]), photos)
    with pytest.raises(UsageError, match="bad item 'gamma=2'"):
        parse_preprocess("unit,gamma=2")
    (photos / "broken.png").write_bytes(b"not a png")
    with pytest.raises(InputError, match=r"cannot read image broken\.png"):
        _read(image_model(tmp_path / "m.onnx", [1, 3, 16, 16]), photos, preprocess="unit")


def text_model(path: Path, vocab: int, seq: int = 8) -> Path:
    weights = np.random.default_rng(0).standard_normal((vocab, 4)).astype(np.float32)
    table = numpy_helper.from_array(weights, "E")
    return _save(
        path,
        [
            helper.make_node("Gather", ["E", "input_ids"], ["h"]),
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "ax"], ["m3"]),
            helper.make_node("Mul", ["h", "m3"], ["hidden"]),
        ],
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq]),
        ],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, 4])],
        [table, numpy_helper.from_array(np.array([2], dtype=np.int64), "ax")],
    )


def word_tokenizer(path: Path, words: list[str]) -> Path:
    tokenizers = pytest.importorskip("tokenizers", reason="--data of text needs tokenizers")
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_text_lines_become_token_ids_and_masks_at_the_pinned_length(tmp_path: Path) -> None:
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    tokenizer = word_tokenizer(tmp_path / "tokenizer.json", words)
    lines = tmp_path / "texts.txt"
    lines.write_text("the cat sat\n\nthe dog ran on a mat and far away now\n" * 9, encoding="utf-8")
    rows = _read(text_model(tmp_path / "m.onnx", vocab=10), lines, tokenizer=tokenizer)
    assert len(rows.samples) == 18
    first, second = rows.samples[0], rows.samples[1]
    assert first["input_ids"].tolist() == [[2, 3, 4, 0, 0, 0, 0, 0]]
    assert first["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]
    assert second["attention_mask"].tolist() == [[1] * 8]  # truncated to the pinned 8 tokens
    assert first["input_ids"].dtype == np.int64


def test_a_tokenizer_larger_than_the_models_embedding_is_refused(tmp_path: Path) -> None:
    tokenizer = word_tokenizer(tmp_path / "tokenizer.json", [f"w{i}" for i in range(40)])
    lines = tmp_path / "texts.txt"
    lines.write_text("w1 w2\n", encoding="utf-8")
    with pytest.raises(InputError, match="has 42 tokens and the model's embedding 10 rows"):
        _read(text_model(tmp_path / "m.onnx", vocab=10), lines, tokenizer=tokenizer)
    with pytest.raises(UsageError, match="needs --tokenizer"):
        _read(text_model(tmp_path / "m.onnx", vocab=10), lines)


def _wav(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


def audio_model(path: Path) -> Path:
    return _save(
        path,
        [
            helper.make_node("ReduceMean", ["input"], ["speech"], axes=[1], keepdims=1),
            helper.make_node("Identity", ["state"], ["stateN"]),
        ],
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 100]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 8]),
        ],
        [
            helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 8]),
        ],
    )


def test_wav_files_become_windows_of_the_pinned_length_with_states_at_zero(tmp_path: Path) -> None:
    clips = tmp_path / "clips"
    clips.mkdir()
    tone = 0.5 * np.sin(np.arange(1050) / 5.0)
    _wav(clips / "a.wav", tone)
    _wav(clips / "b.wav", -tone)
    rows = _read(audio_model(tmp_path / "vad.onnx"), clips)
    assert len(rows.samples) == 20  # 10 whole windows of 100 samples per file
    assert np.allclose(rows.samples[0]["input"][0], tone[:100], atol=1e-4)
    assert rows.samples[0]["state"].shape == (2, 1, 8) and not rows.samples[0]["state"].any()
    assert any("starts at zeros" in w for w in rows.warnings)
    _wav(clips / "c.wav", tone, rate=8000)
    with pytest.raises(InputError, match="different sample rates"):
        _read(audio_model(tmp_path / "vad.onnx"), clips)


@pytest.mark.slow
def test_the_cli_refuses_bad_data_flags_in_one_line(tmp_path: Path) -> None:
    model = image_model(tmp_path / "m.onnx", [1, 3, 16, 16])
    photos = _images(tmp_path / "photos", 4)
    both = run_cli("optimize", model, "--data", photos, "--calib-data", model, "-o", tmp_path / "a")
    assert_clean_error(both, 2, "--data and --calib-data")
    alone = run_cli("optimize", model, "--preprocess", "unit", "-o", tmp_path / "a")
    assert_clean_error(alone, 2, "--preprocess applies to --data only")
    few = run_cli("optimize", model, "--data", photos, "--preprocess", "unit", "-o", tmp_path / "a")
    assert_clean_error(few, 2, "--data holds 4 sample(s); lto needs at least")
