"""Tests of the row-sparse optimizers and slot helpers (xmc_tf.optimizers).

References: NumPy transcriptions of Adam (Kingma & Ba, Algorithm 1, in Keras'
arithmetic) and momentum SGD restricted to the rows of each gradient, the
SCENT weight update (scent-extreme-multiclass, Algorithm 26) and Keras' own
Adam/AdamW/SGD for dense gradients.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.callbacks import SetRewiring
from xmc_tf.layers import SparseEmbeddingBag, UniformSparseDense
from xmc_tf.optimizers import (LazyAdam, LazyAdamW, LazySGD, deduplicate,
                               gather_rows, slot_names, slot_variables)


def np_(v):
    return keras.ops.convert_to_numpy(v)


def dense_of(indices, values, n):
    out = np.zeros((n,) + values.shape[1:], values.dtype)
    np.add.at(out, indices, values)
    return out


def sparse(values, indices, shape):
    return tf.IndexedSlices(tf.constant(values), tf.constant(indices),
                            tf.constant(shape, tf.int64))


class NumpyLazyAdam:
    """Adam on the rows of each gradient only (float64)."""

    def __init__(self, shape, lr=0.01, b1=0.9, b2=0.999, eps=1e-7,
                 amsgrad=False, wd=None):
        self.m, self.v, self.vh = (np.zeros(shape) for _ in range(3))
        self.t = 0
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.amsgrad, self.wd = amsgrad, wd

    def step(self, w, indices, values):
        self.t += 1
        rows = np.unique(indices)
        g = dense_of(indices, values.astype(np.float64), w.shape[0])[rows]
        if self.wd is not None:
            w[rows] -= w[rows] * self.wd * self.lr
        self.m[rows] += (g - self.m[rows]) * (1 - self.b1)
        self.v[rows] += (g * g - self.v[rows]) * (1 - self.b2)
        v = self.v[rows]
        if self.amsgrad:
            self.vh[rows] = np.maximum(self.vh[rows], self.v[rows])
            v = self.vh[rows]
        alpha = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        w[rows] -= alpha * self.m[rows] / (np.sqrt(v) + self.eps)
        return w


# Row sets of 4 steps on a [9, 3] variable: overlapping, with duplicates, a
# single row, and rows given out of order.
ROW_SETS = [[0, 2, 5], [2, 3, 3, 8, 2], [7], [8, 0, 4, 1]]


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("weight_decay", [None, 0.05])
def test_lazy_adam_matches_numpy_on_touched_rows_only(amsgrad, weight_decay):
    rng = np.random.default_rng(0)
    n, d = 9, 3
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    var = keras.Variable(w0)
    opt = LazyAdam(learning_rate=0.05, amsgrad=amsgrad,
                   weight_decay=weight_decay)
    ref = NumpyLazyAdam((n, d), lr=0.05, amsgrad=amsgrad, wd=weight_decay)
    w_ref = w0.astype(np.float64)

    @tf.function
    def step(values, indices):
        opt.apply([tf.IndexedSlices(values, indices, [n, d])], [var])

    for rows in ROW_SETS:
        values = rng.standard_normal((len(rows), d)).astype(np.float32)
        before_w = np_(var).copy()
        before_slots = [np_(s).copy() for s in slot_variables(opt, var)] \
            if opt.built else None
        step(tf.constant(values), tf.constant(rows, tf.int32))
        w_ref = ref.step(w_ref, np.array(rows), values)
        np.testing.assert_allclose(np_(var), w_ref, rtol=2e-5, atol=2e-6)
        m, v = np_(opt._momentums[0]), np_(opt._velocities[0])
        np.testing.assert_allclose(m, ref.m, rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(v, ref.v, rtol=2e-5, atol=1e-9)
        if amsgrad:
            np.testing.assert_allclose(np_(opt._velocity_hats[0]), ref.vh,
                                       rtol=2e-5, atol=1e-9)
        untouched = np.setdiff1d(np.arange(n), rows)
        # Untouched rows: weights and every slot bit-for-bit unchanged.
        np.testing.assert_array_equal(np_(var)[untouched], before_w[untouched])
        if before_slots is not None:
            for before, slot in zip(before_slots, slot_variables(opt, var)):
                np.testing.assert_array_equal(np_(slot)[untouched],
                                              before[untouched])
        assert np.all(np_(var)[np.unique(rows)] != before_w[np.unique(rows)])
    assert int(opt.iterations) == len(ROW_SETS)


def _op_types(fn, *args):
    graph = fn.get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("weight_decay", [None, 0.05])
def test_fused_row_update_equals_composite_bit_for_bit(weight_decay):
    """LazyAdam's fused CPU op (Xmc>ResourceSparseApplyAdam) and its
    gather / element-wise / scatter composite give identical weights and
    slots, step after step (duplicates, out-of-order rows, tf.function)."""
    rng = np.random.default_rng(3)
    n, d = 9, 3
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    runs = []
    for fused in (True, False):
        var = keras.Variable(w0)
        opt = LazyAdam(learning_rate=0.05, weight_decay=weight_decay,
                       fused=fused)

        def make_step(opt, var):
            @tf.function
            def step(values, indices):
                opt.apply([tf.IndexedSlices(values, indices, [n, d])], [var])
            return step

        step = make_step(opt, var)
        spec = (tf.TensorSpec([None, d]), tf.TensorSpec([None], tf.int32))
        fused_op = "Xmc>ResourceSparseApplyAdam" in _op_types(step, *spec)
        assert fused_op == fused
        values_rng = np.random.default_rng(4)
        for rows in ROW_SETS:
            values = values_rng.standard_normal((len(rows), d))
            step(tf.constant(values, tf.float32), tf.constant(rows, tf.int32))
        runs.append([np_(var)] + [np_(s) for s in slot_variables(opt, var)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_fused_dense_update_is_keras_adam_bit_for_bit():
    """Dense gradients go through Xmc>ResourceApplyAdam (one pass) and give
    keras.optimizers.Adam's weights and slots exactly (any rank, scalars
    too); fused=False runs Keras' own update."""
    rng = np.random.default_rng(5)
    shapes = [(5, 4), (3,), ()]
    w0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes]
             for _ in range(3)]
    results = []
    for make in (lambda: LazyAdam(0.01), lambda: LazyAdam(0.01, fused=False),
                 lambda: keras.optimizers.Adam(0.01)):
        opt, var = make(), [keras.Variable(w) for w in w0]

        def make_step(opt, var):
            @tf.function
            def step(*g):
                opt.apply(list(g), var)
            return step

        step = make_step(opt, var)
        spec = [tf.TensorSpec(s) for s in shapes]
        n_fused = sum(op == "Xmc>ResourceApplyAdam" for op in [
            o.type for o in step.get_concrete_function(*spec).graph
            .get_operations()])
        assert n_fused == (len(shapes) if getattr(opt, "fused", False) else 0)
        for g in grads:
            step(*[tf.constant(x) for x in g])
        results.append([np_(x) for x in var + list(opt.variables)])
    for got in results[:2]:
        for a, b in zip(got, results[2]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dense", [False, True])
def test_fused_update_copies_a_buffer_another_tensor_shares(dense):
    """A tensor read from the variable before the update keeps its values
    (both fused kernels copy a shared buffer before writing, as
    TensorFlow's own training ops do)."""
    var = tf.Variable(np.ones((4, 2), np.float32))
    before = var.read_value()  # eager read: shares the variable's buffer
    grad = (tf.ones((4, 2)) if dense else
            tf.IndexedSlices(tf.ones((1, 2)), tf.constant([2]), [4, 2]))
    LazyAdam(learning_rate=0.1).apply([grad], [var])
    np.testing.assert_array_equal(np_(before), np.ones((4, 2)))
    assert np_(var)[2, 0] < 1.0 and (np_(var)[0, 0] == 1.0) != dense


@pytest.mark.parametrize("make", [
    (lambda: LazyAdam(0.01), lambda: keras.optimizers.Adam(0.01)),
    (lambda: LazyAdam(0.01, amsgrad=True),
     lambda: keras.optimizers.Adam(0.01, amsgrad=True)),
    (lambda: LazyAdamW(0.01, weight_decay=0.1),
     lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)),
    (lambda: LazyAdam(0.01, clipnorm=0.5),
     lambda: keras.optimizers.Adam(0.01, clipnorm=0.5)),
    (lambda: LazyAdam(0.01, global_clipnorm=0.5),
     lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.5)),
    (lambda: LazySGD(0.1), lambda: keras.optimizers.SGD(0.1)),
    (lambda: LazySGD(0.1, momentum=0.9),
     lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
    (lambda: LazySGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
     lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True,
                                  weight_decay=0.01)),
], ids=["adam", "amsgrad", "adamw", "clipnorm", "global_clipnorm", "sgd",
        "sgd_momentum", "sgd_nesterov_wd"])
def test_dense_gradients_identical_to_keras(make):
    make_lazy, make_keras = make
    rng = np.random.default_rng(1)
    w0 = [rng.standard_normal((6, 4)).astype(np.float32),
          rng.standard_normal((4,)).astype(np.float32)]
    a = [keras.Variable(w) for w in w0]
    b = [keras.Variable(w) for w in w0]
    lazy, ref = make_lazy(), make_keras()
    for _ in range(4):
        grads = [tf.constant(rng.standard_normal(w.shape).astype(np.float32))
                 for w in w0]
        lazy.apply(grads, a)
        ref.apply(grads, b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np_(x), np_(y))
    for x, y in zip(lazy.variables, ref.variables):
        np.testing.assert_array_equal(np_(x), np_(y))


@pytest.mark.parametrize("make", [
    (lambda: LazyAdam(0.01), lambda: keras.optimizers.Adam(0.01)),
    (lambda: LazyAdamW(0.01), lambda: keras.optimizers.AdamW(0.01)),
    (lambda: LazySGD(0.1, momentum=0.8, nesterov=True),
     lambda: keras.optimizers.SGD(0.1, momentum=0.8, nesterov=True)),
], ids=["adam", "adamw", "sgd_nesterov"])
def test_sparse_gradient_over_all_rows_equals_dense_keras(make):
    """Every row present (in shuffled order): lazy == dense Adam/SGD."""
    make_lazy, make_keras = make
    rng = np.random.default_rng(2)
    n, d = 7, 3
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    a, b = keras.Variable(w0), keras.Variable(w0)
    lazy, ref = make_lazy(), make_keras()
    for _ in range(3):
        g = rng.standard_normal((n, d)).astype(np.float32)
        perm = rng.permutation(n)
        lazy.apply([sparse(g[perm], perm, [n, d])], [a])
        ref.apply([tf.constant(g)], [b])
    np.testing.assert_allclose(np_(a), np_(b), rtol=1e-6, atol=1e-7)


class NumpyLazySGD:
    def __init__(self, shape, lr, momentum, nesterov=False, dampening=0.0):
        self.m = np.zeros(shape)
        self.lr, self.mu, self.nesterov, self.damp = (lr, momentum, nesterov,
                                                      dampening)

    def step(self, w, indices, values):
        rows = np.unique(indices)
        g = dense_of(indices, values.astype(np.float64), w.shape[0])[rows]
        self.m[rows] = self.mu * self.m[rows] - self.lr * (1 - self.damp) * g
        if self.nesterov:
            w[rows] += self.mu * self.m[rows] - self.lr * g
        else:
            w[rows] += self.m[rows]
        return w


@pytest.mark.parametrize("kwargs", [
    dict(momentum=0.0), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
    dict(momentum=0.7, dampening=0.3)],
    ids=["plain", "momentum", "nesterov", "dampening"])
def test_lazy_sgd_matches_numpy_on_touched_rows_only(kwargs):
    rng = np.random.default_rng(3)
    n, d = 9, 3
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    var = keras.Variable(w0)
    opt = LazySGD(learning_rate=0.1, **kwargs)
    ref = NumpyLazySGD((n, d), 0.1, **kwargs)
    w_ref = w0.astype(np.float64)
    for rows in ROW_SETS:
        values = rng.standard_normal((len(rows), d)).astype(np.float32)
        before = np_(var).copy()
        before_m = [np_(s).copy() for s in slot_variables(opt, var)]
        opt.apply([sparse(values, rows, [n, d])], [var])
        w_ref = ref.step(w_ref, np.array(rows), values)
        np.testing.assert_allclose(np_(var), w_ref, rtol=1e-5, atol=1e-6)
        untouched = np.setdiff1d(np.arange(n), rows)
        np.testing.assert_array_equal(np_(var)[untouched], before[untouched])
        if kwargs["momentum"] > 0:
            np.testing.assert_allclose(np_(opt.momentums[0]), ref.m,
                                       rtol=1e-5, atol=1e-7)
            if before_m:
                np.testing.assert_array_equal(
                    np_(opt.momentums[0])[untouched], before_m[0][untouched])
        else:
            assert slot_variables(opt, var) == []


def test_lazy_sgd_is_scent_weight_update():
    """SCENT Alg. 26: V[C] = (1-b) V[C] + b Z[C]; W[C] -= eta V[C]."""
    beta, eta = 0.2, 0.5
    rng = np.random.default_rng(4)
    n, d = 8, 2
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    var = keras.Variable(w0)
    opt = LazySGD(learning_rate=eta, momentum=1 - beta, dampening=1 - beta)
    w, big_v = w0.astype(np.float64), np.zeros((n, d))
    for rows in ROW_SETS[:1] + [[1, 2], [2, 6, 0]]:
        z = rng.standard_normal((len(rows), d)).astype(np.float32)
        opt.apply([sparse(z, rows, [n, d])], [var])
        c = np.unique(rows)
        zc = dense_of(np.array(rows), z.astype(np.float64), n)[c]
        big_v[c] = (1 - beta) * big_v[c] + beta * zc
        w[c] -= eta * big_v[c]
        np.testing.assert_allclose(np_(var), w, rtol=1e-5, atol=1e-6)


def test_duplicate_indices_equal_summed_gradient():
    rng = np.random.default_rng(5)
    n, d = 6, 4
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    rows = np.array([4, 1, 4, 4, 0, 1])
    values = rng.standard_normal((len(rows), d)).astype(np.float32)
    uniq = np.unique(rows)
    summed = dense_of(rows, values, n)[uniq]
    for make in (lambda: LazyAdam(0.1), lambda: LazySGD(0.1, momentum=0.5),
                 lambda: LazyAdamW(0.1, weight_decay=0.2)):
        a, b = keras.Variable(w0), keras.Variable(w0)
        opt_a, opt_b = make(), make()
        for _ in range(2):
            opt_a.apply([sparse(values, rows, [n, d])], [a])
            opt_b.apply([sparse(summed, uniq, [n, d])], [b])
        np.testing.assert_allclose(np_(a), np_(b), rtol=1e-6, atol=1e-6)


def test_deduplicate_and_gather_rows():
    g = sparse(np.array([[1.0], [2.0], [4.0], [8.0]], np.float32),
               [3, 1, 3, 0], [5, 1])
    d = deduplicate(g)
    assert d.indices.numpy().tolist() == [3, 1, 0]
    assert d.values.numpy().ravel().tolist() == [5.0, 2.0, 8.0]
    np.testing.assert_array_equal(tf.convert_to_tensor(d).numpy(),
                                  tf.convert_to_tensor(g).numpy())
    # Already unique: passed through unchanged.
    u = deduplicate(sparse(np.ones((2, 1), np.float32), [2, 0], [5, 1]))
    assert u.indices.numpy().tolist() == [2, 0]
    v = keras.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    np.testing.assert_array_equal(gather_rows(v, tf.constant([3, 0])).numpy(),
                                  np_(v)[[3, 0]])
    assert gather_rows(v, tf.constant([1]), dtype="float16").dtype == tf.float16


@pytest.mark.parametrize("clip", [dict(clipnorm=0.7), dict(global_clipnorm=0.7),
                                  dict(clipvalue=0.3)])
def test_clipping_uses_the_deduplicated_gradient_and_stays_sparse(clip):
    """Rows +3 and -3 at one index are a zero gradient: clip what it sums to."""
    rng = np.random.default_rng(6)
    n, d = 10, 2
    w0 = rng.standard_normal((n, d)).astype(np.float32)
    rows = np.array([2, 5, 2, 7])
    values = rng.standard_normal((4, d)).astype(np.float32) * 3
    values[2] = -values[0] + np.array([0.1, -0.2], np.float32)  # near-cancel
    g = dense_of(rows, values, n).astype(np.float64)
    uniq = np.unique(rows)
    if "clipnorm" in clip:
        norm = np.linalg.norm(g)
        g = g * clip["clipnorm"] / max(norm, clip["clipnorm"])
    elif "global_clipnorm" in clip:
        extra = rng.standard_normal(3).astype(np.float32)  # a dense 2nd var
        norm = np.sqrt((g ** 2).sum() + (extra.astype(np.float64) ** 2).sum())
        g = g * min(1.0, clip["global_clipnorm"] / norm)
    else:
        g = np.clip(g, -clip["clipvalue"], clip["clipvalue"])
    a, b = keras.Variable(w0), keras.Variable(w0)
    clipped, plain = LazyAdam(0.1, **clip), LazyAdam(0.1)
    if "global_clipnorm" in clip:
        e1, e2 = keras.Variable(np.zeros(3, np.float32)), keras.Variable(
            np.zeros(3, np.float32))
        clipped.apply([sparse(values, rows, [n, d]), tf.constant(extra)],
                      [a, e1])
        plain.apply([sparse(g[uniq].astype(np.float32), uniq, [n, d]),
                     tf.constant(extra * min(1.0, clip["global_clipnorm"] / norm),
                                 tf.float32)], [b, e2])
        np.testing.assert_allclose(np_(e1), np_(e2), rtol=1e-5, atol=1e-6)
    else:
        clipped.apply([sparse(values, rows, [n, d])], [a])
        plain.apply([sparse(g[uniq].astype(np.float32), uniq, [n, d])], [b])
    np.testing.assert_allclose(np_(a), np_(b), rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(n), rows)
    np.testing.assert_array_equal(np_(a)[untouched], w0[untouched])


def test_loss_scale_factor_unscales_sparse_gradients():
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((5, 2)).astype(np.float32)
    values = rng.standard_normal((2, 2)).astype(np.float32)
    a, b = keras.Variable(w0), keras.Variable(w0)
    scaled, plain = LazyAdam(0.1, loss_scale_factor=8.0), LazyAdam(0.1)
    scaled.apply([sparse(values * 8, [1, 3], [5, 2])], [a])
    plain.apply([sparse(values, [1, 3], [5, 2])], [b])
    np.testing.assert_allclose(np_(a), np_(b), rtol=1e-6)
    assert scaled.loss_scale_factor == 8.0


def test_any_rank_variable_and_dense_then_sparse_steps():
    """3-D and 1-D variables with IndexedSlices; one variable gets a dense
    gradient in one traced step and a sparse one in the next."""
    rng = np.random.default_rng(8)
    w3 = rng.standard_normal((5, 2, 3)).astype(np.float32)
    w1 = rng.standard_normal((6,)).astype(np.float32)
    v3, v1 = keras.Variable(w3), keras.Variable(w1)
    opt = LazyAdam(0.1)
    ref3, ref1 = NumpyLazyAdam(w3.shape, lr=0.1), NumpyLazyAdam(w1.shape, lr=0.1)
    r3, r1 = w3.astype(np.float64), w1.astype(np.float64)

    @tf.function
    def sparse_step(g3, i3, g1, i1):
        opt.apply([tf.IndexedSlices(g3, i3, [5, 2, 3]),
                   tf.IndexedSlices(g1, i1, [6])], [v3, v1])

    @tf.function
    def dense_step(g3, g1):
        opt.apply([g3, g1], [v3, v1])

    g3 = rng.standard_normal((2, 2, 3)).astype(np.float32)
    g1 = rng.standard_normal((3,)).astype(np.float32)
    sparse_step(g3, tf.constant([4, 1]), g1, tf.constant([0, 5, 0]))
    r3 = ref3.step(r3, np.array([4, 1]), g3)
    r1 = ref1.step(r1, np.array([0, 5, 0]), g1)
    np.testing.assert_allclose(np_(v3), r3, rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(np_(v1), r1, rtol=1e-5, atol=5e-6)
    # Dense step: every row, Keras' formula (the NumPy reference with all rows).
    d3 = rng.standard_normal(w3.shape).astype(np.float32)
    d1 = rng.standard_normal(w1.shape).astype(np.float32)
    dense_step(d3, d1)
    r3 = ref3.step(r3, np.arange(5), d3)
    r1 = ref1.step(r1, np.arange(6), d1)
    np.testing.assert_allclose(np_(v3), r3, rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(np_(v1), r1, rtol=1e-5, atol=5e-6)
    sparse_step(g3, tf.constant([2, 2]), g1, tf.constant([3, 3, 3]))
    r3 = ref3.step(r3, np.array([2, 2]), g3)
    r1 = ref1.step(r1, np.array([3, 3, 3]), g1)
    np.testing.assert_allclose(np_(v3), r3, rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(np_(v1), r1, rtol=1e-5, atol=5e-6)


def _big_tensor_shapes(fn, shape):
    graph = fn.get_concrete_function().graph
    return [op.type for op in graph.get_operations() for out in op.outputs
            if out.shape.rank is not None and tuple(out.shape) == shape]


@pytest.mark.parametrize("make_opt", [lambda: LazyAdam(amsgrad=True),
                                      lambda: LazyAdamW(clipnorm=1.0),
                                      lambda: LazySGD(momentum=0.9)])
def test_sparse_update_never_materialises_a_full_size_tensor(make_opt):
    """No op output of the variable's shape (no densified gradient, no dense
    read of weights or slots); Keras' Adam does make one (the check works)."""
    n, d = 37, 5
    var = keras.Variable(np.zeros((n, d), np.float32))
    g = tf.IndexedSlices(tf.ones((3, d)), tf.constant([1, 4, 1]), [n, d])
    for opt, expect_dense in ((make_opt(), False),
                              (keras.optimizers.Adam(), True)):
        opt.build([var])
        fn = tf.function(lambda: opt.apply([g], [var]))
        big = _big_tensor_shapes(fn, (n, d))
        assert bool(big) == expect_dense, big


def test_out_of_range_row_raises():
    var = keras.Variable(np.zeros((4, 2), np.float32))
    opt = LazyAdam()
    with pytest.raises(tf.errors.InvalidArgumentError):
        opt.apply([sparse(np.ones((1, 2), np.float32), [4], [4, 2])], [var])


def test_config_round_trip_and_serialization():
    for opt in (LazyAdam(0.02, beta_1=0.8, amsgrad=True, clipnorm=2.0),
                LazyAdam(fused=False),
                LazyAdamW(0.03, weight_decay=0.1),
                LazySGD(0.2, momentum=0.6, dampening=0.4)):
        config = opt.get_config()
        again = type(opt).from_config(config)
        assert again.get_config() == config
        ser = keras.optimizers.serialize(opt)
        assert ser["registered_name"].startswith("xmc_tf>")
        back = keras.optimizers.deserialize(ser)
        assert type(back) is type(opt) and back.get_config() == config
    assert LazySGD(momentum=0.5, dampening=0.25).get_config()["dampening"] == 0.25
    assert LazyAdam(fused=False).get_config()["fused"] is False


@pytest.mark.parametrize("kwargs", [dict(momentum=1.5), dict(dampening=-0.1),
                                    dict(momentum=0.9, nesterov=True,
                                         dampening=0.5)])
def test_lazy_sgd_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        LazySGD(**kwargs)


def test_lazy_adamw_needs_weight_decay():
    with pytest.raises(ValueError, match="weight_decay"):
        LazyAdamW(weight_decay=None)


def test_slot_helpers():
    v = keras.Variable(np.zeros((3, 2), np.float32))
    w = keras.Variable(np.zeros((2,), np.float32))
    for opt, count in ((LazyAdam(), 2), (LazyAdam(amsgrad=True), 3),
                       (LazyAdamW(), 2), (LazySGD(momentum=0.5), 1),
                       (LazySGD(), 0), (keras.optimizers.AdamW(), 2),
                       (keras.optimizers.SGD(momentum=0.1), 1)):
        assert slot_variables(opt, v) == []  # not built yet
        opt.build([v, w])
        slots = slot_variables(opt, v)
        assert len(slots) == count
        assert all(tuple(s.shape) == (3, 2) for s in slots)
        assert all(tuple(s.shape) == (2,) for s in slot_variables(opt, w))
    opt = LazyAdam()
    opt.build([v, w])
    assert slot_variables(opt, w)[0] is opt._momentums[1]
    assert slot_names(LazySGD()) == ("momentums",)
    with pytest.raises(ValueError, match="RMSprop"):
        slot_names(keras.optimizers.RMSprop())


def test_set_rewiring_resets_lazy_adam_slots():
    """SET on a UniformSparseDense head after a SparseEmbeddingBag encoder,
    trained with LazyAdam: moved connections restart with zero state."""
    num_features, hidden, labels, fan_in = 60, 16, 12, 8
    rng = np.random.default_rng(9)
    inputs = keras.Input((num_features,), sparse=True)
    h = SparseEmbeddingBag(hidden, activation="relu", name="enc")(inputs)
    out = UniformSparseDense(labels, connections_per_label=fan_in, seed=0,
                             name="usd")(h)
    model = keras.Model(inputs, out)
    model.compile(LazyAdam(0.01), loss="mse", jit_compile=False)
    dense_x = (rng.random((32, num_features)) < 0.1) * rng.random(
        (32, num_features))
    x = tf.sparse.from_dense(dense_x.astype(np.float32))
    y = rng.random((32, labels)).astype(np.float32)
    layer = model.get_layer("usd")
    snaps = []

    class Snap(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            opt = self.model.optimizer
            snaps.append((np_(layer.kernel).copy(), np_(layer.indices).copy(),
                          [np_(s).copy() for s in slot_variables(opt, layer.kernel)]))

    cb = SetRewiring(every_n_steps=4, fraction=0.25, seed=0)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model.fit(ds, epochs=1, verbose=0, callbacks=[Snap(), cb])
    assert cb.rewires == 1
    kernel_before, indices_before, slots_before = snaps[-1]
    moved = np_(layer.indices) != indices_before
    assert moved.sum() == labels * 2
    slots = slot_variables(model.optimizer, layer.kernel)
    assert len(slots) == 2
    for before, slot in zip(slots_before, slots):
        assert np.all(before[moved] != 0)
        np.testing.assert_array_equal(np_(slot)[moved], 0.0)
        np.testing.assert_array_equal(np_(slot)[~moved], before[~moved])
    np.testing.assert_array_equal(np_(layer.kernel)[moved], 0.0)
