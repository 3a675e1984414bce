"""Artifacts: written whole or not at all, verified before use, refused on the wrong CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.artifact import check_cpu, cpu_requirements, load_artifact, read_manifest, write_artifact
from optimize.errors import ModelError
from optimize.files import sha256_file
from optimize.stage import Candidate
from tests.conftest import make_matmul_model


def _write(out: Path, candidate: Candidate, chain: list[dict[str, Any]] | None = None, **kw: Any) -> Path:
    return write_artifact(
        out,
        candidate=candidate,
        input_spec={"inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16]}]},
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
        history=[{"stage": "baseline", "status": "baseline"}],
        accuracy={"ok": True},
        chain_details=chain or [],
        report={"kind": "optimize"},
        report_md="# report\n",
        **kw,
    )


@pytest.fixture
def candidate(tmp_path: Path) -> Candidate:
    (tmp_path / "src").mkdir()
    model = make_matmul_model(tmp_path / "src" / "m.onnx")
    config = {"graph_optimization_level": "disable", "intra_op_num_threads": 1}
    return Candidate(label="operator-fusion:extended", model_path=model, runtime_config=config)


def test_written_artifact_loads_with_its_runtime_config(tmp_path: Path, candidate: Candidate) -> None:
    out = _write(tmp_path / "art", candidate)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.onnx",
        "report.html",
        "report.json",
        "report.md",
    ]
    loaded = load_artifact(out)
    assert loaded.backend == "onnxruntime"
    assert loaded.model_path == out / "model.onnx"
    assert loaded.runtime_config == candidate.runtime_config
    assert loaded.input_spec["inputs"][0]["name"] == "x"
    manifest = loaded.manifest
    assert manifest["files"]["model.onnx"]["sha256"] == sha256_file(candidate.model_path)
    assert set(manifest["files"]) == {"model.onnx", "report.html", "report.json", "report.md"}
    for key in ("environment", "fingerprint", "versions", "stages", "accuracy", "requires"):
        assert key in manifest
    assert manifest["versions"]["onnxruntime"] == ort.__version__
    # Temp-file privacy must not leak into the artifact: others can read and serve it.
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask
    assert (out / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_tampered_or_missing_file_is_refused(tmp_path: Path, candidate: Candidate) -> None:
    out = _write(tmp_path / "art", candidate)
    model = out / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"model\.onnx was changed after lto wrote it \(sha256 mismatch\)"):
        load_artifact(out)
    model.unlink()
    with pytest.raises(ModelError, match=r"model\.onnx is missing"):
        load_artifact(out)


def test_not_an_artifact(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_artifact(tmp_path / "nope")
    with pytest.raises(ModelError, match="not an lto artifact"):
        load_artifact(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        read_manifest(tmp_path)


def test_isa_flag_this_cpu_lacks_is_refused(tmp_path: Path, candidate: Candidate) -> None:
    chain = [{"stage": "tvm-tune", "isa_requires": ["lto_fake_isa_flag"]}]
    out = _write(tmp_path / "art", candidate, chain)
    with pytest.raises(ModelError, match="cannot run on this CPU: this CPU lacks lto_fake_isa_flag"):
        load_artifact(out)
    # ... and accepted where the flag exists.
    assert load_artifact(out, cpu_flags={"lto_fake_isa_flag"}).backend == "onnxruntime"


def test_nchwc_block_width_must_match(tmp_path: Path, candidate: Candidate) -> None:
    chain = [{"stage": "memory-layout:nchwc16-saved", "isa_requires": ["avx512f"],
              "isa_exact": {"nchwc_block_width": 16}}]  # fmt: skip
    out = _write(tmp_path / "art", candidate, chain)
    assert read_manifest(out)["requires"]["nchwc_block"] == 16
    avx512 = {"avx2", "fma", "avx512f"}
    assert load_artifact(out, cpu_flags=avx512).backend == "onnxruntime"
    with pytest.raises(ModelError, match="lacks avx512f"):
        load_artifact(out, cpu_flags={"avx2", "fma"})
    # The flag alone is not enough: an 8-wide layout on a 16-wide CPU runs silently wrong.
    assert "8-wide" in (check_cpu({"nchwc_block": 16}, {"avx2", "fma"}) or "")
    assert check_cpu({"nchwc_block": 8}, avx512) is not None
    assert check_cpu({"nchwc_block": 16}, avx512) is None


def _qdq_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.ones((4, 4), dtype=np.int8), "W")
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "z")
    nodes = [
        helper.make_node("DequantizeLinear", ["W", "s", "z"], ["Wf"]),
        helper.make_node("MatMul", ["x", "Wf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, scale, zero],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_int8_model_built_with_vnni_requires_vnni(tmp_path: Path) -> None:
    path = _qdq_model(tmp_path / "q.onnx")
    # A stage's own "isa" details as a dict (not a list of flags) must not become requirements.
    req = cpu_requirements(path, [{"stage": "quantize", "isa": {"vnni": True}}], {"avx2", "avx512_vnni"})
    assert [e["any_of"] for e in req["cpu_isa"]] == [["avx512_vnni", "avx_vnni", "amx_int8"]]
    assert "one of avx512_vnni" in (check_cpu(req, {"avx2"}) or "")
    assert check_cpu(req, {"avx2", "avx_vnni"}) is None
    # Built without VNNI (reduce_range weights): nothing extra to require.
    assert cpu_requirements(path, [], {"avx2"})["cpu_isa"] == []


def test_external_data_travels_with_the_model(tmp_path: Path) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    model = onnx.load(str(make_matmul_model(tmp_path / "plain.onnx", features=64, out=32)))
    onnx.save_model(model, str(src_dir / "big.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="big.onnx.data", size_threshold=0)  # fmt: skip
    cand = Candidate(label="baseline", model_path=src_dir / "big.onnx")
    out = _write(tmp_path / "art", cand)
    manifest = read_manifest(out)
    assert manifest["side_files"] == ["big.onnx.data"]
    assert "big.onnx.data" in manifest["files"]
    loaded = load_artifact(out)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(str(src_dir / "big.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    got = ort.InferenceSession(str(loaded.model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(want[0], got[0])
    (out / "big.onnx.data").write_bytes(b"\0" * 10)
    with pytest.raises(ModelError, match=r"big\.onnx\.data was changed"):
        load_artifact(out)


def test_failed_write_leaves_no_half_artifact_and_keeps_the_old_one(
    tmp_path: Path, candidate: Candidate
) -> None:
    out = _write(tmp_path / "art", candidate)
    before = json.loads((out / "manifest.json").read_text())

    def broken_writer(path: Path, report: dict[str, Any]) -> None:
        path.write_text("{half")
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path / "art", candidate, report_writer=broken_writer)
    assert json.loads((out / "manifest.json").read_text()) == before
    assert load_artifact(out).backend == "onnxruntime"
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path / "new", candidate, report_writer=broken_writer)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "src"]  # no staging leftovers
