"""Load a stage by name: the stage registry, read from the runtime specs."""

from __future__ import annotations

import importlib

from optimize.errors import BackendUnavailable, UsageError, message_line
from optimize.runtimes.registry import stage_infos
from optimize.stage import Stage, StageSkipped


def load_stage(name: str) -> Stage:
    """Instantiate the stage registered as `name`.

    Raises StageSkipped (with the reason) when its module or a library it needs is not
    installed, and UsageError for a name nobody registered.
    """
    infos = stage_infos()
    if name not in infos:
        raise UsageError(f"unknown stage {name!r}", f"known stages: {', '.join(infos)}")
    module_name, _, class_name = infos[name].target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing == module_name:
            raise StageSkipped(
                f"stage {name} is not available in this build ({module_name} is missing)"
            ) from exc
        raise StageSkipped(f"needs the Python package {missing!r}, which is not installed") from exc
    except ImportError as exc:
        raise StageSkipped(f"cannot import {module_name}: {message_line(exc)}") from exc
    except BackendUnavailable as exc:
        raise StageSkipped(exc.one_line()) from exc
    cls = getattr(module, class_name, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise StageSkipped(f"{module_name} defines no stage class {class_name}")
    try:
        return cls()
    except BackendUnavailable as exc:
        raise StageSkipped(exc.one_line()) from exc


__all__ = ["load_stage"]
