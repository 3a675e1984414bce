"""lto: offline latency optimization for ONNX models.

The command line is `lto`; the same work from Python (each function documents an example)::

    import optimize

    result = optimize.optimize_model("model.onnx", target_ms=5, output="out/model")
    report = optimize.bench_model("out/model", time="5s")
    with optimize.load("out/model") as model:
        outputs = model.run({"input": batch})

Importing the package is cheap: the API loads on first use of one of its names (so a worker
process that imports one of lto's modules does not pay for the whole API), and heavy libraries
load when a function first needs them.
"""

from typing import Any

from optimize.version import __version__

_API = ("LoadedModel", "bench_model", "load", "optimize_model")


def __getattr__(name: str) -> Any:
    if name in _API:
        from optimize import api  # the one lazy import of lto's own: see the docstring

        return getattr(api, name)
    raise AttributeError(f"module 'optimize' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API's lazy names with the module's own (PEP 562), so `dir(optimize)` and completion
    in an interactive session list them before first use."""
    return sorted(set(globals()) | set(_API))


__all__ = ["LoadedModel", "__version__", "bench_model", "load", "optimize_model"]
