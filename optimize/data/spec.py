"""What a model takes: its input tensors, their batch axes, and the input specification every command uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimize.backend import TensorSpec
from optimize.model.onnx_file import load_model


@dataclass
class InputTensor:
    """One pinned model input and how its values are made."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str  # "generated" or "file"
    # How generated values are drawn: normal | randint | ones | zeros | arange
    generator: str = "normal"
    low: int = 0
    high: int = 0
    note: str = ""
    # Where the batch is: not always axis 0 (a recurrent state [2, batch, 128]); None: no batch axis.
    batch_axis: int | None = 0


@dataclass
class InputSpec:
    tensors: list[InputTensor]
    seed: int = 0
    data_file: str | None = None
    data_sha256: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        for t in self.tensors:
            if t.shape and t.batch_axis is not None and t.batch_axis < len(t.shape):
                return t.shape[t.batch_axis]
        return 1

    def batch_axes(self) -> dict[str, int | None]:
        return {t.name: t.batch_axis if t.shape else None for t in self.tensors}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors}

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "data_file": self.data_file,
            "data_sha256": self.data_sha256,
            # batch_axis stays out: manifests list their input fields (artifact.py), and a loaded
            # spec falls back to axis 0, which is what every spec written before it meant.
            "inputs": [{**_tensor_json(t), "shape": list(t.shape)} for t in self.tensors],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        tensors = [InputTensor(**{**t, "shape": tuple(t["shape"])}) for t in data["inputs"]]
        return cls(tensors, seed=data.get("seed", 0), data_file=data.get("data_file"),
                   data_sha256=data.get("data_sha256"))  # fmt: skip


def _tensor_json(tensor: InputTensor) -> dict[str, Any]:
    data = asdict(tensor)
    del data["batch_axis"]
    return data


def model_input_specs(model_path: str | Path) -> list[TensorSpec]:
    """Graph inputs (not initializers) of an ONNX file, read without its weights."""
    import onnx

    model = load_model(model_path, load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        dims: list[int | str | None] = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or None)
        specs.append(TensorSpec(value.name, dtype, tuple(dims)))
    return specs


def embedding_vocab_sizes(model_path: str | Path) -> dict[str, int]:
    """Input name -> rows of the embedding table it indexes (Gather on an initializer)."""

    model = load_model(model_path, load_external_data=False)
    tables = {init.name: (int(init.dims[0]) if init.dims else 0) for init in model.graph.initializer}
    # Follow the input through shape-preserving casts: exporters often Cast ids before Gather.
    aliases: dict[str, str] = {v.name: v.name for v in model.graph.input}
    for node in model.graph.node:
        if node.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze") and node.input:
            src = aliases.get(node.input[0])
            if src is not None:
                for out in node.output:
                    aliases[out] = src
    vocab: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) >= 2 and node.input[0] in tables:
            src = aliases.get(node.input[1])
            if src is not None and tables[node.input[0]] > 0:
                vocab[src] = min(vocab.get(src, tables[node.input[0]]), tables[node.input[0]])
    return vocab


def _is_batch_name(dim: int | str | None) -> bool:
    return isinstance(dim, str) and ("batch" in dim.lower() or dim.lower() in ("n", "b", "bs"))


def batch_axes(specs: Sequence[TensorSpec]) -> dict[str, int | None]:
    """The batch axis of every input, found from the model rather than assumed to be axis 0.

    In order: a dim named like a batch ("batch", "batch_size"); the dim named like the first
    input's leading dynamic dim; a dynamic axis 0; the only dynamic dim of an input whose axis 0
    is fixed, when the first input's axis 0 is dynamic (silero-vad's state [2, batch, 128]).
    Scalars have none; a fully fixed input keeps axis 0 (rows of data are split there).
    """
    first = next((s for s in specs if s.shape), None)
    lead = first.shape[0] if first is not None else None
    lead_dynamic = first is not None and not isinstance(lead, int)
    axes: dict[str, int | None] = {}
    for spec in specs:
        dims = spec.shape
        if not dims:
            axes[spec.name] = None
            continue
        named = [i for i, d in enumerate(dims) if _is_batch_name(d)]
        dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if named:
            axes[spec.name] = named[0]
        elif isinstance(lead, str) and lead in dims:
            axes[spec.name] = dims.index(lead)
        elif not isinstance(dims[0], int):
            axes[spec.name] = 0
        elif lead_dynamic and len(dynamic) == 1:
            axes[spec.name] = dynamic[0]
        else:
            axes[spec.name] = 0
    return axes


def output_batch_axes(
    outputs: Sequence[TensorSpec],
    inputs: Sequence[TensorSpec],
    arrays: Mapping[str, np.ndarray] | None = None,
    batch: int | None = None,
) -> dict[str, int | None]:
    """The batch axis of every output: a dim named like an input's batch dim, else (given the
    arrays of one run and the batch size) the first axis of that size, else axis 0."""
    in_axes = batch_axes(inputs)
    names = {s.shape[a] for s in inputs if (a := in_axes[s.name]) is not None and isinstance(s.shape[a], str)}
    axes: dict[str, int | None] = {}
    for spec in outputs:
        array = arrays.get(spec.name) if arrays is not None else None
        rank = array.ndim if array is not None else len(spec.shape)
        if rank == 0:
            axes[spec.name] = None
            continue
        named = [
            i for i, d in enumerate(spec.shape) if isinstance(d, str) and (d in names or _is_batch_name(d))
        ]
        if named and named[0] < rank:
            axes[spec.name] = named[0]
        elif array is not None and batch is not None and batch in array.shape:
            axes[spec.name] = array.shape.index(batch)
        else:
            axes[spec.name] = 0
    return axes
