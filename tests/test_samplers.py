"""Tests of the negative samplers, label vectors and the RefreshIndex callback.

References are independent NumPy computations: exact scores of the head by a
dense equivalent (uniform-sparse kernel scattered into ``[m, e]``), exact
top-k by ``np.argsort``, set arithmetic for exclusions, and a chi-square test
for the uniform draws.  Sources: ASTRA (Mehta et al.) Algorithm 1 and Eq. 2.
"""

import sys

import keras
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

import xmc_tf
from xmc_tf.callbacks import RefreshIndex, SetRewiring
from xmc_tf.layers import UniformSparseDense
from xmc_tf.samplers import (AnnNegativeSampler, Candidates, InBatchSampler,
                             MixtureSampler, UniformNegativeSampler,
                             label_vectors)
from xmc_tf.samplers.uniform import draw_excluding
from xmc_tf.samplers.vectors import gaussian_projection

faiss = pytest.importorskip("faiss")


class StandInLabelDense(keras.layers.Layer):
    """Label-major dense head (kernel [m, d], bias [m]) like LabelDense."""

    def __init__(self, units, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.units, self.use_bias = units, use_bias

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(self.units, input_shape[-1]),
                                      initializer="glorot_uniform")
        self.bias = (self.add_weight(shape=(self.units,), initializer="zeros")
                     if self.use_bias else None)

    def call(self, x):
        out = keras.ops.matmul(x, keras.ops.transpose(self.kernel))
        return out if self.bias is None else out + self.bias


def dense_kernel(head):
    """Reference: the head's [m, e] weight matrix (uniform-sparse densified)."""
    kernel = keras.ops.convert_to_numpy(head.kernel).astype(np.float64)
    if not hasattr(head, "indices"):
        return kernel
    idx = keras.ops.convert_to_numpy(head.indices)
    full = np.zeros((kernel.shape[0], head.num_features))
    for l in range(kernel.shape[0]):
        full[l, idx[l]] += kernel[l]
    return full


def exact_scores(head, x):
    scores = np.asarray(x, np.float64) @ dense_kernel(head).T
    if head.bias is not None:
        scores += keras.ops.convert_to_numpy(head.bias)
    return scores


def exact_top_negatives(scores, positives, k):
    s = scores.copy()
    for i, row in enumerate(positives):
        s[i, row[row >= 0]] = -np.inf
    return np.argsort(-s, axis=1, kind="stable")[:, :k], s


def make_heads(m, e, seed=0, randomize_bias=True):
    """A uniform-sparse and a label-major dense head with random weights."""
    rng = np.random.default_rng(seed)
    sparse = UniformSparseDense(m, 6, seed=seed)
    sparse.build((None, e))
    sparse.kernel.assign(rng.normal(size=(m, 6)).astype(np.float32))
    dense = StandInLabelDense(m)
    dense.build((None, e))
    dense.kernel.assign(rng.normal(size=(m, e)).astype(np.float32) / np.sqrt(e))
    if randomize_bias:
        for head in (sparse, dense):
            head.bias.assign(rng.normal(size=m).astype(np.float32))
    return sparse, dense


def clustered_head(m, d, clusters, seed=0):
    """Dense head whose label vectors form clusters, and queries near them."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, d)).astype(np.float32)
    label_cluster = rng.integers(0, clusters, m)
    w = centers[label_cluster] + 0.4 * rng.normal(size=(m, d)).astype(np.float32)
    head = StandInLabelDense(m, use_bias=False)
    head.build((None, d))
    head.kernel.assign(w)
    q = centers[rng.integers(0, clusters, 200)] + 0.4 * rng.normal(
        size=(200, d)).astype(np.float32)
    return head, q.astype(np.float32)


def random_positives(rng, b, n, m):
    pos = rng.integers(0, m, size=(b, n))
    pos[rng.random((b, n)) < 0.3] = -1
    return pos.astype(np.int32)


# --------------------------------------------------------------------------
# draw_excluding / UniformNegativeSampler
# --------------------------------------------------------------------------

def test_draw_excluding_stays_in_complement_and_reaches_all_of_it():
    rng = np.random.default_rng(0)
    m = 40
    excluded = rng.integers(-1, m, size=(6, 12)).astype(np.int32)
    excluded[0] = -1                      # nothing excluded
    excluded[1, :4] = [0, 0, m - 1, m - 1]  # boundaries and repeats
    ids, count = draw_excluding(excluded, m, 3000, tf.constant([3, 9], tf.int64))
    ids, count = ids.numpy(), count.numpy()
    assert ids.dtype == np.int32 and ids.shape == (6, 3000)
    for i in range(6):
        complement = set(range(m)) - set(excluded[i][excluded[i] >= 0].tolist())
        assert count[i] == len(complement)
        assert set(ids[i].tolist()) == complement  # in it, and all of it drawn


def test_draw_excluding_everything_excluded():
    ids, count = draw_excluding(np.array([[0, 1, 2]]), 3, 5,
                                tf.constant([0, 0], tf.int64))
    assert count.numpy().tolist() == [0]
    np.testing.assert_array_equal(ids.numpy(), 0)


def test_uniform_sampler_shapes_weights_log_q_and_no_hits():
    m, k = 50, 16
    rng = np.random.default_rng(1)
    pos = random_positives(rng, 8, 10, m)
    pos[0] = -1
    pos[1, :3] = [7, 7, 7]
    c = UniformNegativeSampler(m, k, seed=3).sample(None, pos, step=11)
    assert isinstance(c, Candidates)
    assert c.ids.dtype == tf.int32 and c.mask.dtype == tf.bool
    assert c.log_q.dtype == tf.float32 and c.weights.dtype == tf.float32
    for t in c:
        assert t.shape == (8, k)
    ids = c.ids.numpy()
    for i in range(8):
        p = set(pos[i][pos[i] >= 0].tolist())
        assert not p & set(ids[i].tolist())      # accidental hits impossible
        n_neg = m - len(p)
        np.testing.assert_allclose(c.weights.numpy()[i], n_neg / k, rtol=1e-6)
        np.testing.assert_allclose(c.log_q.numpy()[i], np.log(k / n_neg),
                                   rtol=1e-6)
    assert c.mask.numpy().all()
    assert ids.min() >= 0 and ids.max() < m


def test_uniform_sampler_row_with_all_labels_positive_is_masked():
    c = UniformNegativeSampler(3, 4).sample(None, [[0, 1, 2], [0, -1, -1]], 0)
    assert not c.mask.numpy()[0].any()
    np.testing.assert_array_equal(c.weights.numpy()[0], 0.0)
    assert c.mask.numpy()[1].all()
    np.testing.assert_allclose(c.weights.numpy()[1], 2 / 4)


def test_uniform_sampler_frequencies_are_uniform_chi_square():
    m, k = 30, 64
    pos = np.array([[2, 17, 29, -1]] * 64, np.int32)
    sampler = UniformNegativeSampler(m, k, seed=5)
    counts = np.zeros(m)
    for step in range(20):
        ids = sampler.sample(None, pos, step).ids.numpy()
        counts += np.bincount(ids.ravel(), minlength=m)
    assert counts[[2, 17, 29]].sum() == 0
    neg = np.delete(counts, [2, 17, 29])
    _, p_value = scipy.stats.chisquare(neg)
    assert p_value > 1e-3, (p_value, neg)


def test_uniform_sampler_deterministic_per_step_and_in_graph():
    sampler = UniformNegativeSampler(1000, 8, seed=7)
    pos = np.array([[1, 2], [3, -1]], np.int32)
    a = sampler.sample(None, pos, 5).ids.numpy()
    b = sampler.sample(None, pos, 5).ids.numpy()
    c = sampler.sample(None, pos, 6).ids.numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    step = tf.Variable(5, dtype=tf.int64)
    graph = tf.function(lambda p: sampler.sample(None, p, step))
    np.testing.assert_array_equal(graph(pos).ids.numpy(), a)
    other_seed = UniformNegativeSampler(1000, 8, seed=8).sample(None, pos, 5)
    assert not np.array_equal(other_seed.ids.numpy(), a)


def test_uniform_sampler_rejects_out_of_range_positive():
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_labels"):
        UniformNegativeSampler(10, 4).sample(None, [[3, 10]], 0)


def test_uniform_sampler_config_and_empty_state():
    s = UniformNegativeSampler(10, 4, seed=2)
    assert s.get_config() == {"num_labels": 10, "num_candidates": 4, "seed": 2}
    assert s.get_state() == {}
    s.set_state({})
    with pytest.raises(ValueError):
        s.set_state({"x": np.zeros(1)})
    with pytest.raises(ValueError):
        UniformNegativeSampler(0, 4)


# --------------------------------------------------------------------------
# InBatchSampler
# --------------------------------------------------------------------------

def test_in_batch_candidates_are_other_rows_positives():
    pos = np.array([[1, 4, -1], [4, 9, 9], [-1, -1, -1], [2, 1, -1]], np.int32)
    c = InBatchSampler(10, 6).sample(None, pos, 0)
    ids, mask = c.ids.numpy(), c.mask.numpy()
    assert ids.shape == (4, 6)
    # the distinct batch positives, in first-occurrence order, then padding
    np.testing.assert_array_equal(ids[0], [1, 4, 9, 2, 0, 0])
    assert not mask[:, 4:].any()
    for i in range(4):
        own = set(pos[i][pos[i] >= 0].tolist())
        expect = [l not in own for l in ids[i, :4]]
        np.testing.assert_array_equal(mask[i, :4], expect)
    # row counts: 1 in rows 0,3; 4 in rows 0,1; 9 once (row 1, repeated); 2 once
    expected_log_q = np.log([2, 2, 1, 1])
    for i in range(4):
        np.testing.assert_allclose(c.log_q.numpy()[i, :4][mask[i, :4]],
                                   expected_log_q[mask[i, :4]], rtol=1e-6)
    np.testing.assert_array_equal(c.weights.numpy(), mask.astype(np.float32))


def test_in_batch_subsets_when_more_labels_than_columns():
    rng = np.random.default_rng(0)
    pos = rng.choice(100, size=(10, 5), replace=False).astype(np.int32)  # 50 labels
    sampler = InBatchSampler(100, 20, seed=1)
    c = sampler.sample(None, pos, 3)
    ids = c.ids.numpy()
    assert np.all(ids == ids[0])  # shared by all rows
    assert len(set(ids[0].tolist())) == 20
    assert set(ids[0].tolist()) <= set(pos.ravel().tolist())
    # each label is a positive of exactly one row: log_q = log(1 * 20 / 50)
    np.testing.assert_allclose(c.log_q.numpy()[c.mask.numpy()], np.log(20 / 50),
                               rtol=1e-6)
    np.testing.assert_array_equal(sampler.sample(None, pos, 3).ids.numpy(), ids)
    assert not np.array_equal(sampler.sample(None, pos, 4).ids.numpy(), ids)


# --------------------------------------------------------------------------
# label_vectors
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_label_vectors_exact_encoding_reproduces_scores(kind):
    sparse, dense = make_heads(m=70, e=24)
    head = sparse if kind == "sparse" else dense
    x = np.random.default_rng(1).normal(size=(5, 24)).astype(np.float32)
    vectors, transform = label_vectors(head, projection="none")
    assert vectors.dtype == np.float32 and vectors.shape == (70, 25)
    assert transform.output_dim == 25
    np.testing.assert_allclose(transform(x) @ vectors.T, exact_scores(head, x),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(transform(x) @ vectors.T,
                               keras.ops.convert_to_numpy(head(x)), atol=1e-5)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_label_vectors_projection_is_the_dense_projection(kind):
    sparse, dense = make_heads(m=70, e=24)
    head = sparse if kind == "sparse" else dense
    vectors, transform = label_vectors(head, projection=8, seed=4)
    r = gaussian_projection(24, 8, seed=4)
    assert vectors.shape == (70, 9)
    np.testing.assert_allclose(vectors[:, :8], dense_kernel(head) @ r,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(vectors[:, 8], keras.ops.convert_to_numpy(head.bias))
    x = np.ones((2, 24), np.float32)
    np.testing.assert_allclose(transform(x)[:, :8], x @ r, rtol=1e-5)
    np.testing.assert_array_equal(transform(x)[:, 8], 1.0)


def test_label_vectors_auto_switches_to_projection_beyond_budget():
    sparse, _ = make_heads(m=70, e=24)
    v, t = label_vectors(sparse, max_bytes=70 * 25 * 4)
    assert t.matrix is None and v.shape == (70, 25)
    v, t = label_vectors(sparse, max_bytes=70 * 25 * 4 - 1)
    assert t.matrix is not None and v.shape[1] == 129


def test_label_vectors_auto_projects_wide_large_label_spaces():
    """Within the memory budget, "auto" still projects once a search would
    scan more than MAX_EXACT_ENTRIES floats per query (m * (e + 1))."""
    from xmc_tf.samplers.vectors import MAX_EXACT_ENTRIES, projection_dim
    e = 4095  # e + 1 = 4096 with the bias
    limit = MAX_EXACT_ENTRIES // (e + 1)
    for m, want in ((limit, None), (limit + 1, 128)):
        head = UniformSparseDense(m, 2, seed=0)
        head.build((None, e))
        assert projection_dim(head) == want, m
        assert projection_dim(head, projection="none") is None
    narrow = UniformSparseDense(MAX_EXACT_ENTRIES // 64, 2, seed=0)
    narrow.build((None, 100))  # e + 1 <= 128: projecting would not shrink it
    assert projection_dim(narrow) is None


def test_projected_scores_are_unbiased():
    """E_R[<R^T x, R^T w>] = <x, w>: average over many projection seeds."""
    sparse, _ = make_heads(m=20, e=24, randomize_bias=False)
    x = np.random.default_rng(2).normal(size=(1, 24)).astype(np.float32)
    exact = exact_scores(sparse, x)[0]
    est = np.mean([(lambda v, t: (t(x) @ v.T)[0])(*label_vectors(
        sparse, projection=4, seed=s)) for s in range(400)], axis=0)
    spread = np.linalg.norm(x) * np.linalg.norm(dense_kernel(sparse), axis=1)
    # std of one estimate ~ |x||w|/sqrt(p); of the mean of 400: /20
    assert np.all(np.abs(est - exact) < 5 * spread / np.sqrt(4) / 20)


def test_label_vectors_with_real_label_dense():
    head = xmc_tf.layers.LabelDense(30)
    x = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    out = keras.ops.convert_to_numpy(head(x))
    v, t = label_vectors(head, projection="none")
    np.testing.assert_allclose(t(x) @ v.T, out, atol=1e-5)


# --------------------------------------------------------------------------
# AnnNegativeSampler
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_flat_index_returns_exact_top_k_non_positive(kind):
    m, e, k = 300, 16, 7
    sparse, dense = make_heads(m, e)
    head = sparse if kind == "sparse" else dense
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, e)).astype(np.float32)
    scores = exact_scores(head, x)
    pos = random_positives(rng, 9, 6, m)
    pos[0, :3] = np.argsort(-scores[0])[:3]  # the best labels are positives
    sampler = AnnNegativeSampler(m, k, index="flat")
    sampler.bind(head)
    stats = sampler.refresh()
    assert stats["index_refresh_count"] == 1 and stats["index_refresh_seconds"] >= 0
    c = sampler.sample(x, pos, step=0)
    ids = c.ids.numpy()
    assert c.mask.numpy().all()
    np.testing.assert_array_equal(c.weights.numpy(), 1.0)
    np.testing.assert_array_equal(c.log_q.numpy(), 0.0)
    ref_ids, masked = exact_top_negatives(scores, pos, k)
    # compare score values (ties may order differently)
    np.testing.assert_allclose(np.take_along_axis(scores, ids, 1),
                               np.take_along_axis(masked, ref_ids, 1), atol=1e-4)
    for i in range(9):
        assert not set(ids[i].tolist()) & set(pos[i].tolist())


def test_ann_sampler_masks_when_too_few_negatives():
    m = 6
    sparse, _ = make_heads(m, 8)
    sampler = AnnNegativeSampler(m, 5, index="flat")
    sampler.bind(sparse)
    sampler.refresh()
    c = sampler.sample(np.ones((1, 8), np.float32), [[0, 1, 2]], 0)
    mask = c.mask.numpy()[0]
    assert mask.sum() == 3 and mask[:3].all()
    assert set(c.ids.numpy()[0, :3].tolist()) == {3, 4, 5}
    np.testing.assert_array_equal(c.weights.numpy()[0], mask)


def test_ann_sampler_before_refresh_fails_clearly():
    sampler = AnnNegativeSampler(10, 2, index="flat")
    with pytest.raises(RuntimeError, match="refresh"):  # eager
        sampler.sample(np.ones((1, 4), np.float32), [[0]], 0)
    graph = tf.function(lambda q, p: sampler.sample(q, p, 0))
    with pytest.raises(tf.errors.OpError, match="call refresh"):
        graph(np.ones((1, 4), np.float32), np.array([[0]]))
    with pytest.raises(RuntimeError, match="bind"):
        sampler.refresh()


def test_ivf_recall_on_clustered_data():
    m, d, k = 8000, 32, 20
    head, q = clustered_head(m, d, clusters=100)
    sampler = AnnNegativeSampler(m, k, index="ivf_flat", nlist=64, nprobe=8)
    sampler.bind(head)
    stats = sampler.refresh()
    assert stats["index_retrained"]
    pos = -np.ones((len(q), 1), np.int32)
    ids = sampler.sample(q, pos, 0).ids.numpy()
    ref, _ = exact_top_negatives(exact_scores(head, q), pos, k)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, ref)])
    print(f"IVF recall@{k} (m={m}, nlist=64, nprobe=8): {recall:.3f}")
    assert recall > 0.9


def sparse_clustered_head(m, e, s, clusters, seed=0):
    """Uniform-sparse head whose label weights follow cluster profiles over
    the inputs, and a sampler of ReLU inputs from the same clusters."""
    rng = np.random.default_rng(seed)
    head = UniformSparseDense(m, s, seed=seed + 1)
    head.build((None, e))
    profiles = np.abs(rng.normal(size=(clusters, e))).astype(np.float32)
    cluster = rng.integers(0, clusters, m)
    idx = keras.ops.convert_to_numpy(head.indices)
    head.kernel.assign(profiles[cluster[:, None], idx]
                       + 0.3 * rng.normal(size=(m, s)).astype(np.float32))

    def queries(n):
        return np.maximum(profiles[rng.integers(0, clusters, n)]
                          + 0.3 * rng.normal(size=(n, e)), 0).astype(np.float32)
    return head, queries


@pytest.mark.parametrize("projection,basis,floor", [
    ("none", None, 0.999), (64, "gaussian", 0.05), (64, "queries", 0.7)])
def test_sparse_head_recall_with_and_without_projection(projection, basis, floor):
    """Recall of the returned negatives vs exact top-k of a uniform-sparse head.

    Measured: 1.0 exact, ~0.18 Gaussian projection, ~0.83 query basis (p=64
    of e=256); chance level is k/m = 0.003.
    """
    m, e, s, k = 3000, 256, 16, 10
    head, queries = sparse_clustered_head(m, e, s, clusters=30)
    sampler = AnnNegativeSampler(m, k, index="flat", projection=projection,
                                 query_sample_size=0 if basis == "gaussian" else 1024)
    sampler.bind(head)
    stats = sampler.refresh()
    if basis == "queries":
        assert stats["index_projection"] == "gaussian"  # nothing recorded yet
        train = queries(1024)
        assert sampler.recorded_queries() is None
        sampler.sample(train, -np.ones((1024, 1), np.int32), 0)  # records them
        np.testing.assert_array_equal(sampler.recorded_queries(), train)
        stats = sampler.refresh()
    assert stats["index_projection"] == (basis or "none")
    x = queries(100)
    pos = -np.ones((100, 1), np.int32)
    ids = sampler.sample(x, pos, 0).ids.numpy()
    ref, _ = exact_top_negatives(exact_scores(head, x), pos, k)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, ref)])
    print(f"uniform-sparse recall@{k}, projection={projection} {basis}: {recall:.3f}")
    assert recall >= floor


def test_query_ring_buffer_keeps_most_recent():
    head, queries = sparse_clustered_head(50, 16, 4, clusters=3)
    sampler = AnnNegativeSampler(50, 2, index="flat", projection=4,
                                 query_sample_size=5)
    sampler.bind(head)
    sampler.refresh()
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    for i in range(0, 8, 3):
        sampler.sample(x[i:i + 3], -np.ones((len(x[i:i + 3]), 1), np.int32), 0)
    kept = sampler.recorded_queries()
    assert kept.shape == (5, 16)
    assert sorted(kept[:, 0].tolist()) == sorted(x[3:, 0].tolist())


def test_ivf_refresh_keeps_centroids_and_retrains_on_schedule():
    head, _ = clustered_head(3000, 16, clusters=20)
    sampler = AnnNegativeSampler(3000, 5, index="ivf_flat", nlist=16,
                                 retrain_every=3)
    sampler.bind(head)
    retrained = [sampler.refresh()["index_retrained"] for _ in range(7)]
    assert retrained == [True, False, False, True, False, False, True]
    assert sampler.refresh(retrain=True)["index_retrained"]
    assert sampler.refresh_count == 8


def test_refresh_follows_the_weights():
    head, q = clustered_head(500, 8, clusters=5)
    sampler = AnnNegativeSampler(500, 4, index="flat")
    sampler.bind(head)
    sampler.refresh()
    pos = -np.ones((len(q), 1), np.int32)
    before = sampler.sample(q, pos, 0).ids.numpy()
    head.kernel.assign(-head.kernel)  # scores flip sign
    np.testing.assert_array_equal(sampler.sample(q, pos, 0).ids.numpy(), before)
    sampler.refresh()
    after = sampler.sample(q, pos, 0).ids.numpy()
    ref, _ = exact_top_negatives(exact_scores(head, q), pos, 4)
    np.testing.assert_allclose(
        np.take_along_axis(exact_scores(head, q), after, 1),
        np.take_along_axis(exact_scores(head, q), ref, 1), atol=1e-4)


@pytest.mark.parametrize("index", ["flat", "ivf_flat", "hnsw"])
def test_ann_state_round_trip_samples_identically(index):
    head, q = clustered_head(2000, 16, clusters=10)
    kwargs = dict(index=index, nlist=16, nprobe=4, projection=8, seed=3)
    a = AnnNegativeSampler(2000, 6, **kwargs)
    a.bind(head)
    a.refresh()
    pos = np.tile(np.array([[0, 1]], np.int32), (len(q), 1))
    expected = a.sample(q, pos, 0).ids.numpy()
    state = a.get_state()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    b = AnnNegativeSampler(2000, 6, **kwargs)  # not bound, not refreshed
    b.set_state(state)
    assert b.ready and b.refresh_count == 1
    np.testing.assert_array_equal(b.sample(q, pos, 0).ids.numpy(), expected)
    with pytest.raises(ValueError):
        AnnNegativeSampler(1999, 6, **kwargs).set_state(state)
    with pytest.raises(ValueError, match="missing"):
        b.set_state({"index": state["index"]})
    b.set_state({})
    assert not b.ready


def test_ann_state_keeps_the_recorded_queries_of_the_next_basis():
    """A projecting sampler's recorded head inputs are part of its state
    before its first refresh (a checkpoint after a uniform-only epoch):
    restored into a freshly bound sampler, the next refresh builds the same
    query basis and index as the uninterrupted one's (same candidates),
    while without them it falls back to a Gaussian projection."""
    head, q = clustered_head(2000, 16, clusters=10)
    kwargs = dict(index="flat", projection=8, query_sample_size=64, seed=3)
    pos = np.full((len(q), 1), -1, np.int32)
    a = AnnNegativeSampler(2000, 6, **kwargs)
    a.bind(head)
    for start in range(0, 96, 32):  # 96 queries into a ring of 64
        a.search(q[start:start + 32], pos[:32], allow_empty=True)
    state = a.get_state()
    assert set(state) == {"recorded_queries", "queries_seen"}
    assert int(state["queries_seen"][0]) == 96
    b = AnnNegativeSampler(2000, 6, **kwargs)
    b.bind(head)
    b.set_state(state)
    np.testing.assert_array_equal(b.recorded_queries(), a.recorded_queries())
    assert a.refresh()["index_projection"] == "queries"
    assert b.refresh()["index_projection"] == "queries"
    np.testing.assert_array_equal(b.sample(q, pos, 0).ids.numpy(),
                                  a.sample(q, pos, 0).ids.numpy())
    c = AnnNegativeSampler(2000, 6, **kwargs)  # the state lost: Gaussian
    c.bind(head)
    assert c.refresh()["index_projection"] == "gaussian"
    c.set_state({})  # resets the ring as well
    assert c.recorded_queries() is None and not c.ready
    d = AnnNegativeSampler(2000, 6, **dict(kwargs, query_sample_size=32))
    d.bind(head)
    with pytest.raises(ValueError, match="recorded queries"):
        d.set_state(state)
    with pytest.raises(ValueError, match="go together"):
        d.set_state({"queries_seen": state["queries_seen"]})


def test_ann_auto_index_choice_and_config():
    assert AnnNegativeSampler(1000, 4).kind == "flat"
    big = AnnNegativeSampler(100_000, 4)
    assert big.kind == "ivf_flat" and big.nlist == 256
    config = big.get_config()
    assert config["index"] == "auto" and config["num_labels"] == 100_000
    assert AnnNegativeSampler(**config).get_config() == config
    with pytest.raises(ValueError):
        AnnNegativeSampler(10, 2, index="lsh")


def test_missing_faiss_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    sparse, _ = make_heads(20, 8)
    sampler = AnnNegativeSampler(20, 2)  # constructing needs no faiss
    sampler.bind(sparse)
    with pytest.raises(ImportError, match=r"pip install xmc_tf\[ann\]"):
        sampler.refresh()


# --------------------------------------------------------------------------
# MixtureSampler
# --------------------------------------------------------------------------

def make_mixture(head, m, k_h, k_r, seed=0):
    return MixtureSampler(AnnNegativeSampler(m, k_h, index="flat"),
                          UniformNegativeSampler(m, k_r, seed=seed))


def test_mixture_eq2_weights_no_overlap_no_hits():
    m, e, k_h, k_r = 200, 16, 5, 30
    sparse, _ = make_heads(m, e)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, e)).astype(np.float32)
    pos = random_positives(rng, 6, 8, m)
    mix = make_mixture(sparse, m, k_h, k_r)
    mix.bind(sparse)
    mix.refresh()
    c = mix.sample(x, pos, tf.constant(9, tf.int64))
    ids, mask, lq, w = (t.numpy() for t in c)
    assert ids.shape == (6, k_h + k_r) and mask.all()
    ref, _ = exact_top_negatives(exact_scores(sparse, x), pos, k_h)
    scores = exact_scores(sparse, x)
    np.testing.assert_allclose(np.take_along_axis(scores, ids[:, :k_h], 1),
                               np.take_along_axis(scores, ref, 1), atol=1e-4)
    for i in range(6):
        p = set(pos[i][pos[i] >= 0].tolist())
        hard = set(ids[i, :k_h].tolist())
        uniform = set(ids[i, k_h:].tolist())
        assert not (hard | uniform) & p
        assert not hard & uniform
        n_rest = m - len(p) - len(hard)
        np.testing.assert_array_equal(w[i, :k_h], 1.0)
        np.testing.assert_allclose(w[i, k_h:], n_rest / k_r, rtol=1e-6)
        np.testing.assert_array_equal(lq[i, :k_h], 0.0)
        np.testing.assert_allclose(lq[i, k_h:], np.log(k_r / n_rest), rtol=1e-6)


def test_mixture_before_first_refresh_is_all_uniform_then_switches_in_graph():
    m, e, k_h, k_r = 100, 8, 4, 6
    sparse, _ = make_heads(m, e)
    mix = make_mixture(sparse, m, k_h, k_r, seed=2)
    mix.bind(sparse)
    x = np.ones((3, e), np.float32)
    pos = np.array([[1, 2], [3, -1], [-1, -1]], np.int32)
    step = tf.Variable(0, dtype=tf.int64)
    sample = tf.function(lambda q, p: mix.sample(q, p, step))
    c = sample(x, pos)  # traced while the index does not exist
    n_neg = np.array([98, 99, 100])[:, None]
    assert not mix.ready and c.mask.numpy().all()
    np.testing.assert_allclose(c.weights.numpy(), np.broadcast_to(n_neg / 10, (3, 10)),
                               rtol=1e-6)
    uniform_ids = UniformNegativeSampler(m, 10, seed=2).sample(None, pos, 0).ids
    np.testing.assert_array_equal(c.ids.numpy(), uniform_ids.numpy())
    mix.refresh()
    c = sample(x, pos)  # same trace, index now present
    np.testing.assert_array_equal(c.weights.numpy()[:, :k_h], 1.0)
    np.testing.assert_allclose(c.weights.numpy()[:, k_h:],
                               np.broadcast_to((n_neg - k_h) / k_r, (3, k_r)), rtol=1e-6)


def test_mixture_determinism_state_and_config():
    m, e = 150, 8
    sparse, _ = make_heads(m, e)
    mix = make_mixture(sparse, m, 3, 5, seed=1)
    mix.bind(sparse)
    mix.refresh()
    x = np.random.default_rng(0).normal(size=(4, e)).astype(np.float32)
    pos = np.array([[0], [1], [2], [-1]], np.int32)
    a = mix.sample(x, pos, 4).ids.numpy()
    np.testing.assert_array_equal(mix.sample(x, pos, 4).ids.numpy(), a)
    assert not np.array_equal(mix.sample(x, pos, 5).ids.numpy(), a)
    other = make_mixture(sparse, m, 3, 5, seed=1)
    other.set_state(mix.get_state())
    np.testing.assert_array_equal(other.sample(x, pos, 4).ids.numpy(), a)
    config = mix.get_config()
    assert config["k_h"] == 3 and config["k_r"] == 5
    assert config["uniform"]["config"]["seed"] == 1
    with pytest.raises(ValueError):
        MixtureSampler(AnnNegativeSampler(m, 3), UniformNegativeSampler(m + 1, 5))
    with pytest.raises(ValueError):
        MixtureSampler(AnnNegativeSampler(m, 3), UniformNegativeSampler(m, 5), k_h=4)


def test_mixture_shared_pool_from_the_first_hard_queries_rows():
    """``hard_queries=q``: the shared pool holds the exact top-k_h of the
    first q rows (NumPy scores of the head) plus every row's positives, and
    nothing from the other rows' hard negatives; q=None queries all rows."""
    m, e, k_h, k_r = 300, 16, 4, 7
    sparse, _ = make_heads(m, e)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(8, e)).astype(np.float32)
    pos = rng.integers(0, m, size=(8, 1)).astype(np.int32)
    scores = exact_scores(sparse, x)
    top, _ = exact_top_negatives(scores, pos, k_h)
    for q, rows in ((3, range(3)), (None, range(8))):
        mix = MixtureSampler(AnnNegativeSampler(m, k_h, index="flat"),
                             UniformNegativeSampler(m, k_r, seed=1),
                             hard_queries=q)
        mix.bind(sparse)
        mix.refresh()
        c = mix.sample_shared(x, pos, tf.constant(3, tf.int64))
        ids = c.ids.numpy()
        pool = set(ids[:len(ids) - k_r].tolist())
        want = set(top[list(rows)].ravel().tolist()) | set(pos.ravel().tolist())
        assert pool == want
        assert mix.get_config()["hard_queries"] == q
    with pytest.raises(ValueError, match="hard_queries"):
        MixtureSampler(AnnNegativeSampler(m, 3), UniformNegativeSampler(m, 5),
                       hard_queries=-1)


# --------------------------------------------------------------------------
# RefreshIndex
# --------------------------------------------------------------------------

def small_model(m=40, e=8, s=4):
    head = UniformSparseDense(m, s, seed=0)
    model = keras.Sequential([keras.Input((e,)), head])
    model.compile(keras.optimizers.SGD(0.1), loss=xmc_tf.losses.SquaredHinge(),
                  jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, e)).astype(np.float32)
    y = rng.integers(0, m, size=(32, 2)).astype(np.int32)
    return model, head, x, y


def test_ann_search_runs_with_one_blas_thread_and_restores_the_pools():
    """The faiss query of a step sees one thread in every BLAS / OpenMP
    pool (threadpoolctl's view); the pools get their count back after it,
    and the result is the exact top-k either way."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def most_threads():
        return max(p["num_threads"] for p in threadpoolctl.threadpool_info())

    m, e, k = 60, 8, 3
    sparse, _ = make_heads(m, e)
    sampler = AnnNegativeSampler(m, k, index="flat")
    sampler.bind(sparse)
    sampler.refresh()
    before = most_threads()
    if before < 2:
        pytest.skip("the BLAS / OpenMP pools already have one thread")
    seen = []

    class Recording:  # the faiss index, recording the pools at search time
        def __init__(self, index):
            self.index, self.ntotal = index, index.ntotal

        def search(self, u, depth):
            seen.append(most_threads())
            return self.index.search(u, depth)

    sampler._index = Recording(sampler._index)
    x = np.random.default_rng(1).normal(size=(5, e)).astype(np.float32)
    pos = np.full((5, 1), -1, np.int32)
    ids, mask, _ = sampler.search(x, pos)
    assert seen == [1] and most_threads() == before and mask.all()
    ref, _ = exact_top_negatives(exact_scores(sparse, x), pos, k)
    np.testing.assert_array_equal(np.sort(ids, 1), np.sort(ref, 1))


def test_refresh_index_epoch_schedule_and_logs():
    model, head, x, y = small_model()
    # A mixture samples uniform negatives before its first refresh.
    sampler = MixtureSampler(AnnNegativeSampler(40, 3, index="flat"),
                             UniformNegativeSampler(40, 3))
    sampler.bind(head)
    cb = RefreshIndex(sampler, start_epoch=1, every_n_epochs=2)
    hist = model.fit(x, y, batch_size=8, epochs=6, callbacks=[cb], verbose=0)
    # refreshes at the beginning of epochs 1, 3, 5
    assert hist.history["index_refreshes"] == [0, 1, 1, 2, 2, 3]
    secs = hist.history["index_refresh_seconds"]
    assert secs[0] == 0 and secs[2] == 0 and secs[4] == 0
    assert secs[1] > 0 and secs[3] > 0 and secs[5] > 0
    # the index holds the weights of the beginning of epoch 5
    assert sampler.hard.refresh_count == 3


def test_refresh_index_defaults_build_an_ann_index_at_epoch_0():
    """``RefreshIndex(sampler)``: tau_s = 1, but an ANN sampler alone cannot
    sample without an index, so it gets one at the start of epoch 0; then
    one per epoch from epoch 1."""
    model, head, x, y = small_model()
    sampler = AnnNegativeSampler(40, 3, index="flat")
    sampler.bind(head)
    cb = RefreshIndex(sampler)
    hist = model.fit(x, y, batch_size=8, epochs=3, callbacks=[cb], verbose=0)
    assert hist.history["index_refreshes"] == [1, 2, 3]


def test_refresh_index_resumed_fit_rebuilds_missing_index():
    model, head, x, y = small_model()
    sampler = AnnNegativeSampler(40, 3, index="flat")
    sampler.bind(head)
    cb = RefreshIndex(sampler, start_epoch=0, every_n_epochs=5)
    model.fit(x, y, batch_size=8, epochs=4, initial_epoch=2, callbacks=[cb],
              verbose=0)
    assert cb.refreshes == 1  # epoch 2 is not on the schedule, but no index


def test_refresh_index_every_n_steps_and_after_rewire():
    model, head, x, y = small_model()
    sampler = AnnNegativeSampler(40, 3, index="flat")
    sampler.bind(head)
    cb = RefreshIndex(sampler, start_epoch=0, every_n_epochs=None,
                      every_n_steps=3)
    model.fit(x, y, batch_size=8, epochs=3, callbacks=[cb], verbose=0)
    # 12 steps: first-epoch build (no index) + steps 3, 6, 9, 12
    assert cb.refreshes == 5

    model, head, x, y = small_model()
    sampler = AnnNegativeSampler(40, 3, index="flat")
    sampler.bind(head)
    set_cb = SetRewiring(every_n_steps=2, fraction=0.5, seed=0)
    cb = RefreshIndex(sampler, start_epoch=0, every_n_epochs=None,
                      after_rewire=set_cb)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[set_cb, cb], verbose=0)
    assert set_cb.rewires == 2 and cb.refreshes == 1 + 2
    # the index reflects the rewired connections
    v, t = label_vectors(head)
    q = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    pos = -np.ones((5, 1), np.int32)
    ids = sampler.sample(q, pos, 0).ids.numpy()
    ref, _ = exact_top_negatives(exact_scores(head, q), pos, 3)
    np.testing.assert_allclose(np.take_along_axis(exact_scores(head, q), ids, 1),
                               np.take_along_axis(exact_scores(head, q), ref, 1),
                               atol=1e-4)
    cb.request_refresh()
    cb.on_train_batch_end(0)
    assert cb.refreshes == 4


def test_refresh_index_argument_checks():
    with pytest.raises(ValueError):
        RefreshIndex(None, start_epoch=-1)
    with pytest.raises(ValueError):
        RefreshIndex(None, every_n_steps=0)
    with pytest.raises(ValueError):
        RefreshIndex(None, after_rewire=object())
