from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimize.data import InputSpec, feeds_from_spec, generate_feeds, parse_shape_args, resolve_inputs
from optimize.errors import InputError, UsageError
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
    from optimize.data import split_shape_args

    pins, ranges = split_shape_args(["input_ids=1x16:4x128:8x256", "pixel=1x3x8x8"])
    assert pins == {"input_ids": (4, 128), "pixel": (1, 3, 8, 8)}
    assert ranges == ["input_ids=1x16:4x128:8x256"]
    with pytest.raises(UsageError):
        split_shape_args(["input_ids=1x16:4x128"])


# --- scalars, batch axes found from the model, padding, sample files ------------------------------


def make_state_model(path: Path, named: bool = True) -> Path:
    """A silero-vad-like model: x [batch, 4], a scalar int64 `sr` (a sample rate), and a recurrent
    `state` [2, batch, 4] whose batch axis is 1; y = x * sr + state, shaped like the state."""
    from onnx import TensorProto, helper

    batch = "batch" if named else None
    nodes = [
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "srf"], ["scaled"]),
        helper.make_node("Add", ["scaled", "state"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "state",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, batch, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, batch, 4])],
    )
    import onnx

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_text_model(path: Path) -> Path:
    """input_ids and attention_mask [batch, sequence] int64 -> y = ids * mask as float."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("Cast", ["kept"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "text",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_scalar_input_stays_scalar_generated_or_from_a_file(tmp_path: Path) -> None:
    model = make_state_model(tmp_path / "vad.onnx")
    spec, feeds = resolve_inputs(model, {}, batch=1)
    assert feeds["sr"].shape == ()
    assert spec.batch_axes()["sr"] is None
    warning = next(w for w in spec.warnings if "'sr'" in w)
    assert "sample rate" in warning and "--input-data" in warning
    _run(model, feeds)  # onnxruntime takes it as it is

    data = tmp_path / "vad.npz"
    np.savez(data, x=np.ones((1, 4), np.float32), sr=np.array(16000), state=np.zeros((2, 1, 4), np.float32))
    spec, feeds = resolve_inputs(model, {}, data, batch=1)
    assert feeds["sr"].shape == () and int(feeds["sr"]) == 16000  # was made [1] and refused
    assert not any("'sr'" in w for w in spec.warnings)
    np.testing.assert_array_equal(_run(model, feeds), np.full((2, 1, 4), 16000.0))
    np.testing.assert_array_equal(feeds_from_spec(spec)["sr"], np.array(16000))


@pytest.mark.parametrize("named", [True, False])
def test_batch_axis_is_found_from_the_model(tmp_path: Path, named: bool) -> None:
    from optimize.data import batch_axes, model_input_specs

    model = make_state_model(tmp_path / "vad.onnx", named=named)
    assert batch_axes(model_input_specs(model)) == {"x": 0, "sr": None, "state": 1}
    spec, feeds = resolve_inputs(model, {}, batch=3)  # no --shape needed for the state's batch
    assert feeds["state"].shape == (2, 3, 4) and feeds["x"].shape == (3, 4)
    assert spec.batch_size == 3

    data = tmp_path / "one.npz"
    np.savez(data, x=np.ones((1, 4), np.float32), sr=np.array(8000), state=np.ones((2, 1, 4), np.float32))
    spec, feeds = resolve_inputs(model, {}, data, batch=3)  # batch-1 rows repeated on each batch axis
    assert feeds["state"].shape == (2, 3, 4) and feeds["x"].shape == (3, 4)
    _run(model, feeds)


def test_output_batch_axes_follow_names_or_sizes(tmp_path: Path) -> None:
    from optimize.backend import TensorSpec
    from optimize.data import model_input_specs, output_batch_axes

    inputs = model_input_specs(make_state_model(tmp_path / "vad.onnx"))
    outputs = [TensorSpec("y", "float32", (2, "batch", 4)), TensorSpec("p", "float32", (None, None, 10)),
               TensorSpec("n", "float32", ())]  # fmt: skip
    arrays = {"y": np.zeros((2, 1, 4)), "p": np.zeros((50, 1, 10)), "n": np.zeros(())}
    assert output_batch_axes(outputs, inputs, arrays, batch=1) == {"y": 1, "p": 1, "n": None}


def test_text_shorter_than_the_pinned_shape_is_padded_with_a_warning(tmp_path: Path) -> None:
    model = make_text_model(tmp_path / "text.onnx")
    data = tmp_path / "short.npz"
    ids = np.arange(1, 21, dtype=np.int64)[None]
    np.savez(data, input_ids=ids, attention_mask=np.ones_like(ids))
    spec, feeds = resolve_inputs(model, {"sequence": (32,)}, data, batch=1)
    assert feeds["input_ids"].shape == (1, 32) and feeds["attention_mask"].shape == (1, 32)
    np.testing.assert_array_equal(feeds["input_ids"][0, 20:], 0)
    np.testing.assert_array_equal(feeds["attention_mask"][0], [1] * 20 + [0] * 12)
    ids_note = next(w for w in spec.warnings if "'input_ids'" in w)
    mask_note = next(w for w in spec.warnings if "'attention_mask'" in w)
    assert "padded on axis 1 from 20 to 32" in ids_note and "masked out" in mask_note
    np.testing.assert_array_equal(feeds_from_spec(spec)["attention_mask"], feeds["attention_mask"])

    long = tmp_path / "long.npz"
    np.savez(long, input_ids=np.ones((1, 40), np.int64), attention_mask=np.ones((1, 40), np.int64))
    with pytest.raises(InputError, match="longer than the pinned 32"):
        resolve_inputs(model, {"sequence": (32,)}, long, batch=1)


def test_sample_files_rows_stacked_labels_and_errors(tmp_path: Path) -> None:
    from optimize.data import load_samples, model_input_specs

    model = make_state_model(tmp_path / "vad.onnx")
    specs = model_input_specs(model)
    _, like = resolve_inputs(model, {}, batch=1)
    rows = tmp_path / "rows.npz"
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    state = np.zeros((2, 5, 4), np.float32)  # rows along its batch axis 1
    np.savez(rows, x=x, sr=np.array(16000), state=state, label=np.arange(5))
    data = load_samples(rows, specs, like, "--eval-data", labels_allowed=True)
    assert len(data.samples) == 5 and data.restacked  # the state's rows were not on axis 0
    np.testing.assert_array_equal(data.samples[3]["x"], x[3:4])
    assert data.samples[3]["state"].shape == (2, 1, 4) and data.samples[0]["sr"].shape == ()
    assert list(data.labels) == ["label"]
    with pytest.raises(InputError, match="'label' that is not a model input"):
        load_samples(rows, specs, like, "--input-data")

    stacked = tmp_path / "stacked.npz"
    np.savez(stacked, x=x[:, None], sr=np.full((5,), 8000), state=np.zeros((5, 2, 1, 4), np.float32))
    data = load_samples(stacked, specs, like, "--calib-data")
    assert len(data.samples) == 5 and int(data.samples[2]["sr"]) == 8000 and not data.restacked

    for arrays, needle in (
        ({"x": x, "sr": np.array(1)}, "no array for input 'state'"),
        (
            {"x": x.astype(np.float64), "sr": np.array(1), "state": state},
            "--eval-data array 'x' has dtype float64",
        ),
        ({"x": x[None, None], "sr": np.array(1), "state": state}, "has rank 4"),
        ({"x": np.zeros((5, 3), np.float32), "sr": np.array(1), "state": state}, "size 3 on axis 1"),
        ({"x": x[:4], "sr": np.array(1), "state": state}, "different numbers of samples [4, 5]"),
    ):
        bad = tmp_path / "bad.npz"
        np.savez(bad, **arrays)
        with pytest.raises(InputError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            load_samples(bad, specs, like, "--eval-data")

    _, like3 = resolve_inputs(model, {}, batch=2)
    data = load_samples(rows, specs, like3, "--eval-data", labels_allowed=True)
    assert len(data.samples) == 2 and any("1 rows left over" in w for w in data.warnings)


def test_accuracy_samples_never_use_the_calibration_seeds(tiny_model: Path, tmp_path: Path) -> None:
    """The quantize stage calibrates on generated inputs seeded 1000 + i; the accuracy samples have a
    seed stream of their own, whatever --seed is."""
    from optimize.data import generated_samples
    from optimize.runtimes.quantization import generated_calibration
    from tests.factories import make_stage_context

    ctx = make_stage_context(tmp_path / "work", tiny_model)
    calibration = [c["x"].tobytes() for c in generated_calibration(ctx, 64)]
    spec, _ = resolve_inputs(tiny_model, {}, batch=1)
    for seed in (0, 1000, 1031):
        accuracy = [s["x"].tobytes() for s in generated_samples(spec, seed, 32)]
        assert len(set(accuracy)) == 32
        assert not set(accuracy) & set(calibration)


def test_input_data_for_optimize_gives_its_first_batch_rows_or_stacked(
    tiny_model: Path, tmp_path: Path
) -> None:
    rows = np.arange(64, dtype=np.float32).reshape(4, 16)
    np.savez(tmp_path / "rows.npz", x=rows)
    np.savez(tmp_path / "stacked.npz", x=rows[:, None])
    for name in ("rows.npz", "stacked.npz"):
        spec, feeds = resolve_inputs(tiny_model, {}, tmp_path / name, batch=1, first_rows=True)
        np.testing.assert_array_equal(feeds["x"], rows[:1])
        np.testing.assert_array_equal(feeds_from_spec(spec)["x"], rows[:1])
    with pytest.raises(InputError, match="cannot make batch 1"):  # lto bench keeps refusing
        resolve_inputs(tiny_model, {}, tmp_path / "rows.npz", batch=1)


def test_the_spec_names_its_data_file_wherever_it_is_read_from(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An artifact is served, benched and exported from other folders than the one that made it:
    # a relative path in its spec would name nothing there.
    np.savez(tmp_path / "rows.npz", x=np.arange(32, dtype=np.float32).reshape(2, 16))
    monkeypatch.chdir(tmp_path)
    spec, feeds = resolve_inputs(tiny_model, {}, Path("rows.npz"))
    assert spec.data_file == str(tmp_path.resolve() / "rows.npz")
    monkeypatch.chdir("/")
    np.testing.assert_array_equal(feeds_from_spec(spec)["x"], feeds["x"])


def test_warm_up_rows_keep_the_spec_shapes_when_its_data_file_is_gone(
    tiny_model: Path, tmp_path: Path
) -> None:
    from optimize.model.runtime_model import RuntimeModel
    from optimize.runtimes.backends import open_backend
    from optimize.runtimes.warmup import one_request

    np.savez(tmp_path / "rows.npz", x=np.ones((2, 16), dtype=np.float32))
    spec, _ = resolve_inputs(tiny_model, {}, tmp_path / "rows.npz")
    (tmp_path / "rows.npz").unlink()
    with pytest.raises(InputError, match="is gone"):
        feeds_from_spec(spec)
    served = RuntimeModel("artifact", tiny_model, input_spec=spec.to_json())
    backend = open_backend("onnxruntime", tiny_model, {})
    try:
        row = one_request(served, backend)
    finally:
        backend.close()
    # Timing needs the shape and dtype, not the values: warm-up and calibration still run.
    assert {k: (v.shape, v.dtype) for k, v in row.items()} == {"x": ((1, 16), np.dtype(np.float32))}
