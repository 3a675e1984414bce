"""The runtimes lto runs models on, one folder each.

A runtime folder holds everything that only makes sense for that runtime: its backend (how to
run a model or artifact), the stages that make candidates for it, its Triton mapping, its
helpers, and a `spec.py` that declares them (optimize.runtimes.spec). `registry.py` lists the
specs; `backends.py` opens a model in a runtime; `stages.py` loads a stage by name; `worker.py`
hosts any backend in a process of its own; `warmup.py` runs the batch shapes a server will form
once before its first request.
"""
