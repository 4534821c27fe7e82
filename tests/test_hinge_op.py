"""Tests of the fused squared hinge (ops/hinge/, xmc_tf.ops.squared_hinge_loss)
and of xmc_tf.losses.SquaredHinge through it.

References: a float64 NumPy loop over the multi-hot targets, the pure-TF
dense path of SquaredHinge (``dense_targets`` then ``call``, with TF's
autodiff for the gradient), and central finite differences.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from hinge_reference import squared_hinge_reference as np_reference
from op_requirements import needs_ops
from xmc_tf.losses import SquaredHinge, dense_targets
from xmc_tf.losses import hinge as hinge_module
from xmc_tf.ops import squared_hinge_loss

pytestmark = needs_ops("xmc_squared_hinge_loss", "xmc_squared_hinge_loss_grad")


def dense_path(scores, labels, margin, upstream):
    """The pre-op computation: dense targets, SquaredHinge.call, autodiff."""
    scores = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(scores)
        y = dense_targets(tf.constant(labels), scores.shape[-1])
        loss = SquaredHinge(margin=margin).call(y, scores)
        weighted = tf.reduce_sum(loss * upstream)
    return loss.numpy(), tape.gradient(weighted, scores).numpy()


def random_case(rng, b, m, n, dup=True):
    scores = rng.normal(scale=1.5, size=(b, m)).astype(np.float32)
    labels = np.full((b, n), -1, np.int64)
    for i in range(b):
        k = int(rng.integers(0, n + 1))
        labels[i, :k] = rng.integers(0, m, k)
        if dup and k >= 2:
            labels[i, k - 1] = labels[i, 0]  # a repeated id
        rng.shuffle(labels[i])  # padding anywhere in the row
    return scores, labels


def fused(scores, labels, margin, upstream):
    scores = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(scores)
        loss = squared_hinge_loss(scores, labels, margin)
        weighted = tf.reduce_sum(loss * upstream)
    return loss.numpy(), tape.gradient(weighted, scores).numpy()


@pytest.mark.parametrize("margin", [1.0, 0.5])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("b,m,n", [(6, 37, 5), (3, 40000, 9), (1, 1, 3)])
def test_loss_and_grad_match_numpy_and_dense_path(margin, id_dtype, b, m, n):
    rng = np.random.default_rng(b * 7 + m + n)
    scores, labels = random_case(rng, b, m, n)
    if m == 40000:  # ids at the CPU block edges (16384)
        labels[0, :4] = [16383, 16384, 32767, 39999]
    labels = labels.astype(id_dtype)
    upstream = rng.normal(size=b).astype(np.float32)
    loss, grad = fused(scores, labels, margin, upstream)
    want_loss, want_grad = np_reference(scores, labels, margin, upstream)
    tf_loss, tf_grad = dense_path(scores, labels, margin, upstream)
    assert loss.dtype == np.float32 and loss.shape == (b,)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, tf_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, tf_grad, rtol=1e-5, atol=1e-6)
    # Exact zeros exactly where the margin holds (the backward kernels skip
    # them), as with autodiff.
    np.testing.assert_array_equal(grad == 0, want_grad == 0)
    np.testing.assert_array_equal(grad == 0, tf_grad == 0)


NARROW = {"float16": (tf.float16, 2.0 ** -11), "bfloat16": (tf.bfloat16,
                                                            2.0 ** -8)}


@pytest.mark.parametrize("name", sorted(NARROW))
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("b,m,n", [(6, 37, 5), (3, 40000, 9), (1, 1, 3)])
def test_half_and_bfloat16_scores_computed_in_float(name, id_dtype, b, m, n):
    """float16 / bfloat16 scores (CPU): the loss (float32) and the gradient
    (the scores' dtype) against the float64 NumPy reference of the rounded
    scores, and bit for bit the float32 op on their float32 values (the
    gradient rounded once)."""
    dtype, unit = NARROW[name]
    rng = np.random.default_rng(b * 7 + m + n + 1)
    scores, labels = random_case(rng, b, m, n)
    if m == 40000:  # ids at the CPU block edges (16384)
        labels[0, :4] = [16383, 16384, 32767, 39999]
    labels = labels.astype(id_dtype)
    narrow = tf.cast(tf.constant(scores), dtype)
    wide = tf.cast(narrow, tf.float32)  # exact
    upstream = tf.constant(rng.normal(size=b).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(narrow)
        loss = squared_hinge_loss(narrow, labels, 0.75)
        weighted = tf.reduce_sum(loss * upstream)
    grad = tape.gradient(weighted, narrow)
    assert loss.dtype == tf.float32 and loss.shape == (b,)
    assert grad.dtype == dtype and grad.shape == (b, m)
    want_loss, want_grad = np_reference(wide.numpy(), labels, 0.75,
                                        upstream.numpy())
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5, atol=1e-5)
    got = tf.cast(grad, tf.float64).numpy()
    assert (np.abs(got - want_grad) <= (unit + 1e-6) * np.abs(want_grad)
            ).all()
    np.testing.assert_array_equal(got == 0, want_grad == 0)
    loss32, grad32 = fused(wide.numpy(), labels, 0.75, upstream)
    np.testing.assert_array_equal(loss.numpy(), loss32)
    np.testing.assert_array_equal(got, tf.cast(tf.cast(grad32, dtype),
                                               tf.float64).numpy())


def test_gradient_zero_where_margin_holds_even_for_nonfinite_upstream():
    scores = np.array([[3.0, -3.0, 0.0]], np.float32)
    labels = np.array([[0, -1]])
    _, grad = fused(scores, labels, 1.0, np.array([np.inf], np.float32))
    assert grad[0, 0] == 0 and grad[0, 1] == 0 and np.isinf(grad[0, 2])


def test_finite_differences():
    rng = np.random.default_rng(3)
    scores = rng.uniform(-2, 2, (3, 7)).astype(np.float64)
    # keep away from the kinks |s| = margin
    scores[np.abs(np.abs(scores) - 0.75) < 0.05] += 0.2
    labels = np.array([[1, 4, 4], [-1, -1, -1], [0, 6, -1]])
    upstream = rng.normal(size=3)

    def f(s):
        return float(np.sum(squared_hinge_loss(
            tf.constant(s, tf.float32), labels, 0.75).numpy() * upstream))

    _, grad = fused(scores.astype(np.float32), labels, 0.75,
                    upstream.astype(np.float32))
    eps = 1e-3
    numeric = np.zeros_like(scores)
    for idx in np.ndindex(*scores.shape):
        plus, minus = scores.copy(), scores.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (f(plus) - f(minus)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=2e-2, atol=2e-2)


def test_empty_shapes():
    assert squared_hinge_loss(np.zeros((0, 5), np.float32),
                              np.zeros((0, 2), np.int64)).shape == (0,)
    np.testing.assert_array_equal(
        squared_hinge_loss(np.zeros((2, 0), np.float32),
                           np.full((2, 1), -1)).numpy(), [0.0, 0.0])
    got = squared_hinge_loss(np.zeros((2, 3), np.float32),
                             np.zeros((2, 0), np.int64)).numpy()
    np.testing.assert_array_equal(got, [3.0, 3.0])  # all negatives at 0


def test_nan_score_propagates_to_the_loss():
    got = squared_hinge_loss(np.array([[np.nan, 0.0]], np.float32),
                             np.array([[-1]])).numpy()
    assert np.isnan(got[0])


def _lib():
    from xmc_tf.ops import _loader
    return _loader.load()


BAD_INPUTS = [
    ("id >= m", np.zeros((2, 4), np.float32), np.array([[0], [4]]), None,
     "labels[1, 0] = 4 is out of range [-1, 4)"),
    ("id < -1", np.zeros((2, 4), np.float32), np.array([[0, -2], [1, 1]]),
     None, "labels[0, 1] = -2 is out of range"),
    ("scores rank 1", np.zeros((4,), np.float32), np.array([[0]]), None,
     "must be matrices"),
    ("labels rank 3", np.zeros((1, 4), np.float32), np.zeros((1, 1, 1),
                                                             np.int64),
     None, "must be matrices"),
    ("batch mismatch", np.zeros((2, 4), np.float32), np.array([[0]]), None,
     "must be [batch, n] with batch = 2"),
    ("upstream batch", np.zeros((2, 4), np.float32), np.array([[0], [1]]),
     np.ones(3, np.float32), "upstream shape [3] must be [batch]"),
    ("upstream rank", np.zeros((2, 4), np.float32), np.array([[0], [1]]),
     np.ones((2, 1), np.float32), "must be [batch]"),
]


@pytest.mark.parametrize("what,scores,labels,upstream,message", BAD_INPUTS,
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_invalid_argument(what, scores, labels, upstream,
                                       message):
    lib = _lib()
    calls = []
    if upstream is None:
        calls.append(lambda s, l, u: lib.xmc_squared_hinge_loss(
            scores=s, labels=l))
        upstream = np.ones(scores.shape[0] if scores.ndim else 1, np.float32)
    calls.append(lambda s, l, u: lib.xmc_squared_hinge_loss_grad(
        scores=s, labels=l, upstream=u))
    for call in calls:
        # eager (the kernel checks) and a graph with unknown shapes (no
        # static check can catch it: the kernel must)
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            call(scores, labels, upstream)
        assert message in str(e.value), str(e.value)
        graph_fn = tf.function(call, input_signature=[
            tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.int64),
            tf.TensorSpec(None, tf.float32)])
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            graph_fn(scores, labels.astype(np.int64), upstream)
        assert message in str(e.value), str(e.value)


def test_static_shape_mismatch_is_value_error_in_graph():
    fn = tf.function(lambda: squared_hinge_loss(tf.zeros((2, 4)),
                                                tf.zeros((3, 1), tf.int64)))
    with pytest.raises(ValueError):
        fn()


def test_bad_margin_and_label_dtype():
    with pytest.raises(ValueError, match="margin must be finite"):
        squared_hinge_loss(np.zeros((1, 2), np.float32), [[0]], np.inf)
    with pytest.raises(tf.errors.InvalidArgumentError, match="finite"):
        _lib().xmc_squared_hinge_loss(scores=np.zeros((1, 2), np.float32),
                                      labels=np.array([[0]]),
                                      margin=float("nan"))
    with pytest.raises(TypeError, match="integer ids"):
        squared_hinge_loss(np.zeros((1, 2), np.float32), [[0.0]])


# ---------------------------------------------------------------------------
# xmc_tf.losses.SquaredHinge through the op


def _op_types(fn, *args):
    graph = tf.function(fn).get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations()}


def test_keras_loss_uses_the_op_for_ids_only():
    s = tf.TensorSpec([None, 50], tf.float32)
    loss = SquaredHinge()
    ops = _op_types(loss, tf.TensorSpec([None, 3], tf.int32), s)
    assert "Xmc>SquaredHingeLoss" in ops and "ScatterNd" not in ops
    ops = _op_types(loss, tf.TensorSpec([None, 3], tf.float32), s)  # float ids
    assert "Xmc>SquaredHingeLoss" in ops
    ops = _op_types(loss, tf.TensorSpec([None, 50], tf.float32), s)  # multi-hot
    assert "Xmc>SquaredHingeLoss" not in ops
    jit = tf.function(loss, jit_compile=True).get_concrete_function(
        tf.TensorSpec([None, 3], tf.int32), s).graph
    assert "Xmc>SquaredHingeLoss" not in {o.type for o in jit.get_operations()}


def _keras_cases():
    rng = np.random.default_rng(11)
    scores, labels = random_case(rng, 5, 23, 4)
    labels[0, 0] = -3  # any negative id is padding for the Keras loss
    weights = rng.uniform(0, 2, 5).astype(np.float32)
    return scores, labels, weights


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum", None])
@pytest.mark.parametrize("targets", ["int32", "int64", "float_ids",
                                     "multi_hot"])
@pytest.mark.parametrize("weighted", [False, True])
def test_keras_loss_equals_dense_path(monkeypatch, reduction, targets,
                                      weighted):
    scores, labels, weights = _keras_cases()
    y = {"int32": labels.astype(np.int32), "int64": labels,
         "float_ids": labels.astype(np.float32),
         "multi_hot": dense_targets(tf.constant(labels), 23).numpy()}[targets]
    sw = weights if weighted else None
    loss = SquaredHinge(margin=0.5, reduction=reduction)

    def value_and_grad():
        s = tf.constant(scores)
        with tf.GradientTape() as tape:
            tape.watch(s)
            value = loss(tf.constant(y), s, sample_weight=sw)
        return value.numpy(), tape.gradient(value, s).numpy()

    got, got_grad = value_and_grad()
    monkeypatch.setattr(hinge_module, "squared_hinge_loss_supported",
                        lambda: False)
    want, want_grad = value_and_grad()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got_grad == 0, want_grad == 0)


def test_keras_loss_get_config_unchanged():
    loss = SquaredHinge(margin=0.7, reduction="sum", name="sqh")
    config = loss.get_config()
    assert config["margin"] == 0.7 and config["reduction"] == "sum"
    again = SquaredHinge.from_config(config)
    assert again.get_config() == config


def _fit_history(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    m = 30
    y = np.full((64, 3), -1, np.int32)
    for i in range(64):
        k = int(rng.integers(1, 4))
        y[i, :k] = rng.integers(0, m, k)
    sw = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(m)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=SquaredHinge(margin=0.5), jit_compile=False)
    hist = model.fit(x, y, sample_weight=sw, batch_size=16, epochs=3,
                     shuffle=False, verbose=0)
    return hist.history["loss"], model.get_weights()


def test_model_fit_history_equals_dense_path(monkeypatch):
    got, got_w = _fit_history()
    monkeypatch.setattr(hinge_module, "squared_hinge_loss_supported",
                        lambda: False)
    want, want_w = _fit_history()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(got_w, want_w):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_package_exports():
    assert xmc_tf.ops.squared_hinge_loss is squared_hinge_loss
    assert xmc_tf.ops.squared_hinge_loss_supported()
