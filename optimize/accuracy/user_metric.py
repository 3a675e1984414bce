"""The user's own metric (`--metric FILE.py:FUNCTION`): loaded, called on read-only outputs, its errors
said in one line."""

from __future__ import annotations

import importlib.util
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimize.accuracy.result import MetricError, Outputs
from optimize.errors import UsageError, first_line

USER_METRIC_SIGNATURE = (
    "def metric(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]], "
    "inputs: list[dict[str, np.ndarray]], labels: dict[str, np.ndarray] | None) -> tuple[float, bool]"
)


@dataclass
class UserMetric:
    """`--metric FILE.py:FUNCTION`, loaded. Called with the reference outputs, the candidate's,
    the inputs (one dict per sample each, read-only arrays) and the labels of --eval-data (its
    arrays that are not model inputs; None without). Returns (score, passed)."""

    spec: str
    path: Path
    function: str
    fn: Callable[..., Any]

    def __call__(
        self,
        reference: Sequence[Outputs],
        candidate: Sequence[Outputs],
        inputs: Sequence[Outputs],
        labels: Mapping[str, np.ndarray] | None,
    ) -> tuple[float, bool]:
        args = [_read_only(reference), _read_only(candidate), _read_only(inputs)]
        lab = {k: _frozen(v) for k, v in labels.items()} if labels is not None else None
        try:
            value = self.fn(*args, lab)
        except Exception as exc:
            raise MetricError(
                f"--metric {self.spec} raised {first_line(exc)}", f"it is called as {USER_METRIC_SIGNATURE}"
            ) from exc
        ok = isinstance(value, (tuple, list)) and len(value) == 2
        if ok:
            score, passed = value
            ok = isinstance(passed, (bool, np.bool_)) and isinstance(score, (int, float, np.number))
            ok = ok and not isinstance(score, (bool, np.bool_)) and math.isfinite(float(score))
        if not ok:
            raise MetricError(
                f"--metric {self.spec} returned {_short_repr(value)}",
                "return (score: float, passed: bool), e.g. return 0.97, True",
            )
        return float(score), bool(passed)


def _frozen(array: Any) -> Any:
    if isinstance(array, np.ndarray):
        view = array.view()
        view.flags.writeable = False  # the reference is reused for every candidate
        return view
    return array


def _read_only(samples: Sequence[Outputs]) -> list[dict[str, Any]]:
    return [{k: _frozen(v) for k, v in sample.items()} for sample in samples]


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_user_metric(spec: str) -> UserMetric:
    """Load `FILE.py:FUNCTION`; any problem with the file is a one-line usage error naming it."""
    file, sep, function = spec.rpartition(":")
    if not sep or not file or not function.isidentifier():
        raise UsageError(f"bad --metric {spec!r}", "write FILE.py:FUNCTION, e.g. --metric my_metric.py:score")
    path = Path(file)
    if not path.is_file():
        raise UsageError(f"--metric file not found: {path}")
    module_spec = importlib.util.spec_from_file_location(f"lto_user_metric_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--metric {path}: not a Python file", "give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UsageError(f"--metric {path}: syntax error on line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise UsageError(f"--metric {path}: importing it raised {first_line(exc)}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise UsageError(
            f"--metric {path} has no function {function!r}",
            f"its functions: {', '.join(found)}" if found else "define " + USER_METRIC_SIGNATURE,
        )
    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError:
        raise UsageError(
            f"--metric {path}:{function} does not take 4 arguments", "define " + USER_METRIC_SIGNATURE
        ) from None
    except ValueError:  # builtins without a signature: let the call tell
        pass
    return UserMetric(spec=f"{path.name}:{function}", path=path, function=function, fn=fn)
