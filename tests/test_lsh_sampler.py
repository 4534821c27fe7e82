"""Tests of LshNegativeSampler (xmc_tf.samplers.lsh) and the Rehash callback.

References are independent NumPy computations: cosines of the head's label
vectors, the LNS inclusion probability 1 - (1 - alpha^K)^L, tables rebuilt
from scratch, and a Monte-Carlo check that the Horvitz-Thompson weights
estimate the loss over all negatives without bias.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.callbacks import Rehash
from op_requirements import needs_ops
from xmc_tf.samplers import Candidates, LshNegativeSampler

pytestmark = needs_ops("xmc_lsh_query")


class StandInHead:
    """The attributes of a label-major dense head, nothing else."""

    def __init__(self, kernel):
        self.kernel = tf.Variable(np.asarray(kernel, np.float32))
        self.units = self.kernel.shape[0]
        self.bias = tf.Variable(tf.zeros([self.units]))


def built(layer, d):
    layer(keras.ops.ones((1, d)))
    return layer


def make_head(kind, m=200, d=16, seed=0):
    if kind == "label_dense":
        keras.utils.set_random_seed(seed)
        return built(xmc_tf.layers.LabelDense(m), d)
    if kind == "sparse":
        keras.utils.set_random_seed(seed)
        return built(xmc_tf.layers.UniformSparseDense(m, 6, seed=seed), d)
    if kind == "keras_dense":
        keras.utils.set_random_seed(seed)
        return built(keras.layers.Dense(m), d)
    rng = np.random.default_rng(seed)
    return StandInHead(rng.normal(size=(m, d)))


def label_matrix(head):
    """Dense label-major float64 vectors [m, d] of any head."""
    kernel = np.asarray(keras.ops.convert_to_numpy(head.kernel), np.float64)
    if hasattr(head, "indices"):
        idx = np.asarray(keras.ops.convert_to_numpy(head.indices))
        out = np.zeros((kernel.shape[0], head.num_features))
        for j in range(kernel.shape[0]):
            np.add.at(out[j], idx[j], kernel[j])
        return out
    if isinstance(head, keras.layers.Dense):
        return kernel.T
    return kernel


def cosine(a, b):
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.where(den > 0, (a * b).sum(-1) / np.maximum(den, 1e-300), 0.0)


def lns_probability(cos, K, L):
    alpha = 1 - np.arccos(np.clip(cos, -1, 1)) / np.pi
    return 1 - (1 - alpha**K)**L


def sampler_for(head, **kwargs):
    m = int(head.units)
    kwargs.setdefault("num_candidates", 30)
    s = LshNegativeSampler(m, **kwargs)
    s.bind(head)
    s.refresh()
    return s


POS = np.array([[1, 2, -1], [5, -1, -1], [7, 8, 9], [-1, -1, -1]], np.int32)


def queries(d=16, b=4, seed=1):
    rng = np.random.default_rng(seed)
    return np.maximum(rng.normal(size=(b, d)), 0).astype(np.float32)


# ----------------------------------------------------------------------------
# Construction and binding.


@pytest.mark.parametrize("kwargs,match", [
    (dict(hash="minhash"), "hash"),
    (dict(query="both"), "query"),
    (dict(inclusion="exact"), "inclusion"),
    (dict(hash="dwta", inclusion="cosine"), "cosine"),
    (dict(weighting="uniform"), "weighting"),
    (dict(K=0), "K and L"),
    (dict(L=0), "K and L"),
    (dict(bucket_bits=0), "bucket_bits"),
    (dict(min_probability=0.0), "min_probability"),
    (dict(num_candidates=0), "num_candidates"),
])
def test_constructor_validation(kwargs, match):
    args = dict(num_labels=10, num_candidates=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        LshNegativeSampler(**args)


def test_bind_validation_and_order():
    s = LshNegativeSampler(200, 10, K=3, L=4)
    with pytest.raises(RuntimeError, match="bind"):
        s.refresh()
    with pytest.raises(ValueError, match="built"):
        s.bind(xmc_tf.layers.LabelDense(200))
    with pytest.raises(ValueError, match="labels"):
        s.bind(make_head("label_dense", m=100))
    s.bind(make_head("label_dense"))
    assert not s.ready
    with pytest.raises(RuntimeError, match="refresh"):
        s.sample(queries(), POS, 0)
    with pytest.raises(RuntimeError, match="refresh"):
        s.rehash_rows([1])
    stats = s.refresh()
    assert s.ready and stats["lsh_rows_rehashed"] == 200
    assert stats["index_refresh_seconds"] >= 0
    with pytest.raises(ValueError, match="bin_size"):
        LshNegativeSampler(200, 10, hash="dwta", bin_size=32).bind(
            make_head("label_dense"))


@pytest.mark.parametrize("kind", ["label_dense", "sparse", "keras_dense",
                                  "stand_in"])
@pytest.mark.parametrize("hash_", ["simhash", "dwta"])
@pytest.mark.parametrize("query", ["embedding", "label"])
def test_sample_contract(kind, hash_, query):
    head = make_head(kind)
    s = sampler_for(head, hash=hash_, K=4, L=6, query=query, bin_size=4,
                    seed=3)
    c = s.sample(queries(), POS, tf.constant(5, tf.int64))
    assert isinstance(c, Candidates)
    assert c.ids.shape == (4, 30) and c.ids.dtype == tf.int32
    assert c.mask.dtype == tf.bool
    assert c.log_q.dtype == tf.float32 and c.weights.dtype == tf.float32
    ids, mask = c.ids.numpy(), c.mask.numpy()
    log_q, weights = c.log_q.numpy(), c.weights.numpy()
    assert ids.min() >= 0 and ids.max() < 200
    for i in range(4):
        pos = set(POS[i][POS[i] >= 0].tolist())
        kept = ids[i][mask[i]].tolist()
        assert not pos & set(kept)  # accidental hits masked
        assert len(kept) == len(set(kept))  # no duplicates
    assert (log_q[~mask] == 0).all() and (weights[~mask] == 0).all()
    assert (log_q[mask] <= 0).all() and (weights[mask] >= 1).all()
    np.testing.assert_allclose(weights[mask], np.exp(-log_q[mask]), rtol=1e-5)
    if query == "label":
        assert not mask[3].any()  # a row without positives has no probe
    # The same call inside a tf.function gives the same candidates.
    graph = tf.function(s.sample)(tf.constant(queries()), tf.constant(POS),
                                  tf.constant(5, tf.int64))
    for a, b in zip(c, graph):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kind", ["label_dense", "sparse"])
@pytest.mark.parametrize("query", ["embedding", "label"])
def test_sample_and_rehash_read_variables_densely(kind, query):
    """No ResourceGather on a variable: it would switch the variable to
    copy-on-read, after which every read copies all m rows (O(m) per
    step)."""
    head = make_head(kind)
    s = sampler_for(head, K=3, L=4, query=query)
    graphs = [
        tf.function(s.sample).get_concrete_function(
            tf.TensorSpec([None, 16], tf.float32),
            tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([], tf.int64)),
        tf.function(s.rehash_rows).get_concrete_function(
            tf.TensorSpec([None], tf.int32)),
    ]
    for g in graphs:
        ops = {op.type for op in g.graph.get_operations()}
        assert "Xmc>LshQuery" in ops or "Xmc>LshUpdateTables" in ops, ops
        assert "ResourceGather" not in ops


def test_label_query_retrieves_and_masks_the_positive_itself():
    head = make_head("label_dense", m=300)
    s = sampler_for(head, K=3, L=4, query="label", num_candidates=4 * 300)
    c = s.sample(queries(), POS, 0)
    for i in range(3):
        for p in POS[i][POS[i] >= 0]:
            where = np.flatnonzero(c.ids.numpy()[i] == p)
            assert len(where) == 1  # all of its buckets are probed, r = 1
            assert not c.mask.numpy()[i, where[0]]


# ----------------------------------------------------------------------------
# Inclusion probabilities.


@pytest.mark.parametrize("kind", ["label_dense", "sparse", "keras_dense"])
@pytest.mark.parametrize("query", ["embedding", "label"])
def test_log_q_is_the_lns_inclusion_probability(kind, query):
    m, K, L = 150, 3, 4
    head = make_head(kind, m=m)
    s = sampler_for(head, K=K, L=L, query=query, num_candidates=L * m * 3,
                    seed=2)  # k >= L m q: nothing is subsampled, r = 1
    x = queries()
    c = s.sample(x, POS, 0)
    W = label_matrix(head)
    for i in range(4):
        for j, ok in zip(c.ids.numpy()[i], c.mask.numpy()[i]):
            if not ok:
                continue
            if query == "embedding":
                miss = 1 - lns_probability(cosine(W[j], x[i].astype(float)),
                                           K, L)
            else:
                miss = np.prod([1 - lns_probability(cosine(W[j], W[p]), K, L)
                                for p in POS[i] if p >= 0])
            p = max(1 - miss, 1.0 / m)
            assert c.log_q.numpy()[i][c.ids.numpy()[i] == j][0] == \
                pytest.approx(math.log(p), abs=2e-4)


def test_dwta_log_q_uses_collision_counts():
    m, K, L = 150, 2, 5
    head = make_head("label_dense", m=m)
    s = sampler_for(head, hash="dwta", K=K, L=L, bin_size=4,
                    num_candidates=L * m)
    x = queries()
    c = s.sample(x, POS, 0)
    qcodes = s.family.hash_dense(x, s.get_state()["params"]).numpy()
    codes = s.get_state()["codes"]
    for i in range(4):
        for j, ok, lq in zip(c.ids.numpy()[i], c.mask.numpy()[i],
                             c.log_q.numpy()[i]):
            if ok:
                collided = int((codes[j] == qcodes[i]).sum())
                assert collided >= 1
                p = 1 - (1 - collided / L)**L
                assert lq == pytest.approx(math.log(max(p, 1 / m)), abs=1e-5)


def test_weighting_none():
    head = make_head("label_dense")
    s = sampler_for(head, K=3, L=4, weighting="none")
    c = s.sample(queries(), POS, 0)
    np.testing.assert_array_equal(c.weights.numpy(),
                                  c.mask.numpy().astype(np.float32))


@pytest.mark.parametrize("query", ["embedding", "label"])
def test_horvitz_thompson_weights_are_unbiased(query):
    """E[sum_j weights_j f(j)] = sum over the negatives of f (over hashes).

    With r = 1 and one query per row the inclusion probability is exact, so
    the estimate averaged over independent hash functions (seeds) must match
    the true sum within its standard error.
    """
    m, d, K, L, trials = 60, 16, 2, 3, 160
    head = make_head("stand_in", m=m, d=d, seed=4)
    x = queries(d=d, seed=5)
    pos = np.array([[0], [2], [3], [-1]], np.int32)
    if query == "label":
        pos = pos[:3]
        x = x[:3]
    f = 1.0 + (np.arange(m) % 7)
    truth = np.array([f.sum() - f[p[p >= 0]].sum() for p in pos])
    estimates = []
    for seed in range(trials):
        s = sampler_for(head, K=K, L=L, query=query, seed=seed,
                        num_candidates=L * m, min_probability=1e-12)
        c = s.sample(x, pos, 0)
        estimates.append((c.weights.numpy() * f[c.ids.numpy()]).sum(1))
    estimates = np.array(estimates)
    se = estimates.std(0) / math.sqrt(trials)
    assert (np.abs(estimates.mean(0) - truth) < 4 * se + 1e-6).all(), (
        estimates.mean(0), truth, se)
    # Without reweighting the sum is biased low (a test that can fail).
    assert (estimates.mean(0) > 0.5 * truth).all()


# ----------------------------------------------------------------------------
# Re-hashing and state.


@pytest.mark.parametrize("kind", ["label_dense", "sparse", "keras_dense"])
@pytest.mark.parametrize("hash_", ["simhash", "dwta"])
def test_rehash_rows_equals_full_refresh(kind, hash_):
    head = make_head(kind, m=120)
    a = sampler_for(head, hash=hash_, K=3, L=5, bin_size=4, seed=6)
    rows = np.array([3, 50, 119, 3], np.int32)
    kernel = keras.ops.convert_to_numpy(head.kernel).copy()
    if isinstance(head, keras.layers.Dense):
        kernel[:, rows] = -2 * kernel[:, rows] + 0.3
    else:
        kernel[rows] = -2 * kernel[rows] + 0.3
    head.kernel.assign(kernel)
    if kind == "sparse":  # a rewired connection changes the label vector
        idx = keras.ops.convert_to_numpy(head.indices).copy()
        idx[50, 0] = (idx[50, 0] + 1) % head.num_features
        while idx[50, 0] in idx[50, 1:]:
            idx[50, 0] = (idx[50, 0] + 1) % head.num_features
        head.indices.assign(idx)
    before = a.tables()
    n = tf.function(a.rehash_rows)(tf.constant(rows))
    assert int(n) == 4
    b = sampler_for(head, hash=hash_, K=3, L=5, bin_size=4, seed=6)
    after, fresh = a.tables(), b.tables()
    for key in ("offsets", "labels", "codes"):
        np.testing.assert_array_equal(after[key], fresh[key])
    changed = np.flatnonzero((before["codes"] != after["codes"]).any(1))
    assert set(changed.tolist()) <= {3, 50, 119} and len(changed) >= 1
    with pytest.raises(tf.errors.InvalidArgumentError):
        a.rehash_rows([120])


@pytest.mark.parametrize("kind", ["label_dense", "sparse"])
@pytest.mark.parametrize("query", ["embedding", "label"])
def test_state_round_trip_samples_identically(kind, query):
    head = make_head(kind, m=300)
    cfg = dict(K=3, L=6, query=query, seed=9, num_candidates=25)
    a = sampler_for(head, **cfg)
    a.rehash_rows([1, 2, 3])
    state = a.get_state()
    assert set(state) == {"params", "codes"}
    assert state["codes"].shape == (300, 6) and state["codes"].dtype == np.int32
    # A sampler with another seed, restored, samples like the original.
    b = LshNegativeSampler(300, **{**cfg, "seed": 9})
    b.set_state(state)  # before bind: applied at bind time
    b.bind(head)
    assert b.ready
    x = queries()
    ca, cb = a.sample(x, POS, 11), b.sample(x, POS, 11)
    for u, v in zip(ca, cb):
        np.testing.assert_array_equal(u.numpy(), v.numpy())
    c = LshNegativeSampler(300, **cfg)
    c.bind(head)
    c.set_state(state)
    for u, v in zip(ca, c.sample(x, POS, 11)):
        np.testing.assert_array_equal(u.numpy(), v.numpy())
    for key in ("offsets", "labels", "codes"):
        np.testing.assert_array_equal(a.tables()[key], c.tables()[key])
    c.set_state({})
    assert not c.ready and c.get_state() == {}


def test_set_state_validation():
    head = make_head("label_dense")
    s = sampler_for(head, K=3, L=4)
    state = s.get_state()
    with pytest.raises(ValueError, match="keys"):
        s.set_state({"codes": state["codes"]})
    with pytest.raises(ValueError, match="params"):
        s.set_state({**state, "params": state["params"][:, :5]})
    with pytest.raises(ValueError, match="codes"):
        s.set_state({**state, "codes": state["codes"][:10]})
    bad = state["codes"].copy()
    bad[0, 0] = 8
    with pytest.raises(ValueError, match="num_buckets"):
        s.set_state({**state, "codes": bad})


def test_deterministic_given_seed_and_step():
    head = make_head("label_dense", m=2000)
    cfg = dict(K=2, L=8, num_candidates=20)  # big buckets: subsampled
    a, b = sampler_for(head, seed=1, **cfg), sampler_for(head, seed=1, **cfg)
    other = sampler_for(head, seed=2, **cfg)
    x = queries()
    ca = a.sample(x, POS, 3)
    np.testing.assert_array_equal(ca.ids, b.sample(x, POS, 3).ids)
    assert not np.array_equal(ca.ids, a.sample(x, POS, 4).ids)
    assert not np.array_equal(ca.ids, other.sample(x, POS, 3).ids)


def test_config_round_trip():
    s = LshNegativeSampler(50, 7, hash="dwta", K=5, L=11, query="label",
                           seed=3, bin_size=4, bucket_bits=12,
                           inclusion="collisions", weighting="none",
                           min_probability=0.01)
    config = s.get_config()
    assert config["K"] == 5 and config["hash"] == "dwta"
    assert LshNegativeSampler.from_config(config).get_config() == config
    assert "LshNegativeSampler(" in repr(s)


# ----------------------------------------------------------------------------
# Rehash callback.


def fit_model(m=40, d=8, steps=16, callbacks=(), seed=0):
    keras.utils.set_random_seed(seed)
    head = xmc_tf.layers.LabelDense(m)
    model = keras.Sequential([keras.Input((d,)), head])
    model.compile(keras.optimizers.SGD(0.5), loss="mse", jit_compile=False)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * 4, d)).astype(np.float32)
    y = rng.normal(size=(steps * 4, m)).astype(np.float32)
    return model, head, (x, y)


def test_rehash_validation():
    s = LshNegativeSampler(10, 3)
    with pytest.raises(ValueError, match="schedule"):
        Rehash(s, schedule="cosine")
    with pytest.raises(ValueError, match="every_n_steps"):
        Rehash(s, every_n_steps=0)
    with pytest.raises(ValueError, match="frequency_decay"):
        Rehash(s, frequency_decay=1.5)
    with pytest.raises(ValueError, match="max_period"):
        Rehash(s, every_n_steps=10, max_period=5)
    with pytest.raises(ValueError, match="threshold"):
        Rehash(s, schedule="threshold", threshold=0.0)


def test_rehash_period_schedule_with_decaying_frequency():
    model, head, (x, y) = fit_model()
    sampler = LshNegativeSampler(40, 10, K=3, L=4, seed=1)
    sampler.bind(head)
    cb = Rehash(sampler, schedule="period", every_n_steps=2,
                frequency_decay=0.5)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                        callbacks=[cb])
    # Periods 2, 4, 8, 16: re-hashes after steps 2, 6 and 14 of 16.
    assert cb.rehashes == 3
    logs = history.history
    assert logs["lsh_rehashes"] == [3]
    assert logs["lsh_rows_rehashed"] == [3 * 40]
    assert logs["lsh_rehash_seconds"][0] > 0
    assert logs["lsh_rehash_period"] == [16.0]
    # max_period caps the growth.
    cb2 = Rehash(sampler, every_n_steps=2, frequency_decay=0.5, max_period=3)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[cb2])
    assert cb2.period == 3.0 and cb2.rehashes == 5  # steps 2, 6, 9, 12, 15


def test_rehash_threshold_schedule_rehashes_changed_rows():
    model, head, (x, y) = fit_model(steps=8)
    sampler = LshNegativeSampler(40, 10, K=3, L=4, seed=1)
    sampler.bind(head)
    cb = Rehash(sampler, schedule="threshold", every_n_steps=4,
                threshold=1e-9)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                        callbacks=[cb])
    # Every row moves at every SGD step: all 40 rows at steps 4 and 8.
    assert history.history["lsh_rows_rehashed"] == [80]
    fresh = LshNegativeSampler(40, 10, K=3, L=4, seed=1)
    fresh.bind(head)
    fresh.refresh()
    for key in ("offsets", "labels", "codes"):
        np.testing.assert_array_equal(sampler.tables()[key],
                                      fresh.tables()[key])
    # A huge threshold re-hashes nothing: the tables keep the old codes.
    initial = sampler.tables()
    cb2 = Rehash(sampler, schedule="threshold", every_n_steps=4,
                 threshold=1e9)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0,
                        callbacks=[cb2])
    assert history.history["lsh_rows_rehashed"] == [0]
    assert cb2.rehashes == 0
    np.testing.assert_array_equal(sampler.tables()["codes"], initial["codes"])


def test_rehash_threshold_sees_rewired_connections():
    head = make_head("sparse", m=30)
    sampler = sampler_for(head, K=2, L=3)
    cb = Rehash(sampler, schedule="threshold", threshold=1e9)
    cb._snapshot = sampler.label_rows()  # what on_train_begin records
    idx = keras.ops.convert_to_numpy(head.indices).copy()
    idx[7] = np.roll(idx[7], 1)  # same set, other order: vector changes
    head.indices.assign(idx)
    assert cb.changed_rows().tolist() == [7]
    assert cb.rehash_now() == 1
    assert cb.changed_rows().tolist() == []


def test_rehash_state_round_trip_resumes_the_schedule():
    model, head, (x, y) = fit_model()
    sampler = LshNegativeSampler(40, 10, K=3, L=4, seed=1)
    sampler.bind(head)
    cb = Rehash(sampler, every_n_steps=2, frequency_decay=0.5)
    model.fit(x[:24], y[:24], batch_size=4, epochs=1, verbose=0,
              callbacks=[cb])  # steps 1..6: re-hashes after 2 and 6
    state = cb.get_state()
    assert state == {"period": 8.0, "rehashes": 2, "next_step": 14}
    resumed = Rehash(sampler, every_n_steps=2, frequency_decay=0.5)
    resumed.set_state(state)
    model.fit(x[24:], y[24:], batch_size=4, epochs=1, verbose=0,
              callbacks=[resumed])  # steps 7..16: one re-hash, after 14
    assert resumed.rehashes == 3 and resumed.period == 16.0
    threshold = Rehash(sampler, schedule="threshold", threshold=0.5)
    threshold._snapshot = sampler.label_rows()
    copy = Rehash(sampler, schedule="threshold", threshold=0.5)
    copy.set_state(threshold.get_state())
    np.testing.assert_array_equal(copy._snapshot["weights"],
                                  threshold._snapshot["weights"])



# ----------------------------------------------------------------------------
# Hash functions per table for the label space (K=None), candidate yield.


def auto_k_reference(m, k, L, bits_per_hash, cap=16):
    """The largest K >= 1 whose K * bits_per_hash bits stay within
    floor(log2(L m / k)) (at least 1, at most cap), by search."""
    target = 1
    while target < cap and 2 ** (target + 1) <= L * m / k:
        target += 1
    best = 1
    for K in range(1, 65):
        if K * bits_per_hash <= target:
            best = K
    return best


@pytest.mark.parametrize("m,k,L", [(159, 39, 50), (983, 245, 50),
                                   (50_000, 256, 50), (10**7, 1, 50),
                                   (2, 256, 1)])
def test_lsh_auto_K_per_hash_family(m, k, L):
    from xmc_tf.samplers import lsh_auto_K
    assert lsh_auto_K(m, k, L) == auto_k_reference(m, k, L, 1)
    for w, bits in [(2, 1), (8, 3), (16, 4)]:
        assert lsh_auto_K(m, k, L, hash="dwta", bin_size=w) == (
            auto_k_reference(m, k, L, bits))
    with pytest.raises(ValueError, match="bin_size"):
        lsh_auto_K(m, k, L, hash="dwta", bin_size=6)
    with pytest.raises(ValueError, match="hash"):
        lsh_auto_K(m, k, L, hash="minhash")


def small_label_space(m=159, d=64, b=256, seed=0):
    rng = np.random.default_rng(seed)
    head = built(xmc_tf.layers.LabelDense(m), d)
    head.kernel.assign(rng.normal(size=(m, d)).astype(np.float32))
    q = rng.normal(size=(b, d)).astype(np.float32)
    return head, q, np.full((b, 1), -1, np.int32)


@pytest.mark.parametrize("hash_", ["simhash", "dwta"])
def test_default_K_draws_about_k_candidates(hash_):
    """Bibtex's size (m = 159, k = 39, L = 50): the default K fills most of
    the k candidates (measured 33.7 SimHash, 31.2 DWTA); DWTA with the
    SimHash count K = 7 (21 bits: 65k buckets) drew almost none."""
    from xmc_tf.samplers import lsh_auto_K
    m, k, L = 159, 39, 50
    head, q, pos = small_label_space(m)
    s = LshNegativeSampler(m, k, hash=hash_, L=L, seed=0)
    assert s.K == lsh_auto_K(m, k, L, hash=hash_)
    assert s.get_config()["K"] == s.K  # resolved, so from_config repeats it
    s.bind(head)
    s.refresh()
    assert s.family.num_buckets <= 2 ** math.floor(math.log2(L * m / k))
    c = s.sample(q, pos, 0)
    per_row = c.mask.numpy().sum(1).mean()  # no positives: drawn = unmasked
    assert 0.7 * k <= per_row <= k
    assert s.candidate_yield() == pytest.approx((per_row, k))
    assert s.candidate_yield() is None  # reset by the read
    if hash_ == "dwta":
        bad = LshNegativeSampler(m, k, hash="dwta", K=7, L=L, seed=0)
        bad.bind(head)
        bad.refresh()
        assert bad.sample(q, pos, 0).mask.numpy().sum(1).mean() < 0.05 * k


def test_config_K_0_is_the_automatic_K_of_the_family():
    import ml_collections
    from xmc_tf.job.samplers import make_sampler
    from xmc_tf.samplers import lsh_auto_K
    sc = ml_collections.ConfigDict(dict(
        kind="lsh", num_negatives=39, hash="dwta", K=0, L=50,
        query="embedding"))
    s = make_sampler(sc, 159, seed=0)
    assert s.K == lsh_auto_K(159, 39, 50, hash="dwta") == 2


def lsh_fit(sampler, epochs=2):
    from xmc_tf.data import make_synthetic, make_tf_dataset
    from xmc_tf.losses import SampledSoftmax
    from xmc_tf.models import SampledTrainer
    keras.utils.set_random_seed(0)
    m = sampler.num_labels
    train = make_synthetic(256, 100, m, labels_per_instance=1, seed=0)
    inputs = keras.Input((100,), sparse=True)
    model = keras.Model(inputs, xmc_tf.layers.LabelDense(m)(
        keras.layers.Dense(64)(inputs)))
    trainer = SampledTrainer(model, sampler, SampledSoftmax())
    trainer.compile(optimizer="adam", jit_compile=False)
    return trainer.fit(make_tf_dataset(train, 64), epochs=epochs, verbose=0,
                       callbacks=[Rehash(sampler)])


def test_short_candidate_yield_warns_once_from_rehash():
    """DWTA with K = 7 on 159 labels comes up short: Rehash's epoch end
    warns once (two epochs) and logs the mean candidates per row."""
    import warnings
    sampler = LshNegativeSampler(159, 39, hash="dwta", K=7, L=50, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = lsh_fit(sampler)
    short = [w for w in caught if "candidates per row" in str(w.message)]
    assert len(short) == 1, [str(w.message) for w in caught]
    assert "fewer hash functions" in str(short[0].message)
    per_row = history.history["candidates_per_row"]
    assert len(per_row) == 2 and max(per_row) < 0.5 * 39


def test_default_K_does_not_warn():
    import warnings
    sampler = LshNegativeSampler(159, 39, hash="dwta", L=50, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = lsh_fit(sampler)
    assert not [w for w in caught if "candidates per row" in str(w.message)]
    assert min(history.history["candidates_per_row"]) >= 0.5 * 39
