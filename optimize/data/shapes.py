"""Shape ranges: `--shape input_ids=1x128:8x128:32x128` (min:opt:max).

Stages that build for a range of shapes (a TensorRT optimization profile) take the ranges; every
benchmark runs at each range's `opt` shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optimize.errors import InputError, UsageError


@dataclass(frozen=True)
class ShapeRange:
    """Minimum, optimum and maximum shape of one input, for a TensorRT optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def fixed(self) -> bool:
        return self.min == self.opt == self.max

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= s <= hi for s, lo, hi in zip(shape, self.min, self.max, strict=True)
        )

    def to_json(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


_DIMS = re.compile(r"^\d+([xX]\d+)*$")


def _parse_dims(text: str, arg: str) -> tuple[int, ...]:
    text = text.replace(" ", "").replace(",", "x")  # 1x128, 1 x 128 and 1,128 are one shape
    if not _DIMS.match(text):
        raise InputError(
            f"bad shape {text!r} in --shape {arg!r}", "write dims as 1x128, a range as 1x128:8x128:32x128"
        )
    dims = tuple(int(d) for d in text.lower().split("x"))
    if any(d == 0 for d in dims):
        raise InputError(
            f"shape {text!r} in --shape {arg!r} has a zero dimension", "every dimension must be >= 1"
        )
    return dims


def parse_shape_range(arg: str) -> tuple[str, ShapeRange]:
    """`name=1x128` (fixed) or `name=1x128:8x128:32x128` (min:opt:max) -> (name, ShapeRange)."""
    name, sep, spec = arg.partition("=")
    name = name.strip()
    if not sep or not name or not spec.strip():
        raise InputError(
            f"bad --shape {arg!r}", "use NAME=1x128 or NAME=MIN:OPT:MAX, e.g. input_ids=1x128:8x128:32x128"
        )
    parts = spec.split(":")
    if len(parts) not in (1, 3):
        raise InputError(
            f"--shape {arg!r} has {len(parts)} shapes separated by ':'",
            "give one shape (1x128) or three: min:opt:max (1x128:8x128:32x128)",
        )
    shapes = [_parse_dims(p, arg) for p in parts]
    lo, opt, hi = (shapes[0], shapes[0], shapes[0]) if len(shapes) == 1 else shapes
    if not len(lo) == len(opt) == len(hi):
        raise InputError(
            f"--shape {arg!r}: min, opt and max have different ranks ({len(lo)}, {len(opt)}, {len(hi)})",
            "the three shapes must have the same number of dims",
        )
    for axis, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
        if not a <= b <= c:
            raise InputError(
                f"--shape {arg!r}: axis {axis} must satisfy min <= opt <= max, got {a}, {b}, {c}",
                "order the shapes min:opt:max",
            )
    return name, ShapeRange(lo, opt, hi)


def parse_shape_ranges(args: Sequence[str] | Mapping[str, str]) -> dict[str, ShapeRange]:
    """Parse repeated --shape values (or a recipe's {name: "1x128:8x128:32x128"} mapping)."""
    items = [f"{k}={v}" for k, v in args.items()] if isinstance(args, Mapping) else list(args)
    ranges: dict[str, ShapeRange] = {}
    for arg in items:
        name, rng = parse_shape_range(arg)
        if name in ranges:
            raise InputError(f"--shape gives input {name!r} twice", "give each input once")
        ranges[name] = rng
    return ranges


def opt_shapes(ranges: Mapping[str, ShapeRange]) -> dict[str, tuple[int, ...]]:
    """The shapes to benchmark for range --shape values: each range's `opt` (what the engine is tuned for).

    Lets `lto optimize --shape input_ids=1x128:8x128:32x128` pin its benchmark inputs with
    `optimize.data.resolve.resolve_inputs(model, opt_shapes(ranges))` and hand the ranges to the stage.
    """
    return {name: rng.opt for name, rng in ranges.items()}


__all__ = ["ShapeRange", "opt_shapes", "parse_shape_range", "parse_shape_ranges"]


def parse_shape_args(args: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--shape NAME=1x128` pins (NAME: an input name or a named dynamic dim), each
    read by the one --shape parser (parse_shape_range, above); a MIN:OPT:MAX range is
    split off before (split_shape_args)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for arg in args or []:
        if ":" in arg:
            raise UsageError(
                f"bad --shape {arg!r}", "write NAME=DIMS with dims joined by 'x', e.g. input_ids=1x128"
            )
        name, pinned = parse_shape_range(arg)
        if name in shapes:
            raise UsageError(f"--shape given twice for {name!r}")
        shapes[name] = pinned.opt
    return shapes


def split_shape_args(args: list[str] | None) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Separate `--shape NAME=MIN:OPT:MAX` ranges (TensorRT optimization profiles) from plain pins.

    Returns the pins to benchmark at (a range contributes its OPT shape) and the range strings,
    which go to the stages that build for a range of shapes.
    """
    ranges = [arg for arg in args or [] if ":" in arg]
    pins = parse_shape_args([arg for arg in args or [] if ":" not in arg])
    if ranges:
        for name, opt in opt_shapes(parse_shape_ranges(ranges)).items():
            if name in pins:
                raise UsageError(f"--shape given twice for {name!r}")
            pins[name] = opt
    return pins, ranges
