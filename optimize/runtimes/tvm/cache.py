"""The tuning-record cache: one MetaSchedule JSON database per (target, machine, workload).

Layout: `<cache_dir>/<key>/` holds `database_workload.json` and `database_tuning_record.json`
(MetaSchedule's JSONDatabase files) and `meta.json` (trials spent per task, what it was tuned
for). The key hashes the target JSON, the machine that measured (its fingerprint, or the RPC
key for a remote fleet), the preprocessing recipe, the TVM version and the set of task
workloads, so a second `lto optimize` of the same model on the same machine finds its records
and applies them without tuning, and a changed model or target never picks up stale ones.

Tuning writes into a private copy; after every chunk the copy is published here file by file
with atomic renames, so a crash mid-tuning leaves the last complete state, never a torn line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optimize.errors import LtoError
from optimize.files import cache_root, write_bytes_atomic, write_json_atomic

DB_FILES = ("database_workload.json", "database_tuning_record.json")
META_FILE = "meta.json"
LOCK_FILE = ".lock"


def default_cache_dir() -> Path:
    """$LTO_CACHE_DIR/tvm, else ~/.cache/lto/tvm (XDG_CACHE_HOME respected)."""

    return cache_root().expanduser() / "tvm"


def cache_key(
    target_key: str, measured_on: str, recipe: str, tvm_version: str, task_hashes: list[str]
) -> str:
    digest = hashlib.sha256()
    for part in (target_key, measured_on, recipe, tvm_version, *sorted(task_hashes)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


class TuningCache:
    """One cache entry. Use as a context manager: it holds an exclusive lock on the entry so
    two runs tuning the same workload on one machine do not interleave their records."""

    def __init__(self, root: Path, key: str, on_wait: Callable[[str], None] | None = None) -> None:
        self.on_wait = on_wait
        self.root = Path(root)
        self.key = key
        self.path = self.root / key
        self._lock_fh: Any = None

    def __enter__(self) -> TuningCache:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fh = open(self.path / LOCK_FILE, "a+")
        except OSError as exc:
            raise LtoError(
                f"cannot use the TVM tuning cache {self.path}: {exc.strerror or exc}",
                "set LTO_CACHE_DIR or the stage option cache_dir to a writable folder",
            ) from exc
        try:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if self.on_wait is not None:
                self.on_wait(f"waiting for another run that is tuning the same model ({self.path})")
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- records ---------------------------------------------------------------------------

    def has_records(self) -> bool:
        return all((self.path / name).is_file() for name in DB_FILES)

    def checkout(self, work_dir: Path) -> None:
        """Copy the cached database into `work_dir` (empty files when there is none yet)."""
        work_dir.mkdir(parents=True, exist_ok=True)
        for name in DB_FILES:
            src = self.path / name
            if src.is_file():
                shutil.copyfile(src, work_dir / name)
            else:
                (work_dir / name).touch()

    def publish(self, work_dir: Path, meta: dict[str, Any]) -> None:
        """Make `work_dir`'s database and `meta` the cached state (each file replaced atomically;
        the tuning records file goes last, so a reader never sees records without workloads)."""
        for name in DB_FILES:
            write_bytes_atomic(self.path / name, (work_dir / name).read_bytes())
        write_json_atomic(self.path / META_FILE, meta)

    def read_meta(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
