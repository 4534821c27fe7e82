"""Tests of the uniform-sparse layer on sparse input (the inverted-index ops).

Xmc>UniformSparseInvertedIndex, Xmc>UniformSparseMatmulSparseInput and its
weight gradient against the dense path (``uniform_sparse_matmul`` on
``tf.sparse.to_dense(x)``) and a NumPy reference:
scores[i, j] = sum_k X[i, idx[j, k]] w[j, k];
grad_w[j, k] = sum_i G[i, j] X[i, idx[j, k]].
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xmc_tf
from xmc_tf.ops import _loader

lib = _loader.load()
op = xmc_tf.ops.uniform_sparse_matmul_sparse_input


def make_sparse(rng, b, e, per_row, empty_rows=0.0):
    """Coalesced [b, e] SparseTensor with about `per_row` entries a row."""
    x = np.zeros((b, e), np.float32)
    for i in range(b):
        if rng.random() < empty_rows:
            continue
        cols = rng.choice(e, size=min(e, per_row), replace=False)
        x[i, cols] = rng.normal(size=cols.size)
    return x, tf.sparse.from_dense(x)


def make_connections(rng, e, m, s, features=None):
    """indices [m, s] into [0, e) (or into the given feature subset)."""
    pool = np.arange(e) if features is None else np.asarray(features)
    idx = rng.choice(pool, size=(m, s)).astype(np.int32)
    w = rng.normal(size=(m, s)).astype(np.float32)
    return idx, w


def np_scores(x, idx, w):
    x64 = x.astype(np.float64)
    return (x64[:, idx] * w.astype(np.float64)[None]).sum(axis=2)


def np_grad_weights(x, idx, g):
    return np.einsum("ij,ijk->jk", g.astype(np.float64),
                     x.astype(np.float64)[:, idx])


def np_inverted_index(idx, e):
    flat = idx.reshape(-1)
    counts = np.bincount(flat, minlength=e) if flat.size else np.zeros(e)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, np.argsort(flat, kind="stable")


def grads(fn, x_sp, idx, w, g):
    """scores and d(sum(g * scores))/dw through `fn`."""
    wt = tf.Variable(w)
    with tf.GradientTape() as tape:
        y = fn(x_sp, idx, wt)
    return y.numpy(), tape.gradient(y, wt, output_gradients=tf.constant(g))


def dense_path(x_sp, idx, w):
    return xmc_tf.ops.uniform_sparse_matmul(tf.sparse.to_dense(x_sp), idx, w)


def check_case(x, x_sp, idx, w, g, graph=False):
    fn = tf.function(op) if graph else op
    y, gw = grads(fn, x_sp, idx, w, g)
    y_dense, gw_dense = grads(dense_path, x_sp, idx, w, g)
    assert y.shape == (x.shape[0], idx.shape[0]) and y.dtype == np.float32
    np.testing.assert_allclose(y, np_scores(x, idx, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, y_dense, rtol=1e-5, atol=1e-5)
    gw = tf.convert_to_tensor(gw).numpy()
    assert gw.shape == idx.shape
    np.testing.assert_allclose(gw, np_grad_weights(x, idx, g), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(gw, tf.convert_to_tensor(gw_dense).numpy(),
                               rtol=1e-5, atol=1e-5)


CASES = {
    "random": dict(b=9, e=70, m=301, s=7, per_row=6),
    "fan_in_1": dict(b=5, e=20, m=33, s=1, per_row=3),
    "one_feature": dict(b=4, e=1, m=10, s=3, per_row=1),
    "empty_rows": dict(b=12, e=40, m=50, s=5, per_row=4, empty_rows=0.5),
    "no_entries": dict(b=6, e=40, m=50, s=5, per_row=0),
    "batch_1": dict(b=1, e=300, m=129, s=4, per_row=20),
    "unused_features": dict(b=8, e=500, m=64, s=8, per_row=30,
                            features=range(0, 500, 7)),
    "pow2_fan_in": dict(b=16, e=90, m=200, s=16, per_row=10),
    # n = m * s >= 2^15 and >= 2 * D: the chunked (per-thread histogram)
    # inverted index.
    "many_connections": dict(b=32, e=200, m=3000, s=12, per_row=15),
}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_dense_path_and_numpy(name, graph):
    c = dict(CASES[name])
    rng = np.random.default_rng(sorted(CASES).index(name))
    x, x_sp = make_sparse(rng, c["b"], c["e"], c["per_row"],
                          c.get("empty_rows", 0.0))
    idx, w = make_connections(rng, c["e"], c["m"], c["s"], c.get("features"))
    g = rng.normal(size=(c["b"], c["m"])).astype(np.float32)
    g[rng.random(g.shape) < 0.7] = 0.0  # mostly zero, as a squared hinge's
    check_case(x, x_sp, idx, w, g, graph=graph)


@pytest.mark.parametrize("tidx", [tf.int32, tf.int64])
@pytest.mark.parametrize("shape", [(0, 3, 5), (7, 0, 5), (4, 3, 1),
                                   (50, 8, 9), (3000, 12, 200),
                                   (3000, 12, 5)])
def test_inverted_index(shape, tidx):
    m, s, e = shape
    idx = np.random.default_rng(m + s + e).integers(0, e, size=(m, s))
    idx = idx.astype(np.int32)
    offsets, entries = lib.xmc_uniform_sparse_inverted_index(
        indices=idx, num_features=np.int64(e), Tidx=tidx)
    want_offsets, want_entries = np_inverted_index(idx, e)
    assert entries.dtype == tidx
    np.testing.assert_array_equal(offsets.numpy(), want_offsets)
    np.testing.assert_array_equal(entries.numpy(), want_entries)


def test_inverted_index_no_features():
    offsets, entries = lib.xmc_uniform_sparse_inverted_index(
        indices=np.zeros((3, 0), np.int32), num_features=np.int64(0))
    assert offsets.numpy().tolist() == [0] and entries.shape == (0,)


@pytest.mark.parametrize("tidx", [tf.int32, tf.int64])
def test_raw_ops_with_int64_entries(tidx):
    rng = np.random.default_rng(5)
    x, x_sp = make_sparse(rng, 6, 30, 5)
    idx, w = make_connections(rng, 30, 40, 3)
    g = rng.normal(size=(6, 40)).astype(np.float32)
    offsets, entries = lib.xmc_uniform_sparse_inverted_index(
        indices=idx, num_features=np.int64(30), Tidx=tidx)
    args = dict(rows=x_sp.indices[:, 0], cols=x_sp.indices[:, 1],
                values=x_sp.values, offsets=offsets, entries=entries)
    y = lib.xmc_uniform_sparse_matmul_sparse_input(
        batch_size=np.int64(6), weights=w, **args)
    gw = lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
        backward=g, weights=w, **args)
    np.testing.assert_allclose(y, np_scores(x, idx, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, np_grad_weights(x, idx, g), rtol=1e-5,
                               atol=1e-5)


def test_duplicate_and_unordered_entries_add_up():
    # (0, 2) twice and the entries out of row-major order.
    rows = np.array([1, 0, 0, 1, 0], np.int64)
    cols = np.array([0, 2, 1, 3, 2], np.int64)
    vals = np.array([1.0, 2.0, 3.0, 4.0, 0.5], np.float32)
    x = np.zeros((2, 4), np.float32)
    np.add.at(x, (rows, cols), vals)
    x_sp = tf.SparseTensor(np.stack([rows, cols], 1), vals, [2, 4])
    idx = np.array([[2, 1], [3, 3], [0, 2]], np.int32)
    w = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.25]], np.float32)
    g = np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]], np.float32)
    y, gw = grads(op, x_sp, idx, w, g)
    np.testing.assert_allclose(y, np_scores(x, idx, w), rtol=1e-6)
    np.testing.assert_allclose(gw, np_grad_weights(x, idx, g), rtol=1e-6)


def test_empty_batch_and_no_labels():
    idx, w = make_connections(np.random.default_rng(0), 10, 5, 3)
    empty = tf.SparseTensor(np.zeros((0, 2), np.int64),
                            np.zeros(0, np.float32), [0, 10])
    assert op(empty, idx, w).shape == (0, 5)
    x_sp = tf.sparse.from_dense(np.ones((3, 10), np.float32))
    no_labels = op(x_sp, np.zeros((0, 4), np.int32), np.zeros((0, 4),
                                                              np.float32))
    assert no_labels.shape == (3, 0)


def test_no_gradient_for_the_input_values():
    rng = np.random.default_rng(1)
    _, x_sp = make_sparse(rng, 4, 20, 3)
    idx, w = make_connections(rng, 20, 6, 2)
    values = tf.Variable(x_sp.values)
    with tf.GradientTape() as tape:
        y = op(tf.SparseTensor(x_sp.indices, values, x_sp.dense_shape), idx, w)
    assert tape.gradient(y, values) is None


def test_finite_differences():
    rng = np.random.default_rng(2)
    x, x_sp = make_sparse(rng, 5, 12, 4)
    idx, w = make_connections(rng, 12, 6, 3)
    g = rng.normal(size=(5, 6)).astype(np.float32)

    def loss(wv):
        return float(np.sum(g.astype(np.float64) *
                            op(x_sp, idx, wv).numpy().astype(np.float64)))

    _, gw = grads(op, x_sp, idx, w, g)
    gw = tf.convert_to_tensor(gw).numpy()
    eps = 1e-2
    fd = np.zeros_like(gw, dtype=np.float64)
    for j in range(w.shape[0]):
        for k in range(w.shape[1]):
            wp, wm = w.copy(), w.copy()
            wp[j, k] += eps
            wm[j, k] -= eps
            fd[j, k] = (loss(wp) - loss(wm)) / (2 * eps)
    np.testing.assert_allclose(gw, fd, rtol=1e-3, atol=1e-3)


def test_nonfinite_weight_reaches_only_rows_storing_its_feature():
    x = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    idx = np.array([[0, 1]], np.int32)
    w = np.array([[1.0, np.inf]], np.float32)
    y = op(tf.sparse.from_dense(x), idx, w).numpy()
    assert y[0, 0] == 1.0 and np.isposinf(y[1, 0])


def test_placed_on_cpu_under_a_gpu_scope():
    rng = np.random.default_rng(3)
    x, x_sp = make_sparse(rng, 4, 20, 3)
    idx, w = make_connections(rng, 20, 6, 2)

    @tf.function
    def on_gpu():
        with tf.device("/GPU:0"):
            return op(x_sp, idx, w)

    np.testing.assert_allclose(on_gpu(), np_scores(x, idx, w), rtol=1e-5,
                               atol=1e-6)


# ---------------------------------------------------------------------------
# Validation: InvalidArgumentError naming the problem.


def _raw_args():
    """b = 3, D = 6, m = 4, s = 2: offsets [0, 2, 4, 5, 6, 7, 8]; the batch
    stores features 1, 3 and 5 (the cases of ``_bad`` break their lists:
    the kernels check the lists they read)."""
    idx = np.array([[0, 1], [2, 3], [4, 5], [1, 0]], np.int32)
    offsets, entries = np_inverted_index(idx, 6)
    return dict(rows=np.array([0, 1, 2], np.int64),
                cols=np.array([1, 3, 5], np.int64),
                values=np.ones(3, np.float32), batch_size=np.int64(3),
                offsets=offsets, entries=entries.astype(np.int32),
                weights=np.ones((4, 2), np.float32))


def _grad_call(args):
    args = dict(args)
    b = int(args.pop("batch_size"))
    m = args["weights"].shape[0]
    return lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
        backward=np.ones((b, m), np.float32), **args)


def _bad(kind):
    a = _raw_args()
    if kind == "row":
        a["rows"] = np.array([0, 3, 2], np.int64)
        return a, r"rows\[1\] = 3 is out of range \[0, 3\)"
    if kind == "negative_row":
        a["rows"] = np.array([0, 1, -1], np.int64)
        return a, r"rows\[2\] = -1 is out of range"
    if kind == "col":
        a["cols"] = np.array([1, 6, 5], np.int64)
        return a, r"cols\[1\] = 6 is out of range \[0, 6\)"
    if kind == "length":
        a["values"] = np.ones(2, np.float32)
        return a, "rows, cols and values must have one length"
    if kind == "offsets_decreasing":
        o = a["offsets"].copy()
        o[3], o[4] = o[4] + 1, o[4]
        a["offsets"] = o
        return a, r"offsets\[4\] = .* < offsets\[3\].*non-decreasing"
    if kind == "offsets_first":
        o = a["offsets"].copy()
        o[0] = 1
        a["offsets"] = o
        return a, r"offsets\[0\] = 1 must be 0"
    if kind == "offsets_last":
        o = a["offsets"].copy()
        o[-1] -= 1
        a["offsets"] = o
        return a, r"offsets\[6\] = 7 must equal the number of entries 8"
    if kind == "offsets_empty":
        a["offsets"] = np.zeros(0, np.int64)
        return a, "offsets must have num_features \\+ 1 >= 1"
    if kind == "entry":
        en = a["entries"].copy()
        en[5] = 8
        a["entries"] = en
        return a, r"entries\[5\] = 8 is out of range \[0, 8\)"
    if kind == "entries_size":
        a["entries"] = a["entries"][:-1]
        a["offsets"] = np.minimum(a["offsets"], 7)
        return a, "entries has 7 elements but weights has .* = 8"
    if kind == "weights_rank":
        a["weights"] = np.ones(8, np.float32)
        return a, "weights must be a matrix"
    raise AssertionError(kind)


BAD = ["row", "negative_row", "col", "length", "offsets_decreasing",
       "offsets_first", "offsets_last", "offsets_empty", "entry",
       "entries_size", "weights_rank"]


@pytest.mark.parametrize("kind", BAD)
def test_forward_rejects(kind):
    args, message = _bad(kind)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        lib.xmc_uniform_sparse_matmul_sparse_input(**args)


@pytest.mark.parametrize("kind", [k for k in BAD if k != "weights_rank"])
def test_grad_weights_rejects(kind):
    args, message = _bad(kind)
    if kind == "row":  # the bound is the number of backward rows
        message = r"rows\[1\] = 3 is out of range \[0, 3\) \(rows of backward"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _grad_call(args)


def test_grad_weights_rejects_bad_backward_and_repeated_positions():
    a = _raw_args()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"backward shape \[3,5\] must be \[batch, 4\]"):
        lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
            backward=np.ones((3, 5), np.float32),
            **{k: v for k, v in a.items() if k != "batch_size"})
    # Features 0 and 1 both list position 0 (not an inverted index).
    a["cols"] = np.array([1, 0, 5], np.int64)
    a["offsets"] = np.array([0, 1, 2, 8, 8, 8, 8], np.int64)
    a["entries"] = np.array([0, 0, 1, 2, 3, 4, 5, 6], np.int32)
    y = lib.xmc_uniform_sparse_matmul_sparse_input(**a)  # defined: a sum
    assert y.shape == (3, 4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"entries\[1\] = 0 .*repeats a position"):
        _grad_call(a)


@pytest.mark.parametrize("part", ["entry", "offsets"])
def test_lists_the_batch_does_not_read_are_not_checked(part):
    """The matmul and its gradient check the lists of the features the
    batch stores (features 1, 3, 5), not the whole index on every call: a
    bad entry or offsets pair of feature 2 (positions 4, read by no entry)
    changes nothing; the same list read by the batch is an error."""
    good = _raw_args()
    bad = _raw_args()
    if part == "entry":
        entries = bad["entries"].copy()
        entries[4] = 99  # feature 2's list is entries[4:5]
        bad["entries"] = entries
        message = r"entries\[4\] = 99 is out of range \[0, 8\)"
    else:
        offsets = bad["offsets"].copy()
        offsets[2] = 6  # feature 1 reads offsets[1:3] = [2, 6]
        offsets[3] = 5  # feature 2: [6, 5], decreasing
        bad["offsets"] = offsets
        good["cols"] = bad["cols"] = np.array([0, 4, 5], np.int64)
        message = r"offsets\[3\] = 5 < offsets\[2\] = 6"
    np.testing.assert_array_equal(
        lib.xmc_uniform_sparse_matmul_sparse_input(**bad),
        lib.xmc_uniform_sparse_matmul_sparse_input(**good))
    np.testing.assert_array_equal(_grad_call(bad), _grad_call(good))
    bad["cols"] = np.array([1, 2, 5], np.int64)  # now feature 2 is read
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        lib.xmc_uniform_sparse_matmul_sparse_input(**bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _grad_call(bad)


def test_negative_batch_size():
    a = _raw_args()
    a["batch_size"] = np.int64(-1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="batch_size must be >= 0, got -1"):
        lib.xmc_uniform_sparse_matmul_sparse_input(**a)


@pytest.mark.parametrize("value,pos", [(6, (2, 1)), (-1, (0, 0)),
                                       (2**31 - 1, (3, 0))])
def test_inverted_index_rejects_bad_index(value, pos):
    idx = np.ones((4, 2), np.int32)
    idx[pos] = value
    j, k = pos
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[{j}, {k}\] = {value} is out of "
                             r"range \[0, 6\) \(num_features\)"):
        lib.xmc_uniform_sparse_inverted_index(indices=idx,
                                              num_features=np.int64(6))


def test_wrapper_rejects_bad_index_and_dtype():
    x_sp = tf.sparse.from_dense(np.ones((2, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[1, 0\] = 4 is out of range"):
        op(x_sp, np.array([[0], [4]], np.int32), np.ones((2, 1), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="attr 'T'"):
        op(tf.cast(x_sp, tf.float64), np.array([[0], [3]], np.int32),
           tf.ones((2, 1), tf.float64))
    with pytest.raises(ValueError, match="must equal indices shape"):
        op(x_sp, np.array([[0], [3]], np.int32), np.ones((1, 2), np.float32))
    # Shapes known only at run time.
    dynamic = tf.function(op, input_signature=[
        tf.SparseTensorSpec([None, 4], tf.float32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None, None], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="weights shape must equal indices shape"):
        dynamic(x_sp, np.array([[0], [3]], np.int32),
                np.ones((1, 2), np.float32))
    np.testing.assert_allclose(
        dynamic(x_sp, np.array([[0], [3]], np.int32),
                np.ones((2, 1), np.float32)), [[1.0, 1.0], [1.0, 1.0]])


def test_cached_inverted_index():
    rng = np.random.default_rng(6)
    x, x_sp = make_sparse(rng, 7, 40, 5)
    idx, w = make_connections(rng, 40, 30, 4)
    g = rng.normal(size=(7, 30)).astype(np.float32)
    index = xmc_tf.ops.uniform_sparse_inverted_index(idx, 40)
    assert index[1].dtype == tf.int32

    def cached(x_sp, idx, w):
        return op(x_sp, idx, w, inverted_index=index)

    y, gw = grads(cached, x_sp, idx, w, g)
    np.testing.assert_allclose(y, np_scores(x, idx, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, np_grad_weights(x, idx, g), rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------
# Property test.


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(b=st.integers(0, 12), e=st.integers(1, 60), m=st.integers(0, 40),
       s=st.integers(1, 9), per_row=st.integers(0, 8),
       zero_signal=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
       seed=st.integers(0, 2**31 - 1))
def test_property_matches_numpy(b, e, m, s, per_row, zero_signal, seed):
    rng = np.random.default_rng(seed)
    x, x_sp = make_sparse(rng, b, e, per_row, empty_rows=0.2)
    idx, w = make_connections(rng, e, m, s)
    g = rng.normal(size=(b, m)).astype(np.float32)
    g[rng.random(g.shape) < zero_signal] = 0.0
    y, gw = grads(op, x_sp, idx, w, g)
    gw = tf.convert_to_tensor(gw).numpy()
    np.testing.assert_allclose(y, np_scores(x, idx, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, np_grad_weights(x, idx, g), rtol=1e-5,
                               atol=1e-5)
    if zero_signal == 1.0:
        assert not gw.any()
