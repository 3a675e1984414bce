from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimize.errors import InputError, UsageError
from optimize.inputs import InputSpec, feeds_from_spec, generate_feeds, parse_shape_args, resolve_inputs
from tests.conftest import sample_path


def test_parse_shape_args_accepts_names_and_dims() -> None:
    assert parse_shape_args(["input_ids=1x128", "sequence=64", "x = 2X3"]) == {
        "input_ids": (1, 128),
        "sequence": (64,),
        "x": (2, 3),
    }


@pytest.mark.parametrize(
    "bad", ["input_ids", "input_ids=", "input_ids=1xa", "input_ids=0x5", "=1x2", "a=1x-2"]
)
def test_parse_shape_args_rejects_bad_strings(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_shape_args([bad])
    assert "--shape" in str(info.value)
    assert info.value.exit_code == 2


def test_parse_shape_args_rejects_duplicates() -> None:
    with pytest.raises(UsageError, match="twice"):
        parse_shape_args(["a=1", "a=2"])


def test_bert_inputs_respect_meaning() -> None:
    model = sample_path("bert_tiny.onnx")
    spec, feeds = resolve_inputs(model, {"sequence": (32,)}, batch=2)
    assert {k: v.shape for k, v in feeds.items()} == {
        "input_ids": (2, 32),
        "attention_mask": (2, 32),
        "token_type_ids": (2, 32),
    }
    assert all(v.dtype == np.int64 for v in feeds.values())
    by_name = {t.name: t for t in spec.tensors}
    vocab = by_name["input_ids"].high
    assert by_name["input_ids"].generator == "randint" and vocab > 2, (
        "vocab not found from the embedding Gather"
    )
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < vocab
    assert (feeds["attention_mask"] == 1).all()
    assert (feeds["token_type_ids"] == 0).all()


def test_unpinned_dynamic_dim_names_dim_and_flag() -> None:
    model = sample_path("bert_tiny.onnx")
    with pytest.raises(InputError) as info:
        resolve_inputs(model, {}, batch=1)
    message = info.value.one_line()
    assert "sequence" in message and "--shape" in message
    assert info.value.exit_code == 2


def test_shape_for_unknown_name_is_an_error(tiny_model: Path) -> None:
    with pytest.raises(InputError, match="neither an input nor a dynamic dim"):
        resolve_inputs(tiny_model, {"nope": (1, 16)})


def test_shape_rank_and_fixed_dims_are_checked(tiny_model: Path) -> None:
    with pytest.raises(InputError, match="rank"):
        resolve_inputs(tiny_model, {"x": (1, 16, 1)})
    with pytest.raises(InputError, match="fixed at 16"):
        resolve_inputs(tiny_model, {"x": (1, 8)})


def test_generated_floats_are_seeded(tiny_model: Path) -> None:
    spec, a = resolve_inputs(tiny_model, {}, seed=3, batch=4)
    _, b = resolve_inputs(tiny_model, {}, seed=3, batch=4)
    np.testing.assert_array_equal(a["x"], b["x"])
    other = generate_feeds(spec, seed=4)
    assert not np.array_equal(a["x"], other["x"])
    assert spec.batch_size == 4
    roundtrip = InputSpec.from_json(spec.to_json())
    np.testing.assert_array_equal(feeds_from_spec(roundtrip)["x"], a["x"])


def test_input_data_file_is_used_and_checked(tiny_model: Path, tmp_path: Path) -> None:
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    good = tmp_path / "good.npz"
    np.savez(good, x=data)
    spec, feeds = resolve_inputs(tiny_model, {}, good)
    np.testing.assert_array_equal(feeds["x"], data)
    assert spec.tensors[0].source == "file" and spec.data_sha256

    np.savez(tmp_path / "name.npz", y=data)
    with pytest.raises(InputError, match="'y' that is not a model input"):
        resolve_inputs(tiny_model, {}, tmp_path / "name.npz")
    np.savez(tmp_path / "dtype.npz", x=data.astype(np.float64))
    with pytest.raises(InputError, match="float64, the model expects float32"):
        resolve_inputs(tiny_model, {}, tmp_path / "dtype.npz")
    np.savez(tmp_path / "shape.npz", x=data.reshape(4, 8))
    with pytest.raises(InputError, match="axis 1"):
        resolve_inputs(tiny_model, {}, tmp_path / "shape.npz")
    with pytest.raises(InputError, match="not found"):
        resolve_inputs(tiny_model, {}, tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot read"):
        resolve_inputs(tiny_model, {}, tmp_path / "junk.npz")


def test_input_data_rebatched_from_batch_one(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "one.npz"
    np.savez(path, x=np.ones((1, 16), dtype=np.float32))
    _, feeds = resolve_inputs(tiny_model, {}, path, batch=8)
    assert feeds["x"].shape == (8, 16)
    np.savez(path, x=np.ones((3, 16), dtype=np.float32))
    with pytest.raises(InputError, match="cannot make batch 8"):
        resolve_inputs(tiny_model, {}, path, batch=8)


def test_shape_ranges_pin_the_benchmark_at_opt() -> None:
    from optimize.inputs import split_shape_args

    pins, ranges = split_shape_args(["input_ids=1x16:4x128:8x256", "pixel=1x3x8x8"])
    assert pins == {"input_ids": (4, 128), "pixel": (1, 3, 8, 8)}
    assert ranges == ["input_ids=1x16:4x128:8x256"]
    with pytest.raises(UsageError):
        split_shape_args(["input_ids=1x16:4x128"])
