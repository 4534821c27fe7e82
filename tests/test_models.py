"""build_model / build_optimizer: the encoder on sparse input, the linear
(no hidden layer) models, and the optimizer choice."""


import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.layers import SparseEmbeddingBag, UniformSparseDense
from xmc_tf.job.build import build_model, build_optimizer
from xmc_tf.optimizers import LazyAdam, LazyAdamW


def _config(head="uniform_sparse", encoder_dims=(8,), intermediate=16,
            encoder="sparse_embedding"):
    c = xconfig.base(head)
    c.model.encoder = encoder
    c.model.encoder_dims = encoder_dims
    c.model.intermediate_dim = intermediate
    c.model.connections_per_label = 4
    return c


def _batch(n=6, d=20, seed=0):
    x = sp.random(n, d, density=0.3, format="csr", random_state=seed,
                  dtype=np.float32)
    y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), np.arange(n) % 5)),
                      shape=(n, 5))
    return xdata.make_tf_dataset(xdata.XCDataset(x, y), n).get_single_element()


@pytest.mark.parametrize("encoder,layer_type", [
    ("sparse_embedding", SparseEmbeddingBag), ("dense", keras.layers.Dense)])
def test_encoder_choice_same_function(encoder, layer_type):
    model = build_model(_config(encoder=encoder), 20, 5, sparse_input=True)
    first = model.get_layer("encoder_0")
    assert type(first) is layer_type
    # Dense embeddings never use the sparse layer.
    dense = build_model(_config(encoder=encoder), 20, 5, sparse_input=False)
    assert type(dense.get_layer("encoder_0")) is keras.layers.Dense
    x, _ = _batch()
    got = first(x).numpy()
    kernel, bias = (w.numpy() for w in first.weights)
    want = np.maximum(tf.sparse.to_dense(x).numpy() @ kernel + bias, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_intermediate_dropout_masks_only_in_training():
    """model.intermediate_dropout: inference output unchanged (the same
    weights without the field), training zeroes about that fraction of the
    intermediate units and scales the rest by 1 / (1 - rate)."""
    c = _config(head="dense")
    c.model.dropout = 0.0  # only the intermediate layer's dropout acts
    plain = build_model(c, 20, 5, sparse_input=True)
    c.model.intermediate_dropout = 0.5
    model = build_model(c, 20, 5, sparse_input=True)
    model.set_weights(plain.get_weights())
    x, _ = _batch()
    np.testing.assert_allclose(model(x, training=False).numpy(),
                               plain(x, training=False).numpy(), rtol=1e-6)
    hidden = keras.Model(model.inputs,
                         model.get_layer("intermediate").output)
    after = keras.Model(model.inputs, model.layers[
        [l.name for l in model.layers].index("intermediate") + 1].output)
    h = hidden(x).numpy()
    d = after(x, training=True).numpy()
    kept = (d != 0) & (h != 0)
    np.testing.assert_allclose(d[kept], 2 * h[kept], rtol=1e-6)
    dropped = np.mean(d[h != 0] == 0)
    assert 0.3 < dropped < 0.7, dropped


@pytest.mark.parametrize("activation,negative_slope", [
    ("relu", 0.0), ("leaky_relu", 0.2), ("linear", 1.0)])
def test_intermediate_activation(activation, negative_slope):
    """model.intermediate_activation: the intermediate layer's output
    against NumPy, z where z > 0 and negative_slope * z elsewhere."""
    c = _config()
    c.model.intermediate_activation = activation
    model = build_model(c, 20, 5, sparse_input=True)
    x, _ = _batch()
    hidden = keras.Model(model.inputs, model.get_layer("encoder_0").output)
    inter = keras.Model(model.inputs, model.get_layer("intermediate").output)
    kernel, bias = (w.numpy() for w in model.get_layer("intermediate").weights)
    z = hidden(x, training=False).numpy() @ kernel + bias
    assert (z < 0).any() and (z > 0).any()
    want = np.where(z > 0, z, negative_slope * z)
    np.testing.assert_allclose(inter(x, training=False).numpy(), want,
                               rtol=1e-5, atol=1e-6)


def test_unknown_encoder_and_optimizer():
    with pytest.raises(ValueError, match="config.model.encoder"):
        build_model(_config(encoder="tree"), 20, 5, sparse_input=True)
    c = _config()
    c.model.intermediate_activation = "tanh"
    with pytest.raises(ValueError, match="intermediate_activation='tanh'"):
        build_model(c, 20, 5, sparse_input=True)
    c = _config()
    c.train.optimizer = "adagrad"
    with pytest.raises(ValueError, match="config.train.optimizer"):
        build_optimizer(c)
    c.train.optimizer = "lazy_adam"
    opt = build_optimizer(c)
    assert isinstance(opt, LazyAdam) and opt.weight_decay is None
    c.train.optimizer = "lazy_adamw"
    c.train.weight_decay = 0.25
    opt = build_optimizer(c)
    assert isinstance(opt, LazyAdamW) and opt.weight_decay == 0.25


def test_cosine_schedule_decays_per_step_to_the_minimum():
    """``train.schedule="cosine"``: the rate starts at ``learning_rate``,
    follows ``min + (lr - min) (1 + cos(pi t / T)) / 2`` per step over
    ``epochs * steps_per_epoch`` steps and stays at ``min_learning_rate``
    (an independent formula, not Keras' code)."""
    from xmc_tf.job.build import learning_rate
    c = _config()
    assert learning_rate(c, 10) == c.train.learning_rate  # "plateau"
    c.train.schedule = "cosine"
    c.train.epochs, c.train.learning_rate = 3, 1e-2
    c.train.min_learning_rate = 1e-3
    schedule = learning_rate(c, steps_per_epoch=10)
    total = 30
    for step in (0, 7, 15, 29, 30, 45):
        t = min(step, total)
        want = 1e-3 + (1e-2 - 1e-3) * (1 + np.cos(np.pi * t / total)) / 2
        np.testing.assert_allclose(float(schedule(step)), want, rtol=1e-5)
    opt = build_optimizer(c, steps_per_epoch=10)
    opt.iterations.assign(15)
    np.testing.assert_allclose(float(opt.learning_rate), 5.5e-3, rtol=1e-5)
    with pytest.raises(ValueError, match="steps per epoch"):
        learning_rate(c)
    c.train.schedule = "linear"
    with pytest.raises(ValueError, match="config.train.schedule='linear'"):
        build_optimizer(c, 10)


def test_cosine_schedule_replaces_plateau_halving_in_the_callbacks():
    from xmc_tf import callbacks as xcallbacks
    from xmc_tf.job import fit as xfit
    c = _config()
    head = heads.get_head(c)
    kinds = lambda cbs: {type(cb) for cb in cbs}  # noqa: E731
    plateau = kinds(xfit.make_callbacks(c, "/nonexistent", head, None, None))
    assert xcallbacks.ReduceLROnPlateau in plateau
    assert xfit.LogLearningRate not in plateau
    c.train.schedule = "cosine"
    cosine = kinds(xfit.make_callbacks(c, "/nonexistent", head, None, None))
    assert xcallbacks.ReduceLROnPlateau not in cosine
    assert {xfit.LogLearningRate, xcallbacks.EarlyStopping} <= cosine


def test_check_config_rejects_bad_weight_decay():
    from xmc_tf.job.checks import check_config
    from xmc_tf.errors import ConfigError
    c = xconfig.get_config("uniform_sparse")
    c.train.optimizer = "lazy_adamw"
    check_config(c)
    c.train.weight_decay = -0.1
    with pytest.raises(ConfigError, match=r"config.train.weight_decay=-0.1"):
        check_config(c)


@pytest.mark.parametrize("head,layer_type", [
    ("dense", SparseEmbeddingBag), ("uniform_sparse", UniformSparseDense)])
def test_linear_model_on_sparse_input(head, layer_type):
    model = build_model(_config(head, encoder_dims=(), intermediate=0), 20, 5,
                        sparse_input=True)
    out = decoding.scoring_layer(model)
    assert isinstance(out, layer_type) and len(model.layers) == 2
    assert decoding.scores_every_label(model)
    x, y = _batch()
    dense_x = tf.sparse.to_dense(x).numpy()
    if head == "dense":
        kernel, bias = (w.numpy() for w in out.weights)
        want = dense_x @ kernel + bias
    else:
        idx, w = out.indices.numpy(), out.kernel.numpy()
        want = np.einsum("bmk,mk->bm", dense_x[:, idx], w) + out.bias.numpy()
    np.testing.assert_allclose(model(x).numpy(), want, rtol=1e-5, atol=1e-6)
