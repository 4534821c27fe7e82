"""Smoke test of the Bazel-built op library (``bazel build //ops:xmc_ops``).

Loads ``bazel-bin/ops/_xmc_ops.so`` (or the path given) through xmc_tf's
loader (``XMC_TF_LIBRARY_PATH``), prints its build record
(``_loader.build_info``) and the devices each op has kernels for, runs
``xmc_tf.ops.uniform_sparse_matmul`` and its gradients on a tiny input and
compares them with NumPy.  Exits 0 on success, 1 on a mismatch or when the
library cannot be loaded::

    python tools/bazel_smoke_test.py [--library bazel-bin/ops/_xmc_ops.so]
                                     [--expect-cuda {0,1}]

``--expect-cuda 1`` also requires the CUDA build (as .ci/run checks the pip
build): build record ``cuda`` true with its archs, GPU kernels registered for
the uniform-sparse (and sampled) ops, the nvcc launchers linked in and no
undefined ``cuda*`` symbol (the static CUDA runtime is linked in; checked
with ``nm`` when it exists).  ``--expect-cuda 0`` requires a CPU-only build.
No GPU is needed: kernel registrations do not depend on one being present.

Run it with the Python (and TensorFlow) the library was built against; the
repository root is put first on ``sys.path`` so ``import xmc_tf`` uses the
source tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reference(features, indices, weights, backward):
    """NumPy scores and gradients of uniform_sparse_matmul."""
    import numpy as np

    gathered = features[:, indices]                     # [batch, labels, fan_in]
    scores = np.einsum("blk,lk->bl", gathered, weights)
    grad_weights = np.einsum("bl,blk->lk", backward, gathered)
    grad_features = np.zeros_like(features)
    for j in range(indices.shape[0]):
        for k in range(indices.shape[1]):
            grad_features[:, indices[j, k]] += backward[:, j] * weights[j, k]
    return scores, grad_features, grad_weights


# Ops whose GPU kernels a CUDA build must register (ops/uniform_sparse,
# ops/sampled and ops/hinge, under `#if XMC_TF_WITH_CUDA`).
GPU_OPS = [
    "Xmc>UniformSparseMatmul",
    "Xmc>UniformSparseMatmulGradFeatures",
    "Xmc>UniformSparseMatmulGradWeights",
    "Xmc>UniformSparseSampledMatmul",
    "Xmc>UniformSparseSampledMatmulGradFeatures",
    "Xmc>UniformSparseSampledMatmulGradWeights",
    "Xmc>SquaredHingeLoss",
    "Xmc>SquaredHingeLossGrad",
]
# extern "C" launchers defined by the nvcc-compiled *.cu.cc files.
GPU_LAUNCHERS = ["XmcUniformSparseForwardGpuF32", "XmcSampledForwardGpuF32",
                 "XmcSquaredHingeLossGpuF32"]


def _dynamic_symbols(library, *flags):
    """Names from `nm -D <flags>`, or None without nm."""
    nm = shutil.which("nm")
    if not nm:
        return None
    out = subprocess.run([nm, "-D", *flags, library], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()}


def _check_cuda(library, info, kernel_devices, expect_cuda):
    """Failures of the CUDA (or CPU-only) expectation."""
    failures = []
    gpu_ops = sorted(op for op, devices in kernel_devices.items()
                     if "GPU" in devices)
    if not expect_cuda:
        if info.get("cuda") or gpu_ops:
            failures.append(f"expected a CPU-only build, got build record "
                            f"{info} and GPU kernels for {gpu_ops}")
        print(f"  CPU-only build (cuda {info.get('cuda')}, no GPU kernels)  "
              f"{'MISMATCH' if failures else 'ok'}")
        return failures
    if not info.get("cuda") or not info.get("cuda_archs"):
        failures.append(f"build record says no CUDA: {info}")
    missing = [op for op in GPU_OPS if op not in gpu_ops]
    if missing:
        failures.append(f"no GPU kernel registered for {missing}")
    print(f"  GPU kernels for {len(gpu_ops)} ops  "
          f"{'MISSING ' + str(missing) if missing else 'ok'}")
    defined = _dynamic_symbols(library, "--defined-only")
    if defined is None:
        print("  (no nm: launcher / CUDA runtime symbols not checked)")
        return failures
    absent = [s for s in GPU_LAUNCHERS if s not in defined]
    undefined_cuda = sorted(s for s in _dynamic_symbols(library,
                                                        "--undefined-only")
                            if s.startswith("cuda") or s.startswith("__cuda"))
    if absent:
        failures.append(f"nvcc launchers not linked in: {absent}")
    if undefined_cuda:
        failures.append(f"undefined CUDA runtime symbols (static cudart not "
                        f"linked in?): {undefined_cuda[:5]}")
    print(f"  nvcc launchers defined, no undefined cuda* symbol  "
          f"{'MISMATCH' if absent or undefined_cuda else 'ok'}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        default=os.path.join(ROOT, "bazel-bin", "ops", "_xmc_ops.so"),
        help="op library to test (default: %(default)s)")
    parser.add_argument(
        "--expect-cuda", choices=["0", "1"], default=None,
        help="require a CUDA build (1: GPU kernels registered, static CUDA "
             "runtime linked) or a CPU-only one (0); default: report only")
    args = parser.parse_args(argv)

    library = os.path.abspath(args.library)
    if not os.path.exists(library):
        print(f"FAIL: {library} does not exist; run `bazel build //ops:xmc_ops`",
              file=sys.stderr)
        return 1
    os.environ["XMC_TF_LIBRARY_PATH"] = library
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)

    import numpy as np
    import tensorflow as tf
    import xmc_tf
    from xmc_tf.errors import OpLibraryError
    from xmc_tf.ops import _loader

    try:
        module = _loader.load()
    except OpLibraryError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    if os.path.realpath(_loader.library_path()) != os.path.realpath(library):
        print(f"FAIL: xmc_tf loaded {_loader.library_path()}, not {library}",
              file=sys.stderr)
        return 1
    ops = sorted(n for n in dir(module) if n.startswith("xmc_"))
    ops = [n for n in ops if not n.endswith("_eager_fallback")]
    print(f"loaded {library} (TensorFlow {tf.__version__}, xmc_tf from "
          f"{os.path.dirname(xmc_tf.__file__)}): {len(ops)} ops")
    from tensorflow.python.framework import kernels
    kernel_devices = {}
    for kernel in kernels.get_all_registered_kernels().kernel:
        if kernel.op.startswith("Xmc>"):
            kernel_devices.setdefault(kernel.op, set()).add(kernel.device_type)
    for name in ops:
        op = "Xmc>" + "".join(p.capitalize() for p in name[4:].split("_"))
        devices = ",".join(sorted(kernel_devices.get(op, ()))) or "-"
        print(f"  {name:57s} {devices}")
    info = _loader.build_info(library)
    print(f"build record: {info}")

    failures = []
    if args.expect_cuda is not None:
        failures += _check_cuda(library, info, kernel_devices,
                                args.expect_cuda == "1")

    rng = np.random.default_rng(0)
    batch, num_features, num_labels, fan_in = 3, 7, 5, 4
    features = rng.standard_normal((batch, num_features)).astype(np.float32)
    features[1, 2] = 0.0
    indices = rng.integers(0, num_features, (num_labels, fan_in)).astype(np.int32)
    weights = rng.standard_normal((num_labels, fan_in)).astype(np.float32)
    backward = rng.standard_normal((batch, num_labels)).astype(np.float32)
    backward[backward < 0] = 0.0   # zeros, as the squared hinge produces

    x = tf.constant(features)
    w = tf.constant(weights)
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        scores = xmc_tf.ops.uniform_sparse_matmul(x, tf.constant(indices), w)
    grad_x, grad_w = tape.gradient(scores, [x, w],
                                   output_gradients=tf.constant(backward))

    want_scores, want_gx, want_gw = _reference(features, indices, weights,
                                               backward)
    for name, got, want in [("scores", scores, want_scores),
                            ("grad features", grad_x, want_gx),
                            ("grad weights", grad_w, want_gw)]:
        got = np.asarray(got)
        err = float(np.max(np.abs(got - want))) if got.shape == want.shape else None
        ok = err is not None and np.allclose(got, want, rtol=1e-5, atol=1e-5)
        print(f"  {name:14s} shape {got.shape}  max |diff| {err}  "
              f"{'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(name)

    # Out-of-range indices must fail cleanly, not crash.
    try:
        bad = indices.copy()
        bad[0, 0] = num_features
        xmc_tf.ops.uniform_sparse_matmul(x, tf.constant(bad), w)
        failures.append("out-of-range index accepted")
        print("  out-of-range index: accepted  MISMATCH")
    except tf.errors.InvalidArgumentError:
        print("  out-of-range index: InvalidArgumentError  ok")

    if failures:
        print("FAIL: " + ", ".join(failures), file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
