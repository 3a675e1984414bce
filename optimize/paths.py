"""Where lto keeps what it can reuse across runs (tuning records, timing caches)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$LTO_CACHE_DIR, else $XDG_CACHE_HOME/lto, else ~/.cache/lto.

    One root for every cache, so a CI job can keep (or wipe) all of lto's caches with one path.
    """
    explicit = os.environ.get("LTO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lto"
