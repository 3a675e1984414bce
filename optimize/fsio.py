"""Atomic file and directory writes, so an interrupted run never leaves half a file."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from optimize.errors import LtoError


def _disk_error(path: Path, exc: OSError) -> LtoError:
    if exc.errno == errno.ENOSPC:
        return LtoError(
            f"disk full while writing {path}", "free some space and run again; nothing was replaced"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LtoError(f"cannot write {path}: {exc.strerror}", "choose a writable output path")
    return LtoError(f"cannot write {path}: {exc.strerror or exc}")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file beside `path`, fsync, then rename over it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise _disk_error(target, exc) from exc
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars and paths show up in reports; keep the writer tolerant of them.
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a staging directory; on success it replaces `path` whole, on failure it is removed.

    The previous contents of `path` stay intact until the final rename, so Ctrl-C or a crash
    mid-run never leaves half an artifact behind.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))
    except OSError as exc:
        raise _disk_error(target, exc) from exc
    try:
        yield staging
        old: Path | None = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _disk_error(target, exc) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
