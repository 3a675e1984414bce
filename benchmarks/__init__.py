"""Benchmarks: scripts that back lto's speed claims, and the corpus of real pretrained models."""
