"""Triton's vocabulary: model configuration values and what a runtime hands Triton."""
