"""The wide path (issue 29): input-feature dropout, the per-label linear
layer on the input features with data-chosen connections, its learning-rate
multiplier, and the early-stopping ``min_delta``; each against a NumPy or
dense reference."""


import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.callbacks import SetRewiring
from xmc_tf.layers import (SparseDropout, UniformSparseDense,
                           label_feature_connections)
from xmc_tf.job import wide as xwide
from xmc_tf.job.build import build_model, build_network
from xmc_tf.errors import ConfigError
from xmc_tf.job.checks import check_config
from xmc_tf.job.fit import make_callbacks


def _data(n=40, d=30, m=6, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(n, d, density=0.2, format="csr", random_state=seed,
                  dtype=np.float32)
    y = sp.csr_matrix((rng.random((n, m)) < 0.3).astype(np.float32))
    return xdata.XCDataset(x, y)


# -- SparseDropout -----------------------------------------------------------

def test_sparse_dropout_drops_rate_and_keeps_expectation():
    n = 20000
    x = tf.SparseTensor(np.stack([np.arange(n) % 100, np.arange(n) // 100], 1),
                        np.full(n, 2.0, np.float32), [100, 200])
    layer = SparseDropout(0.25, seed=1)
    out = layer(x, training=True)
    kept = out.values.numpy()
    assert abs(kept.size / n - 0.75) < 0.02
    np.testing.assert_allclose(kept, 2.0 / 0.75, rtol=1e-6)
    # Kept entries keep their positions (a subset of the input's).
    got = {tuple(i) for i in out.indices.numpy().tolist()}
    assert got <= {tuple(i) for i in x.indices.numpy().tolist()}
    assert abs(kept.sum() / (2.0 * n) - 1.0) < 0.03
    same = layer(x, training=False)
    np.testing.assert_array_equal(same.values.numpy(), x.values.numpy())


def test_sparse_dropout_dense_input_and_config():
    x = np.ones((50, 40), np.float32)
    layer = SparseDropout(0.5, seed=0)
    out = layer(x, training=True).numpy()
    assert set(np.unique(out).tolist()) <= {0.0, 2.0}
    assert 0.4 < (out == 0).mean() < 0.6
    clone = SparseDropout.from_config(layer.get_config())
    assert (clone.rate, clone.seed) == (0.5, 0)
    with pytest.raises(ValueError, match="rate"):
        SparseDropout(1.0)


# -- label_feature_connections -------------------------------------------------

def test_label_feature_connections_match_dense_reference():
    data = _data()
    s = 4
    conn, w = label_feature_connections(data.features, data.labels, s, seed=0,
                                        return_weights=True)
    agg = (data.labels.toarray() > 0).T.astype(np.float64) @ \
        data.features.toarray()
    assert conn.shape == w.shape == (6, s)
    for j in range(6):
        row = conn[j]
        assert len(set(row.tolist())) == s and np.all(np.diff(row) > 0)
        support = np.flatnonzero(agg[j])
        if support.size >= s:
            # The s largest aggregate values (ties aside).
            assert np.sort(agg[j][row])[0] >= np.sort(agg[j])[-s] - 1e-6
            np.testing.assert_allclose(
                w[j], agg[j][row] / np.linalg.norm(agg[j][row]), rtol=1e-5)
        else:
            assert set(support.tolist()) <= set(row.tolist())


def test_label_feature_connections_fill_and_errors():
    x = sp.csr_matrix(np.array([[0., 1., 0., 0., 0.]], np.float32))
    y = sp.csr_matrix(np.array([[1., 0.]], np.float32))
    conn = label_feature_connections(x, y, 3, seed=0)
    assert 1 in conn[0] and len(set(conn[0].tolist())) == 3
    assert len(set(conn[1].tolist())) == 3  # a label without instances
    with pytest.raises(ValueError, match="connections_per_label"):
        label_feature_connections(x, y, 6)
    with pytest.raises(ValueError, match="rows"):
        label_feature_connections(x, sp.csr_matrix((2, 2)), 2)


def _hot_feature_data(n=60, d=40, m=20, seed=3):
    """Feature 0 in every instance: in every label's choices."""
    rng = np.random.default_rng(seed)
    x = sp.random(n, d, density=0.1, format="lil", random_state=seed,
                  dtype=np.float32)
    x[:, 0] = rng.random((n, 1)).astype(np.float32) + 0.1
    y = sp.csr_matrix((rng.random((n, m)) < 0.2).astype(np.float32))
    return sp.csr_matrix(x), y


def test_max_fan_out_keeps_a_feature_where_it_weighs_most():
    x, y = _hot_feature_data()
    s, cap = 4, 12
    free_conn, free_w = label_feature_connections(x, y, s, seed=0,
                                                  return_weights=True)
    conn, w = label_feature_connections(x, y, s, seed=0, return_weights=True,
                                        max_fan_out=cap)
    free_fan_out = np.bincount(free_conn.ravel())
    # every label has feature 0, no other feature is above the cap
    assert free_fan_out[0] == 20 and free_fan_out[1:].max() <= cap
    fan_out = np.bincount(conn.ravel(), minlength=x.shape[1])
    assert fan_out.max() <= cap and fan_out[0] == cap
    for j in range(20):
        assert len(set(conn[j].tolist())) == s and np.all(np.diff(conn[j]) > 0)
    # Feature 0 stays in the labels where its normalised weight is largest.
    weight_of_0 = np.array([free_w[j][free_conn[j] == 0][0] for j in range(20)])
    kept = np.flatnonzero((conn == 0).any(axis=1))
    assert sorted(kept.tolist()) == sorted(
        np.argsort(-weight_of_0, kind="stable")[:cap].tolist())
    # Elsewhere the labels keep their other connections and weights; the
    # replacement connection starts at weight 0.
    for j in range(20):
        if j in kept:
            np.testing.assert_array_equal(conn[j], free_conn[j])
            continue
        others = free_conn[j] != 0
        assert set(free_conn[j][others].tolist()) <= set(conn[j].tolist())
        new = ~np.isin(conn[j], free_conn[j])
        assert new.sum() == 1 and w[j][new] == 0.0
    # Without a cap: the same as before; a cap must be positive.
    np.testing.assert_array_equal(
        label_feature_connections(x, y, s, seed=0, max_fan_out=None),
        free_conn)
    with pytest.raises(ValueError, match="max_fan_out=0 must be >= 1"):
        label_feature_connections(x, y, s, seed=0, max_fan_out=0)


def test_wide_max_fan_out_is_a_multiple_of_the_mean_fan_out():
    x, y = _hot_feature_data()
    data = xdata.XCDataset(x, y)
    config = _config(wide_connections=4, wide_max_fan_out=2.0)
    head = heads.get_head(config)
    head.prepare(data)
    _, _, wide = build_network(config, 40, 20, sparse_input=True, head=head)
    xwide.initialize_wide(wide, config, data)
    # ceil(2 * 20 labels * 4 connections / 40 features) = 4 labels a feature
    np.testing.assert_array_equal(
        wide.indices.numpy(),
        label_feature_connections(x, y, 4, seed=config.seed, max_fan_out=4))
    assert np.bincount(wide.indices.numpy().ravel()).max() <= 4


# -- kernel_scale --------------------------------------------------------------

def test_kernel_scale_equals_scaled_kernel_and_scales_adam_step():
    x = np.random.default_rng(0).random((3, 10)).astype(np.float32)
    a = UniformSparseDense(7, 4, seed=0, kernel_scale=10.0)
    b = UniformSparseDense(7, 4, seed=0)
    a(x), b(x)
    b.kernel.assign(a.kernel.numpy() * 10.0)
    b.bias.assign(a.bias.numpy())
    np.testing.assert_allclose(a(x).numpy(), b(x).numpy(), rtol=1e-5)
    cands = np.array([[0, 3], [6, 6], [1, 2]], np.int32)
    np.testing.assert_allclose(a.score_candidates(x, cands).numpy(),
                               b.score_candidates(x, cands).numpy(), rtol=1e-5)
    np.testing.assert_allclose(a.score_shared(x, cands[0]).numpy(),
                               b.score_shared(x, cands[0]).numpy(), rtol=1e-5)
    # One Adam step moves the effective weights kernel_scale times as far.
    moves = []
    for layer in (a, b):
        scale = layer.kernel_scale
        before = layer.kernel.numpy() * scale
        opt = keras.optimizers.Adam(1e-3)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        opt.apply_gradients(zip(tape.gradient(loss, [layer.kernel]),
                                [layer.kernel]))
        moves.append(np.abs(layer.kernel.numpy() * scale - before).max())
    np.testing.assert_allclose(moves[0], 10 * moves[1], rtol=1e-3)
    assert UniformSparseDense.from_config(a.get_config()).kernel_scale == 10.0
    with pytest.raises(ValueError, match="kernel_scale"):
        UniformSparseDense(3, 2, kernel_scale=0)


# -- the wide path in the model ------------------------------------------------

def _config(**model):
    c = xconfig.get_config("uniform_sparse")
    c.model.encoder_dims = (8,)
    c.model.intermediate_dim = 16
    c.model.connections_per_label = 4
    c.model.update(model)
    return c


def test_wide_model_adds_linear_scores_from_the_input():
    data = _data()
    config = _config(wide_connections=5, wide_lr_multiplier=3.0,
                     input_dropout=0.1)
    head = heads.get_head(config)
    head.prepare(data)
    model, out, wide = build_network(config, 30, 6, sparse_input=True,
                                     head=head)
    head.initialize(out, model)
    xwide.initialize_wide(wide, config, data)
    assert wide.name == "wide"
    want_conn = label_feature_connections(data.features, data.labels, 5,
                                          seed=config.seed)
    np.testing.assert_array_equal(wide.indices.numpy(), want_conn)
    assert not wide.use_bias and wide.kernel_scale == 3.0
    np.testing.assert_array_equal(wide.kernel.numpy(), 0)  # "zeros" start
    wide.kernel.assign(np.random.default_rng(1).random((6, 5)).astype(np.float32))
    x, _ = xdata.make_tf_dataset(data, 40).get_single_element()
    sub = keras.Model(model.inputs, [out.output])
    dense_x = tf.sparse.to_dense(x).numpy()
    linear = np.zeros((40, 6), np.float32)
    for j in range(6):
        linear[:, j] = 3.0 * dense_x[:, want_conn[j]] @ wide.kernel.numpy()[j]
    np.testing.assert_allclose(model(x, training=False).numpy(),
                               sub(x, training=False).numpy() + linear,
                               rtol=1e-4, atol=1e-5)
    # SET rewires the deep head only, never the data-chosen connections.
    cb = [c for c in head.callbacks(out, None) if isinstance(c, SetRewiring)]
    assert cb and cb[0]._targets() == [out]


def test_wide_centroid_start_scores_positives_one_on_average():
    data = _data()
    config = _config(wide_connections=5, wide_init="centroid")
    head = heads.get_head(config)
    head.prepare(data)
    _, _, wide = build_network(config, 30, 6, sparse_input=True, head=head)
    xwide.initialize_wide(wide, config, data)
    dense_x = data.features.toarray()
    pos_i, pos_j = np.nonzero(data.labels.toarray())
    w = wide.kernel.numpy() * wide.kernel_scale  # the effective weights
    idx = wide.indices.numpy()
    scores = [dense_x[i, idx[j]] @ w[j] for i, j in zip(pos_i, pos_j)]
    assert abs(np.mean(scores) - 1.0) < 1e-4


def test_wide_path_config_checks_and_min_delta(tmp_path):
    for field, value in (("model.wide_connections", -1),
                         ("model.input_dropout", 1.0),
                         ("train.min_delta", -0.1),
                         ("model.wide_max_fan_out", 0.0),
                         ("model.wide_init", "centroids")):
        c = _config()
        section, name = field.split(".")
        c[section][name] = value
        with pytest.raises(ConfigError, match=name):
            check_config(c)
    c = xconfig.get_config("mach")
    c.model.wide_connections = 4  # MACH has no wide path: built without
    names = [l.name for l in build_model(c, 30, 6, sparse_input=True).layers]
    assert "wide" not in names and "output" in names
    c = _config()
    c.train.min_delta = 0.002
    cbs = make_callbacks(c, str(tmp_path), heads.get_head(c), None, object())
    stops = [cb for cb in cbs if isinstance(cb, keras.callbacks.EarlyStopping)]
    lrs = [cb for cb in cbs
           if isinstance(cb, keras.callbacks.ReduceLROnPlateau)]
    assert stops[0].min_delta == 0.002 and lrs[0].min_delta == 0.002


# -- The wide path's memory cap (config.model.wide_max_mib) -----------------

@pytest.mark.parametrize("max_mib,labels,want", [
    (64, 159, 128),        # Bibtex-sized: untouched
    (64, 26_214, 128),     # the largest label count with all 128
    (64, 26_215, 127),
    (64, 670_091, 5),      # Amazon-670K
    (64, 3_400_000, 0),    # no room for one connection per label
    (None, 670_091, 128),  # no cap
    (0, 10, 0)])
def test_wide_fan_in_caps_the_training_bytes(max_mib, labels, want):
    mc = _config(wide_connections=128, wide_max_mib=max_mib).model
    # 20 bytes per connection: weight, index, two Adam moments, gradient.
    assert xwide.wide_fan_in(mc, 200_000, labels) == want
    if max_mib is not None and want:
        assert 20 * labels * want <= max_mib * 2**20
        assert 20 * labels * (want + 1) > max_mib * 2**20 or want == 128
    assert xwide.wide_fan_in(mc, 50, labels) == min(want, 50)


def test_capped_wide_path_is_built_and_initialized_with_the_same_fan_in(
        caplog):
    # A cap of 0 MiB turns the path off (logged); with the cap lifted the
    # layer has all 5 connections.
    data = _data()
    config = _config(wide_connections=5, wide_max_mib=0)
    head = heads.get_head(config)
    with caplog.at_level("INFO", logger="absl"):
        model, _, wide = build_network(config, 30, 6, sparse_input=True,
                                       head=head)
    assert wide is None
    assert "wide" not in [layer.name for layer in model.layers]
    assert "built without it" in caplog.text

    config = _config(wide_connections=5, wide_max_mib=None)
    _, _, wide = build_network(config, 30, 6, sparse_input=True,
                               head=heads.get_head(config))
    xwide.initialize_wide(wide, config, data)
    np.testing.assert_array_equal(
        wide.indices.numpy(),
        label_feature_connections(data.features, data.labels, 5,
                                  seed=config.seed))

    # 1 MiB at 17,476 labels: 3 connections (20 * 17476 * 3 <= 2**20 <
    # 20 * 17476 * 4); the layer and the head's connections agree.
    data = _data(n=60, m=17_476, seed=1)
    config = _config(wide_connections=5, wide_max_mib=1)
    _, _, wide = build_network(config, 30, 17_476, sparse_input=True,
                               head=heads.get_head(config))
    xwide.initialize_wide(wide, config, data)
    assert wide.indices.shape == (17_476, 3)
    np.testing.assert_array_equal(
        wide.indices.numpy(),
        label_feature_connections(data.features, data.labels, 3,
                                  seed=config.seed))


def test_wide_max_mib_is_checked():
    c = _config(wide_max_mib=-1)
    with pytest.raises(ConfigError, match="wide_max_mib"):
        check_config(c)
    check_config(_config(wide_max_mib=None))
