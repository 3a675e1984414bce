"""Artifacts of every runtime `lto export` handles, written by lto's own artifact writer.

ONNX Runtime artifacts hold a real model. OpenVINO ones hold a real IR when OpenVINO is installed
and a hand-written one otherwise (the export reads the IR's XML, never runs it). TensorRT ones
hold stand-in engine bytes beside a hand-made engine manifest: no GPU is needed to export, and
Triton's TensorRT backend reads the same manifest fields lto's engine builder writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from optimize.artifact import write_artifact
from optimize.stage import Candidate
from tests.conftest import make_matmul_model

ArtifactMaker = Callable[..., Path]

HAND_MADE_IR = """<?xml version="1.0"?>
<net name="relu" version="11">
  <layers>
    <layer id="0" name="x" type="Parameter" version="opset1">
      <data shape="?,16" element_type="f32"/>
      <output><port id="0" precision="FP32" names="x"><dim>-1</dim><dim>16</dim></port></output>
    </layer>
    <layer id="1" name="relu" type="ReLU" version="opset1">
      <input><port id="0" precision="FP32"><dim>-1</dim><dim>16</dim></port></input>
      <output><port id="1" precision="FP32" names="y"><dim>-1</dim><dim>16</dim></port></output>
    </layer>
    <layer id="2" name="y/sink_port_0" type="Result" version="opset1">
      <input><port id="0" precision="FP32"><dim>-1</dim><dim>16</dim></port></input>
    </layer>
  </layers>
  <edges>
    <edge from-layer="0" from-port="0" to-layer="1" to-port="0"/>
    <edge from-layer="1" from-port="1" to-layer="2" to-port="0"/>
  </edges>
</net>
"""


def engine_manifest(runtime: str = "tensorrt", max_batch: int = 16) -> dict[str, Any]:
    return {
        "runtime": runtime,
        "runtime_version": "10.9.0",
        "compute_capabilities": ["9.0"],
        "precision": "fp16",
        "profiles": [{"x": {"min": [1, 16], "opt": [8, 16], "max": [max_batch, 16]}}],
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 16]}],
        "outputs": [{"name": "y", "dtype": "float16", "shape": [-1, 4]}],
    }


@pytest.fixture
def make_artifact(tmp_path: Path) -> ArtifactMaker:
    counter = iter(range(1000))

    def make(
        backend: str = "onnxruntime",
        runtime_config: dict[str, Any] | None = None,
        precision: str = "fp32",
        batch: int = 1,
        source: Path | None = None,
        extra: dict[str, Any] | None = None,
        name: str | None = None,
        engine: dict[str, Any] | None = None,
    ) -> Path:
        work = tmp_path / f"src{next(counter)}"
        work.mkdir()
        extra_files: list[Path] = []
        if backend == "openvino":
            model = source or work / "model.xml"
            if source is None:
                model.write_text(HAND_MADE_IR)
                (work / "model.bin").write_bytes(b"")
            extra_files = [model.with_suffix(".bin")] if model.suffix == ".xml" else []
        elif backend == "tensorrt":
            model = work / "model_fp16.engine"
            model.write_bytes(b"stand-in engine bytes")
            meta = work / "model_fp16.engine.json"
            meta.write_text(json.dumps(engine or engine_manifest()))
            extra_files = [meta]
        elif backend == "tvm":
            model = work / "model.so"
            model.write_bytes(b"stand-in library")
        else:
            model = source or make_matmul_model(work / "m.onnx", features=16, out=4)
        return write_artifact(
            tmp_path / (name or f"art{next(counter)}"),
            candidate=Candidate(
                label="best",
                model_path=model,
                backend=backend,
                runtime_config=runtime_config or {},
                precision=precision,
                extra_files=extra_files,
            ),
            input_spec={
                "seed": 0,
                "inputs": [{"name": "x", "dtype": "float32", "shape": [batch, 16], "source": "generated"}],
            },
            outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
            history=[],
            accuracy={"ok": True},
            chain_details=[],
            report={"kind": "optimize"},
            report_md="# report\n",
            extra=extra,
        )

    return make
