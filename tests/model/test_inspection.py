"""`lto inspect` and optimize.model.inspection: histogram, parameters, MACs/FLOPs, JSON, external data."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from optimize.errors import InputError
from optimize.model.inspection import inspect_model
from tests.cli_helpers import assert_clean_error, run_cli
from tests.model.models import write_mixed_types_model

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_models"
MLP = SAMPLES / "mlp_small.onnx"
BERT = SAMPLES / "bert_tiny.onnx"
RESNET = SAMPLES / "resnet_tiny.onnx"


def _hist(info: dict) -> dict[str, int]:
    return {row["op_type"]: row["count"] for row in info["ops"]}


def test_mlp_op_histogram_and_io() -> None:
    info = inspect_model(MLP)
    assert _hist(info) == {"Gemm": 2, "MatMul": 1, "Add": 1, "Relu": 2}
    assert {row["domain"] for row in info["ops"]} == {"ai.onnx"}
    assert info["node_count"] == 6
    assert info["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 256]}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}]
    assert info["ir_version"] == 8 and info["opset_version"] == 17
    assert info["producer"]["name"] == "lto sample_models/build.py"


@pytest.mark.parametrize("path", [MLP, BERT, RESNET], ids=lambda p: p.stem)
def test_parameter_count_and_bytes_match_numpy(path: Path) -> None:
    arrays = [numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer]
    params = inspect_model(path)["parameters"]
    assert params["count"] == sum(a.size for a in arrays)
    assert params["bytes"] == sum(a.nbytes for a in arrays)
    assert params["tensors"] == len(arrays)
    by_dtype: dict[str, int] = {}
    for a in arrays:
        by_dtype[a.dtype.name] = by_dtype.get(a.dtype.name, 0) + a.size
    assert {k: v["count"] for k, v in params["by_dtype"].items()} == by_dtype


def test_mlp_macs_and_flops_by_hand() -> None:
    batch = 3
    info = inspect_model(MLP, {"features": (batch, 256)})
    compute = info["compute"]
    assert compute["available"]
    # Gemm 256->512, MatMul 512->128, Gemm 128->10.
    macs = batch * (256 * 512 + 512 * 128 + 128 * 10)
    assert compute["macs"] == macs
    bias_and_elementwise = batch * (512 + 512 + 128 + 128 + 10)  # Gemm bias, Relu, Add, Relu, Gemm bias
    assert compute["flops"] == 2 * macs + bias_and_elementwise
    rows = {r["op_type"]: r for r in compute["by_op_type"]}
    assert rows["MatMul"]["macs"] == batch * 512 * 128
    assert rows["Gemm"]["macs"] == batch * (256 * 512 + 128 * 10)
    assert compute["not_counted"] == {} and compute["unknown_shapes"] == {}


def test_bert_macs_match_the_transformer_formula() -> None:
    batch, seq, hidden, ffn, layers = 2, 16, 128, 512, 2
    info = inspect_model(BERT, {"input_ids": (batch, seq)})
    compute = info["compute"]
    assert compute["available"], compute
    # Input names share dims, so one pin fixes all three inputs.
    assert compute["input_shapes"] == {
        n: [batch, seq] for n in ("input_ids", "attention_mask", "token_type_ids")
    }
    per_layer = 4 * seq * hidden * hidden + 2 * seq * seq * hidden + 2 * seq * hidden * ffn
    pooler = hidden * hidden
    assert compute["macs"] == batch * (layers * per_layer + pooler)
    assert compute["unknown_shapes"] == {}


def test_pin_by_dim_name_equals_pin_by_input() -> None:
    by_input = inspect_model(RESNET, {"pixel_values": (2, 3, 64, 64)})["compute"]
    by_dim = inspect_model(RESNET, {"batch": (2,)})["compute"]
    assert by_input["macs"] == by_dim["macs"] > 0
    # Stem conv alone, by hand: 64x64 outputs x 32 channels x (3 x 3 x 3) per sample.
    assert by_input["macs"] > 2 * 64 * 64 * 32 * 27


def test_unpinned_dims_are_named_not_guessed() -> None:
    info = inspect_model(BERT)
    assert info["inputs"][0]["shape"] == ["batch", "sequence"]
    assert info["outputs"][0]["shape"] == ["batch", "sequence", 128]
    compute = info["compute"]
    assert compute["available"] is False
    assert "macs" not in compute and "flops" not in compute
    assert compute["unpinned"] == ["batch", "sequence"]
    assert "--shape batch=N" in compute["reason"]


def test_bad_shape_names_the_inputs() -> None:
    with pytest.raises(InputError) as info:
        inspect_model(BERT, {"tokens": (1, 8)})
    assert "inputs: input_ids, attention_mask, token_type_ids" in info.value.one_line()
    with pytest.raises(InputError, match="rank"):
        inspect_model(BERT, {"input_ids": (1, 8, 2)})
    with pytest.raises(InputError, match="fixed at 256"):
        inspect_model(MLP, {"features": (1, 100)})
    proc = run_cli("inspect", BERT, "--shape", "tokens=1x8")
    assert_clean_error(proc, 2, "no input or dynamic dim named 'tokens'", "input_ids")


def test_cli_json_output_parses() -> None:
    proc = run_cli("inspect", MLP, "--shape", "features=1x256", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["compute"]["macs"] == 256 * 512 + 512 * 128 + 128 * 10
    assert info["parameters"]["count"] == 198_538
    assert info["checks"]["checker"]["ok"] is True
    assert info["external_data"]["used"] is False


@pytest.mark.slow
def test_cli_tables_show_dynamic_dims_and_compute() -> None:
    proc = run_cli("inspect", BERT, "--shape", "batch=1", "--shape", "sequence=128")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[batch, sequence, 128]" in out  # rich markup must not swallow bracketed shapes
    assert "LayerNormalization" in out and "Softmax" in out
    assert "58.74 MMAC" in out
    assert "onnx.checker (full): ok" in out
    unpinned = run_cli("inspect", BERT)
    assert unpinned.returncode == 0, unpinned.stderr
    assert "FLOPs need --shape batch=N --shape sequence=N" in unpinned.stdout


def test_help_has_examples() -> None:
    proc = run_cli("inspect", "--help")
    assert proc.returncode == 0
    assert "lto inspect sample_models/bert_tiny.onnx --shape input_ids=1x128" in proc.stdout


def test_inspect_model_with_external_data(tmp_path: Path) -> None:
    path = tmp_path / "mlp_ext.onnx"
    onnx.save_model(
        onnx.load(str(MLP)), str(path), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    plain = inspect_model(MLP, {"batch": (4,)})
    ext = inspect_model(path, {"batch": (4,)})
    assert ext["external_data"] == {
        "used": True,
        "files": ["weights.bin"],
        "bytes": path.with_name("weights.bin").stat().st_size,
    }
    assert ext["size_bytes"] < 2_000 < plain["size_bytes"]
    assert ext["parameters"] == plain["parameters"]
    assert ext["compute"]["macs"] == plain["compute"]["macs"]
    assert ext["checks"]["checker"]["ok"] and ext["checks"]["shape_inference"]["ok"]
    proc = run_cli("inspect", path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["external_data"]["files"] == ["weights.bin"]


def test_external_data_values_needed_by_shape_inference_are_read(tmp_path: Path) -> None:
    # Every tensor in the side file, including the int64 position-id buffer that Slice reads.
    path = tmp_path / "bert_ext.onnx"
    onnx.save_model(onnx.load(str(BERT)), str(path), save_as_external_data=True, size_threshold=0)
    ext = inspect_model(path, {"input_ids": (1, 64)})["compute"]
    assert ext["unknown_shapes"] == {}
    assert ext["macs"] == inspect_model(BERT, {"input_ids": (1, 64)})["compute"]["macs"]


def test_contrib_ops_are_listed_as_not_counted(tmp_path: Path) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(BERT), model_type="bert", num_heads=4, hidden_size=128, opt_level=0)
    path = tmp_path / "bert_fused.onnx"
    fused.save_model_to_file(str(path))
    info = inspect_model(path, {"batch": (1,), "sequence": (32,)})
    domains = {(r["domain"], r["op_type"]) for r in info["ops"]}
    assert ("com.microsoft", "Attention") in domains
    compute = info["compute"]
    assert compute["available"]
    assert compute["not_counted"]["Attention"] == 2
    assert compute["not_counted"]["EmbedLayerNormalization"] == 1
    # The FFN and output projections stay MatMuls and are still counted exactly.
    assert compute["macs"] >= 2 * (32 * 128 * 128 + 2 * 32 * 128 * 512)


def test_inspect_reports_failed_checks_instead_of_failing(tmp_path: Path) -> None:
    path = write_mixed_types_model(tmp_path / "mixed.onnx")
    proc = run_cli("inspect", path)
    assert proc.returncode == 0, proc.stderr
    assert "onnx.checker (full): failed" in proc.stdout
    info = inspect_model(path)
    assert info["checks"]["checker"]["ok"] is False
    assert info["checks"]["shape_inference"]["ok"] is False
    assert "Add" in info["checks"]["shape_inference"]["error"]
