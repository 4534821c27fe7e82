"""Tests of the embedding-bag ops (``ops/embedding_bag/``, xmc_tf.ops.embedding_bag).

References: a NumPy loop over the COO entries, and TensorFlow's own
``tf.sparse.sparse_dense_matmul`` (values and gradients) on the same entries.
"""

import numpy as np
import pytest
import tensorflow as tf

from xmc_tf.ops import embedding_bag as eb


def entries(rng, nnz, batch, u, dtype=np.float32):
    rows = rng.integers(0, batch, nnz)
    positions = rng.integers(0, u, nnz)
    weights = rng.standard_normal(nnz).astype(dtype)
    return rows, positions, weights


def numpy_bag(rows, positions, weights, table, batch):
    out = np.zeros((batch, table.shape[1]), np.float64)
    for r, p, w in zip(rows, positions, weights):
        out[r] += float(w) * table[p].astype(np.float64)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nnz,batch,u,d", [(0, 3, 2, 4), (1, 1, 1, 1),
                                           (50, 7, 9, 5), (400, 16, 60, 33)])
def test_forward_matches_numpy(dtype, nnz, batch, u, d):
    rng = np.random.default_rng(nnz + d)
    rows, positions, weights = entries(rng, nnz, batch, u, dtype)
    table = rng.standard_normal((u, d)).astype(dtype)
    got = eb.embedding_bag(rows, positions, weights, table, batch).numpy()
    assert got.shape == (batch, d) and got.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, numpy_bag(rows, positions, weights, table,
                                              batch), rtol=tol, atol=tol)


def test_gradients_equal_sparse_dense_matmul():
    """Duplicated entries, unsorted order, empty output rows and unused
    table rows: gradients w.r.t. table and weights equal TensorFlow's."""
    rng = np.random.default_rng(0)
    batch, u, d = 6, 10, 8
    rows, positions, weights = entries(rng, 40, batch, u)
    rows[rows == 4] = 5  # row 4 empty
    positions[positions == 9] = 0  # table row 9 unused
    rows, positions = np.append(rows, rows[:3]), np.append(positions,
                                                           positions[:3])
    weights = np.append(weights, weights[:3])
    table = tf.constant(rng.standard_normal((u, d)).astype(np.float32))
    w = tf.constant(weights)
    upstream = tf.constant(rng.standard_normal((batch, d)).astype(np.float32))
    results = []
    for use_op in (True, False):
        with tf.GradientTape() as tape:
            tape.watch([table, w])
            if use_op:
                y = eb.embedding_bag(rows, positions, w, table, batch)
            else:
                sp = tf.sparse.reorder(tf.SparseTensor(
                    np.stack([rows, positions], 1), w, [batch, u]))
                y = tf.sparse.sparse_dense_matmul(sp, table)
            loss = tf.reduce_sum(y * upstream)
        results.append([y] + tape.gradient(loss, [table, w]))
    (y, gt, gw), (y_ref, gt_ref, gw_ref) = results
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gt.numpy(), gt_ref.numpy(), rtol=1e-5,
                               atol=1e-5)
    assert not gt.numpy()[9].any() and not y.numpy()[4].any()
    # reorder permutes the entries: compare the weight gradient per entry.
    want = np.sum(upstream.numpy()[rows] * table.numpy()[positions], axis=1)
    np.testing.assert_allclose(gw.numpy(), want, rtol=1e-5, atol=1e-5)
    assert gw_ref is not None


@pytest.mark.parametrize("case", ["row_high", "row_negative", "position_high",
                                  "lengths", "batch_negative", "table_rank"])
def test_invalid_inputs_raise_invalid_argument(case):
    rows, positions, weights = [0, 1], [0, 1], [1.0, 2.0]
    table, batch = np.ones((2, 3), np.float32), 2
    if case == "row_high":
        rows = [0, 2]
    elif case == "row_negative":
        rows = [-1, 0]
    elif case == "position_high":
        positions = [0, 2]
    elif case == "lengths":
        weights = [1.0]
    elif case == "batch_negative":
        batch = -1
    elif case == "table_rank":
        table = np.ones((2, 3, 1), np.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        eb.embedding_bag(rows, positions, weights, table, batch)


def test_grad_table_op_rejects_out_of_range_position():
    lib = eb._ops()
    with pytest.raises(tf.errors.InvalidArgumentError, match="positions"):
        lib.xmc_embedding_bag_grad_table(
            backward=tf.ones((2, 3)), rows=tf.constant([0, 1], tf.int64),
            positions=tf.constant([0, 3], tf.int64),
            weights=tf.ones((2,)), num_table_rows=tf.constant(3, tf.int64))


def test_supported_dtypes_and_devices():
    assert eb.embedding_bag_supported(tf.float32)
    assert eb.embedding_bag_supported("float64", "/device:CPU:0")
    assert eb.embedding_bag_supported(tf.float16)
    assert eb.embedding_bag_supported(tf.bfloat16)
    assert not eb.embedding_bag_supported(tf.int32)
    assert not eb.embedding_bag_supported(tf.float32, "/device:GPU:0")


# Unit roundoff of the narrow types: the op sums in float32 and rounds once,
# so each output is within u * |exact| (plus float32 summation error) of the
# float64 sum of the same (already rounded) inputs.  A sum in half or
# bfloat16 itself would be off by about (terms) * u.
NARROW = {"float16": (tf.float16, 2.0 ** -11), "bfloat16": (tf.bfloat16,
                                                            2.0 ** -8)}


def _narrow(x, dtype):
    """x rounded to dtype, and the float64 values of the rounded entries."""
    t = tf.cast(tf.constant(x, tf.float32), dtype)
    return t, tf.cast(t, tf.float64).numpy()


def _assert_within_rounding(got, want, magnitude, u):
    """|got - want| <= u |want| + 1e-6 magnitude (float32 summation)."""
    got = tf.cast(got, tf.float64).numpy()
    err = np.abs(got - want)
    bound = u * np.abs(want) + 1e-6 * magnitude + 1e-30
    assert (err <= bound).all(), float(np.max(err / bound))


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("nnz,batch,u,d", [(0, 3, 2, 4), (1, 1, 1, 1),
                                           (50, 7, 9, 5), (2000, 4, 60, 33)])
def test_half_and_bfloat16_sum_in_float(name, nnz, batch, u, d):
    """Forward and table gradient in float16 / bfloat16 against a float64
    NumPy reference of the rounded inputs (2,000 entries in 4 rows: 500
    terms per output, which a half / bfloat16 sum would miss by far)."""
    dtype, unit = NARROW[name]
    rng = np.random.default_rng(nnz + d + 7)
    rows, positions, weights = entries(rng, nnz, batch, u)
    w, w64 = _narrow(weights, dtype)
    table, table64 = _narrow(rng.standard_normal((u, d)), dtype)
    got = eb.embedding_bag(rows, positions, w, table, batch)
    assert got.dtype == dtype and got.shape == (batch, d)
    want = numpy_bag(rows, positions, w64, table64, batch)
    magnitude = numpy_bag(rows, positions, np.abs(w64), np.abs(table64),
                          batch)
    _assert_within_rounding(got, want, magnitude, unit)
    backward, backward64 = _narrow(rng.standard_normal((batch, d)), dtype)
    grad = eb._ops().xmc_embedding_bag_grad_table(
        backward=backward, rows=tf.constant(rows, tf.int64),
        positions=tf.constant(positions, tf.int64), weights=w,
        num_table_rows=tf.constant(u, tf.int64))
    assert grad.dtype == dtype and grad.shape == (u, d)
    want_grad = numpy_bag(positions, rows, w64, backward64, u)
    magnitude = numpy_bag(positions, rows, np.abs(w64), np.abs(backward64), u)
    _assert_within_rounding(grad, want_grad, magnitude, unit)


@pytest.mark.parametrize("name", sorted(NARROW))
def test_half_and_bfloat16_gradients_follow_float32(name):
    """tf.GradientTape through the op in float16 / bfloat16 gives the float32
    op's gradients up to the narrow type's rounding."""
    dtype, unit = NARROW[name]
    rng = np.random.default_rng(5)
    batch, u, d = 5, 8, 6
    rows, positions, weights = entries(rng, 60, batch, u)
    table32 = rng.standard_normal((u, d)).astype(np.float32)
    upstream32 = rng.standard_normal((batch, d)).astype(np.float32)
    grads = {}
    for dt in (tf.float32, dtype):
        table = tf.cast(tf.constant(table32), dt)
        w = tf.cast(tf.constant(weights), dt)
        upstream = tf.cast(tf.constant(upstream32), dt)
        with tf.GradientTape() as tape:
            tape.watch([table, w])
            y = eb.embedding_bag(rows, positions, w, table, batch)
            loss = tf.reduce_sum(y * upstream)
        gt, gw = tape.gradient(loss, [table, w])
        assert gt.dtype == dt and gw.dtype == dt
        grads[dt] = [tf.cast(g, tf.float64).numpy() for g in (gt, gw)]
    for narrow, wide in zip(grads[dtype], grads[tf.float32]):
        np.testing.assert_allclose(narrow, wide, rtol=40 * unit,
                                   atol=40 * unit * np.abs(wide).max())
