"""The seeded-random sample models lto's tests, docs and benchmarks run on (built by build.py),
and variants of them (variants.py: a copy that does more work, for gate tests and benchmarks)."""
