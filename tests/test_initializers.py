"""PriorBias (xmc_tf.initializers): the output layers' default bias.

References: the closed-form minimisers of each loss over a constant score,
written out here (not the losses' ``prior_scores``), and the README's toy
problem (3 labels per instance, the top-3 of a random linear map), on which
a zero bias under the squared hinge does not learn at all.
"""

import json
import math

import keras
import numpy as np
import pytest

import xmc_tf
from xmc_tf.initializers import PriorBias
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.losses import (BinaryCrossentropy, SoftmaxCrossentropy,
                           SquaredHinge)
from xmc_tf.metrics import PrecisionAtK


def _values(init, shape):
    return keras.ops.convert_to_numpy(init(shape, dtype="float32"))


@pytest.mark.parametrize("loss,lpi,margin,m,want", [
    ("squared_hinge", None, 1.0, 7, -1.0),             # rare-label limit
    ("squared_hinge", None, 0.5, 3, -0.5),
    ("squared_hinge", 3.0, 2.0, 5000, 2.0 * (2 * 3 / 5000 - 1)),
    ("squared_hinge", 10.0, 1.0, 4, 1.0),             # p capped at 1
    ("bce", 3.0, 1.0, 5000, math.log((3 / 5000) / (1 - 3 / 5000))),
    ("softmax", 1.0, 1.0, 100, math.log(1 / 100)),
])
def test_values_are_each_losses_constant_minimiser(loss, lpi, margin, m, want):
    init = PriorBias(loss, lpi, margin)
    got = _values(init, (m,))
    assert got.dtype == np.float32 and got.shape == (m,)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # The minimiser: a grid search of the expected loss at p = lpi / m.
    p = 0.0 if lpi is None else min(lpi / m, 1.0)
    if loss == "squared_hinge" and 0 < p < 1:
        c = np.linspace(-3 * margin, 3 * margin, 600001)
        risk = (p * np.maximum(0, margin - c) ** 2
                + (1 - p) * np.maximum(0, margin + c) ** 2)
        assert abs(c[np.argmin(risk)] - want) < 1e-4


def test_loss_methods_and_the_registered_name():
    assert repr(SquaredHinge(margin=2.0).bias_initializer()) == (
        "PriorBias(loss='squared_hinge', labels_per_instance=None, "
        "margin=2.0)")
    assert BinaryCrossentropy().bias_initializer(3).get_config() == {
        "loss": "bce", "labels_per_instance": 3.0, "margin": 1.0}
    assert SoftmaxCrossentropy().bias_initializer(1).loss == "softmax"
    init = keras.initializers.get("hinge_prior")
    assert isinstance(init, PriorBias)
    np.testing.assert_array_equal(_values(init, (4,)), -1.0)
    # Serialized under its registered name, and back.
    config = keras.initializers.serialize(PriorBias("bce", 2.0))
    assert config["registered_name"] == "xmc_tf>PriorBias"
    back = keras.initializers.deserialize(json.loads(json.dumps(config)))
    assert back.get_config() == {"loss": "bce", "labels_per_instance": 2.0,
                                 "margin": 1.0}
    # Usable by any layer, e.g. keras.layers.Dense.
    dense = keras.layers.Dense(3, bias_initializer="hinge_prior")
    dense.build((None, 2))
    np.testing.assert_array_equal(dense.bias.numpy(), -1.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"loss": "hinge"}, "loss='hinge'"),
    ({"loss": "bce"}, "needs labels_per_instance"),
    ({"loss": "softmax"}, "needs labels_per_instance"),
    ({"labels_per_instance": 0}, "must be > 0"),
    ({"margin": -1.0}, "margin must be > 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PriorBias(**kwargs)


def test_empty_label_axis_is_an_error():
    with pytest.raises(ValueError, match=">= 1 label"):
        PriorBias()((0,))


@pytest.mark.parametrize("make", [lambda: UniformSparseDense(6, 2, seed=0),
                                  lambda: LabelDense(6)])
def test_layers_default_to_the_hinge_prior_and_round_trip(make, tmp_path):
    layer = make()
    model = keras.Sequential([keras.Input((4,)), layer])
    np.testing.assert_array_equal(layer.bias.numpy(), -1.0)
    config = layer.get_config()
    assert config["bias_initializer"]["registered_name"] == "xmc_tf>PriorBias"
    clone = type(layer).from_config(json.loads(json.dumps(config)))
    assert isinstance(clone.bias_initializer, PriorBias)
    # Configs written before the default changed name Zeros: kept.
    old = dict(config, bias_initializer={
        "module": "keras.initializers", "class_name": "Zeros", "config": {},
        "registered_name": None})
    old_layer = type(layer).from_config(old)
    keras.Sequential([keras.Input((4,)), old_layer])
    np.testing.assert_array_equal(old_layer.bias.numpy(), 0.0)
    # A config without the key gets the new default.
    del old["bias_initializer"]
    assert isinstance(type(layer).from_config(old).bias_initializer,
                      PriorBias)
    # Whole-model save and load: the trained bias, and the initializer.
    layer.bias.assign(np.arange(6, dtype=np.float32))
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.layers[-1].bias.numpy(),
                                  np.arange(6))
    assert isinstance(loaded.layers[-1].bias_initializer, PriorBias)


def _toy(n=1024, d=32, m=1000, seed=0):
    """The README's toy: 3 labels per instance, the top-3 of x @ W."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = np.argsort(-(x @ rng.standard_normal((d, m))), axis=1)[:, :3]
    return x, y.astype(np.int32)


def _train_p1(out, loss, epochs, data):
    keras.utils.set_random_seed(0)
    x, y = data
    model = keras.Sequential([
        keras.Input(x.shape[1:]),
        keras.layers.Dense(512, activation="leaky_relu"), out])
    model.compile("adam", loss=loss, metrics=[PrecisionAtK(1)],
                  jit_compile=False)
    history = model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return history.history["precision_at_1"][-1]


def test_label_dense_learns_with_the_default_bias():
    """LabelDense + SquaredHinge out of the box: train P@1 0.99 after 6
    epochs (measured; 0.58 with a zero bias)."""
    data = _toy(n=2048, m=2000)
    assert _train_p1(LabelDense(2000), SquaredHinge(), 6, data) >= 0.9


def test_bce_learns_from_its_own_prior():
    """BinaryCrossentropy with ``bias_initializer(labels_per_instance)``
    (-5.8 for 3 labels of 1000): train P@1 0.99 after 10 epochs (measured;
    0.25 with a zero bias, 0.45 with the layer's default -1; on the
    README's toy both of those stay near 0.001)."""
    loss = BinaryCrossentropy()
    out = LabelDense(1000, bias_initializer=loss.bias_initializer(3))
    assert _train_p1(out, loss, 10, _toy()) >= 0.9


# ---------------------------------------------------------------------------
# Block-by-block draws of large matrices.

@pytest.mark.parametrize("init, moments", [
    # Glorot uniform on [rows, cols]: U(-l, l), l = sqrt(6 / (rows + cols)).
    (keras.initializers.GlorotUniform(seed=3),
     lambda r, c: (0.0, math.sqrt(6 / (r + c)) / math.sqrt(3))),
    (keras.initializers.HeNormal(seed=3),  # truncated, stddev sqrt(2 / r)
     lambda r, c: (0.0, math.sqrt(2 / r))),
    (keras.initializers.RandomUniform(-0.05, 0.05, seed=3),
     lambda r, c: (0.0, 0.1 / math.sqrt(12))),
    (keras.initializers.RandomNormal(0.5, 2.0, seed=3),
     lambda r, c: (0.5, 2.0)),
    (keras.initializers.Constant(0.25), lambda r, c: (0.25, 0.0)),
])
def test_chunked_draw_has_the_whole_draws_distribution(init, moments):
    rows, cols = 20_000, 24
    value = xmc_tf.initializers.chunked_initial_value(
        init, (rows, cols), chunk_bytes=4 * cols * 777)  # 26 blocks
    assert value.shape == (rows, cols) and value.dtype == np.float32
    whole = keras.ops.convert_to_numpy(init((rows, cols)))
    mean, std = moments(rows, cols)
    for v in (value, whole):
        assert abs(v.mean() - mean) < 0.01 * max(std, 1e-3) + 1e-6
        assert v.std() == pytest.approx(std, rel=0.02, abs=1e-6)
        assert np.abs(v - mean).max() <= max(whole.max() - mean,
                                             mean - whole.min()) + 1e-6
    if std > 0:
        # The blocks are not repeats of one another (an int seed given to
        # every block would make them so).
        assert not np.array_equal(value[:777], value[777:1554])
        again = xmc_tf.initializers.chunked_initial_value(
            type(init).from_config(init.get_config()), (rows, cols),
            chunk_bytes=4 * cols * 777)
        np.testing.assert_array_equal(again, value)  # seeded: reproducible


def test_chunked_draw_needs_a_known_distribution_and_float32():
    class Custom(keras.initializers.Initializer):
        def __call__(self, shape, dtype=None):
            return keras.ops.ones(shape, dtype)

    assert xmc_tf.initializers.chunked_initial_value(Custom(), (4, 3)) is None
    assert xmc_tf.initializers.chunked_initial_value(
        "glorot_uniform", (4, 3), dtype="float16") is None
    with pytest.raises(ValueError, match="shape"):
        xmc_tf.initializers.chunked_initial_value("zeros", (-1, 3))
    # Below CHUNKED_INIT_BYTES a layer keeps its initializer as it is.
    init = keras.initializers.GlorotUniform(seed=1)
    assert xmc_tf.initializers.large_matrix_initializer(
        init, (1000, 32)) is init
    big = xmc_tf.initializers.large_matrix_initializer(
        init, (xmc_tf.initializers.CHUNKED_INIT_BYTES // 128, 32))
    assert big is not init and callable(big)
    assert isinstance(xmc_tf.initializers.large_matrix_initializer(
        Custom(), (xmc_tf.initializers.CHUNKED_INIT_BYTES // 128, 32)),
        Custom)


def test_layers_draw_large_kernels_in_blocks(monkeypatch):
    """Above CHUNKED_INIT_BYTES the uniform-sparse kernel and the embedding
    are drawn block by block (another draw of the same distribution);
    below it, by their initializer in one call (the values of before)."""
    from xmc_tf.layers import SparseEmbeddingBag

    def kernels():
        head = UniformSparseDense(
            40_000, 8, seed=0,
            kernel_initializer=keras.initializers.GlorotUniform(seed=5))
        head.build((None, 64))
        emb = SparseEmbeddingBag(
            16, kernel_initializer=keras.initializers.RandomUniform(
                -0.05, 0.05, seed=5))
        emb.build((None, 30_000))
        return head.kernel.numpy(), emb.kernel.numpy()

    head_whole = keras.ops.convert_to_numpy(
        keras.initializers.GlorotUniform(seed=5)((40_000, 8)))
    emb_whole = keras.ops.convert_to_numpy(keras.initializers.RandomUniform(
        -0.05, 0.05, seed=5)((30_000, 16)))
    head, emb = kernels()
    np.testing.assert_array_equal(head, head_whole)
    np.testing.assert_array_equal(emb, emb_whole)
    monkeypatch.setattr(xmc_tf.initializers, "CHUNKED_INIT_BYTES", 1 << 20)
    head, emb = kernels()  # one block: the one-call draw
    np.testing.assert_array_equal(head, head_whole)
    np.testing.assert_array_equal(emb, emb_whole)
    monkeypatch.setattr(xmc_tf.initializers, "CHUNK_BYTES", 100_000)
    head, emb = kernels()
    for got, whole in ((head, head_whole), (emb, emb_whole)):
        assert not np.array_equal(got, whole)
        assert np.abs(got).max() <= np.abs(whole).max() + 1e-7
        assert got.std() == pytest.approx(whole.std(), rel=0.02)
