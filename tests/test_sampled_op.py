"""Tests of Xmc>UniformSparseSampledMatmul, its gradients and dense_sampled_matmul.

References: a float64 NumPy evaluation of the definitions
(scores[i, j] = sum_k x[i, idx[r, k]] w[r, k], r = cand[i, j]), the full
uniform-sparse op followed by ``tf.gather(..., batch_dims=1)``, and finite
differences.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras
import xmc_tf
from op_requirements import require_ops_for_module
from xmc_tf.ops import _loader

require_ops_for_module("xmc_uniform_sparse_sampled_matmul",
                       "xmc_uniform_sparse_sampled_matmul_grad_features",
                       "xmc_uniform_sparse_sampled_matmul_grad_weights")
lib = _loader.load()

forward_op = lib.xmc_uniform_sparse_sampled_matmul
grad_features_op = lib.xmc_uniform_sparse_sampled_matmul_grad_features
grad_weights_op = lib.xmc_uniform_sparse_sampled_matmul_grad_weights


# ---------------------------------------------------------------------------
# References and helpers.

def reference(x, idx, w, cand, g):
    """float64 (scores, grad_features, grad_values, dense grad_weights)."""
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    b, c = cand.shape
    m, s = idx.shape
    rows = idx[cand]                                   # [b, c, s]
    inst = np.broadcast_to(np.arange(b)[:, None, None], rows.shape)
    gathered = x[inst, rows]                           # x[i, idx[r, k]]
    w_rows = w[cand]                                   # [b, c, s]
    scores = np.einsum("bcs,bcs->bc", gathered, w_rows)
    grad_features = np.zeros_like(x)
    np.add.at(grad_features, (inst, rows), g[:, :, None] * w_rows)
    grad_values = (g[:, :, None] * gathered).reshape(b * c, s)
    grad_weights = np.zeros((m, s))
    np.add.at(grad_weights, cand.reshape(-1), grad_values)
    return scores, grad_features, grad_values, grad_weights


def make_case(rng, b, e, m, s, c, density=1.0, duplicates=False):
    x = rng.normal(size=(b, e)).astype(np.float32)
    idx = rng.integers(0, e, size=(m, s)).astype(np.int32)
    w = rng.normal(size=(m, s)).astype(np.float32)
    if duplicates:  # few labels: repeats within and across rows
        cand = rng.integers(0, min(m, 3), size=(b, c))
    else:
        cand = rng.integers(0, m, size=(b, c))
    cand = cand.astype(np.int32)
    g = rng.normal(size=(b, c)).astype(np.float32)
    g[rng.random((b, c)) >= density] = 0.0
    return x, idx, w, cand, g


def run(x, idx, w, cand, g):
    """Scores and both gradients through tf.GradientTape."""
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = xmc_tf.ops.uniform_sparse_sampled_matmul(xt, idx, wt, cand)
    gx, gw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(g))
    return y, gx, gw


CASES = {
    "random": dict(b=7, e=60, m=300, s=7, c=13),
    "fan_in_1": dict(b=5, e=20, m=33, s=1, c=4),
    "fan_in_33": dict(b=4, e=50, m=40, s=33, c=9),  # > 32: tail of 8-sums
    "one_candidate": dict(b=6, e=30, m=50, s=5, c=1),
    "duplicates": dict(b=6, e=40, m=30, s=8, c=10, duplicates=True),
    "zero_signal": dict(b=6, e=40, m=30, s=8, c=10, density=0.0),
    "sparse_signal": dict(b=16, e=200, m=500, s=16, c=40, density=0.05),
    # b < 2 * threads with many candidates: the feature gradient splits the
    # candidates into chunks with private buffers.
    "chunks_b1": dict(b=1, e=64, m=5000, s=4, c=4096, density=0.5),
    "chunks_b3": dict(b=3, e=64, m=5000, s=3, c=3000, density=0.3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_numpy_reference(name):
    assert_case_matches_reference(name)


def assert_case_matches_reference(name):
    """The op's scores and gradients on ``CASES[name]`` against the float64
    reference (the instruction set XMC_TF_CPU_ISA leaves)."""
    rng = np.random.default_rng(sorted(CASES).index(name))
    x, idx, w, cand, g = make_case(rng, **CASES[name])
    y, gx, gw = run(x, idx, w, cand, g)
    ref_y, ref_gx, ref_values, ref_gw = reference(x, idx, w, cand, g)
    np.testing.assert_allclose(y.numpy(), ref_y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gx.numpy(), ref_gx, rtol=1e-5, atol=1e-4)
    assert isinstance(gw, tf.IndexedSlices)
    np.testing.assert_array_equal(gw.indices.numpy(), cand.reshape(-1))
    np.testing.assert_array_equal(gw.dense_shape.numpy(), idx.shape)
    np.testing.assert_allclose(gw.values.numpy(), ref_values, rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(tf.convert_to_tensor(gw).numpy(), ref_gw,
                               rtol=1e-5, atol=1e-4)
    if CASES[name].get("density", 1.0) == 0.0:
        assert not gx.numpy().any() and not gw.values.numpy().any()


@pytest.mark.parametrize("duplicates", [False, True])
def test_matches_full_op_restricted_to_candidates(duplicates):
    """Forward = gather of the full scores; gradients = the full op's
    gradients for the upstream signal scattered to [b, m] (duplicates
    summed); the densified IndexedSlices is zero outside candidate rows."""
    rng = np.random.default_rng(10 + duplicates)
    x, idx, w, cand, g = make_case(rng, 5, 40, 60, 6, 12, density=0.7,
                                   duplicates=duplicates)
    if duplicates:
        cand[1] = cand[0]            # a row repeated across instances
        cand[2, :3] = cand[2, 0]     # repeated within a row
    y, gx, gw = run(x, idx, w, cand, g)

    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        full = xmc_tf.ops.uniform_sparse_matmul(xt, idx, wt)
        picked = tf.gather(full, cand, batch_dims=1)
    full_gx, full_gw = tape.gradient(picked, [xt, wt],
                                     output_gradients=tf.constant(g))
    np.testing.assert_allclose(y.numpy(), picked.numpy(), rtol=1e-6,
                               atol=1e-5)
    np.testing.assert_allclose(gx.numpy(), full_gx.numpy(), rtol=1e-5,
                               atol=1e-5)
    dense_gw = tf.convert_to_tensor(gw).numpy()
    np.testing.assert_allclose(dense_gw, tf.convert_to_tensor(full_gw).numpy(),
                               rtol=1e-5, atol=1e-5)
    outside = np.setdiff1d(np.arange(idx.shape[0]), cand)
    assert outside.size and not dense_gw[outside].any()


def test_zero_signal_skipping_gives_identical_results():
    """Zeroing entries of the signal gives exactly the gradient of the
    remaining entries (no stale reads), and a label row is not even read for
    a zero entry: a bad index there is not reported by the gradients."""
    rng = np.random.default_rng(3)
    x, idx, w, cand, g = make_case(rng, 8, 30, 40, 5, 10)
    g_sparse = g.copy()
    g_sparse[:, ::2] = 0.0
    _, gx, gw = run(x, idx, w, cand, g_sparse)
    _, ref_gx, ref_values, _ = reference(x, idx, w, cand, g_sparse)
    np.testing.assert_allclose(gx.numpy(), ref_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.values.numpy(), ref_values, rtol=1e-5,
                               atol=1e-5)
    assert not gw.values.numpy().reshape(8, 10, 5)[:, ::2].any()

    # Label 39 is scored only at (0, 0), whose signal is zero.
    cand = np.where(cand == 39, 38, cand).astype(np.int32)
    cand[0, 0] = 39
    bad_idx = idx.copy()
    bad_idx[39, 2] = 10_000
    g_skip = g.copy()
    g_skip[0, 0] = 0.0
    got_gx = grad_features_op(g_skip, x, bad_idx, w, cand).numpy()
    got_values = grad_weights_op(g_skip, x, bad_idx, cand).numpy()
    _, ref_gx, ref_values, _ = reference(x, idx, w, cand, g_skip)
    np.testing.assert_allclose(got_gx, ref_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_values, ref_values, rtol=1e-5, atol=1e-5)
    # With a non-zero signal at (0, 0) the same row is read and rejected.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[39, 2\] = 10000 .*candidates\[0, 0\]"):
        grad_weights_op(g, x, bad_idx, cand)


# Every instruction set of the CPU loops (ops/common/cpu_isa.h;
# XMC_TF_CPU_ISA can only lower the detected one, read per kernel call): the
# index check, the gathers (AVX2 hardware gathers on AVX2 / AVX-512, portable
# code on base) on cases with vector tails (fan-in 1, 7, 33), repeats, zero
# signals and the chunked feature gradient.
ISA_CASES = ("random", "fan_in_1", "fan_in_33", "duplicates", "sparse_signal",
             "chunks_b3")


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
@pytest.mark.parametrize("name", ISA_CASES)
def test_every_cpu_instruction_set_matches_reference(isa, name, monkeypatch):
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    assert_case_matches_reference(name)


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
def test_every_cpu_instruction_set_rejects_a_bad_index(isa, monkeypatch):
    """The index check of each instruction set, on a fan-in with a vector
    tail (33 = 32 + 1): the bad entry is the tail's."""
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(21)
    x, idx, w, cand, g = make_case(rng, 3, 40, 20, 33, 5)
    idx[cand[1, 2], 32] = 40
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[{cand[1, 2]}, 32\] = 40 "):
        forward_op(x, idx, w, cand)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[{cand[1, 2]}, 32\] = 40 "):
        grad_weights_op(g, x, idx, cand)


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(not {"avx2", "fma"} <= _cpu_flags(),
                    reason="needs an AVX2 + FMA CPU")
def test_instruction_set_switch_changes_the_summation(monkeypatch):
    """XMC_TF_CPU_ISA=base runs other code than the detected set: the
    portable dot product (4 partial sums) and the AVX2 one (16 lanes) do
    not round all sums of 37 products alike; both match the reference."""
    rng = np.random.default_rng(12)
    x, idx, w, cand, g = make_case(rng, 6, 50, 80, 37, 11, density=0.6)
    here = forward_op(x, idx, w, cand).numpy()
    monkeypatch.setenv("XMC_TF_CPU_ISA", "base")
    portable = forward_op(x, idx, w, cand).numpy()
    ref_y = reference(x, idx, w, cand, g)[0]
    np.testing.assert_allclose(portable, ref_y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(here, ref_y, rtol=1e-5, atol=1e-4)
    assert not np.array_equal(portable, here)


def test_finite_differences():
    rng = np.random.default_rng(4)
    x, idx, w, cand, _ = make_case(rng, 3, 8, 11, 3, 5, duplicates=True)

    def f(a, weights):
        return xmc_tf.ops.uniform_sparse_sampled_matmul(a, idx, weights, cand)

    theoretical, numerical = tf.test.compute_gradient(f, [x, w], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        assert np.abs(t).max() > 0
        np.testing.assert_allclose(t, n, atol=2e-2)


@pytest.mark.parametrize("dtype,tol", [(tf.float16, 2e-2), (tf.bfloat16, 1e-1)])
def test_reduced_precision(dtype, tol):
    rng = np.random.default_rng(5)
    x, idx, w, cand, g = make_case(rng, 5, 30, 50, 4, 7, density=0.5)
    refs = reference(x, idx, w, cand, g)[:3]
    xt, wt, gt = (tf.cast(a, dtype) for a in (x, w, g))
    got = [forward_op(xt, idx, wt, cand),
           grad_features_op(gt, xt, idx, wt, cand),
           grad_weights_op(gt, xt, idx, cand)]
    for value, ref in zip(got, refs):
        assert value.dtype == dtype
        np.testing.assert_allclose(tf.cast(value, tf.float32).numpy(), ref,
                                   atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("b,m,s,c", [(0, 5, 2, 3), (3, 5, 2, 0), (0, 5, 2, 0),
                                     (3, 0, 2, 0), (3, 5, 0, 4)])
def test_empty_sizes(b, m, s, c):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(b, 6)).astype(np.float32)
    idx = rng.integers(0, 6, size=(m, s)).astype(np.int32)
    w = rng.normal(size=(m, s)).astype(np.float32)
    cand = rng.integers(0, max(m, 1), size=(b, c)).astype(np.int32)
    g = np.ones((b, c), np.float32)
    y, gx, gw = run(x, idx, w, cand, g)
    assert y.shape == (b, c) and gx.shape == (b, 6)
    assert gw.values.shape == (b * c, s) and gw.indices.shape == (b * c,)
    assert not y.numpy().any() and not gx.numpy().any()
    assert not tf.convert_to_tensor(gw).numpy().any()


def test_graph_mode_and_shape_inference():
    rng = np.random.default_rng(7)
    x, idx, w, cand, g = make_case(rng, 4, 10, 12, 3, 5)

    @tf.function(input_signature=[tf.TensorSpec([None, 10], tf.float32),
                                  tf.TensorSpec([None, 5], tf.int32)])
    def f(a, cd):
        y = xmc_tf.ops.uniform_sparse_sampled_matmul(a, idx, w, cd)
        assert y.shape.as_list() == [None, 5]
        values = grad_weights_op(tf.ones_like(y), a, idx, cd)
        assert values.shape.as_list() == [None, 3]
        return y

    np.testing.assert_allclose(f(x, cand).numpy(),
                               reference(x, idx, w, cand, g)[0], rtol=1e-5,
                               atol=1e-5)

    @tf.function
    def shapes():
        y = forward_op(tf.zeros([4, 10]), idx, w, tf.zeros([4, 5], tf.int32))
        gv = grad_weights_op(tf.zeros([4, 5]), tf.zeros([4, 10]), idx,
                             tf.zeros([4, 5], tf.int32))
        gf = grad_features_op(tf.zeros([4, 5]), tf.zeros([4, 10]), idx, w,
                              tf.zeros([4, 5], tf.int32))
        assert y.shape.as_list() == [4, 5]
        assert gv.shape.as_list() == [20, 3]
        assert gf.shape.as_list() == [4, 10]
        return y

    shapes()


@pytest.mark.parametrize("call", [
    lambda: forward_op(tf.zeros([2, 3]), tf.zeros([4, 2], tf.int32),
                       tf.zeros([4, 3]), tf.zeros([2, 5], tf.int32)),
    lambda: forward_op(tf.zeros([2, 3]), tf.zeros([4, 2], tf.int32),
                       tf.zeros([4, 2]), tf.zeros([3, 5], tf.int32)),
    lambda: grad_features_op(tf.zeros([2, 4]), tf.zeros([2, 3]),
                             tf.zeros([4, 2], tf.int32), tf.zeros([4, 2]),
                             tf.zeros([2, 5], tf.int32)),
    lambda: grad_weights_op(tf.zeros([2, 5]), tf.zeros([2, 3]),
                            tf.zeros([4, 2], tf.int32),
                            tf.zeros([2, 5, 1], tf.int32)),
])
def test_shape_function_rejects_mismatch_in_graph(call):
    with pytest.raises(ValueError, match="must be equal|Dimensions must be|"
                                         "must be rank"):
        tf.function(call)()


# ---------------------------------------------------------------------------
# Validation in the kernels: InvalidArgument naming the entry.

X = np.ones((2, 5), np.float32)
IDX = np.array([[0, 1], [2, 4], [3, 3]], np.int32)    # m = 3, s = 2, e = 5
W = np.ones((3, 2), np.float32)
CAND = np.array([[0, 2, 1], [2, 2, 0]], np.int32)     # b = 2, c = 3
G = np.ones((2, 3), np.float32)

ALL_OPS = {
    "forward": lambda x, i, w, cd, g: forward_op(x, i, w, cd),
    "grad_features": lambda x, i, w, cd, g: grad_features_op(g, x, i, w, cd),
    "grad_weights": lambda x, i, w, cd, g: grad_weights_op(g, x, i, cd),
}


@pytest.mark.parametrize("op", sorted(ALL_OPS))
@pytest.mark.parametrize("bad_value", [3, 1000, -1])
def test_out_of_range_candidate(op, bad_value):
    cand = CAND.copy()
    cand[1, 2] = bad_value
    cand[1, 1] = bad_value  # the first bad entry in row-major order is named
    # Candidates are checked even where the signal is zero.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"candidates\[1, 1\] = {bad_value} is out of "
                             r"range \[0, 3\) \(num_labels\)"):
        ALL_OPS[op](X, IDX, W, cand, np.zeros_like(G))


@pytest.mark.parametrize("op", sorted(ALL_OPS))
@pytest.mark.parametrize("bad_value", [5, 99, -1])
def test_out_of_range_index_in_candidate_row(op, bad_value):
    idx = IDX.copy()
    idx[2, 1] = bad_value
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[2, 1\] = {bad_value} is out of range "
                             r"\[0, 5\) \(num_features\); label 2 is "
                             r"candidates\[0, 1\]"):
        ALL_OPS[op](X, idx, W, CAND, G)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_rows_of_other_labels_are_not_read(op):
    """Only candidate rows are read (documented): a bad index in a label
    that is nobody's candidate does not fail, and results are correct."""
    idx = np.concatenate([IDX, [[7, -3]]]).astype(np.int32)   # label 3
    w = np.concatenate([W, [[1.0, 1.0]]]).astype(np.float32)
    got = ALL_OPS[op](X, idx, w, CAND, G).numpy()
    ref_y, ref_gx, ref_values, _ = reference(X, IDX, W, CAND, G)
    ref = {"forward": ref_y, "grad_features": ref_gx,
           "grad_weights": ref_values}[op]
    np.testing.assert_allclose(got, ref)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_wrong_rank(op):
    for args in [(X.reshape(-1), IDX, W, CAND, G),
                 (X, IDX.reshape(-1), W, CAND, G),
                 (X, IDX, W, CAND.reshape(-1), G)]:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"must be a matrix \(rank 2\)"):
            ALL_OPS[op](*args)
    if op != "forward":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"backward must be a matrix"):
            ALL_OPS[op](X, IDX, W, CAND, G.reshape(-1))
    if op != "grad_weights":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"weights must be a matrix"):
            ALL_OPS[op](X, IDX, W.reshape(-1), CAND, G)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_shape_mismatch(op):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"candidates shape \[3,3\] must be \[batch, "
                             r"num_candidates\] with batch = 2"):
        ALL_OPS[op](X, IDX, W, np.zeros((3, 3), np.int32), np.ones((3, 3),
                                                                 np.float32))
    if op != "grad_weights":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"weights shape \[3,3\] must equal indices "
                                 r"shape \[3,2\]"):
            ALL_OPS[op](X, IDX, np.ones((3, 3), np.float32), CAND, G)
    if op != "forward":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"backward shape \[2,4\] must equal "
                                 r"candidates shape \[2,3\]"):
            ALL_OPS[op](X, IDX, W, CAND, np.ones((2, 4), np.float32))


def test_wrong_dtype_is_rejected():
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError,
                        tf.errors.NotFoundError)):
        forward_op(X, IDX, W, tf.constant(CAND, tf.int64))
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError,
                        tf.errors.NotFoundError)):
        forward_op(tf.constant(X, tf.float64), IDX,
                   tf.constant(W, tf.float64), CAND)


# ---------------------------------------------------------------------------
# IndexedSlices reach the optimizer.

def test_tape_through_variable_gives_indexed_slices_and_sparse_update():
    rng = np.random.default_rng(8)
    x, idx, w, cand, _ = make_case(rng, 4, 20, 50, 4, 6)
    var = tf.Variable(w)
    with tf.GradientTape() as tape:
        y = xmc_tf.ops.uniform_sparse_sampled_matmul(x, idx, var, cand)
        loss = tf.reduce_sum(tf.square(y))
    grad = tape.gradient(loss, var)
    assert isinstance(grad, tf.IndexedSlices)

    # Keras SGD applies it with a scatter: only candidate rows change, by
    # exactly -lr * (dense gradient).
    kvar = keras.Variable(w)
    with tf.GradientTape() as tape:
        y = xmc_tf.ops.uniform_sparse_sampled_matmul(
            x, idx, keras.ops.convert_to_tensor(kvar), cand)
        loss = tf.reduce_sum(tf.square(y))
    kgrad = tape.gradient(loss, kvar.value)
    assert isinstance(kgrad, tf.IndexedSlices)
    keras.optimizers.SGD(0.1).apply_gradients([(kgrad, kvar)])
    g = 2.0 * reference(x, idx, w, cand, np.ones_like(cand, np.float32))[0]
    dense = reference(x, idx, w, cand, g.astype(np.float32))[3]
    np.testing.assert_allclose(kvar.numpy(), w - 0.1 * dense, rtol=1e-5,
                               atol=1e-5)
    changed = np.nonzero((kvar.numpy() != w).any(axis=1))[0]
    assert set(changed) <= set(cand.reshape(-1))


# ---------------------------------------------------------------------------
# Variables are read in place (Xmc>ResourceUniformSparseSampledMatmul).

def graph_reads(fn, *args):
    """(op types, captured tensors read by ReadVariableOp) of fn's graph."""
    concrete = tf.function(fn).get_concrete_function(*args)
    graph = concrete.graph
    external = {internal.name: ext for ext, internal in graph.captures}
    types = [op.type for op in graph.get_operations()]
    read = [external.get(op.inputs[0].name) for op in graph.get_operations()
            if op.type == "ReadVariableOp"]
    return types, read


@pytest.mark.parametrize("kind", ["tf", "keras"])
def test_variable_weights_are_read_in_place(kind):
    rng = np.random.default_rng(13)
    x, idx, w, cand, g = make_case(rng, 5, 30, 40, 6, 8, density=0.7)
    cand[1] = cand[0]
    var = tf.Variable(w) if kind == "tf" else keras.Variable(w)
    target = var if kind == "tf" else var.value   # the tf.Variable
    handle = target.handle
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = xmc_tf.ops.uniform_sparse_sampled_matmul(xt, idx, var, cand)
    gx, gw = tape.gradient(y, [xt, target], output_gradients=tf.constant(g))
    ref_y, ref_gx, ref_values, ref_gw = reference(x, idx, w, cand, g)
    np.testing.assert_allclose(y.numpy(), ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx.numpy(), ref_gx, rtol=1e-5, atol=1e-5)
    assert isinstance(gw, tf.IndexedSlices)
    np.testing.assert_array_equal(gw.dense_shape.numpy(), w.shape)
    np.testing.assert_allclose(tf.convert_to_tensor(gw).numpy(), ref_gw,
                               rtol=1e-5, atol=1e-5)

    # After a sparse update the variable is in copy-on-read mode; the op
    # still reads the current values, and its graph (forward and gradients)
    # has no dense read of the variable.
    update = tf.IndexedSlices(tf.ones([2, 6]), tf.constant([cand[0, 0], 3]),
                              tf.constant(w.shape))
    target.scatter_sub(update)
    w_new = w.copy()
    np.subtract.at(w_new, [cand[0, 0], 3], 1.0)
    np.testing.assert_allclose(
        xmc_tf.ops.uniform_sparse_sampled_matmul(x, idx, var, cand).numpy(),
        reference(x, idx, w_new, cand, g)[0], rtol=1e-5, atol=1e-5)

    def step(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            out = xmc_tf.ops.uniform_sparse_sampled_matmul(a, idx, var, cand)
        return tape.gradient(out, [a, target], output_gradients=g)

    types, read = graph_reads(step, xt)
    assert "Xmc>ResourceUniformSparseSampledMatmul" in types
    assert "Xmc>ResourceUniformSparseSampledMatmulGradFeatures" in types
    assert not any(ext is handle for ext in read)


def test_resource_op_validation():
    resource_op = lib.xmc_resource_uniform_sparse_sampled_matmul
    var = tf.Variable(W)
    np.testing.assert_allclose(resource_op(X, IDX, var.handle, CAND).numpy(),
                               reference(X, IDX, W, CAND, G)[0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="the weights variable has dtype float, the "
                             "features have half"):
        resource_op(tf.constant(X, tf.float16), IDX, var.handle, CAND)
    wide = tf.Variable(np.ones((3, 3), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"weights shape \[3,3\] must equal indices "
                             r"shape \[3,2\]"):
        resource_op(X, IDX, wide.handle, CAND)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"candidates\[0, 2\] = 3 is out of range"):
        resource_op(X, IDX, var.handle, np.array([[0, 1, 3], [0, 0, 0]],
                                                 np.int32))
    uninitialized = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[3, 2],
                                           shared_name="helperB_no_value")
    with pytest.raises((tf.errors.FailedPreconditionError,
                        tf.errors.NotFoundError)):
        resource_op(X, IDX, uninitialized, CAND)


# ---------------------------------------------------------------------------
# dense_sampled_matmul and check_candidates.

def test_dense_sampled_matmul_matches_full_scores_and_gradients():
    rng = np.random.default_rng(9)
    b, d, m, c = 5, 7, 40, 9
    x = rng.normal(size=(b, d)).astype(np.float32)
    kernel = tf.Variable(rng.normal(size=(m, d)).astype(np.float32))
    bias = tf.Variable(rng.normal(size=(m,)).astype(np.float32))
    cand = rng.integers(0, m, size=(b, c)).astype(np.int32)
    cand[1] = cand[0]
    g = rng.normal(size=(b, c)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        y = xmc_tf.ops.dense_sampled_matmul(x, kernel, cand, bias)
        full = tf.matmul(x, kernel, transpose_b=True) + bias
        picked = tf.gather(full, cand, batch_dims=1)
    np.testing.assert_allclose(y.numpy(), picked.numpy(), rtol=1e-5, atol=1e-5)
    ref = np.einsum("bd,bcd->bc", x.astype(np.float64),
                    kernel.numpy()[cand].astype(np.float64)) + bias.numpy()[cand]
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    gk, gb = tape.gradient(y, [kernel, bias], output_gradients=g)
    fk, fb = tape.gradient(picked, [kernel, bias], output_gradients=g)
    assert isinstance(gk, tf.IndexedSlices) and isinstance(gb, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(gk).numpy(),
                               tf.convert_to_tensor(fk).numpy(), atol=1e-5)
    np.testing.assert_allclose(tf.convert_to_tensor(gb).numpy(),
                               tf.convert_to_tensor(fb).numpy(), atol=1e-5)


def test_dense_sampled_matmul_finite_differences():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    kernel = rng.normal(size=(6, 4)).astype(np.float32)
    cand = np.array([[0, 5, 5], [2, 0, 1], [3, 3, 4]], np.int32)

    def f(a, k):
        return xmc_tf.ops.dense_sampled_matmul(a, k, cand)

    theoretical, numerical = tf.test.compute_gradient(f, [x, kernel],
                                                      delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=2e-2)


@pytest.mark.parametrize("bad", [6, -2])
def test_check_candidates_eager_and_graph(bad):
    kernel = np.ones((6, 4), np.float32)
    x = np.ones((2, 4), np.float32)
    cand = np.array([[0, 1, 2], [3, bad, 4]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"candidates\[1, 1\] = {bad} is out of range "
                             r"\[0, 6\) \(num_labels\)"):
        xmc_tf.ops.dense_sampled_matmul(x, kernel, cand)
    graph = tf.function(lambda c: xmc_tf.ops.dense_sampled_matmul(x, kernel, c))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"candidates\[i, j\] is out of range .*"
                             rf"\(i, j\) =\] \[1 1\] \[value =\] \[{bad}\]"):
        graph(tf.constant(cand))
    np.testing.assert_allclose(graph(tf.constant([[0, 1, 2], [3, 5, 4]])),
                               np.full((2, 3), 4.0))


def test_dense_sampled_matmul_empty_and_rank_errors():
    kernel = np.ones((6, 4), np.float32)
    assert xmc_tf.ops.dense_sampled_matmul(
        np.ones((0, 4), np.float32), kernel,
        np.zeros((0, 3), np.int32)).shape == (0, 3)
    assert xmc_tf.ops.dense_sampled_matmul(
        np.ones((2, 4), np.float32), kernel,
        np.zeros((2, 0), np.int32)).shape == (2, 0)
    with pytest.raises(ValueError, match="candidates must have rank 2"):
        xmc_tf.ops.dense_sampled_matmul(np.ones((2, 4), np.float32), kernel,
                                        np.zeros((2,), np.int32))
    with pytest.raises(ValueError, match="bias must have rank 1"):
        xmc_tf.ops.dense_sampled_matmul(np.ones((2, 4), np.float32), kernel,
                                        np.zeros((2, 3), np.int32),
                                        bias=tf.zeros((6, 1)))
