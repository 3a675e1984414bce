"""What lto's tests and benchmarks drive it with, kept out of the wheel: a raw-socket KServe v2
load generator (raw_load) and a real Triton server fetched from a PyPI wheel (tritonserver).
Nothing in `optimize` imports this package (import-linter checks it)."""
