#!/usr/bin/env bash
# Offline Bazel build of the op library, then a smoke test of the result.
#
#   .ci/bazel.sh [extra bazel build flags...]
#
# 1. Installs Debian's bazel-bootstrap (Bazel 4.2.3) with apt-get when no
#    `bazel` is on PATH (needs root or sudo; apt-get update only when the
#    package is unknown).
# 2. bazel build //ops:xmc_ops  ->  bazel-bin/ops/_xmc_ops.so, against the
#    TensorFlow of $PYTHON_BIN_PATH (default: the active virtual environment's
#    python, else python3 on PATH).  Nothing is downloaded (see .bazelrc).
#    CUDA as for pip (tools/build_ops.py): with nvcc on PATH (or $NVCC) the
#    build requires CUDA (XMC_TF_CUDA=1: nvcc launchers, GPU kernel
#    registrations, static CUDA runtime; third_party/cuda/); without nvcc it
#    is CPU only (XMC_TF_CUDA=0), and says so.  XMC_TF_CUDA=0|1 set by the
#    caller wins.
# 3. tools/bazel_smoke_test.py: loads that library through xmc_tf
#    (XMC_TF_LIBRARY_PATH) and checks uniform_sparse_matmul against NumPy;
#    with CUDA also that the library's build record says cuda (as .ci/run
#    checks the pip build) and that the GPU kernels are registered and the
#    CUDA runtime linked in (--expect-cuda; no GPU needed).
#
# Idempotent: a second run finds bazel installed and the build up to date.
# Prints the time of each step.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

declare -a TIMINGS=()
step_start() { STEP_NAME="$1"; STEP_T0=$(date +%s.%N); echo "=== ${STEP_NAME}"; }
step_end() {
  local dt
  dt=$(awk -v a="${STEP_T0}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  TIMINGS+=("$(printf '%-38s %7s s' "${STEP_NAME}" "${dt}")")
  echo "=== ${STEP_NAME}: ${dt} s"
}

# --- 1. bazel ---------------------------------------------------------------
step_start "bazel install"
if command -v bazel >/dev/null 2>&1; then
  echo "found $(command -v bazel) ($(bazel --version 2>/dev/null || echo 'version unknown'))"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "bazel missing; need root or sudo to apt-get install bazel-bootstrap" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache policy bazel-bootstrap 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    ${SUDO} apt-get update -q
  fi
  ${SUDO} apt-get install -y -q bazel-bootstrap
  command -v bazel >/dev/null 2>&1 || { echo "apt-get installed bazel-bootstrap but no bazel on PATH" >&2; exit 1; }
fi
step_end

# --- 2. build -----------------------------------------------------------------
if [ -z "${PYTHON_BIN_PATH:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "${VIRTUAL_ENV}/bin/python" ]; then
    PYTHON_BIN_PATH="${VIRTUAL_ENV}/bin/python"
  else
    PYTHON_BIN_PATH="$(command -v python3 || command -v python || true)"
  fi
fi
if [ -z "${PYTHON_BIN_PATH}" ] || ! TF_CPP_MIN_LOG_LEVEL=3 "${PYTHON_BIN_PATH}" -c "import tensorflow" >/dev/null 2>&1; then
  echo "no Python with TensorFlow: set PYTHON_BIN_PATH or activate the venv (tried '${PYTHON_BIN_PATH}')" >&2
  exit 1
fi
export PYTHON_BIN_PATH
echo "PYTHON_BIN_PATH=${PYTHON_BIN_PATH}"

# CUDA or not: @local_config_cuda (third_party/cuda/cuda_configure.bzl) reads
# XMC_TF_CUDA from this environment.  "auto" is made explicit here so that
# nvcc without a usable toolkit fails the build instead of quietly building
# CPU only.
CUDA_WHY="XMC_TF_CUDA=${XMC_TF_CUDA:-}"
case "${XMC_TF_CUDA:-auto}" in
  0|1) ;;
  auto)
    if [ -n "${NVCC:-}" ] || command -v nvcc >/dev/null 2>&1; then
      XMC_TF_CUDA=1 CUDA_WHY="nvcc found"
    else
      XMC_TF_CUDA=0 CUDA_WHY="no nvcc on PATH"
    fi ;;
  *) echo "XMC_TF_CUDA must be auto, 0 or 1 (got '${XMC_TF_CUDA}')" >&2; exit 1 ;;
esac
export XMC_TF_CUDA
if [ "${XMC_TF_CUDA}" = 1 ]; then
  echo "CUDA (${CUDA_WHY}): building the CUDA kernels too, nvcc" \
       "$(command -v "${NVCC:-nvcc}" || echo "${NVCC:-nvcc}"), archs ${XMC_TF_CUDA_ARCHS:-75;80;86;89;90}"
else
  echo "CUDA off (${CUDA_WHY}): CPU-only build, no GPU kernels"
fi

step_start "bazel build //ops:xmc_ops ($([ "${XMC_TF_CUDA}" = 1 ] && echo CUDA || echo CPU only))"
bazel build //ops:xmc_ops "$@"
step_end

# --- 3. smoke test --------------------------------------------------------------
step_start "smoke test"
"${PYTHON_BIN_PATH}" tools/bazel_smoke_test.py --library bazel-bin/ops/_xmc_ops.so \
  --expect-cuda "${XMC_TF_CUDA}"
step_end

echo "=== timings"
printf '%s\n' "${TIMINGS[@]}"
