"""Smoke test of the Bazel-built op library (``bazel build //ops:xmc_ops``).

Loads ``bazel-bin/ops/_xmc_ops.so`` (or the path given) through xmc_tf's
loader (``XMC_TF_LIBRARY_PATH``), runs ``xmc_tf.ops.uniform_sparse_matmul``
and its gradients on a tiny input and compares them with NumPy.  Exits 0 on
success, 1 on a mismatch or when the library cannot be loaded::

    python tools/bazel_smoke_test.py [--library bazel-bin/ops/_xmc_ops.so]

Run it with the Python (and TensorFlow) the library was built against; the
repository root is put first on ``sys.path`` so ``import xmc_tf`` uses the
source tree.
"""

from __future__ import annotations

import argparse
import os
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        default=os.path.join(ROOT, "bazel-bin", "ops", "_xmc_ops.so"),
        help="op library to test (default: %(default)s)")
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
    from xmc_tf.ops import _loader

    try:
        module = _loader.load()
    except _loader.OpLibraryError as e:
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
    for name in ops:
        print(f"  {name}")

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
    failures = []
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
