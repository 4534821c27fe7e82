"""Tests of xmc_tf.losses (SquaredHinge, BinaryCrossentropy, dense_targets).

References are NumPy float64 formulas (paper Sec. 2 eq. 2, Sec. 3.3):
squared hinge sum_j max(0, margin - t_j s_j)**2 with t = 2y - 1, and binary
cross-entropy from logits sum_j log(1 + exp(s_j)) - y_j s_j.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.losses import BinaryCrossentropy, SquaredHinge, dense_targets

BIG = 2 ** 24


def np_sqh(y, s, margin=1.0):
    t = 2.0 * y - 1.0
    return np.sum(np.maximum(0.0, margin - t * s.astype(np.float64)) ** 2, axis=-1)


def np_bce(y, s):
    s = s.astype(np.float64)
    return np.sum(np.logaddexp(0.0, s) - y * s, axis=-1)


def np_dense(ids, num_labels):
    out = np.zeros((ids.shape[0], num_labels), np.float32)
    for i, row in enumerate(ids):
        for j in row:
            if j >= 0:
                out[i, j] = 1.0
    return out


def make_ids(rng, b=7, n=5, m=13):
    ids = rng.integers(0, m, size=(b, n))
    ids[rng.random((b, n)) < 0.3] = -1  # padding
    ids[0] = -1                          # empty row
    ids[1, :3] = [4, 4, 4]               # duplicates
    ids[2, 0], ids[2, -1] = m - 1, 0     # boundary ids
    return ids


@pytest.mark.parametrize("loss_cls,ref", [(SquaredHinge, np_sqh),
                                          (BinaryCrossentropy, np_bce)])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_losses_match_numpy_both_encodings(loss_cls, ref, id_dtype):
    rng = np.random.default_rng(0)
    m = 13
    ids = make_ids(rng, m=m).astype(id_dtype)
    dense = np_dense(ids, m)
    s = (rng.normal(size=dense.shape) * 2).astype(np.float32)
    per_instance = ref(dense, s)

    for reduction, expected in [("sum_over_batch_size", per_instance.mean()),
                                ("sum", per_instance.sum()),
                                (None, per_instance)]:
        loss = loss_cls(reduction=reduction)
        from_ids = loss(tf.constant(ids), tf.constant(s)).numpy()
        from_dense = loss(tf.constant(dense), tf.constant(s)).numpy()
        from_bool = loss(tf.constant(dense > 0), tf.constant(s)).numpy()
        assert from_ids.shape == np.shape(expected)
        # SquaredHinge: ids go through the fused op (Xmc>SquaredHingeLoss,
        # float64 accumulation), multi-hot targets through TF's float32
        # sum: equal up to rounding, not bit for bit.
        np.testing.assert_allclose(from_ids, from_dense, rtol=1e-6)
        np.testing.assert_array_equal(from_bool, from_dense)
        np.testing.assert_allclose(from_ids, expected, rtol=1e-5)


def test_squared_hinge_margin_and_docstring_values():
    rng = np.random.default_rng(1)
    ids = make_ids(rng)
    s = rng.normal(size=(7, 13)).astype(np.float32)
    got = SquaredHinge(margin=0.5, reduction=None)(ids, s).numpy()
    np.testing.assert_allclose(got, np_sqh(np_dense(ids, 13), s, 0.5), rtol=1e-5)
    # Worked examples: max(0, 1-2)^2 + max(0, 1-0.5)^2 = 0.25
    assert float(SquaredHinge()(tf.constant([[0]]), tf.constant([[2.0, -0.5]]))) == 0.25
    np.testing.assert_allclose(
        float(BinaryCrossentropy()(tf.constant([[1]]), tf.constant([[0.0, 0.0]]))),
        2 * np.log(2.0), rtol=1e-6)


@pytest.mark.parametrize("loss_cls,ref", [(SquaredHinge, np_sqh),
                                          (BinaryCrossentropy, np_bce)])
def test_sample_weight(loss_cls, ref):
    rng = np.random.default_rng(2)
    ids = make_ids(rng)
    s = rng.normal(size=(7, 13)).astype(np.float32)
    w = rng.random(7).astype(np.float32)
    w[3] = 0.0
    per_instance = ref(np_dense(ids, 13), s)
    none = loss_cls(reduction=None)(ids, s, sample_weight=w).numpy()
    assert none.shape == (7,)
    np.testing.assert_allclose(none, w * per_instance, rtol=1e-5)
    assert none[3] == 0.0
    # Keras' sum_over_batch_size divides the weighted sum by the batch size.
    mean = loss_cls()(ids, s, sample_weight=w).numpy()
    assert mean.shape == ()
    np.testing.assert_allclose(mean, np.sum(w * per_instance) / 7, rtol=1e-5)


def test_dense_targets_matches_numpy():
    rng = np.random.default_rng(3)
    ids = make_ids(rng, b=9, n=6, m=11)
    ids[4, 2] = -7  # any negative value is padding
    got = dense_targets(tf.constant(ids), 11)
    assert got.dtype == tf.float32 and tuple(got.shape) == (9, 11)
    np.testing.assert_array_equal(got.numpy(), np_dense(ids, 11))
    # num_labels as a tensor, other dtypes
    got16 = dense_targets(tf.constant(ids), tf.constant(11), dtype=tf.float16)
    assert got16.dtype == tf.float16
    np.testing.assert_array_equal(got16.numpy().astype(np.float32), np_dense(ids, 11))
    # dense float / bool targets are returned cast
    dense = np_dense(ids, 11)
    np.testing.assert_array_equal(dense_targets(tf.constant(dense), 11).numpy(), dense)
    b = dense_targets(tf.constant(dense > 0), 11, dtype=tf.float64)
    assert b.dtype == tf.float64
    np.testing.assert_array_equal(b.numpy(), dense)
    # no ids at all
    np.testing.assert_array_equal(
        dense_targets(tf.zeros((3, 0), tf.int32), 5).numpy(), np.zeros((3, 5)))
    # docstring example
    np.testing.assert_array_equal(
        dense_targets(tf.constant([[2, -1], [0, 1]]), 3).numpy(),
        [[0, 0, 1], [1, 1, 0]])


def test_dense_targets_in_tf_function_unknown_batch():
    f = tf.function(lambda y: dense_targets(y, 6),
                    input_signature=[tf.TensorSpec([None, None], tf.int32)])
    rng = np.random.default_rng(4)
    for b, n in [(1, 1), (5, 3), (2, 7)]:
        ids = rng.integers(-1, 6, size=(b, n)).astype(np.int32)
        np.testing.assert_array_equal(f(tf.constant(ids)).numpy(), np_dense(ids, 6))


def test_dense_targets_out_of_range_id():
    with pytest.raises(tf.errors.InvalidArgumentError):
        dense_targets(tf.constant([[0, 5]]), 5).numpy()


def test_ids_above_2_pow_24_are_exact():
    # float32 cannot represent 2**24 + 3 (it rounds to 2**24 + 4); the ids must
    # be expanded in integer arithmetic.
    m = BIG + 10
    ids = np.array([[BIG + 3, BIG + 1, 5, -1, BIG + 3]], np.int64)
    dense = dense_targets(tf.constant(ids), m)
    nz = tf.where(dense[0] > 0)[:, 0].numpy()
    np.testing.assert_array_equal(nz, [5, BIG + 1, BIG + 3])
    del dense, nz

    # Scores that make the loss exactly zero everywhere except at BIG + 3.
    # If BIG + 3 were mapped to BIG + 4, BIG + 3 (s = 0.5) and BIG + 4
    # (s = -2) would both contribute large terms.
    s = np.full((1, m), -2.0, np.float32)
    s[0, [5, BIG + 1]] = 2.0
    s[0, BIG + 3] = 0.5
    s = tf.constant(s)
    sqh = SquaredHinge(reduction=None)(tf.constant(ids), s).numpy()
    assert sqh.tolist() == [0.25]

    logits = np.full((1, m), -1e4, np.float32)
    logits[0, [5, BIG + 1]] = 1e4
    logits[0, BIG + 3] = 0.0
    bce = BinaryCrossentropy(reduction=None)(tf.constant(ids), tf.constant(logits))
    np.testing.assert_allclose(bce.numpy(), [np.log(2.0)], rtol=1e-6)


def test_ids_above_2_pow_24_through_model_evaluate():
    # The compiled-loss path of Keras must not cast the ids to float either.
    m = BIG + 10
    model = keras.Sequential([keras.Input((m,)), keras.layers.Identity()])
    model.compile(loss=SquaredHinge(), jit_compile=False)
    s = np.full((1, m), -2.0, np.float32)
    s[0, BIG + 3] = 0.5
    ids = np.array([[BIG + 3, -1]], np.int64)
    value = model.evaluate(s, ids, batch_size=1, verbose=0)
    assert value == 0.25


def _grad(loss, y_true, s):
    s = tf.constant(s)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = loss(y_true, s)
    return tape.gradient(value, s).numpy()


def test_squared_hinge_gradient_exact_zeros():
    rng = np.random.default_rng(5)
    b, m = 6, 40
    ids = make_ids(rng, b=b, n=4, m=m)
    y = np_dense(ids, m)
    t = 2 * y - 1
    s = rng.uniform(-3, 3, size=(b, m)).astype(np.float32)
    # Exactly on the margin (t*s == 1): gradient must be exactly zero too.
    edge = rng.random((b, m)) < 0.15
    s[edge] = t[edge]
    s[0, :3] = [1.0, -1.0, 0.0]  # empty row: all negatives
    expected = -2.0 * t * np.maximum(0.0, 1.0 - t * s.astype(np.float64)) / b
    satisfied = t * s >= 1
    assert 0 < satisfied.sum() < satisfied.size
    for targets in (tf.constant(ids), tf.constant(y)):
        g = _grad(SquaredHinge(), targets, s)
        np.testing.assert_array_equal(g == 0.0, satisfied)
        assert int(np.sum(g == 0.0)) == int(satisfied.sum())
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=0)


def test_bce_gradient_dense():
    rng = np.random.default_rng(6)
    ids = make_ids(rng, b=5, m=9)
    y = np_dense(ids, 9)
    s = rng.normal(size=y.shape).astype(np.float32) * 3
    g = _grad(BinaryCrossentropy(), tf.constant(ids), s)
    expected = (1 / (1 + np.exp(-s.astype(np.float64))) - y) / 5
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7)
    assert np.all(g != 0.0)  # BCE never gives exact zeros: no negative mining


@pytest.mark.parametrize("loss", [
    SquaredHinge(margin=0.7, reduction="sum", name="sqh"),
    BinaryCrossentropy(reduction=None, name="bce")])
def test_serialization_round_trip(loss):
    rng = np.random.default_rng(7)
    ids = make_ids(rng)
    s = rng.normal(size=(7, 13)).astype(np.float32)
    config = loss.get_config()
    for clone in (type(loss).from_config(config),
                  keras.losses.deserialize(keras.losses.serialize(loss)),
                  keras.saving.deserialize_keras_object(
                      keras.saving.serialize_keras_object(loss))):
        assert type(clone) is type(loss)
        assert clone.get_config() == config
        np.testing.assert_array_equal(clone(ids, s).numpy(), loss(ids, s).numpy())
    assert keras.saving.serialize_keras_object(loss)["registered_name"] in (
        "xmc_tf>SquaredHinge", "xmc_tf>BinaryCrossentropy")
    if isinstance(loss, SquaredHinge):
        assert config["margin"] == 0.7


def test_compiled_model_with_ids_and_dense_targets(tmp_path):
    rng = np.random.default_rng(8)
    m = 13
    model = keras.Sequential([keras.Input((5,)),
                              keras.layers.Dense(m, kernel_initializer="random_normal")])
    model.compile(optimizer="sgd", loss=SquaredHinge(margin=0.5), jit_compile=False)
    x = rng.normal(size=(7, 5)).astype(np.float32)
    ids = make_ids(rng, m=m)
    dense = np_dense(ids, m)
    expected = np_sqh(dense, model.predict(x, verbose=0), 0.5).mean()
    v_ids = model.evaluate(x, ids, batch_size=7, verbose=0)
    v_dense = model.evaluate(x, dense, batch_size=7, verbose=0)
    np.testing.assert_allclose([v_ids, v_dense], [expected, expected], rtol=1e-5)
    # the loss (with its margin) survives a .keras round trip
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, SquaredHinge) and loaded.loss.margin == 0.5
    np.testing.assert_allclose(loaded.evaluate(x, ids, batch_size=7, verbose=0),
                               expected, rtol=1e-5)


def test_package_exports():
    assert xmc_tf.losses.SquaredHinge is SquaredHinge
    assert xmc_tf.losses.BinaryCrossentropy is BinaryCrossentropy
    assert xmc_tf.losses.dense_targets is dense_targets


def test_softmax_cross_entropy_against_numpy():
    from xmc_tf.losses import SoftmaxCrossentropy
    rng = np.random.default_rng(7)
    scores = rng.normal(size=(4, 6)).astype(np.float32) * 3
    ids = np.array([[1, 3, -1], [0, -1, -1], [-1, -1, -1], [5, 5, 2]])
    got = SoftmaxCrossentropy(reduction=None)(tf.constant(ids),
                                              tf.constant(scores)).numpy()
    log_p = scores - np.log(np.exp(scores.astype(np.float64)).sum(1,
                                                                   keepdims=True))
    want = [-(log_p[0, 1] + log_p[0, 3]) / 2, -log_p[1, 0], 0.0,
            -(log_p[3, 5] + log_p[3, 2]) / 2]  # a repeated id counts once
    np.testing.assert_allclose(got, want, rtol=1e-5)
    mean = SoftmaxCrossentropy()(tf.constant(ids), tf.constant(scores))
    np.testing.assert_allclose(float(mean), np.mean(want), rtol=1e-5)


@pytest.mark.parametrize("loss_cls", [SquaredHinge, BinaryCrossentropy])
@pytest.mark.parametrize("p", [0.0005, 0.03, 0.25, 0.5, 0.9])
def test_prior_scores_minimise_the_loss_of_a_constant(loss_cls, p):
    # Independent reference: the expected loss of a constant score c under a
    # label that is positive with rate p, minimised by a grid search with
    # the loss itself (positives and negatives weighted p and 1 - p).
    loss = loss_cls(reduction=None)
    grid = np.linspace(-10.0, 10.0, 40001).astype(np.float32)
    scores = tf.constant(grid[:, None])
    pos = loss(tf.ones([grid.size, 1]), scores).numpy()
    neg = loss(tf.zeros([grid.size, 1]), scores).numpy()
    best = grid[np.argmin(p * pos + (1 - p) * neg)]
    got = loss_cls().prior_scores([p])
    assert got.dtype == np.float32 and got.shape == (1,)
    np.testing.assert_allclose(got[0], best, atol=1e-3)


def test_softmax_prior_scores_are_the_label_distribution():
    from xmc_tf.losses import SoftmaxCrossentropy
    freq = np.array([0.5, 0.3, 0.15, 0.05])
    logits = SoftmaxCrossentropy().prior_scores(freq)
    np.testing.assert_allclose(tf.nn.softmax(logits).numpy(), freq, rtol=1e-6)
    # and it is the best constant: the expected loss of any other is higher
    rng = np.random.default_rng(0)
    ids = rng.choice(4, size=4000, p=freq)[:, None]
    loss = SoftmaxCrossentropy()
    at_prior = float(loss(tf.constant(ids), tf.tile(logits[None], [4000, 1])))
    for _ in range(5):
        other = logits + rng.normal(0, 0.3, 4).astype(np.float32)
        assert at_prior < float(loss(tf.constant(ids),
                                     tf.tile(other[None], [4000, 1])))


def test_smoothed_label_frequency():
    from xmc_tf.losses import smoothed_label_frequency
    np.testing.assert_allclose(smoothed_label_frequency([0, 2, 10], 10),
                               [0.5 / 11, 2.5 / 11, 10.5 / 11])
    with pytest.raises(ValueError, match="label counts"):
        smoothed_label_frequency([0, 11], 10)
    with pytest.raises(ValueError, match="label counts"):
        smoothed_label_frequency([-1], 10)
