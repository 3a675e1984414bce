"""Generated inputs with meaning: token ids inside the vocabulary, masks of ones, images in range; and the
memory they will take."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from optimize.backend import TensorSpec
from optimize.data.spec import InputSpec, InputTensor
from optimize.errors import InputError
from optimize.model.inspection import largest_activation
from optimize.system.env import available_memory


def describe_generator(spec: TensorSpec, vocab: dict[str, int]) -> tuple[str, int, int, str]:
    lowered = spec.name.lower()
    kind = np.dtype(spec.dtype).kind
    if kind == "b":
        return "ones", 0, 0, "all true"
    if kind in "iu":
        if "mask" in lowered:
            return "ones", 0, 0, "attention mask of ones"
        if "token_type" in lowered or "segment" in lowered:
            return "zeros", 0, 0, "single segment"
        if "position" in lowered:
            return "arange", 0, 0, "positions 0..n-1 along the last axis"
        if spec.name in vocab:
            return (
                "randint",
                0,
                vocab[spec.name],
                f"token ids in [0, {vocab[spec.name]}) from the embedding table",
            )
        return "randint", 0, 2, "no embedding table found: integers in [0, 2)"
    return "normal", 0, 0, "seeded standard normal"


def _generate(tensor: InputTensor, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(tensor.dtype)
    if tensor.generator == "ones":
        return np.ones(tensor.shape, dtype=dtype)
    if tensor.generator == "zeros":
        return np.zeros(tensor.shape, dtype=dtype)
    if tensor.generator == "arange":
        last = tensor.shape[-1] if tensor.shape else 1
        return np.broadcast_to(np.arange(last, dtype=dtype), tensor.shape).copy()
    if tensor.generator == "randint":
        return rng.integers(tensor.low, tensor.high, size=tensor.shape).astype(dtype)
    return rng.standard_normal(size=tensor.shape).astype(dtype)


def generate_feeds(spec: InputSpec, seed: int | Sequence[int]) -> dict[str, np.ndarray]:
    """Fresh inputs with the spec's shapes and meaning (e.g. more calibration samples)."""
    rng = np.random.default_rng(seed)
    return {t.name: _generate(t, rng) for t in spec.tensors}


# The accuracy samples' own stream of seeds. numpy's SeedSequence treats an int seed n like
# [n, 0, 0, ...], so a 3-word seed whose last word is non-zero can never equal an int seed: not
# the benchmark's --seed, not the quantize stage's calibration seeds (1000 + i).
_ACCURACY_STREAM = 0xACC


def accuracy_seed(seed: int, index: int) -> tuple[int, int, int]:
    """The seed of the index-th generated accuracy sample of a run with --seed `seed`."""
    return (seed, index, _ACCURACY_STREAM)


def generated_samples(spec: InputSpec, seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """`count` accuracy samples with the spec's shapes and meaning, disjoint from any int seed."""
    return [generate_feeds(spec, accuracy_seed(seed, i)) for i in range(count)]


def _gib(n: float) -> str:
    gib = n / 2**30
    return f"{gib:,.1f} GiB" if gib >= 1 else f"{gib:.2g} GiB"


def check_memory(
    tensors: list[tuple[str, str, tuple[int, ...]]], model_path: str | Path | None = None
) -> None:
    """Refuse inputs (name, dtype, shape) that cannot fit in memory, before any is allocated.

    With an ONNX `model_path`, the largest intermediate tensor at these shapes counts too (an
    estimate from shape inference, skipped when inference fails). A run that dies of
    MemoryError, or gets the machine swapping, after minutes of work helps nobody.
    """

    available = available_memory()
    if available is None or not tensors:
        return
    sizes = {name: math.prod(shape) * np.dtype(dtype).itemsize for name, dtype, shape in tensors}
    total = sum(sizes.values())
    hint = "pin smaller shapes with --shape, or a smaller --batch"
    if total > available:
        name, dtype, shape = max(tensors, key=lambda t: sizes[t[0]])
        where = f"input {name!r} at {'x'.join(map(str, shape))} {dtype} needs {_gib(sizes[name])}"
        if len(tensors) > 1:
            where = f"the inputs need {_gib(total)} ({where})"
        raise InputError(f"{where}, more than the {_gib(available)} of memory available", hint)
    if model_path is None or Path(model_path).suffix != ".onnx":
        return

    largest = largest_activation(model_path, {name: shape for name, _, shape in tensors})
    if largest is not None and total + largest[2] > available:
        name, shape_text, size = largest
        raise InputError(
            f"at these shapes the model's tensor {name!r} ({shape_text}) needs {_gib(size)}: with "
            f"the inputs' {_gib(total)} that is more than the {_gib(available)} of memory available",
            hint,
        )
