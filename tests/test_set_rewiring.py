"""Tests of SET rewiring (xmc_tf.callbacks.rewire, its op and SetRewiring).

Paper Sec. 2 / 4.1: every N steps, per label, the fraction alpha of
connections with the smallest |w| is pruned and as many are regrown at
uniformly random structural zeros; moved weights (and optimizer state)
restart at zero.  References are computed with NumPy from snapshots of the
variables taken right before the rewire.
"""

import keras
import numpy as np
import pytest

import xmc_tf
import functools

import tensorflow as tf

from xmc_tf.callbacks import SetRewiring, rewire
from xmc_tf.layers import UniformSparseDense, random_connections
from xmc_tf.ops.uniform_sparse import set_rewire, set_rewire_supported

needs_set_op = pytest.mark.skipif(not set_rewire_supported(),
                                  reason="op library without Xmc>SetRewire")


@pytest.fixture(params=[False, True], ids=["numpy", "op"])
def rewire_impl(request):
    """rewire() in NumPy and through the op Xmc>SetRewire."""
    if request.param and not set_rewire_supported():
        pytest.skip("op library without Xmc>SetRewire")
    return functools.partial(rewire, use_op=request.param)


def np_(v):
    return keras.ops.convert_to_numpy(v)


def distinct_weights(rng, m, s):
    """Weights with pairwise distinct |w| per row (unique smallest set)."""
    mags = np.stack([rng.permutation(s) + 1 for _ in range(m)]).astype(np.float32)
    mags += rng.random((m, s)).astype(np.float32) * 0.5
    return mags * rng.choice([-1.0, 1.0], size=(m, s)).astype(np.float32)


def assert_valid_rows(idx, s, e):
    assert idx.dtype == np.int32 and idx.shape[1] == s
    assert idx.min() >= 0 and idx.max() < e
    srt = np.sort(idx, axis=1)
    assert np.all(srt[:, 1:] != srt[:, :-1]), "duplicate source in a row"


# --------------------------------------------------------------------------
# rewire(), in NumPy and through the op
# --------------------------------------------------------------------------

@pytest.mark.parametrize("m,s,e,fraction", [
    (50, 10, 40, 0.3), (30, 10, 200, 0.1), (20, 7, 30, 0.5), (40, 4, 8, 1.0),
    (30, 40, 100, 0.5)])  # n = 20: the op selects with nth_element
def test_rewire_replaces_smallest_with_fresh_sources(m, s, e, fraction, rewire_impl):
    rng = np.random.default_rng(0)
    old = random_connections(m, s, e, seed=1)
    old_copy = old.copy()
    w = distinct_weights(rng, m, s)
    n = int(round(fraction * s))
    assert e - s >= n
    new, pos = rewire_impl(old, w, fraction, e, np.random.default_rng(2))
    np.testing.assert_array_equal(old, old_copy)  # input not modified
    assert_valid_rows(new, s, e)
    assert pos.shape == (m, n) and pos.dtype == np.int64
    assert np.all(np.diff(pos, axis=1) > 0)
    # exactly the n smallest |w| per row
    ref = np.sort(np.argsort(np.abs(w), axis=1)[:, :n], axis=1)
    np.testing.assert_array_equal(pos, ref)
    rows = np.arange(m)[:, None]
    moved = np.zeros((m, s), bool)
    moved[rows, pos] = True
    np.testing.assert_array_equal(new[~moved], old[~moved])
    # regrown sources are none of the row's pre-rewire sources
    for j in range(m):
        assert not set(new[j, moved[j]]) & set(old[j])
    np.testing.assert_array_equal(new != old, moved)


@pytest.mark.parametrize("s,fraction,n", [
    (10, 0.25, 2), (10, 0.35, 4), (10, 0.04, 0), (10, 0.06, 1), (7, 0.5, 4), (6, 0.5, 3)])
def test_rewire_count_is_round_fraction_s(s, fraction, n, rewire_impl):
    assert n == round(fraction * s)
    m, e = 25, 60
    old = random_connections(m, s, e, seed=3)
    w = distinct_weights(np.random.default_rng(4), m, s)
    new, pos = rewire_impl(old, w, fraction, e, np.random.default_rng(5))
    assert pos.shape == (m, n)
    np.testing.assert_array_equal(np.sum(new != old, axis=1), np.full(m, n))
    assert_valid_rows(new, s, e)


def test_rewire_fraction_zero_is_identity(rewire_impl):
    old = random_connections(5, 4, 10, seed=0)
    new, pos = rewire_impl(old, np.ones((5, 4), np.float32), 0.0, 10,
                      np.random.default_rng(0))
    np.testing.assert_array_equal(new, old)
    assert pos.shape == (5, 0)
    assert new is not old


def test_rewire_with_ties_prunes_smallest_magnitudes(rewire_impl):
    rng = np.random.default_rng(6)
    m, s, e = 60, 8, 50
    old = random_connections(m, s, e, seed=6)
    w = rng.integers(-2, 3, size=(m, s)).astype(np.float32)  # many ties, zeros
    new, pos = rewire_impl(old, w, 0.5, e, np.random.default_rng(7))
    rows = np.arange(m)[:, None]
    kept = np.ones((m, s), bool)
    kept[rows, pos] = False
    a = np.abs(w)
    pruned_max = np.max(np.where(kept, -np.inf, a), axis=1)
    kept_min = np.min(np.where(kept, a, np.inf), axis=1)
    assert np.all(pruned_max <= kept_min)
    assert np.all(np.sum(~kept, axis=1) == 4)
    assert_valid_rows(new, s, e)


def test_rewire_exactly_enough_free_sources(rewire_impl):
    # e - s == n: the regrown sources must be exactly the unused ones.
    m, s, e = 30, 8, 12
    old = random_connections(m, s, e, seed=8)
    w = distinct_weights(np.random.default_rng(8), m, s)
    new, pos = rewire_impl(old, w, 0.5, e, np.random.default_rng(9))
    for j in range(m):
        assert set(new[j]) == set(new[j, np.setdiff1d(np.arange(s), pos[j])]) | (
            set(range(e)) - set(old[j]))
        assert set(new[j, pos[j]]) == set(range(e)) - set(old[j])


@pytest.mark.parametrize("s,e,fraction", [(8, 10, 0.5), (10, 10, 1.0), (9, 10, 0.6),
                                          (5, 5, 0.4)])
def test_rewire_fallback_when_too_few_free_sources(s, e, fraction, rewire_impl):
    m = 40
    n = int(round(fraction * s))
    assert e - s < n
    old = random_connections(m, s, e, seed=10)
    w = distinct_weights(np.random.default_rng(10), m, s)
    new, pos = rewire_impl(old, w, fraction, e, np.random.default_rng(11))
    assert_valid_rows(new, s, e)
    assert pos.shape == (m, n)
    rows = np.arange(m)[:, None]
    kept = np.ones((m, s), bool)
    kept[rows, pos] = False
    np.testing.assert_array_equal(new[kept], old[kept])
    np.testing.assert_array_equal(pos, np.sort(np.argsort(np.abs(w), axis=1)[:, :n], axis=1))
    if s == e:
        np.testing.assert_array_equal(np.sort(new, axis=1),
                                      np.broadcast_to(np.arange(e), (m, e)))


def test_rewire_seeded_determinism(rewire_impl):
    m, s, e = 80, 6, 100
    old = random_connections(m, s, e, seed=12)
    w = distinct_weights(np.random.default_rng(12), m, s)
    a = rewire_impl(old, w, 0.5, e, np.random.default_rng(42))
    b = rewire_impl(old, w, 0.5, e, np.random.default_rng(42))
    c = rewire_impl(old, w, 0.5, e, np.random.default_rng(43))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[1], c[1])  # pruning is deterministic
    assert not np.array_equal(a[0], c[0])      # regrowth is random


def test_rewire_regrowth_is_uniform(rewire_impl):
    m, s, e = 3200, 4, 20
    old = np.tile(np.arange(s, dtype=np.int32), (m, 1))
    w = np.tile(np.array([0.1, 1.0, 2.0, 3.0], np.float32), (m, 1))
    new, pos = rewire_impl(old, w, 0.25, e, np.random.default_rng(13))
    assert np.all(pos == 0)
    counts = np.bincount(new[:, 0], minlength=e)
    assert np.all(counts[:s] == 0)
    expected = m / (e - s)  # 200 each
    sigma = np.sqrt(m * (1 / (e - s)) * (1 - 1 / (e - s)))
    assert np.all(np.abs(counts[s:] - expected) < 6 * sigma), counts


@needs_set_op
def test_set_rewire_op_nan_counts_as_largest_and_ties_go_to_lower_position():
    idx = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
    w = np.array([[np.nan, 0.5, -0.5, 2.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    new, pos = set_rewire(idx, w, 2, 10, [3, 4])
    np.testing.assert_array_equal(pos.numpy(), [[1, 2], [0, 1]])
    assert_valid_rows(new.numpy(), 4, 10)


@needs_set_op
def test_set_rewire_op_draws_depend_on_seed_and_row_only():
    m, s, e = 5000, 16, 1000
    idx = random_connections(m, s, e, seed=0)
    w = distinct_weights(np.random.default_rng(1), m, s)
    a = set_rewire(idx, w, 4, e, [7, 8])[0].numpy()
    # The same rows in another batch of labels get the same draws (the
    # generator is keyed by (seed, row), whatever the sharding).
    b = set_rewire(idx[:1000], w[:1000], 4, e, [7, 8])[0].numpy()
    np.testing.assert_array_equal(a[:1000], b)
    assert not np.array_equal(
        a, set_rewire(idx, w, 4, e, [7, 9])[0].numpy())


@needs_set_op
@pytest.mark.parametrize("args,message", [
    (dict(idx=[[0, 12]]), r"indices\[0, 1\] = 12 is out of range"),
    (dict(idx=[[0, -1]]), r"indices\[0, 1\] = -1 is out of range"),
    (dict(n=3), "num_moved = 3 must be <= fan_in = 2"),
    (dict(e=1), "num_features = 1 must be in"),
    (dict(w=[[1.0, 2.0, 3.0]]), "weights shape"),
    (dict(seed=[1]), "seed must be a"),
])
def test_set_rewire_op_invalid_arguments(args, message):
    kw = dict(idx=[[0, 1]], w=[[1.0, 2.0]], n=1, e=10, seed=[1, 2])
    kw.update(args)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=message):
        set_rewire(np.array(kw["idx"], np.int32),
                   np.array(kw["w"], np.float32), kw["n"], kw["e"],
                   kw["seed"])


# --------------------------------------------------------------------------
# SetRewiring in model.fit
# --------------------------------------------------------------------------

UNITS, FAN_IN, HIDDEN, IN_DIM = 12, 6, 16, 6


def make_model(optimizer, seed=0, extra_sparse=False):
    inp = keras.Input((IN_DIM,))
    h = keras.layers.Dense(HIDDEN, activation="tanh", name="hidden",
                           kernel_initializer=keras.initializers.GlorotUniform(seed))(inp)
    if extra_sparse:
        h = UniformSparseDense(HIDDEN, 4, seed=seed + 1, name="usd0",
                               kernel_initializer=keras.initializers.GlorotUniform(seed))(h)
    out = UniformSparseDense(UNITS, FAN_IN, seed=seed, name="usd",
                             kernel_initializer=keras.initializers.GlorotUniform(seed),
                             bias_initializer="zeros")(h)
    model = keras.Model(inp, out)
    model.compile(optimizer=optimizer, loss=xmc_tf.losses.BinaryCrossentropy(),
                  jit_compile=False)
    return model


def make_data(steps, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch, IN_DIM)).astype(np.float32)
    ids = rng.integers(-1, UNITS, size=(steps * batch, 3))
    return x, ids


def slot_lists(optimizer):
    if isinstance(optimizer, keras.optimizers.SGD):
        return {"momentums": optimizer.momentums}
    out = {"m": optimizer._momentums, "v": optimizer._velocities}
    if getattr(optimizer, "amsgrad", False):
        out["vhat"] = optimizer._velocity_hats
    return out


class Recorder(keras.callbacks.Callback):
    """Snapshots variables at every batch end (placed before SetRewiring)."""

    def __init__(self, layer_name="usd"):
        super().__init__()
        self.layer_name = layer_name
        self.snaps = []

    def on_train_batch_end(self, batch, logs=None):
        layer = self.model.get_layer(self.layer_name)
        opt = self.model.optimizer
        slots = {}
        for key, values in slot_lists(opt).items():
            for var in (layer.kernel, self.model.get_layer("hidden").kernel):
                slots[(key, var.path)] = np_(values[opt._get_variable_index(var)]).copy()
        self.snaps.append({"kernel": np_(layer.kernel).copy(),
                           "indices": np_(layer.indices).copy(),
                           "slots": slots})


@pytest.mark.parametrize("make_opt", [
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.Adam(0.01, amsgrad=True),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    lambda: keras.optimizers.SGD(0.05, momentum=0.9),
], ids=["adam", "adam_amsgrad", "adamw", "sgd_momentum"])
def test_rewire_in_fit_resets_weights_and_optimizer_slots(make_opt):
    steps, fraction = 3, 0.5
    n = round(fraction * FAN_IN)
    model = make_model(make_opt())
    layer = model.get_layer("usd")
    x, ids = make_data(steps)
    rec = Recorder()
    cb = SetRewiring(every_n_steps=steps, fraction=fraction, seed=0)
    model.fit(x, ids, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[rec, cb])
    assert cb.rewires == 1
    before = rec.snaps[-1]  # state after the last train step, before the rewire
    kernel, indices = np_(layer.kernel), np_(layer.indices)
    assert_valid_rows(indices, FAN_IN, HIDDEN)
    moved = indices != before["indices"]  # e - s >= n: every moved source changes
    np.testing.assert_array_equal(moved.sum(axis=1), np.full(UNITS, n))
    smallest = np.argsort(np.abs(before["kernel"]), axis=1)[:, :n]
    ref = np.zeros_like(moved)
    ref[np.arange(UNITS)[:, None], smallest] = True
    np.testing.assert_array_equal(moved, ref)
    np.testing.assert_array_equal(kernel[moved], 0.0)
    np.testing.assert_array_equal(kernel[~moved], before["kernel"][~moved])

    opt = model.optimizer
    checked = 0
    for key, values in slot_lists(opt).items():
        for var in (layer.kernel, model.get_layer("hidden").kernel):
            after = np_(values[opt._get_variable_index(var)])
            snap = before["slots"][(key, var.path)]
            if var is layer.kernel:
                assert np.all(snap[moved] != 0), key  # the reset is observable
                np.testing.assert_array_equal(after[moved], 0.0)
                np.testing.assert_array_equal(after[~moved], snap[~moved])
                checked += 1
            else:  # other variables' state untouched
                np.testing.assert_array_equal(after, snap)
    assert checked == (3 if getattr(opt, "amsgrad", False) else
                       1 if isinstance(opt, keras.optimizers.SGD) else 2)

    # the compiled predict function sees the new connections
    hidden = keras.Model(model.inputs, model.get_layer("hidden").output).predict(x, verbose=0)
    w = np.zeros((HIDDEN, UNITS))
    np.add.at(w, (indices, np.broadcast_to(np.arange(UNITS)[:, None], indices.shape)), kernel)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               hidden @ w + np_(layer.bias), rtol=1e-4, atol=1e-5)


def test_unsupported_optimizer_raises_at_train_begin():
    model = make_model(keras.optimizers.RMSprop(0.01))
    x, ids = make_data(2)
    kernel = np_(model.get_layer("usd").kernel).copy()
    with pytest.raises(ValueError, match="RMSprop"):
        model.fit(x, ids, batch_size=8, epochs=1, verbose=0,
                  callbacks=[SetRewiring(every_n_steps=1)])
    # nothing was trained
    np.testing.assert_array_equal(np_(model.get_layer("usd").kernel), kernel)


def test_model_without_sparse_layer_raises():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    with pytest.raises(ValueError, match="UniformSparseDense"):
        model.fit(np.ones((4, 4), np.float32), np.ones((4, 3), np.float32),
                  verbose=0, callbacks=[SetRewiring(every_n_steps=1)])


@pytest.mark.parametrize("kwargs", [dict(every_n_steps=0), dict(fraction=1.5),
                                    dict(fraction=-0.1)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        SetRewiring(**kwargs)


def test_history_statistics_and_period():
    # 2 epochs x 4 steps, rewire every 3 steps -> after global steps 3 and 6.
    model = make_model(keras.optimizers.Adam(0.01))
    x, ids = make_data(4)
    rec = Recorder()
    cb = SetRewiring(every_n_steps=3, fraction=0.34, seed=1)  # round(2.04) = 2
    hist = model.fit(x, ids, batch_size=8, epochs=2, shuffle=False, verbose=0,
                     callbacks=[rec, cb])
    final = np_(model.get_layer("usd").indices)
    snaps = [s["indices"] for s in rec.snaps] + [final]
    changed_after = [t + 1 for t in range(8) if not np.array_equal(snaps[t], snaps[t + 1])]
    assert changed_after == [3, 6]
    assert cb.rewires == 2
    assert hist.history["set_rewires"] == [1, 2]
    assert hist.history["set_moved"] == [UNITS * 2, UNITS * 2]
    # mean |w| of the pruned connections of the last rewire (after step 6)
    snap = rec.snaps[5]
    pruned = np.sort(np.abs(snap["kernel"]), axis=1)[:, :2]
    np.testing.assert_allclose(hist.history["set_mean_abs_pruned"][-1], pruned.mean(),
                               rtol=1e-5)
    assert cb.last_stats["set_rewires"] == 2


def test_set_moved_sums_over_layers_and_layers_argument():
    model = make_model(keras.optimizers.SGD(0.01, momentum=0.9), extra_sparse=True)
    x, ids = make_data(2)
    usd0, usd = model.get_layer("usd0"), model.get_layer("usd")
    idx0, idx = np_(usd0.indices).copy(), np_(usd.indices).copy()
    cb_all = SetRewiring(every_n_steps=2, fraction=0.5, seed=0)
    hist = model.fit(x, ids, batch_size=8, verbose=0, callbacks=[cb_all])
    # usd0: 16 labels x round(0.5*4)=2; usd: 12 labels x round(0.5*6)=3
    assert hist.history["set_moved"] == [HIDDEN * 2 + UNITS * 3]
    assert np.sum(np_(usd0.indices) != idx0) == HIDDEN * 2
    assert np.sum(np_(usd.indices) != idx) == UNITS * 3

    idx0, idx = np_(usd0.indices).copy(), np_(usd.indices).copy()
    cb_one = SetRewiring(every_n_steps=1, fraction=0.5, layers=[usd], seed=0)
    hist = model.fit(x, ids, batch_size=8, verbose=0, callbacks=[cb_one])
    assert hist.history["set_moved"] == [UNITS * 3]
    assert hist.history["set_rewires"] == [2]
    np.testing.assert_array_equal(np_(usd0.indices), idx0)
    assert not np.array_equal(np_(usd.indices), idx)


def test_rewire_now_seeded_determinism_and_repeated_rewires():
    results = []
    for _ in range(2):
        model = make_model(keras.optimizers.Adam(), seed=3)
        cb = SetRewiring(fraction=0.5, seed=21)
        cb.set_model(model)
        for _ in range(15):
            stats = cb.rewire_now()
            assert_valid_rows(np_(model.get_layer("usd").indices), FAN_IN, HIDDEN)
        assert stats == cb.last_stats and stats["set_rewires"] == 15
        assert stats["set_moved"] == UNITS * 3
        results.append(np_(model.get_layer("usd").indices))
    np.testing.assert_array_equal(results[0], results[1])


def test_every_n_steps_counts_batches_with_steps_per_execution():
    # every_n_steps is documented as "rewire period in training batches";
    # with steps_per_execution=2 Keras calls on_train_batch_end once per two
    # batches (with batch = index of the last one).
    model = make_model(keras.optimizers.Adam(0.01))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=xmc_tf.losses.BinaryCrossentropy(), jit_compile=False,
                  steps_per_execution=2)
    x, ids = make_data(8)
    cb = SetRewiring(every_n_steps=2, fraction=0.5, seed=0)
    model.fit(x, ids, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert cb.rewires == 4  # 8 batches / every 2 batches


def test_statistics_logged_every_epoch_even_before_first_rewire(tmp_path):
    model = make_model(keras.optimizers.Adam(0.01))
    x, ids = make_data(4)
    csv_path = str(tmp_path / "log.csv")
    hist = model.fit(x, ids, batch_size=8, epochs=3, shuffle=False, verbose=0,
                     callbacks=[SetRewiring(every_n_steps=5, fraction=0.5, seed=0),
                                keras.callbacks.CSVLogger(csv_path)])
    # rewires after global steps 5 and 10 (epochs 2 and 3)
    assert hist.history["set_rewires"][-1] == 2
    assert len(hist.history["set_rewires"]) == 3
    with open(csv_path) as f:
        header = f.readline().strip().split(",")
    assert "set_moved" in header and "set_rewires" in header
