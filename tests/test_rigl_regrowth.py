"""Tests of gradient-based (RigL) regrowth in SET rewiring.

Evci et al. 2020, Sec. 3: the connections grown are those of largest
|dense gradient| dL/dW = G^T X.  References: NumPy (the dense product and
a top-n per row) and the gradient TensorFlow gives for a dense Keras layer
holding the same weights (the independent dense equivalent).
"""

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import config as xconfig
from xmc_tf.job import heads as xheads
from xmc_tf.callbacks import SetRewiring, rewire
from xmc_tf.callbacks.rewiring import gradient_candidates, layer_gradient_sample
from xmc_tf.layers import UniformSparseDense, random_connections
from xmc_tf.losses import SquaredHinge


def np_(v):
    return keras.ops.convert_to_numpy(v)


def reference_candidates(x, g, indices, n):
    """Top-n |G^T X| per label outside its connections, -1 for zeros."""
    d = np.abs(np.asarray(g, np.float64).T @ np.asarray(x, np.float64))
    out = np.full((indices.shape[0], n), -1)
    for j in range(indices.shape[0]):
        row = d[j].copy()
        row[indices[j]] = 0.0
        order = [f for f in np.argsort(-row, kind="stable") if row[f] > 0][:n]
        out[j, :len(order)] = order
    return out


@pytest.mark.parametrize("sparse_x", [False, True])
@pytest.mark.parametrize("block_bytes", [1 << 20, 4 * 30 * 2])  # 1 or 2 labels
def test_gradient_candidates_match_numpy(sparse_x, block_bytes):
    rng = np.random.default_rng(0)
    n_inst, m, e, s, n = 40, 9, 30, 5, 4
    x = rng.normal(size=(n_inst, e)).astype(np.float32)
    x[rng.random(x.shape) < 0.7] = 0.0
    g = rng.normal(size=(n_inst, m)).astype(np.float32)
    g[rng.random(g.shape) < 0.8] = 0.0
    g[:, 3] = 0.0  # a label without gradient: all -1
    g[:, 5] = 0.0
    g[7, 5] = 1.0  # one instance: fewer than n non-zero sources
    x[7] = 0.0
    x[7, [2, 11]] = [0.5, -2.0]
    indices = random_connections(m, s, e, seed=1)
    got = gradient_candidates(sp.csr_matrix(x) if sparse_x else x,
                              sp.csr_matrix(g), indices, n,
                              block_bytes=block_bytes)
    ref = reference_candidates(x, g, indices, n)
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.int32
    assert np.all(got[3] == -1)
    assert sorted(got[5][got[5] >= 0].tolist()) == sorted(
        {2, 11} - set(indices[5].tolist()))


def test_gradient_candidates_shape_mismatch_raises():
    with pytest.raises(ValueError, match="output_grads has shape"):
        gradient_candidates(np.zeros((4, 6)), np.zeros((3, 2)),
                            np.zeros((2, 1), np.int32), 1)


def test_rewire_grows_at_given_sources_then_draws_the_rest():
    rng = np.random.default_rng(0)
    m, s, e, fraction = 30, 10, 60, 0.3
    n = 3
    old = random_connections(m, s, e, seed=1)
    w = rng.normal(size=(m, s)).astype(np.float32)
    grow = np.full((m, n), -1, np.int64)
    for j in range(m):
        free = np.setdiff1d(np.arange(e), old[j])
        k = j % (n + 1)  # 0..n given sources
        grow[j, :k] = rng.choice(free, k, replace=False)
    new, pos = rewire(old, w, fraction, e, np.random.default_rng(2), grow=grow)
    ref_pos = np.sort(np.argsort(np.abs(w), axis=1)[:, :n], axis=1)
    np.testing.assert_array_equal(pos, ref_pos)
    for j in range(m):
        srt = np.sort(new[j])
        assert np.all(srt[1:] != srt[:-1]) and new[j].min() >= 0
        assert new[j].max() < e
        given = grow[j][grow[j] >= 0]
        grown = new[j, pos[j]]
        assert set(given.tolist()) <= set(grown.tolist())
        assert not set(grown.tolist()) & set(old[j].tolist())  # all fresh
    with pytest.raises(ValueError, match="grow has shape"):
        rewire(old, w, fraction, e, np.random.default_rng(2),
               grow=grow[:, :2])


def hidden_model(m, e, s, seed=0):
    inp = keras.Input((e,))
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
    out = UniformSparseDense(m, s, seed=seed, name="out",
                             bias_initializer="zeros")(h)
    model = keras.Model(inp, out)
    model.compile(optimizer="adam", loss=SquaredHinge())
    return model


def test_layer_gradient_sample_is_the_dense_layers_gradient():
    """G^T X equals the gradient of the loss w.r.t. a dense kernel holding
    the same weights (zero off the connections), on every entry."""
    rng = np.random.default_rng(0)
    m, e, s, b = 12, 8, 3, 20
    model = hidden_model(m, e, s)
    layer = model.get_layer("out")
    layer.kernel.assign(rng.normal(size=(m, s)).astype(np.float32))
    x = rng.normal(size=(b, e)).astype(np.float32)
    y = np.stack([rng.choice(m, 2, replace=False) for _ in range(b)]
                 ).astype(np.int32)
    batches = [(x[:11], y[:11]), (x[11:], y[11:])]
    [(xs, gs)] = layer_gradient_sample(model, [layer], batches)
    assert "call" not in layer.__dict__  # the wrappers are gone
    d = np.asarray(gs.T @ xs)  # [m, 16]
    # The dense equivalent: a Dense kernel [16, m] holding the weights.
    dense_w = np.zeros((16, m), np.float32)
    idx, w = np_(layer.indices), np_(layer.kernel)
    dense_w[idx.T, np.arange(m)[None, :]] = w.T
    hidden = keras.Model(model.input, model.get_layer("hidden").output)
    kernel = tf.Variable(dense_w)
    ref = np.zeros_like(dense_w)
    for xb, yb in batches:  # one loss per batch, as the sample takes it
        with tf.GradientTape() as tape:
            z = tf.matmul(hidden(xb), kernel) + layer.bias
            loss = SquaredHinge()(yb, z)
        ref += tape.gradient(loss, kernel).numpy()
    np.testing.assert_allclose(d, ref.T, rtol=1e-4, atol=1e-6)
    assert np.abs(ref).max() > 0


def test_gradient_regrowth_finds_the_informative_feature():
    """A linear uniform-sparse layer whose label j fires with feature
    2j: one RigL rewire connects every label to its feature; random
    regrowth into 200 features does that by chance only."""
    m, e, s = 20, 200, 2
    rng = np.random.default_rng(0)
    x = (rng.random((400, e)) < 0.05).astype(np.float32)
    y = [np.flatnonzero(x[i, 0:2 * m:2]) for i in range(len(x))]
    width = max(len(r) for r in y)
    ids = np.full((len(x), max(width, 1)), -1, np.int32)
    for i, r in enumerate(y):
        ids[i, :len(r)] = r

    def fitted(regrowth):
        inp = keras.Input((e,))
        layer = UniformSparseDense(m, s, seed=3, name="out",
                                   bias_initializer="hinge_prior")
        model = keras.Model(inp, layer(inp))
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=SquaredHinge())
        before = np_(layer.indices).copy()
        cb = SetRewiring(every_n_steps=1, fraction=0.5, seed=0,
                         regrowth=regrowth,
                         gradient_data=[(x[:200], ids[:200])])
        model.fit(x, ids, batch_size=len(x), epochs=1, verbose=0,
                  callbacks=[cb])
        return before, np_(layer.indices), cb

    target = np.arange(m) * 2
    before, after, cb = fitted("gradient")
    had = np.array([target[j] in before[j] for j in range(m)])
    has = np.array([target[j] in after[j] for j in range(m)])
    assert has.all(), (had, has)
    assert cb.last_stats["set_gradient_grown"] == m  # one per label
    _, after_random, cb_random = fitted("random")
    hits = np.array([target[j] in after_random[j] for j in range(m)])
    assert hits.sum() <= had.sum() + 2
    assert "set_gradient_grown" not in cb_random.last_stats


def test_bad_regrowth_arguments():
    with pytest.raises(ValueError, match="regrowth must be one of"):
        SetRewiring(regrowth="rigl")
    with pytest.raises(ValueError, match="needs gradient_data"):
        SetRewiring(regrowth="gradient")


def test_head_config_checks_and_sample_is_keyed_by_rewire_number():
    c = xconfig.get_config("uniform_sparse")
    c.set.regrowth = "rigl"
    with pytest.raises(ValueError, match="config.set.regrowth='rigl'"):
        xheads.get_head(c).check_config()
    c.set.regrowth = "gradient"
    c.set.gradient_instances = 0
    with pytest.raises(ValueError, match="gradient_instances must be >= 1"):
        xheads.get_head(c).check_config()
    c.set.gradient_instances = 50
    head = xheads.get_head(c)
    from xmc_tf import data as xdata
    data = xdata.make_synthetic(num_instances=300, num_features=40,
                                num_labels=10, seed=0)
    head.prepare(data)
    sample = head._gradient_sample()  # pylint: disable=protected-access

    def rows(r):
        return np.concatenate([np_(tf.sparse.to_dense(xb)) if isinstance(
            xb, tf.SparseTensor) else np_(xb) for xb, _ in sample(r)])

    a, b, again = rows(0), rows(1), rows(0)
    assert a.shape[0] == 50
    np.testing.assert_array_equal(a, again)  # a resumed run draws the same
    assert not np.array_equal(a, b)
