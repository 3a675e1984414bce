"""Every way a model file can be unusable ends in exit code 2 and one line, never a traceback."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.errors import ModelError
from optimize.files import sha256_file
from optimize.model.onnx_file import (
    check_model,
    external_data_files,
    load_model,
    max_supported_opsets,
    model_sha256,
    opset_version,
    strip_unused_opsets,
    uses_external_data,
)
from tests.cli_helpers import assert_clean_error, run_cli
from tests.model.models import write_mixed_types_model

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "sample_models" / "mlp_small.onnx"


def _relu_model(opset: int = 17, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def broken_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    files["missing"] = tmp_path / "nope.onnx"
    files["directory"] = tmp_path / "a_folder"
    files["directory"].mkdir()
    files["not_onnx"] = tmp_path / "notes.onnx"
    files["not_onnx"].write_text("this is a text file, not a model\n")
    files["truncated"] = tmp_path / "truncated.onnx"
    files["truncated"].write_bytes(MLP.read_bytes()[: MLP.stat().st_size // 2])
    files["empty"] = tmp_path / "empty.onnx"
    files["empty"].write_bytes(b"")
    # Structurally broken: the node reads a tensor nothing produces.
    bad = _relu_model()
    bad.graph.node[0].input[0] = "nowhere"
    files["checker"] = _save(bad, tmp_path / "dangling.onnx")
    files["opset"] = _save(_relu_model(opset=max_supported_opsets()[""] + 1), tmp_path / "future_opset.onnx")
    files["ir"] = _save(_relu_model(ir_version=onnx.IR_VERSION + 1), tmp_path / "future_ir.onnx")
    return files


EXPECTED = {
    "missing": ("model file not found", "check the path"),
    "directory": ("is a directory",),
    "not_onnx": ("is not an ONNX model",),
    "truncated": ("truncated or corrupt",),
    "empty": ("is empty",),
    "checker": ("is not a valid ONNX model", "nowhere"),
    "opset": (
        f"uses opset {max_supported_opsets()[''] + 1}",
        f"supports up to opset {max_supported_opsets()['']}",
    ),
    "ir": (f"IR version {onnx.IR_VERSION + 1}", f"supports IR version {onnx.IR_VERSION} at most"),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_load_model_raises_model_error(case: str, broken_files: dict[str, Path]) -> None:
    with pytest.raises(ModelError) as info:
        load_model(broken_files[case])
    assert info.value.exit_code == 2
    text = info.value.one_line()
    assert "\n" not in text
    for needle in EXPECTED[case]:
        assert needle in text


@pytest.mark.parametrize("case", ["missing", "directory", "not_onnx", "truncated", "checker", "opset", "ir"])
def test_cli_reports_unusable_model_in_one_line(case: str, broken_files: dict[str, Path]) -> None:
    proc = run_cli("inspect", broken_files[case])
    assert_clean_error(proc, 2, "error:", *EXPECTED[case])


def test_git_lfs_pointer_is_named(tmp_path: Path) -> None:
    pointer = tmp_path / "model.onnx"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    with pytest.raises(ModelError, match="Git LFS pointer"):
        load_model(pointer)


def test_loads_sample_and_reports_versions() -> None:
    model = load_model(MLP)
    assert isinstance(model, onnx.ModelProto)
    assert opset_version(model) == 17
    assert not uses_external_data(model)
    assert model_sha256(MLP) == sha256_file(MLP) == hashlib.sha256(MLP.read_bytes()).hexdigest()


def _save_external(tmp_path: Path) -> tuple[Path, onnx.ModelProto]:
    model = onnx.load(str(MLP))
    path = tmp_path / "ext" / "mlp.onnx"
    path.parent.mkdir()
    onnx.save_model(
        onnx.load(str(MLP)),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.data",
        size_threshold=0,
    )
    return path, model


def test_external_data_loads_lazily_or_fully(tmp_path: Path) -> None:
    path, original = _save_external(tmp_path)
    lazy = load_model(path, load_external_data=False)
    assert uses_external_data(lazy)
    assert external_data_files(lazy) == ["mlp.data"]
    full = load_model(path)
    assert not uses_external_data(full)
    for want, have in zip(original.graph.initializer, full.graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(have), numpy_helper.to_array(want))
    assert check_model(path)["checker"]["ok"]


def test_external_data_hash_covers_the_data_file(tmp_path: Path) -> None:
    path, _ = _save_external(tmp_path)
    before = model_sha256(path)
    assert before != sha256_file(path)
    data = path.with_name("mlp.data")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert model_sha256(path) != before


def test_missing_external_data_is_a_model_error(tmp_path: Path) -> None:
    path, _ = _save_external(tmp_path)
    path.with_name("mlp.data").unlink()
    with pytest.raises(ModelError, match=r"mlp\.data, which is missing"):
        load_model(path)
    proc = run_cli("inspect", path)
    assert_clean_error(proc, 2, "mlp.data")


def test_check_model_reports_type_errors_without_raising(tmp_path: Path) -> None:
    # Structurally fine (load_model accepts it) but float + int64 fails type inference.
    path = write_mixed_types_model(tmp_path / "mixed.onnx")
    load_model(path)
    result = check_model(path)
    assert result["checker"]["ok"] is False
    assert result["shape_inference"]["ok"] is False
    assert "Add" in result["shape_inference"]["error"]
    assert check_model(MLP) == {
        "checker": {"full_check": True, "ok": True, "error": None},
        "shape_inference": {"strict": True, "ok": True, "error": None},
    }


def test_strip_unused_opsets_drops_and_declares() -> None:
    node = helper.make_node("FusedMatMul", ["a", "b"], ["c"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "unused")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 5)]
    )
    removed = strip_unused_opsets(model)
    assert removed == ["ai.onnx.ml"]
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("com.microsoft", 1)}
