"""The fused backward + update of the uniform-sparse head
(``Xmc>UniformSparseGradApply``, ``UniformSparseDense(fused_update=...)``),
against NumPy references and against the same layer trained by a Keras
optimizer."""

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.ops import uniform_sparse_grad_apply
from xmc_tf.optimizers import FusedUpdate


def _problem(seed=0, b=6, e=12, m=40, s=4, density=0.2):
    rng = np.random.default_rng(seed)
    back = rng.normal(size=(b, m)).astype(np.float32)
    back[rng.random((b, m)) > density] = 0.0
    back[:, :5] = 0.0  # labels without any signal
    feat = rng.normal(size=(b, e)).astype(np.float32)
    idx = np.stack([rng.choice(e, s, replace=False) for _ in range(m)])
    w = rng.normal(size=(m, s)).astype(np.float32)
    return back, feat, idx.astype(np.int32), w


def _reference_grads(back, feat, idx, w):
    gx = np.zeros_like(feat)
    m, s = idx.shape
    gw = np.zeros_like(w)
    for j in range(m):
        for k in range(s):
            gx[:, idx[j, k]] += back[:, j] * w[j, k]
            gw[j, k] = back[:, j] @ feat[:, idx[j, k]]
    return gx, gw


def test_sgd_step_matches_numpy_and_skips_labels_without_signal():
    back, feat, idx, w0 = _problem()
    w = tf.Variable(w0)
    gx = uniform_sparse_grad_apply(back, feat, idx, w, [], 0.1)
    ref_gx, ref_gw = _reference_grads(back, feat, idx, w0)
    np.testing.assert_allclose(gx.numpy(), ref_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.numpy(), w0 - 0.1 * ref_gw, rtol=1e-5,
                               atol=1e-6)
    silent = ~back.any(axis=0)
    assert silent[:5].all()
    np.testing.assert_array_equal(w.numpy()[silent], w0[silent])


@pytest.mark.parametrize("lazy", [True, False])
def test_adam_steps_match_numpy(lazy):
    back, feat, idx, w0 = _problem(seed=1)
    w = tf.Variable(w0)
    m, v = tf.Variable(np.zeros_like(w0)), tf.Variable(np.zeros_like(w0))
    rw, rm, rv = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    b1, b2, eps, lr = 0.9, 0.999, 1e-7, 0.01
    for t in (1, 2, 3):
        alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        _, g = _reference_grads(back, feat, idx, rw)
        # the second step has no signal: only the non-lazy rule moves
        signal = back if t != 2 else np.zeros_like(back)
        if t == 2:
            g = np.zeros_like(g)
        uniform_sparse_grad_apply(signal, feat, idx, w, [m, v], alpha,
                                  rule="adam", lazy=lazy)
        rows = signal.any(axis=0) if lazy else np.ones(len(w0), bool)
        rm[rows] += (g[rows] - rm[rows]) * (1 - b1)
        rv[rows] += (g[rows] ** 2 - rv[rows]) * (1 - b2)
        rw[rows] -= alpha * rm[rows] / (np.sqrt(rv[rows]) + eps)
    np.testing.assert_allclose(m.numpy(), rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.numpy(), rv, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(w.numpy(), rw, rtol=1e-5, atol=1e-6)


def test_kahan_keeps_bfloat16_steps_below_the_precision():
    # 200 steps of -1e-4 on a weight of 1.0: each is below half a bfloat16
    # ulp at 1 (2^-9), so a plain bfloat16 store loses every one.
    feat = np.ones((1, 1), ml_dtypes.bfloat16)
    idx = np.zeros((1, 1), np.int32)
    back = np.ones((1, 1), ml_dtypes.bfloat16)
    plain = tf.Variable(np.ones((1, 1), ml_dtypes.bfloat16))
    kahan = tf.Variable(np.ones((1, 1), ml_dtypes.bfloat16))
    comp = tf.Variable(np.zeros((1, 1), ml_dtypes.bfloat16))
    for _ in range(200):
        uniform_sparse_grad_apply(back, feat, idx, plain, [], 1e-4)
        uniform_sparse_grad_apply(back, feat, idx, kahan, [comp], 1e-4,
                                  kahan=True)
    assert float(plain.numpy()[0, 0]) == 1.0
    total = float(kahan.numpy()[0, 0]) - float(comp.numpy()[0, 0])
    assert abs(total - 0.98) < 1e-3, total
    assert abs(float(kahan.numpy()[0, 0]) - 0.98) < 0.004


def test_bad_index_of_a_label_with_signal_fails_and_writes_nothing():
    back, feat, idx, w0 = _problem(seed=2)
    j = int(np.flatnonzero(back.any(axis=0))[0])
    bad = idx.copy()
    bad[j, 1] = 99
    w = tf.Variable(w0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"indices\[{j}, 1\] = 99"):
        uniform_sparse_grad_apply(back, feat, bad, w, [], 0.1)
    np.testing.assert_array_equal(w.numpy(), w0)
    # A bad index of a label without signal is not read.
    quiet = idx.copy()
    quiet[0, 0] = -3
    uniform_sparse_grad_apply(back, feat, quiet, w, [], 0.1)


def test_wrong_state_and_shared_buffers():
    back, feat, idx, w0 = _problem(seed=3)
    w = tf.Variable(w0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 state"):
        uniform_sparse_grad_apply(back, feat, idx, w, [], 0.1, rule="adam")
    m = tf.Variable(np.zeros_like(w0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same variable"):
        uniform_sparse_grad_apply(back, feat, idx, w, [m, m], 0.1,
                                  rule="adam")
    small = tf.Variable(np.zeros((3, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        uniform_sparse_grad_apply(back, feat, idx, small, [], 0.1)
    # A read that is still alive keeps its values (copy before the write).
    before = tf.convert_to_tensor(w)
    uniform_sparse_grad_apply(back, feat, idx, w, [], 0.1)
    np.testing.assert_array_equal(before.numpy(), w0)
    assert not np.array_equal(w.numpy(), w0)


def _model(fused, dtype=None, loss="mse", units=50):
    inp = keras.Input((20,))
    hidden = keras.layers.Dense(16, kernel_initializer=keras.initializers
                                .GlorotUniform(seed=2))(inp)
    out = xmc_tf.layers.UniformSparseDense(
        units, 5, seed=1, fused_update=fused, dtype=dtype,
        kernel_initializer=keras.initializers.GlorotUniform(seed=3))(hidden)
    model = keras.Model(inp, out)
    return model


def _data(seed=0, n=64, units=50):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 20)).astype(np.float32),
            rng.normal(size=(n, units)).astype(np.float32))


@pytest.mark.parametrize("rule, optimizer, loss", [
    ("sgd", lambda: keras.optimizers.SGD(0.05), "mse"),
    ("adam", lambda: keras.optimizers.Adam(0.01), "mse"),
    # the squared hinge leaves most labels without signal in a batch: the
    # non-lazy rule still steps them as Adam on the dense gradient does
    ("sgd", lambda: keras.optimizers.SGD(0.05), "hinge"),
    ("adam", lambda: keras.optimizers.Adam(0.01), "hinge")])
def test_fit_equals_the_keras_optimizer(rule, optimizer, loss):
    x, y = _data()
    if loss == "hinge":
        y = (y > 1.2).astype(np.float32)  # {0, 1} targets
        loss = xmc_tf.losses.SquaredHinge()
    ref, fused = _model(None), _model(FusedUpdate(rule, learning_rate=(
        0.05 if rule == "sgd" else 0.01)))
    for model in (ref, fused):
        model.compile(optimizer(), loss, jit_compile=False)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    a, b = ref.layers[-1], fused.layers[-1]
    assert not b.kernel.trainable and int(b._fused_step.numpy()) == 8
    np.testing.assert_allclose(b.kernel.numpy(), a.kernel.numpy(), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(b.bias.numpy(), a.bias.numpy(), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(fused.layers[1].kernel.numpy(),
                               ref.layers[1].kernel.numpy(), rtol=1e-4,
                               atol=1e-6)
    # No optimizer slot of the kernel's shape (Adam's reference has two).
    shape = tuple(b.kernel.shape)
    assert not [v for v in fused.optimizer.variables
                if tuple(v.shape) == shape]
    assert len([v for v in ref.optimizer.variables
                if tuple(v.shape) == shape]) == (2 if rule == "adam" else 0)


def test_learning_rate_follows_a_callable_and_a_frozen_layer_stays():
    x, y = _data(seed=1)
    lr = tf.Variable(0.0)
    model = _model(FusedUpdate("sgd", learning_rate=lambda: lr))
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    head = model.layers[-1]
    before = head.kernel.numpy().copy()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    np.testing.assert_array_equal(head.kernel.numpy(), before)  # lr 0
    lr.assign(0.1)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert not np.array_equal(head.kernel.numpy(), before)
    assert head.get_config()["fused_update"]["learning_rate"] == \
        pytest.approx(0.1)
    head.trainable = False
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=False)
    frozen = head.kernel.numpy().copy()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    np.testing.assert_array_equal(head.kernel.numpy(), frozen)


def test_bfloat16_head_learns_and_saves(tmp_path):
    x, y = _data(seed=2, units=30)
    y = (y > 1.0).astype(np.float32)  # {0, 1} targets
    model = _model(FusedUpdate("adam", learning_rate=0.02), dtype="bfloat16",
                   units=30)
    head = model.layers[-1]
    assert head.kernel.dtype == "bfloat16"
    assert [v.name for v in head.fused_state_variables()] == [
        "fused_compensation", "fused_m", "fused_v"]
    model.compile(keras.optimizers.Adam(0.01), xmc_tf.losses.SquaredHinge(),
                  jit_compile=False)
    hist = model.fit(x, y, batch_size=16, epochs=8, verbose=0)
    assert hist.history["loss"][-1] < 0.7 * hist.history["loss"][0]
    assert np.abs(head.fused_state_variables()[0].numpy().astype(
        np.float32)).max() > 0
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    again = loaded.layers[-1]
    assert again.fused_update.rule == "adam"
    for a, b in zip(head.weights, again.weights):
        np.testing.assert_array_equal(np.asarray(a.numpy(), np.float32),
                                      np.asarray(b.numpy(), np.float32))
    np.testing.assert_array_equal(model.predict(x, verbose=0),
                                  loaded.predict(x, verbose=0))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_set_rewiring_zeroes_the_fused_state_of_moved_connections(dtype):
    x, y = _data(seed=3)
    model = _model(FusedUpdate("adam", learning_rate=0.01), dtype=dtype)
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    head = model.layers[-1]
    old = head.indices.numpy().copy()
    cb = xmc_tf.callbacks.SetRewiring(every_n_steps=1, fraction=0.4, seed=0)
    cb.set_model(model)
    cb.on_train_begin()
    cb.rewire_now()
    moved = head.indices.numpy() != old
    assert moved.any()
    for variable in [head.kernel] + head.fused_state_variables():
        value = np.asarray(variable.numpy(), np.float32)
        assert (value[moved] == 0).all()
        assert (value[~moved] != 0).any()


def test_bad_configurations_are_one_clear_error():
    with pytest.raises(ValueError, match="kernel_regularizer"):
        xmc_tf.layers.UniformSparseDense(10, 2, kernel_regularizer="l2",
                                         fused_update=FusedUpdate())
    with pytest.raises(ValueError, match="rule"):
        FusedUpdate("rmsprop")
    with pytest.raises(ValueError, match="loss scaling"):
        xmc_tf.layers.UniformSparseDense(10, 2, dtype="mixed_float16",
                                         fused_update=FusedUpdate())


def test_bfloat16_variables_round_trip_through_npy_blocks():
    import io

    from xmc_tf.variable_io import read_variable, write_variable
    rng = np.random.default_rng(4)
    value = rng.normal(size=(300, 7)).astype(ml_dtypes.bfloat16)
    source = tf.Variable(value)
    target = tf.Variable(np.zeros_like(value))
    for chunk in (1 << 20, 256):  # whole, and in blocks of rows
        buffer = io.BytesIO()
        write_variable(buffer, source, chunk_bytes=chunk)
        buffer.seek(0)
        read_variable(buffer, target, chunk_bytes=chunk)
        np.testing.assert_array_equal(target.numpy().view(np.uint16),
                                      value.view(np.uint16))
        target.assign(np.zeros_like(value))


def test_set_rewire_op_on_bfloat16_weights_equals_float32():
    from xmc_tf.ops.uniform_sparse import set_rewire
    rng = np.random.default_rng(5)
    idx = np.sort(np.stack([rng.choice(50, 8, replace=False)
                            for _ in range(30)]), axis=1).astype(np.int32)
    w16 = rng.normal(size=(30, 8)).astype(ml_dtypes.bfloat16)
    new16, pos16 = set_rewire(idx, w16, 3, 50, [7, 8])
    new32, pos32 = set_rewire(idx, w16.astype(np.float32), 3, 50, [7, 8])
    np.testing.assert_array_equal(pos16.numpy(), pos32.numpy())
    np.testing.assert_array_equal(new16.numpy(), new32.numpy())
    # the moved positions are the 3 smallest |w| of each row
    smallest = np.sort(np.argsort(np.abs(w16.astype(np.float32)), axis=1,
                                  kind="stable")[:, :3], axis=1)
    np.testing.assert_array_equal(pos16.numpy(), smallest)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_resource_set_rewire_equals_the_tensor_op_in_place(dtype):
    from xmc_tf.ops.uniform_sparse import resource_set_rewire, set_rewire
    rng = np.random.default_rng(6)
    idx0 = np.sort(np.stack([rng.choice(60, 10, replace=False)
                             for _ in range(40)]), axis=1).astype(np.int32)
    w0 = rng.normal(size=(40, 10)).astype(dtype)
    m0 = rng.normal(size=(40, 10)).astype(np.float32) + 5.0
    new, pos = set_rewire(idx0, w0, 3, 60, [11, 12])
    idx, w, m = tf.Variable(idx0), tf.Variable(w0), tf.Variable(m0)
    moved, pruned = resource_set_rewire(idx, w, [m], 3, 60, [11, 12])
    np.testing.assert_array_equal(idx.numpy(), new.numpy())
    mask = np.zeros(idx0.shape, bool)
    np.put_along_axis(mask, pos.numpy(), True, axis=1)
    want_w = np.where(mask, 0, w0.astype(np.float32))
    np.testing.assert_array_equal(w.numpy().astype(np.float32), want_w)
    np.testing.assert_array_equal(m.numpy(), np.where(mask, 0, m0))
    assert int(moved) == 40 * 3
    assert float(pruned) == pytest.approx(
        np.abs(w0.astype(np.float64))[mask].sum(), rel=1e-6)
    # a bad index: InvalidArgument, nothing written
    bad = idx0.copy()
    bad[2, 4] = 60
    idx.assign(bad)
    w.assign(w0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[2, 4\] = 60"):
        resource_set_rewire(idx, w, [], 3, 60, [1, 2])
    np.testing.assert_array_equal(idx.numpy(), bad)
    np.testing.assert_array_equal(w.numpy(), w0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="same variable"):
        resource_set_rewire(tf.Variable(idx0), w, [w], 3, 60, [1, 2])


def test_set_rewiring_callback_rewires_in_place_as_by_tensors():
    # The callback's in-place op and the tensor path draw the same
    # connections from the same seed.
    from xmc_tf.callbacks import rewiring
    x, y = _data(seed=7)
    results = []
    for in_place in (True, False):
        keras.utils.set_random_seed(0)
        model = _model(None)
        model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        cb = xmc_tf.callbacks.SetRewiring(every_n_steps=1, fraction=0.4,
                                          seed=3)
        cb.set_model(model)
        cb.on_train_begin()
        original = rewiring._rewire_in_place
        used = []

        def recorded(*args):
            out = original(*args)
            used.append(out is not None)
            return out
        rewiring._rewire_in_place = recorded if in_place else (
            lambda *a: None)
        try:
            stats = cb.rewire_now()
        finally:
            rewiring._rewire_in_place = original
        assert used == ([True] if in_place else [])
        head = model.layers[-1]
        slots = xmc_tf.optimizers.slot_variables(model.optimizer, head.kernel)
        results.append((stats, head.indices.numpy(), head.kernel.numpy(),
                        [s.numpy() for s in slots]))
    (s1, i1, k1, o1), (s2, i2, k2, o2) = results
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(k1, k2)
    for a, b in zip(o1, o2):
        np.testing.assert_array_equal(a, b)
    assert s1["set_moved"] == s2["set_moved"] == 50 * 2
    assert s1["set_mean_abs_pruned"] == pytest.approx(
        s2["set_mean_abs_pruned"], rel=1e-6)
