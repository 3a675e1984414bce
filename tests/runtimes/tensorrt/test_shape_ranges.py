"""TensorRT shape ranges (optimize/runtimes/tensorrt/engine.py): `--shape` parsing, the
benchmark shapes they pin, and the optimization profile built from them for a model's inputs."""

from __future__ import annotations

import pytest

from optimize.data.shapes import ShapeRange, parse_shape_range, parse_shape_ranges
from optimize.errors import InputError
from optimize.runtimes.tensorrt.engine import profile_for_inputs
from tests.runtimes.tensorrt.helpers import SAMPLES


def test_parse_range_and_fixed_shapes() -> None:
    ranges = parse_shape_ranges(["input_ids=1x128:8x128:32x128", "mask=1x128"])
    assert ranges["input_ids"] == ShapeRange((1, 128), (8, 128), (32, 128))
    assert ranges["mask"].fixed and ranges["mask"].opt == (1, 128)
    assert parse_shape_ranges({"x": "1x16:4x16:8x16"})["x"].max == (8, 16)


@pytest.mark.parametrize(
    ("arg", "names"),
    [
        ("input_ids", "input_ids"),
        ("x=1x128:8x128", "2 shapes"),
        ("x=1xa:2x2:3x3", "'1xa'"),
        ("x=1x128:8x64:32x128", "axis 1"),
        ("x=8x128:1x128:32x128", "axis 0"),
        ("x=1x128:8x128x2:32x128", "different ranks"),
        ("x=0x128", "zero dimension"),
        ("=1x2", "bad --shape"),
    ],
)
def test_parse_range_errors_name_the_bad_part(arg: str, names: str) -> None:
    with pytest.raises(InputError) as err:
        parse_shape_range(arg)
    assert names in err.value.message


def test_opt_shapes_pin_the_benchmark_inputs() -> None:
    from optimize.data import resolve_inputs
    from optimize.data.shapes import opt_shapes

    model = SAMPLES / "bert_tiny.onnx"
    if not model.is_file():
        pytest.skip("sample models not built")
    ranges = parse_shape_ranges(
        ["input_ids=1x16:2x32:4x64", "attention_mask=1x16:2x32:4x64", "token_type_ids=2x32"]
    )
    _, feeds = resolve_inputs(model, opt_shapes(ranges))
    assert {name: a.shape for name, a in feeds.items()} == dict.fromkeys(feeds, (2, 32))


def test_parse_ranges_rejects_a_repeated_input() -> None:
    with pytest.raises(InputError, match="twice"):
        parse_shape_ranges(["x=1x2", "x=1x3"])


def test_profile_uses_ranges_and_pins_the_rest() -> None:
    inputs = [("ids", ("batch", "seq")), ("mask", ("batch", "seq")), ("pix", (1, 3))]
    profile = profile_for_inputs(
        inputs, parse_shape_ranges(["ids=1x8:2x8:4x8"]), {"ids": (2, 8), "mask": (2, 8), "pix": (1, 3)}
    )
    assert profile["ids"] == ShapeRange((1, 8), (2, 8), (4, 8))
    assert profile["mask"].fixed and profile["mask"].min == (2, 8)
    assert profile["pix"].fixed


def test_profile_takes_ranges_for_named_dims() -> None:
    inputs = [("ids", ("batch", "seq")), ("mask", ("batch", "seq")), ("pix", (1, 3))]
    ranges = parse_shape_ranges(["seq=16:128:512", "batch=1:4:8"])
    profile = profile_for_inputs(inputs, ranges, {"ids": (4, 128), "mask": (4, 128), "pix": (1, 3)})
    assert profile["ids"] == profile["mask"] == ShapeRange((1, 16), (4, 128), (8, 512))
    # A named dim without a range keeps the benchmark's size.
    profile = profile_for_inputs(
        inputs, parse_shape_ranges(["seq=16:128:512"]), {"ids": (2, 128), "mask": (2, 128)}
    )
    assert profile["ids"] == ShapeRange((2, 16), (2, 128), (2, 512))
    with pytest.raises(InputError, match="names a dim, so it takes one number"):
        profile_for_inputs(inputs, parse_shape_ranges(["batch=1", "seq=1x16:1x128:1x512"]), {})


@pytest.mark.parametrize(
    ("shapes", "pinned", "message"),
    [
        (["nope=1x2"], {"ids": (1, 8)}, "neither a model input nor a named dynamic dim"),
        (["ids=1x8:2x8:4x8"], {"ids": (8, 8)}, "outside the --shape range"),
        (["ids=1x8x1:2x8x1:4x8x1"], {"ids": (1, 8)}, "rank 3"),
        ([], {}, "no shape for input 'ids': dim 'batch' on axis 0 has no range"),
    ],
)
def test_profile_errors(shapes: list[str], pinned: dict[str, tuple[int, ...]], message: str) -> None:
    with pytest.raises(InputError, match=message):
        profile_for_inputs([("ids", ("batch", 8))], parse_shape_ranges(shapes), pinned)


def test_profile_refuses_to_range_a_fixed_dim() -> None:
    with pytest.raises(InputError, match="axis 1 is fixed at 8"):
        profile_for_inputs([("ids", ("batch", 8))], parse_shape_ranges(["ids=1x4:1x8:1x16"]), {})
