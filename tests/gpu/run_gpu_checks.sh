#!/usr/bin/env bash
# One command for a GPU machine without TensorFlow: builds the uniform-sparse
# CUDA launchers alone for the local GPU (tools/build_cuda_harness.py, nvcc
# -arch=native), runs the CuPy/ctypes tests (tests/gpu), then the benchmark
# (benchmarks/uniform_sparse_gpu.py).
#
# Usage (from anywhere):
#   bash tests/gpu/run_gpu_checks.sh            # full benchmark (a few minutes)
#   bash tests/gpu/run_gpu_checks.sh --quick    # extra args go to the benchmark
#
# Needs: nvcc, python3 with numpy, cupy and pytest.  Environment:
#   OUT        output folder (default /tmp/xmc_gpu_out): build.log,
#              nvidia-smi.txt, pytest.log, pytest.xml, benchmark.txt,
#              uniform_sparse_gpu.json
#   PYTHON     interpreter (default python3)
#   BUILD_DIR  where the harness library goes (default /tmp/xmc_gpu_build)
#   XMC_CUDA_HARNESS_LIB, XMC_HINGE_CUDA_LIB, XMC_SAMPLED_CUDA_LIB
#              prebuilt harness libraries (uniform-sparse, hinge, sampled;
#              e.g. built elsewhere with tools/build_cuda_harness.py --archs
#              90): used instead of building here when set
#   SANITIZE   1: also run the uniform-sparse tests of float32 at 10 %
#              density under compute-sanitizer (memcheck), if installed
# Exit status: 0 when the build, the tests and the benchmark all succeeded.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${OUT:-/tmp/xmc_gpu_out}"
BUILD_DIR="${BUILD_DIR:-/tmp/xmc_gpu_build}"
PY="${PYTHON:-python3}"
LIB="${XMC_CUDA_HARNESS_LIB:-$BUILD_DIR/libxmc_uniform_sparse_cuda.so}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR" "$BUILD_DIR"
cd "$ROOT"

nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1 || true

if [[ -n "${XMC_CUDA_HARNESS_LIB:-}" && -f "$LIB" ]]; then
  echo "== prebuilt $LIB" | tee "$OUT_DIR/build.log"
else
  echo "== build ($LIB)"
  if ! "$PY" tools/build_cuda_harness.py --archs native --output "$LIB" \
      2>&1 | tee "$OUT_DIR/build.log"; then
    echo "BUILD FAILED (see $OUT_DIR/build.log)"
    exit 1
  fi
fi

echo "== tests"
# --confcutdir: only tests/gpu/conftest.py is loaded (a conftest higher up
# may import TensorFlow, which this machine lacks).
XMC_CUDA_HARNESS_LIB="$LIB" "$PY" -m pytest tests/gpu -v -rs \
  -p no:cacheprovider -o addopts="" --confcutdir="$ROOT/tests/gpu" \
  --junitxml="$OUT_DIR/pytest.xml" 2>&1 | tee "$OUT_DIR/pytest.log"
tests_rc=${PIPESTATUS[0]}

if [[ "${SANITIZE:-0}" == 1 ]] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck)"
  XMC_CUDA_HARNESS_LIB="$LIB" compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$PY" -m pytest tests/gpu/test_uniform_sparse_cuda.py \
    -q -p no:cacheprovider -o addopts="" --confcutdir="$ROOT/tests/gpu" \
    -k "matches_reference and 0.1 or zero_signal or bad_index" \
    2>&1 | tail -40 | tee "$OUT_DIR/sanitizer.log"
  sanitize_rc=${PIPESTATUS[0]}
  echo "compute-sanitizer rc=$sanitize_rc"
  [[ $sanitize_rc -eq 0 ]] || tests_rc=$sanitize_rc
fi

echo "== benchmark"
"$PY" benchmarks/uniform_sparse_gpu.py --lib "$LIB" \
  --out "$OUT_DIR/uniform_sparse_gpu.json" "$@" 2>&1 \
  | tee "$OUT_DIR/benchmark.txt"
bench_rc=${PIPESTATUS[0]}

echo "== summary: tests rc=$tests_rc, benchmark rc=$bench_rc; outputs in $OUT_DIR"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
