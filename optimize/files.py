"""Atomic file and directory writes, and the rule for what an output path may replace.

Every write goes through a temp file or staging folder beside the target and one rename, so an
interrupted run never leaves half a file. Before any work starts, commands check their output
paths (`check_output_dir`, `check_output_file`): lto replaces only what is empty or what it
wrote itself, so a mistyped `-o` never costs the user their files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from optimize.errors import LtoError, UsageError


def _disk_error(path: Path, exc: OSError, writable_hint: str = "choose a writable output path") -> LtoError:
    if exc.errno == errno.ENOSPC:
        return LtoError(
            f"disk full while writing {path}", "free some space and run again; nothing was replaced"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LtoError(f"cannot write {path}: {exc.strerror}", writable_hint)
    return LtoError(f"cannot write {path}: {exc.strerror or exc}")


def current_umask() -> int:
    """The process umask, read without changing it where /proc says it (os.umask has no getter,
    and setting it to read it races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_file_mode(target: Path) -> int:
    """A replaced file keeps its mode; a new one gets what the user's umask allows (mkstemp
    creates files 0600, which would hide reports from the rest of a team)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~current_umask()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file beside `path`, fsync, then rename over it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            os.fchmod(fd, _new_file_mode(target))
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


def write_markdown_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Markdown for people, with lto's mark as its last line (an HTML comment, invisible when
    rendered) so that a later run knows it may replace the file."""
    return write_text_atomic(path, text.rstrip("\n") + "\n\n" + MARKDOWN_MARK + "\n")


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
def atomic_directory(
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    check: Callable[[Path], None] | None = None,
    writable_hint: str = "choose a writable output path",
) -> Iterator[Path]:
    """Yield a staging directory; on success it replaces `path` whole, on failure it is removed.

    The previous contents of `path` stay intact until the final rename, so Ctrl-C or a crash
    mid-run never leaves half an artifact behind. `path` is checked again just before the swap,
    by `check` (default: `check_output_dir`, the rule for lto's outputs): files someone put there
    while lto worked are never removed.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))
        staging.chmod(0o777 & ~current_umask())  # mkdtemp makes it 0700
    except OSError as exc:
        raise _disk_error(target, exc, writable_hint) from exc
    try:
        yield staging
        if check is not None:
            check(target)
        else:
            check_output_dir(target, force=force)
        old: Path | None = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _disk_error(target, exc, writable_hint) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# -- what an output path may replace -------------------------------------------------------------

# The last line of every Markdown file lto writes: what lets a later run replace it.
MARKDOWN_MARK = "<!-- written by lto; lto may replace this file -->"
_ARTIFACT_MANIFEST = "manifest.json"


def is_lto_artifact(directory: Path) -> bool:
    """A folder lto optimize wrote: its manifest.json is a JSON object that says so."""
    try:
        manifest = json.loads((directory / _ARTIFACT_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "lto_version" in manifest and "manifest_version" in manifest


def _looks_like_artifact(directory: Path) -> bool:
    """Has an artifact's parts (a manifest, or a model beside a report) without lto's manifest:
    a damaged or hand-edited artifact, replaceable with --force."""
    names = {p.name for p in directory.iterdir()}
    has_model = any(n.startswith("model") for n in names)
    return _ARTIFACT_MANIFEST in names or ("report.json" in names and has_model)


def _is_lto_file(path: Path) -> bool:
    """A report lto wrote: JSON from lto's report writer, or Markdown carrying lto's mark."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError:
        return False
    text = head.decode("utf-8", errors="replace")
    if MARKDOWN_MARK in text:
        return True
    try:
        data = json.loads(head)
    except ValueError:
        return False
    tool = data.get("tool") if isinstance(data, dict) else None
    return isinstance(tool, dict) and tool.get("name") == "lto" and "kind" in data


def _contains(folder: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except (OSError, ValueError):
        return False
    return True


def check_writable_place(path: str | os.PathLike[str], flag: str, what: str = "folder") -> None:
    """Refuse, before any work, an output path lto could not write: one under a file, or whose
    folder (the nearest one that exists) cannot take a new entry: read-only, no permission, a
    pseudo file system such as /proc. lto writes beside the target and renames, so the check is
    on the target's folder. The error names the user's path and the real cause."""
    existing = Path(path).absolute().parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(
            f"{flag} {path}: {existing} is a file, not a folder", f"give {flag} a path to a {what}"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".lto-write-check-", dir=existing)
    except OSError as exc:
        cause = {errno.EROFS: "the file system is read-only", errno.EACCES: "no permission"}.get(
            exc.errno or 0, exc.strerror or type(exc).__name__
        )
        raise UsageError(
            f"{flag} {path}: cannot write in {existing} ({cause})", "choose a path you can write"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_output_dir(
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    force: bool = False,
    flag: str = "-o",
) -> None:
    """Refuse an artifact folder that lto could only write by destroying files it did not write.

    Replaced: nothing there, an empty folder, an lto artifact; with `force`, a folder that looks
    like a damaged artifact. Refused whatever the flags: a file, a symlink, the working folder or
    one above it, a folder holding one of `inputs`, any other folder with files in it.
    """
    target = Path(path)
    shown = str(target)
    fix = f"choose another {flag}; lto replaces only empty folders and artifacts it wrote"
    if target.is_symlink():
        raise UsageError(f"{flag} {shown} is a symlink; lto will not replace it", fix)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {shown} is a file, not an artifact folder; lto will not replace it", fix)
    # The artifact is written beside it (a scratch folder, then one rename): its folder must take it.
    check_writable_place(target, flag)
    if not target.exists():
        return
    if _contains(target, Path.cwd()):
        raise UsageError(f"{flag} {shown} is the working folder or holds it; lto will not replace it", fix)
    for item in inputs:
        if item is not None and _contains(target, Path(item)):
            raise UsageError(f"{flag} {shown} holds the input {item}; lto will not replace it", fix)
    try:
        entries = list(target.iterdir())
    except OSError as exc:
        raise UsageError(f"{flag} {shown} cannot be read: {exc.strerror}", fix) from None
    if not entries or is_lto_artifact(target):
        return
    if _looks_like_artifact(target):
        if force:
            return
        raise UsageError(
            f"{flag} {shown} looks like an artifact but its manifest.json is not lto's",
            f"add --force to replace it, or {fix.replace('; ', ' (', 1)})",
        )
    raise UsageError(
        f"{flag} {shown} is a folder of {len(entries)} {'entry' if len(entries) == 1 else 'entries'} "
        "that lto did not write; "
        "lto will not replace it",
        fix,
    )


def check_output_file(
    path: str | os.PathLike[str] | None,
    *,
    flag: str,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
) -> None:
    """Refuse a report path that holds something lto did not write (an empty file is fine: CI
    systems create the job-summary file before the step runs), or that is one of the command's
    `inputs` (a report rendered over itself is lost)."""
    if path is None:
        return
    target = Path(path)
    fix = f"choose another {flag}; lto replaces only files it wrote"
    for item in inputs:
        if item is not None and Path(item).exists() and target.exists() and target.samefile(item):
            raise UsageError(f"{flag} {target} is also an input of this command; lto will not write it", fix)
    if target.is_symlink():
        raise UsageError(f"{flag} {target} is a symlink; lto will not replace it", fix)
    if target.is_dir():
        raise UsageError(f"{flag} {target} is a folder; give a file path", fix)
    check_writable_place(target, flag, what="file")
    if not target.exists():
        return
    if target.stat().st_size and not _is_lto_file(target):
        raise UsageError(f"{flag} {target} is a file lto did not write; lto will not replace it", fix)


def cache_root() -> Path:
    """$LTO_CACHE_DIR, else $XDG_CACHE_HOME/lto, else ~/.cache/lto.

    One root for every cache, so a CI job can keep (or wipe) all of lto's caches with one path.
    """
    explicit = os.environ.get("LTO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lto"


def sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
