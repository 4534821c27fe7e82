"""Tests of the uniform-sparse ops against a dense NumPy reference.

The reference builds the dense [num_features, num_labels] matrix W with
W[indices[j, k], j] += weights[j, k]; then scores = X @ W,
grad_features = G @ W.T, grad_weights[j, k] = sum_i G[i, j] X[i, idx[j, k]].
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.ops import _loader

lib = _loader.load()


def dense_weights(indices, weights, num_features):
    w = np.zeros((num_features, indices.shape[0]), np.float64)
    for j in range(indices.shape[0]):
        for k in range(indices.shape[1]):
            w[indices[j, k], j] += weights[j, k]
    return w


def reference(x, indices, weights, g):
    w = dense_weights(indices, weights, x.shape[1])
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    grad_w = np.einsum("ij,ijk->jk", g64, x64[:, indices])
    return x64 @ w, g64 @ w.T, grad_w


def make_case(rng, b, e, m, s, density=1.0, duplicates=False):
    x = rng.normal(size=(b, e)).astype(np.float32)
    if duplicates:
        indices = rng.integers(0, max(1, min(e, 2)), size=(m, s))
    else:
        indices = np.stack([rng.choice(e, size=s, replace=s > e)
                            for _ in range(m)]) if m else np.zeros((0, s))
    indices = indices.astype(np.int32)
    weights = rng.normal(size=(m, s)).astype(np.float32)
    g = rng.normal(size=(b, m)).astype(np.float32)
    g[rng.random((b, m)) >= density] = 0.0
    return x, indices, weights, g


def run_op(x, indices, weights, g):
    """Forward and both gradients through tf.GradientTape."""
    xt = tf.constant(x)
    wt = tf.constant(weights)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = xmc_tf.ops.uniform_sparse_matmul(xt, indices, wt)
    gx, gw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(g))
    return y.numpy(), gx.numpy(), gw.numpy()


CASES = {
    "random": dict(b=9, e=70, m=301, s=7),
    "fan_in_1": dict(b=5, e=20, m=33, s=1),
    "batch_1": dict(b=1, e=40, m=129, s=4),
    "labels_prime": dict(b=4, e=31, m=997, s=3),
    "fan_in_gt_features": dict(b=3, e=4, m=17, s=9),
    "duplicates": dict(b=6, e=50, m=40, s=8, duplicates=True),
    "zero_signal": dict(b=6, e=50, m=40, s=8, density=0.0),
    "dense_signal": dict(b=6, e=50, m=40, s=8, density=1.0),
    "sparse_signal": dict(b=32, e=300, m=500, s=16, density=0.01),
    # b < 2 * threads with many labels: the features gradient splits labels
    # into chunks with private buffers.
    "label_chunks": dict(b=1, e=64, m=9000, s=3, density=0.5),
    "label_chunks_b3": dict(b=3, e=64, m=9000, s=3, density=0.3),
}


def assert_case_matches_reference(name, cases):
    """The op's forward and both gradients on case ``cases[name]`` against
    the dense NumPy reference; returns ``(gx, gw)``."""
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    x, indices, weights, g = make_case(rng, **cases[name])
    y, gx, gw = run_op(x, indices, weights, g)
    ref_y, ref_gx, ref_gw = reference(x, indices, weights, g)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-5, atol=1e-4)
    return gx, gw


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_dense_reference(name):
    gx, gw = assert_case_matches_reference(name, CASES)
    if CASES[name].get("density", 1.0) == 0.0:
        assert not gx.any() and not gw.any()


def test_zero_sizes():
    rng = np.random.default_rng(0)
    for b, m in [(0, 5), (3, 0), (0, 0)]:
        x, indices, weights, g = make_case(rng, b, 6, m, 2)
        y, gx, gw = run_op(x, indices, weights, g)
        assert y.shape == (b, m) and gx.shape == (b, 6) and gw.shape == (m, 2)
        assert not y.any() and not gx.any() and not gw.any()


@pytest.mark.parametrize("dtype,tol", [(tf.float16, 2e-2), (tf.bfloat16, 1e-1)])
def test_reduced_precision(dtype, tol):
    rng = np.random.default_rng(1)
    x, indices, weights, g = make_case(rng, 5, 30, 50, 4, density=0.5)
    ref_y, ref_gx, ref_gw = reference(x, indices, weights, g)
    xt, wt, gt = (tf.cast(a, dtype) for a in (x, weights, g))
    y = xmc_tf.ops.uniform_sparse_matmul(xt, indices, wt)
    gx = lib.xmc_uniform_sparse_matmul_grad_features(gt, xt, indices, wt)
    gw = lib.xmc_uniform_sparse_matmul_grad_weights(gt, xt, indices)
    for got, ref in [(y, ref_y), (gx, ref_gx), (gw, ref_gw)]:
        assert got.dtype == dtype
        scale = np.abs(ref).max()
        np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), ref,
                                   atol=tol * scale)


def test_finite_differences():
    rng = np.random.default_rng(2)
    x, indices, weights, _ = make_case(rng, 3, 8, 11, 3)
    x, weights = x.astype(np.float32), weights.astype(np.float32)

    def f(a, w):
        return xmc_tf.ops.uniform_sparse_matmul(a, indices, w)

    theoretical, numerical = tf.test.compute_gradient(f, [x, weights], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=2e-2)


def test_graph_mode_and_shape_inference():
    rng = np.random.default_rng(3)
    x, indices, weights, g = make_case(rng, 4, 10, 12, 3)

    @tf.function(input_signature=[tf.TensorSpec([None, 10], tf.float32)])
    def f(a):
        y = xmc_tf.ops.uniform_sparse_matmul(a, indices, weights)
        assert y.shape.as_list() == [None, 12]
        return y

    np.testing.assert_allclose(f(x).numpy(), reference(x, indices, weights, g)[0],
                               rtol=1e-5, atol=1e-5)

    @tf.function
    def grads(a, w, up):
        with tf.GradientTape() as tape:
            tape.watch([a, w])
            y = xmc_tf.ops.uniform_sparse_matmul(a, indices, w)
        return tape.gradient(y, [a, w], output_gradients=up)

    gx, gw = grads(tf.constant(x), tf.constant(weights), tf.constant(g))
    _, ref_gx, ref_gw = reference(x, indices, weights, g)
    np.testing.assert_allclose(gx.numpy(), ref_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), ref_gw, rtol=1e-5, atol=1e-5)


def test_shape_function_rejects_mismatch_in_graph():
    with pytest.raises(ValueError, match="must be equal|Dimensions must be"):
        tf.function(lambda: xmc_tf.ops.uniform_sparse_matmul(
            tf.zeros([2, 3]), tf.zeros([4, 2], tf.int32),
            tf.zeros([4, 3])))()


# ---------------------------------------------------------------------------
# Validation: every kernel reports InvalidArgument naming the problem.

X = np.ones((2, 5), np.float32)
IDX = np.array([[0, 1], [2, 4], [3, 3]], np.int32)
W = np.ones((3, 2), np.float32)
G = np.ones((2, 3), np.float32)

ALL_OPS = {
    "forward": lambda x, i, w, g: lib.xmc_uniform_sparse_matmul(x, i, w),
    "grad_features": lambda x, i, w, g:
        lib.xmc_uniform_sparse_matmul_grad_features(g, x, i, w),
    "grad_weights": lambda x, i, w, g:
        lib.xmc_uniform_sparse_matmul_grad_weights(g, x, i),
    "grad": lambda x, i, w, g:
        lib.xmc_uniform_sparse_matmul_grad(g, x, i, w),
}


@pytest.mark.parametrize("op", sorted(ALL_OPS))
@pytest.mark.parametrize("bad_value", [5, 99, -1])
def test_out_of_range_index(op, bad_value):
    idx = IDX.copy()
    idx[1, 1] = bad_value
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[1, 1\] = {bad_value} is out of range \[0, 5\)"):
        ALL_OPS[op](X, idx, W, G)


@pytest.mark.parametrize("bad_value", [5, 99, -1])
def test_forward_checks_every_index_gradients_those_they_read(bad_value):
    """The forward reads every index, so it rejects a bad one whatever the
    signal; a gradient reads the indices of the labels with a non-zero
    signal only: with an all-zero signal it returns zeros."""
    idx = IDX.copy()
    idx[1, 1] = bad_value
    g = np.zeros_like(G)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        ALL_OPS["forward"](X, idx, W, g)
    for op in ("grad_features", "grad_weights", "grad"):
        out = ALL_OPS[op](X, idx, W, g)
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            assert not t.numpy().any(), op


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_wrong_rank(op):
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank|must be"):
        ALL_OPS[op](X, IDX.reshape(-1), W, G)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank|must be"):
        ALL_OPS[op](X.reshape(-1), IDX, W, G)


def test_weights_shape_mismatch():
    for op in ("forward", "grad_features", "grad"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="weights shape"):
            ALL_OPS[op](X, IDX, W[:2], G)


@pytest.mark.parametrize("op", ["grad_features", "grad_weights", "grad"])
def test_backward_shape_mismatch(op):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"backward shape|Dimensions must be"):
        ALL_OPS[op](X, IDX, W, G[:, :2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"backward shape|Dimensions must be"):
        ALL_OPS[op](X, IDX, W, G[:1])


def test_wrong_dtypes():
    # Tensors (not NumPy arrays, which TF would convert) of unsupported dtypes.
    x, idx, w = tf.constant(X), tf.constant(IDX), tf.constant(W)
    bad = [(x, tf.cast(idx, tf.int64), w),
           (tf.cast(x, tf.float64), idx, tf.cast(w, tf.float64)),
           (x, idx, tf.cast(w, tf.float16))]
    for args in bad:
        with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
            lib.xmc_uniform_sparse_matmul(*args)


# ---------------------------------------------------------------------------
# SavedModel round trip in a new process.

def test_saved_model_new_process(tmp_path):
    rng = np.random.default_rng(4)
    x, indices, weights, g = make_case(rng, 3, 12, 20, 4)

    class Scorer(tf.Module):
        def __init__(self):
            self.indices = tf.Variable(indices, trainable=False)
            self.weights = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 12], tf.float32)])
        def __call__(self, a):
            return xmc_tf.ops.uniform_sparse_matmul(a, self.indices, self.weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 12], tf.float32),
                                      tf.TensorSpec([None, 20], tf.float32)])
        def grads(self, a, up):
            with tf.GradientTape() as tape:
                tape.watch(a)
                y = xmc_tf.ops.uniform_sparse_matmul(a, self.indices, self.weights)
            return tape.gradient(y, [a, self.weights], output_gradients=up)

    path = str(tmp_path / "scorer")
    tf.saved_model.save(Scorer(), path)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "g.npy", g)
    script = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        import xmc_tf  # loads the op library and registers the gradient
        m = tf.saved_model.load({path!r})
        x = np.load({str(tmp_path / "x.npy")!r}); g = np.load({str(tmp_path / "g.npy")!r})
        np.save({str(tmp_path / "y.npy")!r}, m(x).numpy())
        gx, gw = m.grads(x, g)
        np.save({str(tmp_path / "gx.npy")!r}, gx.numpy())
        np.save({str(tmp_path / "gw.npy")!r}, gw.numpy())
        """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([sys.executable, "-c", script], check=True, env=env)
    ref_y, ref_gx, ref_gw = reference(x, indices, weights, g)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "gx.npy"), ref_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "gw.npy"), ref_gw, rtol=1e-5, atol=1e-5)


def test_missing_library_error(tmp_path):
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore")
        import xmc_tf
        try:
            xmc_tf.ops.uniform_sparse_matmul([[1.0]], [[0]], [[1.0]])
        except xmc_tf.errors.OpLibraryError as e:
            print("ERR:", e)
        """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               XMC_TF_LIBRARY_PATH=str(tmp_path / "nope.so"))
    out = subprocess.run([sys.executable, "-c", script], check=True, env=env,
                         capture_output=True, text=True).stdout
    assert "ERR:" in out and "nope.so does not exist" in out


def _skip_zeros_reference(x, indices, g):
    """grad_weights with the documented zero-skip semantics, in float64:
    grad_weights[j, k] = sum over i with g[i, j] != 0 of
    g[i, j] * x[i, indices[j, k]] (a zero g[i, j] contributes exactly 0, even
    against an inf/NaN feature)."""
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    gathered = x64[:, indices]                     # [b, m, s]
    with np.errstate(invalid="ignore"):
        terms = g64[:, :, None] * gathered
    terms[np.broadcast_to((g64 == 0)[:, :, None], terms.shape)] = 0.0
    return terms.sum(axis=0)


# (batch, num_features, density): which CPU path computes grad_weights
# depends on the density of backward (see uniform_sparse_grad_plan.h).
@pytest.mark.parametrize("b,e,density", [
    (64, 8, 1.0),      # transposed features, dense dot product per label
    (64, 8, 0.1),      # transposed features, dense or sparse per label
    (64, 8, 0.05),     # instance-major: gathers from features rows
    (64, 3000, 0.05),  # instance-major, wider rows
    (64, 8, 0.0),      # all-zero columns: zeros without reading indices
])
def test_grad_weights_zero_signal_against_non_finite_features(b, e, density):
    """Regression (issue 14): the weight gradient was NaN or finite for the
    same inputs depending on the density of backward (0 * inf in the dense
    dot product, skipped in the sparse path)."""
    rng = np.random.default_rng(int(density * 100) + e)
    m, s = 40, 4
    x = rng.normal(size=(b, e)).astype(np.float32)
    indices = rng.integers(0, min(e, 8), size=(m, s)).astype(np.int32)
    x[3, :8] = np.inf
    x[5, :8] = np.nan
    x[7, :8] = -np.inf
    g = rng.normal(size=(b, m)).astype(np.float32)
    g[rng.random((b, m)) >= density] = 0.0
    g[3, :] = 0.0           # zero signal against inf features: contributes 0
    g[5, :] = 0.0           # ... against NaN features
    g[7, : m // 2] = 0.0    # -inf features with signal on half the labels
    gw = lib.xmc_uniform_sparse_matmul_grad_weights(
        backward=g, features=x, indices=indices).numpy()
    weights = np.ones(indices.shape, np.float32)
    _, fused_gw = lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights)
    np.testing.assert_array_equal(fused_gw.numpy(), gw)
    ref = _skip_zeros_reference(x, indices, g)
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(gw), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(gw), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(gw[finite], ref[finite], rtol=1e-5, atol=1e-4)
    if density > 0:
        # Labels with signal only from the finite rows stay finite.
        assert finite[: m // 2].all()
    # Every backward entry that multiplies a non-finite feature is zero on
    # the first half of the labels, so their gradient is finite in all paths.
    assert np.isfinite(gw[: m // 2]).all()


def test_grad_features_zero_signal_against_non_finite_weights():
    """The features gradient skips zero backward entries too: a zero
    backward[i, j] never multiplies an inf/NaN weight of label j."""
    rng = np.random.default_rng(14)
    b, e, m, s = 6, 10, 30, 3
    x, indices, weights, g = make_case(rng, b, e, m, s)
    weights[2, :] = np.inf
    weights[4, :] = np.nan
    g[:, 2] = 0.0
    g[:, 4] = 0.0
    gx = lib.xmc_uniform_sparse_matmul_grad_features(
        backward=g, features=x, indices=indices, weights=weights).numpy()
    fused_gx, _ = lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights)
    np.testing.assert_array_equal(fused_gx.numpy(), gx)
    w_ok = weights.copy()
    w_ok[2, :] = w_ok[4, :] = 0.0
    _, ref_gx, _ = reference(x, indices, w_ok, g)
    assert np.isfinite(gx).all()
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
def test_sparse_signal_against_non_finite_weights_and_features(
        isa, monkeypatch):
    """The instance-major path (a sparse signal, several spans of labels):
    only the non-zero backward entries multiply inf / NaN weights and
    features."""
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(16)
    b, e, m, s = 32, 40, 1100, 32
    x, indices, weights, g = make_case(rng, b, e, m, s, density=0.02)
    weights[2, :] = np.inf
    weights[700, 5] = np.nan
    x[3, :] = np.inf
    g[3, :] = 0.0        # zero signal against inf features
    g[:, 2] = 0.0
    g[5, 2] = 1.0        # one non-zero against the inf weights of label 2
    g[:, 700] = 0.0      # no signal against the NaN weight
    gx, gw = (t.numpy() for t in lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights))
    ref_gw = _skip_zeros_reference(x, indices, g)
    ref_gx = np.zeros((b, e))
    for i, j in zip(*np.nonzero(g)):
        np.add.at(ref_gx[i], indices[j], float(g[i, j]) * weights[j])
    for got, ref in ((gx, ref_gx), (gw, ref_gw)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-5,
                                   atol=1e-4)
    assert np.isinf(gx[5]).any() and np.isfinite(np.delete(gx, 5, 0)).all()
    assert np.isfinite(gw).all()


# Every instruction set of the CPU loops (uniform_sparse_cpu_loops.h;
# XMC_TF_CPU_ISA can only lower the detected one), on cases that reach the
# tiled paths: batches that are not a multiple of 16 (padding), wider than
# one register block (b = 70: 64 + a 16-float tail with AVX-512), fan-ins
# with tails (17 = 16 + 1 connections per reduction, 4 + 1 per unrolled
# step), and the sparse per-instance path of the features gradient.
ISA_CASES = {
    "b70_s17": dict(b=70, e=90, m=77, s=17),
    "b33_s3": dict(b=33, e=20, m=40, s=3, density=0.5),
    "b1": dict(b=1, e=40, m=129, s=4),
    "b16_s96": dict(b=16, e=200, m=20, s=96),
    "sparse": dict(b=32, e=300, m=500, s=16, density=0.01),
    "duplicates": dict(b=20, e=50, m=40, s=8, duplicates=True),
}


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
@pytest.mark.parametrize("name", sorted(ISA_CASES))
def test_every_cpu_instruction_set_matches_reference(isa, name, monkeypatch):
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    assert_case_matches_reference(name, ISA_CASES)


@pytest.mark.parametrize("isa", ["base", "avx512"])
def test_grad_features_partly_zero_column_against_non_finite_weight(
        isa, monkeypatch):
    """A dense signal (the tiled features gradient) on a label with inf / NaN
    weights: only its non-zero backward entries multiply them."""
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(15)
    b, e, m, s = 40, 12, 50, 5
    x, indices, weights, g = make_case(rng, b, e, m, s)
    weights[2, :] = np.inf
    weights[4, 1] = np.nan
    g[:20, 2] = 0.0
    g[:30, 4] = 0.0
    gx = lib.xmc_uniform_sparse_matmul_grad_features(
        backward=g, features=x, indices=indices, weights=weights).numpy()
    ref = np.zeros((b, e))
    for i in range(b):
        for j in range(m):
            if g[i, j] != 0:
                for k in range(s):
                    ref[i, indices[j, k]] += float(g[i, j]) * float(weights[j, k])
    assert np.isfinite(gx[:20]).all()
    np.testing.assert_array_equal(np.isnan(gx), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(gx), np.isposinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(gx[finite], ref[finite], rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------
# The fused gradient (Xmc>UniformSparseMatmulGrad, the registered gradient)
# and the signal paths of the CPU kernels, by the estimated density of the
# signal: instance-major over its non-zeros (sparse), or a pass over label
# blocks with the signal loaded as dense columns and per label the
# vectorised loops (many non-zeros) or one update per non-zero (few).

def mixed_signal(rng, b, m, head, head_density, tail_density):
    """[b, m] signal whose first `head` label columns have `head_density`
    non-zeros and the rest `tail_density` (head and tail labels, as the
    squared hinge leaves them)."""
    g = rng.normal(size=(b, m)).astype(np.float32)
    keep = rng.random((b, m)) < tail_density
    keep[:, :head] = rng.random((b, head)) < head_density
    g[~keep] = 0.0
    g[:, m - 1] = 0.0  # one all-zero column
    return g


SIGNAL_CASES = {
    # mean density 0.12: columns loaded dense; tail labels take the lists
    # built from their columns.
    "dense_mode_mixed": dict(b=128, e=300, m=400, s=9, head=50,
                             head_density=0.9, tail_density=0.01),
    # mean density < 1%: instance-major, dense head columns included.
    "sparse_mode_mixed": dict(b=128, e=300, m=400, s=9, head=3,
                              head_density=0.9, tail_density=0.002),
    "sparse_mode_b256": dict(b=256, e=64, m=300, s=32, head=0,
                             head_density=0.0, tail_density=0.01),
    "one_block_partial": dict(b=20, e=30, m=70, s=5, head=7,
                              head_density=1.0, tail_density=0.05),
    "b1": dict(b=1, e=30, m=300, s=5, head=100, head_density=1.0,
               tail_density=0.0),
    # Sparse signals over several spans of labels (instance-major path:
    # 512 labels a span at fan_in 32, 3264 at fan_in 5), so over several
    # threads' parts; the last span partial.
    "sparse_spans": dict(b=48, e=100, m=1700, s=32, head=0, head_density=0.0,
                         tail_density=0.01),
    "sparse_spans_s5": dict(b=20, e=40, m=7000, s=5, head=40,
                            head_density=0.9, tail_density=0.002),
}


@pytest.mark.parametrize("isa", ["base", "avx2"])
@pytest.mark.parametrize("name", sorted(SIGNAL_CASES))
def test_fused_gradient_matches_reference_and_separate_ops(name, isa,
                                                           monkeypatch):
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    case = dict(SIGNAL_CASES[name])
    rng = np.random.default_rng(sum(map(ord, name)))
    b, e, m, s = (case.pop(k) for k in ("b", "e", "m", "s"))
    x, indices, weights, _ = make_case(rng, b, e, m, s)
    g = mixed_signal(rng, b, m, **case)
    gx, gw = (t.numpy() for t in lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights))
    _, ref_gx, ref_gw = reference(x, indices, weights, g)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-5, atol=1e-4)
    assert (gw[m - 1] == 0).all()  # the all-zero column
    # The separate ops take the same paths: the same bits.
    np.testing.assert_array_equal(
        gx, lib.xmc_uniform_sparse_matmul_grad_features(
            backward=g, features=x, indices=indices, weights=weights).numpy())
    np.testing.assert_array_equal(
        gw, lib.xmc_uniform_sparse_matmul_grad_weights(
            backward=g, features=x, indices=indices).numpy())


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
def test_sparse_signal_duplicate_sources_over_spans(isa, monkeypatch):
    """Two connections of a label with the same source feature, on the
    sparse (instance-major) path over several spans: both updates land."""
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(43)
    x, indices, weights, g = make_case(rng, 32, 50, 1200, 32, density=0.01,
                                       duplicates=True)
    gx, gw = (t.numpy() for t in lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights))
    _, ref_gx, ref_gw = reference(x, indices, weights, g)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
@pytest.mark.parametrize("density", [0.0, 0.01, 0.1, 0.5])
def test_smallest_bad_index_over_spans(op, density):
    """Bad indices in two spans of labels (so in two threads' parts of the
    sparse path) of labels with signal, and one smaller in a label without:
    the forward names the smallest of all, a gradient the smallest it read
    (the signal's density picks the CPU path: instance-major below 1/16
    non-zero, blocks of labels above, with per-label scalar loops on
    columns of few non-zeros and vector loops on the others)."""
    rng = np.random.default_rng(7)
    x, indices, weights, g = make_case(rng, 64, 64, 2000, 32, density=density)
    indices[1500, 3] = 64
    indices[700, 20] = -5
    indices[300, 0] = 99
    g[2, [700, 1500]] = 1.0
    g[:, 300] = 0.0
    first = "300, 0\\] = 99" if op == "forward" else "700, 20\\] = -5"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[{first} is out of range \[0, 64\)"):
        ALL_OPS[op](x, indices, weights, g)


@pytest.mark.parametrize("isa", ["base", "avx512"])
@pytest.mark.parametrize("density", [0.01, 0.1, 0.5, 1.0])
def test_gradients_skip_bad_indices_of_labels_without_signal(
        isa, density, monkeypatch):
    """Labels whose backward column is zero may hold any index (it is not
    read): both gradients equal the dense reference of the same connections
    with those labels' indices replaced by valid ones, on every CPU path."""
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(11)
    x, indices, weights, g = make_case(rng, 48, 40, 3000, 8, density=density)
    silent = rng.choice(3000, size=200, replace=False)
    g[:, silent] = 0.0
    valid = indices.copy()
    indices[silent, rng.integers(0, 8, size=200)] = rng.choice(
        [-7, 40, 2 ** 31 - 1], size=200)
    gx, gw = (t.numpy() for t in lib.xmc_uniform_sparse_matmul_grad(
        backward=g, features=x, indices=indices, weights=weights))
    _, ref_gx, ref_gw = reference(x, valid, weights, g)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        lib.xmc_uniform_sparse_matmul_grad_weights(g, x, indices).numpy(),
        ref_gw, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        lib.xmc_uniform_sparse_matmul_grad_features(
            g, x, indices, weights).numpy(), ref_gx, rtol=1e-5, atol=1e-4)


def test_fused_gradient_reduced_precision():
    rng = np.random.default_rng(21)
    x, indices, weights, g = make_case(rng, 40, 50, 300, 6, density=0.02)
    for dtype, tol in ((tf.float16, 2e-2), (tf.bfloat16, 5e-2)):
        gx, gw = lib.xmc_uniform_sparse_matmul_grad(
            tf.cast(g, dtype), tf.cast(x, dtype), indices,
            tf.cast(weights, dtype))
        assert gx.dtype == dtype and gw.dtype == dtype
        _, ref_gx, ref_gw = reference(
            tf.cast(tf.cast(x, dtype), tf.float32).numpy(), indices,
            tf.cast(tf.cast(weights, dtype), tf.float32).numpy(),
            tf.cast(tf.cast(g, dtype), tf.float32).numpy())
        np.testing.assert_allclose(tf.cast(gx, tf.float32).numpy(), ref_gx,
                                   rtol=tol, atol=tol)
        np.testing.assert_allclose(tf.cast(gw, tf.float32).numpy(), ref_gw,
                                   rtol=tol, atol=tol)


def test_registered_gradient_uses_the_fused_op():
    x = tf.constant(X)
    w = tf.constant(W)

    @tf.function
    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = xmc_tf.ops.uniform_sparse_matmul(x, IDX, w)
        return tape.gradient(y, [x, w])

    graph = grads.get_concrete_function(x, w).graph
    types = {op.type for op in graph.get_operations()}
    assert "Xmc>UniformSparseMatmulGrad" in types
    assert "Xmc>UniformSparseMatmulGradFeatures" not in types


@pytest.mark.parametrize("density", [0.002, 0.3])
def test_16_bit_weights_widened_where_read(density):
    # bfloat16 weights are widened a tile / span / label at a time, the
    # rows the signal reads only: labels without signal hold NaN weights,
    # which must reach neither gradient (and the forward's scores of the
    # other labels), over many tiles and spans.
    rng = np.random.default_rng(23)
    x, indices, weights, g = make_case(rng, 24, 64, 3000, 8, density=density)
    g[:, ::7] = 0.0
    silent = ~(g != 0).any(axis=0)
    assert silent.any() and (~silent).any()
    weights[silent] = np.nan
    rounded = [tf.cast(tf.cast(a, tf.bfloat16), tf.float32).numpy()
               for a in (x, weights, g)]
    ref_y, ref_gx, ref_gw = reference(rounded[0], indices,
                                      np.nan_to_num(rounded[1]), rounded[2])
    xt, wt, gt = (tf.cast(a, tf.bfloat16) for a in (x, weights, g))
    gx, gw = lib.xmc_uniform_sparse_matmul_grad(gt, xt, indices, wt)
    y = xmc_tf.ops.uniform_sparse_matmul(xt, indices, wt)
    got_y = tf.cast(y, tf.float32).numpy()
    assert np.isnan(got_y[:, silent]).all()
    for got, ref in ((got_y[:, ~silent], ref_y[:, ~silent]), (gx, ref_gx),
                     (gw, ref_gw)):
        got = tf.cast(got, tf.float32).numpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=2e-2,
                                   atol=2e-2 * np.abs(ref).max())
