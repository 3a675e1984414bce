#!/usr/bin/env bash
# The GPU check: one command on a machine with an NVIDIA GPU and lto's GPU extra installed.
#
#   scripts/gpu_check.sh [OUT_DIR]          # default: reports/gpu-check
#   PYTHON=/path/to/python scripts/gpu_check.sh
#
# 1. records the driver, the GPU and the GPU packages (OUT_DIR/summary.txt, nvidia-smi.txt);
# 2. runs tests/system/test_gpu_detection.py tests/runtimes/tensorrt tests/runtimes/onnxruntime/test_gpu_backend.py tests/runtimes/test_gpu_backends.py with its GPU-only tests (engine build + run vs ONNX Runtime, CUDA
#    graphs, refusal of a foreign engine, ORT CUDA fail-closed) -> gpu-tests.txt / .xml;
# 3. benchmarks TensorRT (fp32, fp16, with and without CUDA graphs) and ONNX Runtime CUDA against
#    ONNX Runtime CPU on sample_models/resnet_tiny.onnx -> gpu-compare.json / .md.
# Each step runs under `timeout`; the whole check stays under 8 minutes.
# Exit: 0 all passed, 1 a test or the benchmark failed, 3 no usable GPU here (nothing was run).
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT="${1:-reports/gpu-check}"
mkdir -p "$OUT"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
echo "lto GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), python: $PY" > "$SUMMARY"

timeout 30 nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi: not available or failed" >> "$SUMMARY"

"$PY" - >> "$SUMMARY" 2>&1 <<'PYEOF'
import importlib, importlib.metadata as md, json
from optimize.system.gpu import detect_gpu
status = detect_gpu()
print(json.dumps(status.to_json(), indent=2))
for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-rtx-cu12", "cuda-python",
             "cuda-bindings", "onnxruntime", "onnxruntime-gpu", "onnx", "numpy"):
    try:
        print(f"{dist}: {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
try:
    import onnxruntime as ort
    print("onnxruntime providers:", ort.get_available_providers())
except Exception as exc:
    print("onnxruntime:", exc)
raise SystemExit(0 if status.usable else 3)
PYEOF
probe=$?
cat "$SUMMARY"
if [ "$probe" -eq 3 ]; then
    echo "no usable NVIDIA GPU here (reason above): nothing to check" | tee -a "$SUMMARY"
    exit 3
elif [ "$probe" -ne 0 ]; then
    echo "the environment probe failed (is lto installed in $PY?)" | tee -a "$SUMMARY"
    exit 1
fi

failed=0
echo "== GPU tests" | tee -a "$SUMMARY"
timeout 240 "$PY" -m pytest tests/system/test_gpu_detection.py tests/runtimes/tensorrt tests/runtimes/onnxruntime/test_gpu_backend.py tests/runtimes/test_gpu_backends.py -q -rs -p no:cacheprovider \
    --junitxml "$OUT/gpu-tests.xml" > "$OUT/gpu-tests.txt" 2>&1
rc=$?
tail -n 25 "$OUT/gpu-tests.txt"
if [ "$rc" -ne 0 ]; then
    echo "GPU tests FAILED (pytest exit $rc)" | tee -a "$SUMMARY"
    failed=1
elif grep -q "SKIPPED.*needs an NVIDIA GPU" "$OUT/gpu-tests.txt"; then
    # On a GPU machine the GPU-only tests must run; a skip means TensorRT or cuda-python is missing.
    echo "GPU tests were SKIPPED: install the GPU extra (see docs/gpu.md)" | tee -a "$SUMMARY"
    failed=1
else
    echo "GPU tests passed: $(tail -n 1 "$OUT/gpu-tests.txt")" >> "$SUMMARY"
fi

echo "== benchmark" | tee -a "$SUMMARY"
timeout 210 "$PY" benchmarks/gpu_compare.py --out "$OUT/gpu-compare.json" --max-time-s 8 --require-gpu \
    > "$OUT/gpu-compare.txt" 2>&1
rc=$?
cat "$OUT/gpu-compare.txt"
if [ "$rc" -ne 0 ]; then
    echo "benchmark FAILED (exit $rc)" | tee -a "$SUMMARY"
    failed=1
else
    grep -A 20 "^| backend" "$OUT/gpu-compare.txt" >> "$SUMMARY"
fi

echo "finished in $(( $(date +%s) - START )) s; results in $OUT" | tee -a "$SUMMARY"
exit "$failed"
