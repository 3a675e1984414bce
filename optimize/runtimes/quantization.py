"""Quantization helpers every runtime's int8 stage shares: calibration rows (the user's, or
generated ones) and the numbers behind back-off (how far a tensor moved, how many nodes to keep in
float). Runtime-neutral: ONNX Runtime's and OpenVINO's stages both use them, and neither runtime
folder imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optimize.data import generate_feeds, read_npz, resolve_inputs
from optimize.errors import InputError
from optimize.stage import StageContext

DEFAULT_CALIB_SAMPLES = 16


def _split_samples(name: str, array: np.ndarray, like: np.ndarray) -> list[np.ndarray]:
    if array.dtype != like.dtype:
        raise InputError(f"calibration array {name!r} is {array.dtype}, the model input is {like.dtype}")
    if array.ndim == like.ndim + 1 and array.shape[1:] == like.shape:
        return [np.require(a, requirements="C") for a in array]  # a scalar input stays 0-d
    if array.ndim == like.ndim and array.shape[1:] == like.shape[1:] and like.ndim > 0:
        batch = like.shape[0]
        if array.shape[0] % batch == 0:
            return [np.ascontiguousarray(array[i : i + batch]) for i in range(0, array.shape[0], batch)]
    raise InputError(
        f"calibration array {name!r} has shape {list(array.shape)}; expected {list(like.shape)} "
        f"or samples stacked on a new first axis, e.g. {[8, *like.shape]}"
    )


def load_calibration(source: Any, like: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Calibration feeds from an .npz path (samples along axis 0) or a list of feed dicts."""
    if isinstance(source, (list, tuple)):
        samples = [dict(s) for s in source]
        for sample in samples:
            missing = sorted(set(like) - set(sample))
            if missing:
                raise InputError(f"calibration sample lacks input {missing[0]!r}")
        return samples
    path = Path(str(source))
    arrays = read_npz(path, "--calib-data")
    missing = sorted(set(like) - set(arrays))
    if missing:
        raise InputError(f"calibration data {path.name} has no array for input {missing[0]!r}")
    per_input = {name: _split_samples(name, arrays[name], like[name]) for name in like}
    counts = {len(v) for v in per_input.values()}
    if len(counts) != 1:
        raise InputError(
            f"calibration data {path.name}: inputs hold different numbers of samples {sorted(counts)}"
        )
    return [{name: per_input[name][i] for name in like} for i in range(counts.pop())]


def generated_calibration(ctx: StageContext, count: int) -> list[dict[str, np.ndarray]]:
    """Inputs drawn like the benchmark inputs (token ids in the vocab, masks of ones), other seeds."""

    shapes = {name: tuple(int(d) for d in array.shape) for name, array in ctx.feeds.items()}
    spec, _ = resolve_inputs(ctx.original_model, shapes)
    # Seeds far from the benchmark seed so calibration never sees the accuracy-check inputs.
    return [generate_feeds(spec, 1_000 + i) for i in range(count)]


def calibration_samples(
    ctx: StageContext, purpose: str = "int8"
) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """(samples, where they came from): --calib-data (ctx.options["calib_data"]) or generated
    inputs, with a warning, since synthetic activation ranges may not match real ones.
    Shared by ONNX Runtime's and OpenVINO's int8 stages."""
    count = int(ctx.options.get("calib_samples", DEFAULT_CALIB_SAMPLES))
    source = ctx.options.get("calib_data")
    if source is not None:
        samples = load_calibration(source, ctx.feeds)
        origin = str(source) if not isinstance(source, (list, tuple)) else "list"
        return samples, {"source": origin, "samples": len(samples)}
    ctx.warn(
        f"calibrating {purpose} on {count} generated inputs (no --calib-data); activation ranges "
        "from synthetic data may not match real inputs. Pass --calib-data FILE.npz for representative ranges."
    )
    return generated_calibration(ctx, count), {"source": "generated", "samples": count}


def channel_error(refs: Sequence[np.ndarray], gots: Sequence[np.ndarray], axis: int) -> float | None:
    """Mean over channels of ||got_c - ref_c|| / ||ref_c||, all samples pooled.

    Per channel, because the typical int8 failure is one outlier setting the scale so that
    the other channels round to zero: a norm over the whole tensor is dominated by the big
    channel and hides exactly that. Channels that are ~0 in the reference are left out.
    """
    rows_ref, rows_got = [], []
    for ref, got in zip(refs, gots, strict=True):
        if ref.shape != got.shape or ref.ndim == 0:
            return None
        ax = axis if ref.ndim > 1 else 0
        rows_ref.append(np.moveaxis(ref.astype(np.float64), ax, -1).reshape(-1, ref.shape[ax]))
        rows_got.append(np.moveaxis(got.astype(np.float64), ax, -1).reshape(-1, ref.shape[ax]))
    if not rows_ref:
        return None
    ref2, got2 = np.concatenate(rows_ref), np.concatenate(rows_got)
    norms = np.linalg.norm(ref2, axis=0)
    live = norms > 1e-6 * max(float(norms.max()), 1e-30)
    if not live.any():
        return None
    return float(np.mean(np.linalg.norm(got2 - ref2, axis=0)[live] / norms[live]))


def backoff_sizes(total: int, rounds: int) -> list[int]:
    """How many of the ranked nodes to keep in float on each retry: 10 %, 20 %, 40 % ... (at least +1).

    At least one node stays quantized: excluding them all would just be the float model, slower.
    """
    limit = total - 1
    sizes: list[int] = []
    for r in range(rounds):
        k = min(limit, max(math.ceil(total * 0.1 * 2**r), (sizes[-1] + 1) if sizes else 1))
        if k < 1 or (sizes and k <= sizes[-1]):
            break
        sizes.append(k)
    return sizes


def bisect_towards_fewest(
    last_fail: int,
    first_pass: int,
    passes: Callable[[int], bool],
    stop: Callable[[], bool],
    rounds: int = 2,
) -> int:
    """Between a count of nodes in float known to fail and one known to pass, try the midpoint
    `rounds` times (fewer when `stop()` says time is up): the fewest found that pass. Each node kept
    in float costs speed, and the doubling that found `first_pass` overshoots by up to half."""
    for _ in range(rounds):
        if first_pass - last_fail <= 1 or stop():
            break
        mid = (last_fail + first_pass) // 2
        if passes(mid):
            first_pass = mid
        else:
            last_fail = mid
    return first_pass


__all__ = [
    "DEFAULT_CALIB_SAMPLES",
    "backoff_sizes",
    "bisect_towards_fewest",
    "calibration_samples",
    "channel_error",
    "generated_calibration",
    "load_calibration",
]
