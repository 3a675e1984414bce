"""One versioned report schema for every command that measures: create, validate, write, load.

Rendering (Markdown and terminal tables) lives in optimize.render.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.files import sha256_file, write_json_atomic
from optimize.system.env import environment
from optimize.version import __version__

SCHEMA_VERSION = "1.0"
KINDS = ("bench", "compare", "optimize", "load", "gate")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    path = Path(__file__).parent / "schemas" / "report.schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


def model_block(model_path: str | Path) -> dict[str, Any]:
    path = Path(model_path)
    return {"path": str(path), "sha256": sha256_file(path), "size_bytes": path.stat().st_size}


def new_report(
    kind: str,
    *,
    model_path: str | Path | None = None,
    input_spec: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A report skeleton with the environment filled in; callers append to `results`."""

    if kind not in KINDS:
        raise ValueError(f"unknown report kind {kind!r}")
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "tool": {"name": "lto", "version": __version__, "command": " ".join(["lto", *sys.argv[1:]])},
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "model": model_block(model_path) if model_path is not None else None,
        "input_spec": input_spec,
        "settings": settings or {},
        "results": [],
    }


def validate_report(report: Any, source: str = "report") -> None:
    """Raise LtoError naming the first schema violation and where it is."""
    import jsonschema

    if isinstance(report, dict) and report.get("schema_version") not in (None, SCHEMA_VERSION):
        raise UsageError(
            f"{source}: schema_version {report.get('schema_version')!r} is not supported "
            f"(this lto reads {SCHEMA_VERSION})",
            "re-create the report with this version of lto",
        )
    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(report))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise UsageError(f"{source} is not a valid lto report: at {where}: {error.message[:200]}")


def write_report(path: str | Path, report: dict[str, Any]) -> Path:
    """Validate, then write atomically: a reader never sees half a report."""
    validate_report(report, source=str(path))
    return write_json_atomic(path, report)


def load_report(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if not source.is_file():
        raise UsageError(f"report not found: {source}", "pass the JSON file a command wrote")
    try:
        report = json.loads(source.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source} is not JSON: {exc}") from exc
    validate_report(report, source=str(source))
    return report
