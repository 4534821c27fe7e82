"""Tests of UniformSparseDense and random_connections.

Independent references: a dense NumPy matrix W[e, m] built from the layer's
own `indices`/`kernel` variables (W[indices[j, k], j] = kernel[j, k]), and a
keras Dense layer holding that same matrix (for gradients).
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.layers import UniformSparseDense, random_connections

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(xmc_tf.__file__)))


def np_(v):
    return keras.ops.convert_to_numpy(v)


def dense_equivalent(layer):
    """W[e, m] (float64) with W[indices[j, k], j] += kernel[j, k]."""
    idx, ker = np_(layer.indices), np_(layer.kernel).astype(np.float64)
    w = np.zeros((layer.num_features, layer.units), np.float64)
    np.add.at(w, (idx, np.broadcast_to(np.arange(layer.units)[:, None], idx.shape)),
              ker)
    return w


def reference_output(layer, x, activation=lambda z: z):
    out = x.astype(np.float64) @ dense_equivalent(layer)
    if layer.bias is not None:
        out = out + np_(layer.bias).astype(np.float64)
    return activation(out)


def check_rows(conn, m, s, e):
    assert conn.shape == (m, s)
    assert conn.dtype == np.int32
    assert conn.min() >= 0 and conn.max() < e
    # sorted and strictly increasing => distinct
    assert np.all(np.diff(conn.astype(np.int64), axis=1) > 0)


# --------------------------------------------------------------------------
# random_connections
# --------------------------------------------------------------------------

@pytest.mark.parametrize("m,s,e", [
    (64, 3, 100),     # 4s <= e: draw with replacement + redraw duplicates
    (40, 25, 100),    # 4s == e: still the sparse path (boundary)
    (40, 26, 100),    # 4s > e: permutation-prefix path
    (30, 10, 10),     # s == e: every row is 0..e-1
    (7, 1, 1),        # trivial
    (500, 2, 3),      # sparse path with many collisions to redraw
])
def test_random_connections_rows(m, s, e):
    conn = random_connections(m, s, e, seed=11)
    check_rows(conn, m, s, e)
    if s == e:
        np.testing.assert_array_equal(conn, np.broadcast_to(np.arange(e), (m, e)))
    np.testing.assert_array_equal(conn, random_connections(m, s, e, seed=11))


@pytest.mark.parametrize("m,s,e", [(64, 3, 100), (64, 40, 100)])
def test_random_connections_seed(m, s, e):
    a = random_connections(m, s, e, seed=1)
    b = random_connections(m, s, e, seed=2)
    assert not np.array_equal(a, b)
    # rows are not all identical (the generator advances between rows)
    assert len({tuple(r) for r in a}) > m // 2
    # seed=None draws fresh connections
    c, d = random_connections(m, s, e), random_connections(m, s, e)
    check_rows(c, m, s, e)
    assert not np.array_equal(c, d)


def test_random_connections_multiple_chunks():
    # Dense path processes chunks of max(1, 2**22 // e) rows: e = 2**20 gives
    # chunks of 4 rows, so 9 rows span 3 chunks.
    e = 1 << 20
    s = e // 4 + 1
    conn = random_connections(9, s, e, seed=3)
    check_rows(conn, 9, s, e)
    assert len({tuple(r[:50]) for r in conn}) == 9


@pytest.mark.parametrize("s,e", [(3, 20), (12, 20)])  # both code paths
def test_random_connections_uniform(s, e):
    m = 3000
    conn = random_connections(m, s, e, seed=5)
    counts = np.bincount(conn.ravel(), minlength=e)
    expected = m * s / e
    p = s / e
    sigma = np.sqrt(m * p * (1 - p))
    assert np.all(np.abs(counts - expected) < 6 * sigma), counts


@pytest.mark.parametrize("s,e", [(11, 10), (0, 10), (-1, 10), (1, 0)])
def test_random_connections_bad_fan_in(s, e):
    with pytest.raises(ValueError, match="connections_per_label"):
        random_connections(3, s, e, seed=0)


# --------------------------------------------------------------------------
# layer: forward, variables, errors
# --------------------------------------------------------------------------

@pytest.mark.parametrize("m,s,e,use_bias", [
    (37, 5, 20, True), (8, 20, 20, True), (50, 2, 64, False), (1, 1, 1, True)])
def test_output_matches_dense_reference(m, s, e, use_bias):
    rng = np.random.default_rng(0)
    layer = UniformSparseDense(m, s, use_bias=use_bias, seed=4,
                               bias_initializer="random_normal")
    x = rng.normal(size=(6, e)).astype(np.float32)
    y = np_(layer(x))
    assert y.shape == (6, m) and y.dtype == np.float32
    np.testing.assert_array_equal(np_(layer.indices),
                                  random_connections(m, s, e, seed=4))
    if not use_bias:
        assert layer.bias is None and len(layer.weights) == 2
    np.testing.assert_allclose(y, reference_output(layer, x), rtol=1e-5, atol=1e-5)


def test_activation_applied():
    rng = np.random.default_rng(1)
    layer = UniformSparseDense(9, 3, activation="sigmoid", seed=0,
                               bias_initializer="random_normal")
    x = rng.normal(size=(4, 7)).astype(np.float32)
    y = np_(layer(x))
    np.testing.assert_allclose(
        y, reference_output(layer, x, lambda z: 1 / (1 + np.exp(-z))),
        rtol=1e-5, atol=1e-6)


def test_variables():
    layer = UniformSparseDense(21, 4, seed=0)
    layer.build((None, 10))
    assert layer.num_features == 10
    assert layer.indices.dtype == "int32"
    assert not layer.indices.trainable
    assert tuple(layer.indices.shape) == (21, 4)
    assert tuple(layer.kernel.shape) == (21, 4)
    assert layer.kernel.dtype == "float32" and layer.kernel.trainable
    assert tuple(layer.bias.shape) == (21,)
    trainable = [id(v) for v in layer.trainable_weights]
    assert id(layer.indices) not in trainable
    assert id(layer.kernel) in trainable and id(layer.bias) in trainable
    assert [id(v) for v in layer.non_trainable_weights] == [id(layer.indices)]
    check_rows(np_(layer.indices), 21, 4, 10)


def test_glorot_uniform_bound():
    # shape [units, s]: fan_in + fan_out = units + s.
    m, s = 400, 25
    layer = UniformSparseDense(m, s, seed=0)
    layer.build((None, 100))
    k = np_(layer.kernel)
    limit = np.sqrt(6.0 / (m + s))
    assert np.abs(k).max() <= limit
    assert np.abs(k).max() > 0.95 * limit
    assert abs(k.mean()) < 0.05 * limit


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError):
        UniformSparseDense(0, 3)
    with pytest.raises(ValueError):
        UniformSparseDense(5, 0)
    # fan-in larger than the input width
    with pytest.raises(ValueError, match="connections_per_label"):
        UniformSparseDense(4, 9)(np.ones((2, 8), np.float32))
    # wrong rank, at build and at call
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2).build((2, 3, 4))
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2).build((4,))
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2)(np.ones((2, 3, 4), np.float32))
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2)(np.ones((5,), np.float32))
    # unknown feature dimension
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2).build((None, None))
    with pytest.raises(ValueError):
        UniformSparseDense(4, 2)(keras.Input((None,)))
    # after build, the input width is fixed
    layer = UniformSparseDense(4, 2, seed=0)
    layer(np.ones((1, 6), np.float32))
    with pytest.raises(ValueError):
        layer(np.ones((1, 7), np.float32))


def test_symbolic_output_shape():
    inp = keras.Input((12,))
    out = UniformSparseDense(30, 3, seed=0)(inp)
    assert tuple(out.shape) == (None, 30)


# --------------------------------------------------------------------------
# config, regularizers
# --------------------------------------------------------------------------

def test_config_round_trip_and_regularizers():
    kwargs = dict(
        units=17, connections_per_label=3, activation="relu", use_bias=True,
        kernel_initializer=keras.initializers.RandomNormal(seed=3),
        bias_initializer=keras.initializers.RandomUniform(seed=4),
        kernel_regularizer=keras.regularizers.L2(0.01),
        bias_regularizer=keras.regularizers.L1(0.02),
        activity_regularizer=keras.regularizers.L2(0.5),
        kernel_constraint=keras.constraints.MaxNorm(2.0),
        bias_constraint=keras.constraints.NonNeg(),
        seed=7, name="usd")
    layer = UniformSparseDense(**kwargs)
    config = layer.get_config()
    assert config["units"] == 17 and config["connections_per_label"] == 3
    assert config["seed"] == 7 and config["name"] == "usd"
    clone = UniformSparseDense.from_config(config)
    assert clone.get_config() == config
    # also through the registered Keras serialization
    ser = keras.saving.serialize_keras_object(layer)
    assert ser["registered_name"] == "xmc_tf>UniformSparseDense"
    clone2 = keras.saving.deserialize_keras_object(ser)
    assert isinstance(clone2, UniformSparseDense)
    assert clone2.get_config() == config

    x = np.random.default_rng(0).normal(size=(3, 9)).astype(np.float32)
    y, y_clone = np_(layer(x)), np_(clone(x))
    np.testing.assert_array_equal(np_(layer.indices), np_(clone.indices))
    np.testing.assert_array_equal(np_(layer.kernel), np_(clone.kernel))
    np.testing.assert_array_equal(y, y_clone)
    np.testing.assert_allclose(y, reference_output(layer, x, lambda z: np.maximum(z, 0)),
                               rtol=1e-5, atol=1e-6)
    # regularization losses against NumPy
    k, b = np_(layer.kernel).astype(np.float64), np_(layer.bias).astype(np.float64)
    expected = sorted([0.01 * np.sum(k ** 2), 0.02 * np.sum(np.abs(b)),
                       0.5 * np.sum(y.astype(np.float64) ** 2) / x.shape[0]])
    got = sorted(float(np_(v)) for v in layer.losses)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# --------------------------------------------------------------------------
# tf.function, gradients, fit
# --------------------------------------------------------------------------

def test_tf_function_matches_eager():
    rng = np.random.default_rng(2)
    layer = UniformSparseDense(25, 4, seed=1, bias_initializer="random_normal")
    layer.build((None, 11))
    f = tf.function(layer, input_signature=[tf.TensorSpec([None, 11], tf.float32)])
    for b in (1, 5, 0):
        x = rng.normal(size=(b, 11)).astype(np.float32)
        y = f(tf.constant(x)).numpy()
        assert y.shape == (b, 25)
        np.testing.assert_allclose(y, reference_output(layer, x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y, np_(layer(x)), rtol=1e-6, atol=1e-6)


def _dense_twin(layer):
    dense = keras.layers.Dense(layer.units)
    dense.build((None, layer.num_features))
    dense.kernel.assign(dense_equivalent(layer).astype(np.float32))
    dense.bias.assign(np_(layer.bias))
    return dense


@pytest.mark.parametrize("loss", ["squared_hinge", "random_cotangent"])
def test_gradient_matches_dense_equivalent(loss):
    rng = np.random.default_rng(3)
    m, s, e, b = 30, 4, 12, 5
    layer = UniformSparseDense(m, s, seed=2, bias_initializer="random_normal")
    x = tf.constant(rng.normal(size=(b, e)).astype(np.float32))
    layer.build((None, e))
    dense = _dense_twin(layer)
    if loss == "squared_hinge":
        ids = tf.constant(rng.integers(-1, m, size=(b, 3)), tf.int32)
        loss_fn = lambda y: xmc_tf.losses.SquaredHinge()(ids, y)  # noqa: E731
    else:
        g = tf.constant(rng.normal(size=(b, m)).astype(np.float32))
        loss_fn = lambda y: tf.reduce_sum(y * g)  # noqa: E731

    def grads(lay):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = lay(x)
            value = loss_fn(y)
        return [np_(t) for t in tape.gradient(value, [lay.kernel, lay.bias, x])] + [np_(y)]

    gk, gb, gx, y_sparse = grads(layer)
    dk, db, dx, y_dense = grads(dense)
    np.testing.assert_allclose(y_sparse, y_dense, rtol=1e-5, atol=1e-5)
    idx = np_(layer.indices)
    gathered = dk[idx, np.arange(m)[:, None]]  # dense grad at [indices[j,k], j]
    assert gk.shape == (m, s)
    assert np.abs(gathered).max() > 0
    np.testing.assert_allclose(gk, gathered, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, db, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, dx, rtol=1e-5, atol=1e-6)
    if loss == "squared_hinge":
        # Labels with all-zero upstream gradient get exactly zero kernel grads.
        silent = np.all(dk == 0, axis=0)
        np.testing.assert_array_equal(gk[silent], 0.0)


def test_fit_learns_toy_problem_and_keeps_indices():
    # Targets produced by a sparse teacher with the same connectivity, so the
    # student can represent them exactly.
    rng = np.random.default_rng(4)
    m, s, e, n = 20, 6, 16, 256
    student = UniformSparseDense(m, s, seed=9, name="student")
    model = keras.Sequential([keras.Input((e,)), student])
    idx = np_(student.indices)
    w_true = rng.normal(size=(m, s)) * 2
    x = rng.normal(size=(n, e)).astype(np.float32)
    scores = np.einsum("ijk,jk->ij", x[:, idx], w_true)
    y = (scores > 0.5).astype(np.float32)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=xmc_tf.losses.SquaredHinge(),
                  jit_compile=False)
    hist = model.fit(x, y, batch_size=32, epochs=12, verbose=0, shuffle=False)
    losses = hist.history["loss"]
    assert losses[-1] < 0.25 * losses[0], losses
    np.testing.assert_array_equal(np_(student.indices), idx)
    pred = model.predict(x, verbose=0)
    np.testing.assert_allclose(pred, reference_output(student, x), rtol=1e-4, atol=1e-4)
    assert np.mean((pred > 0) == (y > 0)) > 0.9


# --------------------------------------------------------------------------
# saving
# --------------------------------------------------------------------------

def _trained_model(seed=0):
    rng = np.random.default_rng(seed)
    model = keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(16, activation="relu"),
        UniformSparseDense(40, 4, seed=3, name="usd"),
    ])
    model.compile(optimizer="adam", loss=xmc_tf.losses.SquaredHinge(), jit_compile=False)
    x = rng.normal(size=(32, 12)).astype(np.float32)
    ids = rng.integers(-1, 40, size=(32, 3))
    model.fit(x, ids, batch_size=16, epochs=1, verbose=0)
    return model, x


def test_keras_save_load(tmp_path):
    model, x = _trained_model()
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.get_layer("usd")
    assert isinstance(layer, UniformSparseDense)
    np.testing.assert_array_equal(np_(layer.indices), np_(model.get_layer("usd").indices))
    assert not layer.indices.trainable
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert isinstance(loaded.loss, xmc_tf.losses.SquaredHinge)


def test_export_and_load_in_new_process(tmp_path):
    model, x = _trained_model(1)
    export_dir = str(tmp_path / "exported")
    model.export(export_dir, verbose=False)
    keras_path = str(tmp_path / "m.keras")
    model.save(keras_path)
    np.save(tmp_path / "x.npy", x)
    expected = model.predict(x, verbose=0)
    script = textwrap.dedent(f"""
        import numpy as np
        import tensorflow as tf
        import xmc_tf
        import keras
        x = np.load({str(tmp_path / "x.npy")!r})
        loaded = tf.saved_model.load({export_dir!r})
        np.save({str(tmp_path / "serve.npy")!r}, loaded.serve(tf.constant(x)).numpy())
        m = keras.models.load_model({keras_path!r})
        np.save({str(tmp_path / "keras.npy")!r}, m.predict(x, verbose=0))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [REPO_ROOT, env.get("PYTHONPATH")] if p)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = np.load(tmp_path / "serve.npy")
    np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.load(tmp_path / "keras.npy"), expected)


def _sparse_batch(rng, b, d, per_row):
    rows = np.repeat(np.arange(b), per_row)
    cols = np.concatenate([rng.choice(d, per_row, replace=False)
                           for _ in range(b)])
    values = rng.random(rows.size).astype(np.float32)
    x = tf.sparse.reorder(tf.SparseTensor(
        np.stack([rows, cols], 1).astype(np.int64), values, [b, d]))
    return x, tf.sparse.to_dense(x).numpy()


def test_kept_inverted_index_follows_every_change_of_the_indices(tmp_path):
    """On sparse input the layer keeps the connections' inverted index
    between calls: the scores must stay those of the dense reference after
    each way the indices change (assign in eager and in a tf.function, SET,
    set_weights, a reload), and the kept index is no Keras weight."""
    from xmc_tf.callbacks.rewiring import rewire
    rng = np.random.default_rng(3)
    m, s, d, b = 40, 6, 90, 8
    x, dense = _sparse_batch(rng, b, d, 5)
    layer = UniformSparseDense(m, s, seed=1, bias_initializer="zeros")
    inp = keras.Input((d,), sparse=True)
    model = keras.Model(inp, layer(inp))

    def reference():
        idx, w = layer.indices.numpy(), layer.kernel.numpy()
        return (dense[:, idx] * w).sum(-1)

    step = tf.function(lambda v: layer(v))
    np.testing.assert_allclose(model(x).numpy(), reference(), atol=1e-5)
    assert len(layer.weights) == 3  # kernel, bias, indices: no cache
    assert layer._inverted_cache is not None
    new = layer.indices.numpy().copy()
    new[3] = rng.choice(d, s, replace=False)
    layer.indices.assign(new)  # eager assign
    np.testing.assert_allclose(step(x).numpy(), reference(), atol=1e-5)
    np.testing.assert_allclose(model(x).numpy(), reference(), atol=1e-5)
    idx, _ = rewire(layer.indices.numpy(), layer.kernel.numpy(), 0.5, d,
                    np.random.default_rng(0))
    tf.function(lambda: layer.indices.assign(idx))()  # in a graph
    np.testing.assert_allclose(step(x).numpy(), reference(), atol=1e-5)
    weights = layer.get_weights()
    weights[2] = random_connections(m, s, d, seed=9)
    layer.set_weights(weights)
    np.testing.assert_allclose(model(x).numpy(), reference(), atol=1e-5)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(),
                               atol=1e-6)
    # The SavedModel keeps no index state of its own and scores as the model.
    from xmc_tf.saving import export_saved_model
    export_saved_model(model, str(tmp_path / "sm"), k=3)
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures[
        "score_all_labels"](indices=x.indices, values=x.values,
                            dense_shape=x.dense_shape)
    np.testing.assert_allclose(next(iter(served.values())).numpy(),
                               reference(), atol=1e-5)
    # A bad index is still rejected (the rebuild range-checks it).
    bad = layer.indices.numpy().copy()
    bad[0, 0] = d
    layer.indices.assign(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices"):
        model(x)


def test_writers_of_the_indices_check_them(tmp_path):
    """``set_weights`` and loading range-check the connections they write
    (nothing is assigned on a bad one); an assign that bypasses them (the
    model's ``set_weights``) fails at the next forward, which checks every
    index it gathers."""
    import h5py

    inputs = keras.Input((8,))
    layer = UniformSparseDense(10, 3, seed=0, name="head")
    model = keras.Model(inputs, layer(inputs))
    x = np.ones((2, 8), np.float32)
    before = [w.copy() for w in layer.get_weights()]
    kernel, bias, indices = before
    bad = indices.copy()
    bad[4, 2] = 8
    with pytest.raises(ValueError,
                       match=r"head: indices\[4, 2\] = 8 is out of range "
                             r"\[0, 8\)"):
        layer.set_weights([kernel + 1, bias, bad])
    for got, want in zip(layer.get_weights(), before):
        np.testing.assert_array_equal(got, want)

    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    with h5py.File(path, "r+") as f:
        found = []
        f.visititems(lambda n, d: found.append(n) if isinstance(
            d, h5py.Dataset) and d.dtype == np.int32 else None)
        assert len(found) == 1, found  # the only int32 variable: indices
        data = f[found[0]][...]
        data[1, 0] = -3
        f[found[0]][...] = data
    with pytest.raises(ValueError,
                       match=r"head: indices\[1, 0\] = -3 is out of range"):
        model.load_weights(path)
    np.testing.assert_array_equal(layer.indices.numpy(), indices)

    model.set_weights([kernel, bias, bad])  # Keras assigns directly
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[4, 2\] = 8 is out of range"):
        model(x)
