"""lto: offline latency optimization for ONNX models."""

__version__ = "0.1.0"
