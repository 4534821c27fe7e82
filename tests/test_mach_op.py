"""Tests of the Xmc>MachTopK decoder op (xmc_tf.ops.mach).

The fast path (threshold algorithm) must equal brute force and a NumPy
reference bit for bit (ids and scores), including ties.
"""

import numpy as np
import pytest
import tensorflow as tf

from op_requirements import needs_ops
from xmc_tf.ops import _loader
from xmc_tf.ops.mach import PRIME, MachHashing, mach_top_k

pytestmark = needs_ops("xmc_mach_top_k")


def reference_top_k(probs, hashing, k):
    """NumPy reference: all [b, m] scores (float32, summed in repetition
    order like the kernel), sorted by (score desc, id asc)."""
    probs = np.asarray(probs, np.float32)
    b, R, _ = probs.shape
    h = hashing.buckets_numpy(np.arange(hashing.num_labels))  # [m, R]
    scores = np.zeros((b, hashing.num_labels), np.float32)
    for r in range(R):
        scores += probs[:, r, h[:, r]]
    scores /= np.float32(R)
    ids = np.empty((b, k), np.int32)
    for i in range(b):
        order = np.lexsort((np.arange(hashing.num_labels), -scores[i]))
        ids[i] = order[:k]
    return ids, np.take_along_axis(scores, ids.astype(np.int64), axis=1)


def peaked_probs(rng, hashing, b, num_relevant=5, boost=6.0):
    """Trained-like meta-probabilities: softmax of noise plus large logits at
    the buckets of a few relevant labels per row."""
    R, B = hashing.num_repetitions, hashing.num_buckets
    logits = rng.normal(0.0, 1.0, (b, R, B)).astype(np.float32)
    rel = rng.integers(0, hashing.num_labels, (b, num_relevant))
    hb = hashing.buckets_numpy(rel)  # [b, n, R]
    for t in range(num_relevant):
        for r in range(R):
            logits[np.arange(b), r, hb[:, t, r]] += boost - 0.5 * t
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def run_all(probs, hashing, k):
    """(ids, scores) of every method; all must agree."""
    out = {}
    for name, kw in [("threshold", dict(method="threshold")),
                     ("threshold_nofallback",
                      dict(method="threshold", brute_force_fallback=False)),
                     ("brute_force", dict(method="brute_force"))]:
        ids, scores = mach_top_k(probs, k, hashing, **kw)
        out[name] = (ids.numpy(), scores.numpy())
    return out


def assert_all_equal(probs, hashing, k):
    ref_ids, ref_scores = reference_top_k(probs, hashing, k)
    for name, (ids, scores) in run_all(probs, hashing, k).items():
        np.testing.assert_array_equal(ids, ref_ids, err_msg=name)
        np.testing.assert_array_equal(scores, ref_scores, err_msg=name)
    return ref_ids, ref_scores


@pytest.mark.parametrize("m,R,B,k,seed", [
    (2000, 4, 64, 10, 0),
    (3001, 3, 50, 7, 1),      # B not a power of two
    (500, 1, 16, 5, 2),       # R = 1
    (777, 6, 8, 20, 3),
])
def test_uniform_random_matches_brute_force(m, R, B, k, seed):
    rng = np.random.default_rng(seed)
    h = MachHashing.random(m, B, R, seed=seed)
    probs = rng.random((16, R, B), dtype=np.float32)
    assert_all_equal(probs, h, k)


@pytest.mark.parametrize("m,R,B,k", [(20000, 8, 256, 5), (5000, 16, 128, 10),
                                     (100_000, 16, 1024, 5)])
def test_peaked_matches_brute_force(m, R, B, k):
    rng = np.random.default_rng(m)
    h = MachHashing.random(m, B, R, seed=m)
    probs = peaked_probs(rng, h, 12)
    assert_all_equal(probs, h, k)


def test_logits_and_negative_values():
    rng = np.random.default_rng(5)
    h = MachHashing.random(3000, 32, 5, seed=5)
    logits = rng.normal(0, 3, (10, 5, 32)).astype(np.float32)
    assert_all_equal(logits, h, 8)


def test_non_mersenne_prime():
    rng = np.random.default_rng(6)
    h = MachHashing.random(5000, 100, 4, seed=6, prime=10007)
    assert h.prime == 10007
    assert_all_equal(peaked_probs(rng, h, 8), h, 5)
    assert_all_equal(rng.random((8, 4, 100), dtype=np.float32), h, 5)


def test_ties_broken_by_lower_id():
    h = MachHashing.random(1000, 8, 3, seed=7)
    # All probabilities equal: every label ties; ids 0..k-1 win.
    flat = np.full((2, 3, 8), 0.125, np.float32)
    ids, scores = assert_all_equal(flat, h, 6)
    np.testing.assert_array_equal(ids, np.tile(np.arange(6), (2, 1)))
    assert np.all(scores == np.float32(0.125))
    # Few distinct values: many exact ties at every rank.
    rng = np.random.default_rng(8)
    quant = rng.integers(0, 3, (20, 3, 8)).astype(np.float32) / 2
    assert_all_equal(quant, h, 25)


def test_ties_with_one_bucket_and_colliding_labels():
    # B = 1: every label has the same score.
    h = MachHashing.random(50, 1, 2, seed=9)
    ids, _ = assert_all_equal(np.ones((3, 2, 1), np.float32), h, 4)
    np.testing.assert_array_equal(ids[0], [0, 1, 2, 3])
    # R = 1, B = 2: half the labels share each bucket.
    h = MachHashing.random(40, 2, 1, seed=10)
    assert_all_equal(np.array([[[0.3, 0.7]], [[0.7, 0.3]]], np.float32), h, 25)


@pytest.mark.parametrize("k", [1, 2, 49, 50])
def test_k_edge_cases(k):
    rng = np.random.default_rng(k)
    h = MachHashing.random(50, 8, 3, seed=11)
    ids, _ = assert_all_equal(rng.random((4, 3, 8), dtype=np.float32), h, k)
    if k == 50:  # every label exactly once
        np.testing.assert_array_equal(np.sort(ids, axis=1),
                                      np.tile(np.arange(50), (4, 1)))


def test_single_label_and_empty_batch():
    h = MachHashing.random(1, 4, 2, seed=12)
    ids, scores = mach_top_k(np.ones((2, 2, 4), np.float32), 1, h)
    np.testing.assert_array_equal(ids.numpy(), [[0], [0]])
    h = MachHashing.random(100, 4, 2, seed=12)
    ids, scores = mach_top_k(np.zeros((0, 2, 4), np.float32), 3, h)
    assert ids.shape == (0, 3) and scores.shape == (0, 3)


def test_graph_mode_unknown_shapes_and_cache_reuse():
    rng = np.random.default_rng(13)
    h = MachHashing.random(4000, 64, 4, seed=13)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None])])
    def decode(p):
        return mach_top_k(p, 5, h)

    for _ in range(3):  # the cached inverted lists are reused
        probs = peaked_probs(rng, h, 7)
        ids, scores = decode(probs)
        ref_ids, ref_scores = reference_top_k(probs, h, 5)
        np.testing.assert_array_equal(ids.numpy(), ref_ids)
        np.testing.assert_array_equal(scores.numpy(), ref_scores)
    out = decode.get_concrete_function().structured_outputs
    assert out[0].shape.as_list() == [None, 5]


def test_static_shape_inference():
    h = MachHashing.random(100, 16, 4, seed=14)

    @tf.function
    def f(p):
        ids, scores = mach_top_k(p, 3, h)
        assert ids.shape.as_list() == [7, 3]
        assert scores.shape.as_list() == [7, 3]
        return ids

    f(tf.zeros([7, 4, 16]))


def test_hash_matches_python_and_has_no_overflow():
    # Python ints are the exact reference; ids up to prime - 1.
    h = MachHashing.random(PRIME, 4096, 16, seed=15)
    ids = np.array([0, 1, 2**24 + 1, 2**30 + 7, PRIME - 1], np.int64)
    expect = np.array([[((a * int(j) + b) % PRIME) % 4096
                        for a, b in zip(h.hash_a, h.hash_b)] for j in ids])
    np.testing.assert_array_equal(h.buckets_numpy(ids), expect)
    np.testing.assert_array_equal(h.buckets(tf.constant(ids)).numpy(), expect)
    # (The kernel's hash equals this one: every reference comparison above
    # uses buckets_numpy; with a_r up to 2^31 and m up to 1e5 the products
    # reach 2^48 there.)


def _raw(probs, **kw):
    attrs = dict(k=2, num_labels=100, num_buckets=8, hash_a=[3, 5],
                 hash_b=[1, 2], prime=PRIME, method="threshold")
    attrs.update(kw)
    return _loader.load().xmc_mach_top_k(probs, **attrs)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("probs_shape,kw,match", [
    ((4, 2, 8, 1), {}, "rank 3"),
    ((4, 16), {}, "rank 3"),
    ((4, 3, 8), {}, "repetitions"),
    ((4, 2, 9), {}, "num_buckets"),
    ((4, 2, 8), dict(k=101), "k must be"),
    ((4, 2, 8), dict(hash_a=[0, 5]), "hash_a"),
    ((4, 2, 8), dict(hash_a=[PRIME, 5]), "hash_a"),
    ((4, 2, 8), dict(hash_b=[-1, 2]), "hash_b"),
    ((4, 2, 8), dict(hash_b=[1]), "same non-zero length"),
    ((4, 2, 8), dict(prime=1000), "prime"),
    ((4, 2, 8), dict(prime=2**31 + 11), "prime"),
    ((4, 2, 8), dict(num_labels=200, prime=101), "num_labels"),
])
def test_invalid_arguments(graph, probs_shape, kw, match):
    probs = tf.zeros(probs_shape)
    if graph:
        fn = tf.function(lambda p: _raw(p, **kw),
                         input_signature=[tf.TensorSpec(None, tf.float32)])
    else:
        fn = lambda p: _raw(p, **kw)  # noqa: E731
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=match):
        fn(probs)


@pytest.mark.parametrize("method", ["threshold", "brute_force"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_probabilities(method, bad):
    probs = np.full((3, 2, 8), 0.1, np.float32)
    probs[1, 1, 5] = bad
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"probs\[1\] contains a NaN"):
        _raw(probs, method=method)


def test_wrapper_validation():
    h = MachHashing.random(100, 8, 2, seed=17)
    with pytest.raises(ValueError, match="k must be"):
        mach_top_k(tf.zeros([1, 2, 8]), 0, h)
    with pytest.raises(ValueError, match="k must be"):
        mach_top_k(tf.zeros([1, 2, 8]), 101, h)
    with pytest.raises(ValueError, match="method"):
        mach_top_k(tf.zeros([1, 2, 8]), 1, h, method="fast")
    with pytest.raises(ValueError, match="shape"):
        mach_top_k(tf.zeros([1, 3, 8]), 1, h)
    with pytest.raises(ValueError, match="prime"):
        MachHashing(10, 4, [1], [0], prime=15)
    with pytest.raises(ValueError, match="hash_a"):
        MachHashing(10, 4, [0], [0])
    with pytest.raises(ValueError, match="num_labels"):
        MachHashing(200, 4, [1], [0], prime=101)
    with pytest.raises(TypeError):
        MachHashing.from_any(3)


def test_float64_and_float16_inputs_are_cast():
    rng = np.random.default_rng(18)
    h = MachHashing.random(300, 16, 3, seed=18)
    p32 = rng.random((4, 3, 16), dtype=np.float32)
    ids32, _ = mach_top_k(p32, 4, h)
    ids64, _ = mach_top_k(p32.astype(np.float64), 4, h)
    np.testing.assert_array_equal(ids32.numpy(), ids64.numpy())


def test_inverted_lists_layout():
    h = MachHashing.random(1000, 16, 3, seed=19)
    offsets, labels = h.inverted_lists()
    assert offsets.shape == (3, 17) and labels.shape == (3, 1000)
    hb = h.buckets_numpy(np.arange(1000))
    for r in range(3):
        for c in range(16):
            members = labels[r, offsets[r, c]:offsets[r, c + 1]]
            assert np.all(np.diff(members) > 0)
            assert np.all(hb[members, r] == c)


@pytest.mark.parametrize("m,R,B,k,seed", [
    (600, 2, 21, 9, 0),
    (2112, 5, 4, 20, 1),
    (143, 2, 39, 14, 2),
    (2500, 4, 8, 3, 3),
    (4000, 3, 64, 10, 4),
])
def test_overflowing_scores_match_brute_force(m, R, B, k, seed):
    """Regression (issue 14): finite probabilities near the float32 limit
    overflow float partial sums (3e38 + 3e38 - 3e38 is inf in float32); the
    threshold scan pruned with a double-precision bound that ignored this and
    returned other ids than brute force.  Scores +-inf rank as floats, ties
    by the lower id."""
    rng = np.random.default_rng(seed)
    h = MachHashing.random(m, B, R, seed=seed)
    values = np.array([3e38, -3e38, 2e38, 3.4e38, -3.4e38, 1.0, 0.0, -1.0],
                      np.float32)
    probs = rng.choice(values, size=(6, R, B))
    with np.errstate(over="ignore"):
        ref_ids, ref_scores = assert_all_equal(probs, h, k)
    assert np.isinf(ref_scores).any()  # the case exercises overflow


@pytest.mark.parametrize("value", [3e38, -3e38])
def test_all_scores_infinite_tie_by_lower_id(value):
    h = MachHashing.random(5000, 16, 3, seed=20)
    probs = np.full((2, 3, 16), value, np.float32)
    with np.errstate(over="ignore"):
        ids, scores = assert_all_equal(probs, h, 7)
    np.testing.assert_array_equal(ids, np.tile(np.arange(7), (2, 1)))
    assert np.all(scores == np.float32(np.sign(value) * np.inf))


def test_mixed_infinite_and_finite_scores_rank_as_floats():
    # Labels hashed to the 3e38 buckets of both repetitions score +inf and
    # come first; the rest are finite; huge negatives give -inf last.
    h = MachHashing.random(3000, 32, 2, seed=21)
    rng = np.random.default_rng(21)
    probs = rng.random((4, 2, 32), dtype=np.float32)
    probs[:, :, 0] = 3e38
    probs[:, :, 1] = -3e38
    with np.errstate(over="ignore"):
        ids, scores = assert_all_equal(probs, h, 3000)  # full ranking
    hb = h.buckets_numpy(np.arange(3000))
    pos_inf = np.flatnonzero((hb == 0).all(axis=1))
    neg_inf = np.flatnonzero((hb == 1).all(axis=1))
    assert len(pos_inf) and len(neg_inf)
    np.testing.assert_array_equal(ids[0, :len(pos_inf)], pos_inf)
    np.testing.assert_array_equal(ids[0, -len(neg_inf):], neg_inf)
    assert not np.isnan(scores).any()
