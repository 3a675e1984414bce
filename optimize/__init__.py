"""lto: offline latency optimization for ONNX models.

The command line is `lto`; the same work from Python (each function documents an example)::

    import optimize

    result = optimize.optimize_model("model.onnx", target_ms=5, output="out/model")
    report = optimize.bench_model("out/model", time="5s")
    with optimize.load("out/model") as model:
        outputs = model.run({"input": batch})

Importing the package is cheap: heavy libraries load when a function first needs them.
"""

from optimize.api import LoadedModel, bench_model, load, optimize_model

__version__ = "0.1.0"

__all__ = ["LoadedModel", "__version__", "bench_model", "load", "optimize_model"]
