"""Make "model X with +N% compute": the same outputs, measurably more work.

Used to check that `lto gate` catches a real slowdown. The extra work is a chain of
MatMul+Tanh layers fed by the model's float input or output with the most rows, sized so
its multiply-accumulates are `extra` x the model's (MatMul, Gemm and Conv counted). The chain
is reduced to a scalar, multiplied by zero and added to a float output, so the runtime must
compute it; Tanh keeps every value finite, so 0 * chain is exactly 0 and the outputs are
bit-identical to the original's. The model surgery is `sample_models/variants.py` (`add_extra_work`),
which the gate's tests use too.

    python -m benchmarks.slow_model sample_models/mlp_small.onnx /tmp/mlp_slow.onnx --extra 15%
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from sample_models.variants import add_extra_work


def make_slower(
    src: Path,
    dst: Path,
    extra: float,
    dims: dict[str, int] | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> int:
    """Write `src` with about `extra` x more compute to `dst`; returns the chain length."""
    slow, layers = add_extra_work(onnx.load(str(src)), extra, dims=dims, input_shapes=input_shapes)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(slow, str(dst))
    return layers


def shape_args(args: list[str]) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """lto's --shape values split into named dims (one number) and whole input shapes."""
    from optimize.data import parse_shape_args

    parsed = parse_shape_args(args)
    dims = {k: v[0] for k, v in parsed.items() if len(v) == 1}
    return dims, {k: tuple(v) for k, v in parsed.items() if len(v) > 1}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--extra", default="15%", help="extra compute as a fraction or percentage")
    parser.add_argument(
        "--shape", action="append", default=[], help="as for lto: NAME=DxD, an input or a named dim"
    )
    args = parser.parse_args()
    text = args.extra.strip()
    extra = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    dims, inputs = shape_args(args.shape)
    layers = make_slower(args.model, args.out, extra, dims, inputs)
    print(f"wrote {args.out}: +{extra:.0%} MACs as {layers} extra MatMul+Tanh layers")


if __name__ == "__main__":
    main()
