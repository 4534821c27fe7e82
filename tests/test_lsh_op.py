"""Tests of the LSH op family (xmc_tf.ops.lsh, ops/lsh/).

Every op is checked against an independent NumPy reference: SimHash bits
from a float64 projection, DWTA from a per-bin loop with the documented
densification rule, tables from a stable argsort, the query union from set
operations.  Statistical tests (collision probability 1 - theta/pi, sampling
frequency 1 - (1 - alpha^K)^L) use fixed seeds and tolerances of several
standard errors.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from lsh_reference import (ref_codes_from_values, ref_dwta_values,
                           ref_tables)
from op_requirements import needs_ops
from xmc_tf.ops import _loader
from xmc_tf.ops.lsh import (LshHashFamily, collision_inclusion_probability,
                            dwta_bins, lsh_build_tables, lsh_dwta_hash,
                            lsh_dwta_hash_sparse, lsh_query, lsh_simhash,
                            lsh_simhash_gemm, lsh_simhash_sparse, lsh_sparse_cosine,
                            lsh_update_tables, simhash_inclusion_probability,
                            simhash_projection)

pytestmark = needs_ops("xmc_lsh_query")

BAD = (tf.errors.InvalidArgumentError, ValueError)


# ----------------------------------------------------------------------------
# NumPy references.


def ref_simhash_bits(x, proj):
    """float64 projections and bits [n, H]."""
    p = np.asarray(x, np.float64) @ np.asarray(proj, np.float64)
    return p, p > 0


def densify(indices, weights, e):
    x = np.zeros((indices.shape[0], e), np.float32)
    for i in range(indices.shape[0]):
        np.add.at(x[i], indices[i], weights[i])
    return x


def sparse_rows(rng, n, s, e, dup=True):
    """Random sparse rows with duplicates, exact zeros and a zero row."""
    indices = rng.integers(0, e, (n, s)).astype(np.int32)
    weights = rng.normal(size=(n, s)).astype(np.float32)
    if dup:
        indices[:, 1] = indices[:, 0]  # duplicate index in every row
    weights[:, 2] = 0.0  # explicit zero
    weights[0] = 0.0  # all-zero row
    if n > 1:  # weights cancelling on a duplicate
        weights[1, 1] = -weights[1, 0]
    return indices, weights


# ----------------------------------------------------------------------------
# Hash parameters.


def test_parameters_deterministic_given_seed():
    a = simhash_projection(7, 3, 4, seed=5)
    assert a.shape == (7, 12) and a.dtype == np.float32
    np.testing.assert_array_equal(a, simhash_projection(7, 3, 4, seed=5))
    assert not np.array_equal(a, simhash_projection(7, 3, 4, seed=6))
    b = dwta_bins(20, 30, bin_size=4, seed=2)
    assert b.shape == (30, 4) and b.dtype == np.int32
    np.testing.assert_array_equal(b, dwta_bins(20, 30, bin_size=4, seed=2))
    assert not np.array_equal(b, dwta_bins(20, 30, bin_size=4, seed=3))
    # Bins are blocks of permutations: distinct coordinates within a bin,
    # each permutation's 5 bins cover 20 distinct coordinates.
    for j in range(30):
        assert len(set(b[j])) == 4
    assert len(set(b[:5].ravel())) == 20


@pytest.mark.parametrize("kwargs", [
    dict(input_dim=0, num_bits=1, num_tables=1),
    dict(input_dim=3, num_bits=0, num_tables=1),
])
def test_projection_validation(kwargs):
    with pytest.raises(ValueError):
        simhash_projection(**kwargs)


@pytest.mark.parametrize("args", [(8, 4, 3), (8, 4, 6), (2, 4, 4), (8, 0, 4)])
def test_bins_validation(args):
    d, H, w = args
    with pytest.raises(ValueError):
        dwta_bins(d, H, bin_size=w)


def test_family_validation():
    with pytest.raises(ValueError, match="hash"):
        LshHashFamily("minhash", 2, 2, 8)
    with pytest.raises(ValueError, match="bucket_bits"):
        LshHashFamily("simhash", 2, 2, 8, bucket_bits=30)
    with pytest.raises(ValueError, match="shape"):
        LshHashFamily("simhash", 2, 2, 8, params=np.zeros((8, 3), np.float32))
    with pytest.raises(ValueError, match="<= 64"):
        LshHashFamily("dwta", 33, 1, 8, bin_size=4)
    f = LshHashFamily("dwta", 6, 2, 64, bin_size=8, bucket_bits=10)
    assert f.code_bits == 18 and f.num_buckets == 1024


# ----------------------------------------------------------------------------
# SimHash.


def test_simhash_matches_numpy_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 12)).astype(np.float32)
    x[3, ::2] = 0.0  # zero entries are skipped: same result
    K, L = 5, 7
    proj = simhash_projection(12, K, L, seed=1)
    codes = lsh_simhash(x, proj, K).numpy()
    p, bits = ref_simhash_bits(x, proj)
    ref = ref_codes_from_values(bits.astype(np.int64), K, 1, 16)
    # float32 accumulation may flip a bit only where |projection| is tiny.
    tiny = np.abs(p) < 1e-4
    ok = (codes == ref) | ref_codes_differ_only_on_tiny(tiny, K, L)
    assert ok.all()
    assert codes.shape == (50, L) and codes.dtype == np.int32
    assert codes.min() >= 0 and codes.max() < 2**K


def ref_codes_differ_only_on_tiny(tiny, K, L):
    return tiny.reshape(tiny.shape[0], L, K).any(-1)


@pytest.mark.parametrize("chunk", [None, 16])
def test_simhash_gemm_matches_numpy_reference_and_the_op(chunk, monkeypatch):
    """The matrix-product SimHash (what LshHashFamily uses without folding)
    gives the float64 reference's codes, in one product or in row chunks,
    and so the op's codes, except where a projection is within rounding of
    0."""
    import xmc_tf.ops.lsh as lsh_module
    if chunk:
        monkeypatch.setattr(lsh_module, "_GEMM_CHUNK", chunk)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(70, 24)).astype(np.float32)
    x[5] = 0.0  # every product 0: every bit 0
    K, L = 6, 9
    proj = simhash_projection(24, K, L, seed=2)
    codes = lsh_simhash_gemm(x, proj, K).numpy()
    p, bits = ref_simhash_bits(x, proj)
    ref = ref_codes_from_values(bits.astype(np.int64), K, 1, 16)
    loose = ref_codes_differ_only_on_tiny(np.abs(p) < 1e-4, K, L)
    assert ((codes == ref) | loose).all() and not loose.all()
    assert codes.shape == (70, L) and codes.dtype == np.int32
    np.testing.assert_array_equal(codes[5], 0)
    op = lsh_simhash(x, proj, K).numpy()
    assert ((codes == op) | loose).all()
    family = LshHashFamily("simhash", K, L, 24, seed=2)
    np.testing.assert_array_equal(family.hash_dense(x).numpy(), codes)


def test_simhash_gemm_validation():
    proj = simhash_projection(8, 3, 4, seed=0)
    x = np.ones((5, 8), np.float32)
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[2, 1] = bad
        with pytest.raises(tf.errors.InvalidArgumentError, match="finite"):
            lsh_simhash_gemm(y, proj, 3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        lsh_simhash_gemm(x[:, :7], proj, 3)  # width 7 against 8 rows
    with pytest.raises(ValueError, match="num_bits"):
        lsh_simhash_gemm(x, proj, 5)  # 12 columns are not tables of 5 bits
    assert lsh_simhash_gemm(x[:0], proj, 3).shape == (0, 4)


# Every instruction set of SimHash's projection loop (ops/common/cpu_isa.h;
# XMC_TF_CPU_ISA can only lower the detected one, read per kernel call):
# widths H = K L with vector tails (35 = 32 + 3, 650 = ManNextWord's K 13,
# L 50), dense against the float64 reference and sparse against dense (the
# two paths share the loop, so they agree bit for bit under each set).
@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
@pytest.mark.parametrize("K,L,d", [(5, 7, 12), (13, 50, 64)])
def test_simhash_every_cpu_instruction_set(isa, K, L, d, monkeypatch):
    monkeypatch.setenv("XMC_TF_CPU_ISA", isa)
    rng = np.random.default_rng(K)
    x = rng.normal(size=(40, d)).astype(np.float32)
    x[3, ::2] = 0.0
    proj = simhash_projection(d, K, L, seed=1)
    codes = lsh_simhash(x, proj, K).numpy()
    p, bits = ref_simhash_bits(x, proj)
    ref = ref_codes_from_values(bits.astype(np.int64), K, 1, 16)
    tiny = np.abs(p) < 1e-4
    assert ((codes == ref) | ref_codes_differ_only_on_tiny(tiny, K, L)).all()
    indices, weights = sparse_rows(rng, 30, 9, d)
    sparse = lsh_simhash_sparse(indices, weights, proj, K).numpy()
    dense = lsh_simhash(densify(indices, weights, d), proj, K).numpy()
    np.testing.assert_array_equal(sparse, dense)


def test_simhash_folded_codes():
    """K > bucket_bits: the K bits are folded by the documented mixing hash."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    K, L, bb = 12, 3, 5
    proj = simhash_projection(6, K, L, seed=2)
    codes = lsh_simhash(x, proj, K, bucket_bits=bb).numpy()
    _, bits = ref_simhash_bits(x, proj)
    ref = ref_codes_from_values(bits.astype(np.int64), K, 1, bb)
    np.testing.assert_array_equal(codes, ref)
    assert codes.max() < 2**bb


@pytest.mark.parametrize("theta", [0.3, 1.0, 2.0, 2.8])
def test_simhash_collision_probability_is_one_minus_theta_over_pi(theta):
    """LNS Eq. 3: Pr[h(x) = h(y)] = 1 - theta / pi, per hash function."""
    rng = np.random.default_rng(42)
    d, pairs, H = 16, 40, 500
    xs, ys = [], []
    for _ in range(pairs):
        u = rng.normal(size=d)
        u /= np.linalg.norm(u)
        v = rng.normal(size=d)
        v -= (v @ u) * u
        v /= np.linalg.norm(v)
        xs.append(u)
        ys.append(math.cos(theta) * u + math.sin(theta) * v)
    x = np.array(xs + ys, np.float32)
    proj = simhash_projection(d, 1, H, seed=7)  # K = 1: one bit per table
    codes = lsh_simhash(x, proj, 1).numpy()
    agree = (codes[:pairs] == codes[pairs:]).mean()
    expected = 1.0 - theta / math.pi
    se = math.sqrt(expected * (1 - expected) / (pairs * H))
    assert abs(agree - expected) < 5 * se + 1e-3, (agree, expected)


def test_simhash_table_collision_is_alpha_to_the_k():
    """A K-bit table collides with probability alpha^K."""
    rng = np.random.default_rng(3)
    d, pairs, K, L, theta = 16, 60, 3, 400, 0.8
    u = rng.normal(size=(pairs, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    v = rng.normal(size=(pairs, d))
    v -= (v * u).sum(1, keepdims=True) * u
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    y = math.cos(theta) * u + math.sin(theta) * v
    proj = simhash_projection(d, K, L, seed=4)
    cu = lsh_simhash(u.astype(np.float32), proj, K).numpy()
    cy = lsh_simhash(y.astype(np.float32), proj, K).numpy()
    expected = (1 - theta / math.pi) ** K
    se = math.sqrt(expected * (1 - expected) / (pairs * L))
    assert abs((cu == cy).mean() - expected) < 5 * se


@pytest.mark.parametrize("K,bb", [(6, 16), (20, 8)])
def test_simhash_sparse_equals_densified(K, bb):
    rng = np.random.default_rng(5)
    e, n, s, L = 40, 60, 7, 9
    indices, weights = sparse_rows(rng, n, s, e)
    proj = simhash_projection(e, K, L, seed=6)
    sparse = lsh_simhash_sparse(indices, weights, proj, K, bb).numpy()
    dense = lsh_simhash(densify(indices, weights, e), proj, K, bb).numpy()
    np.testing.assert_array_equal(sparse, dense)
    if K <= bb:
        assert (sparse[0] == 0).all()  # zero vector: every bit 0


def test_simhash_order_of_sparse_entries_is_irrelevant():
    rng = np.random.default_rng(8)
    e, n, s = 30, 20, 6
    indices = np.stack([rng.choice(e, s, replace=False) for _ in range(n)]
                       ).astype(np.int32)
    weights = rng.normal(size=(n, s)).astype(np.float32)
    perm = np.stack([rng.permutation(s) for _ in range(n)])
    proj = simhash_projection(e, 4, 5, seed=9)
    a = lsh_simhash_sparse(indices, weights, proj, 4).numpy()
    b = lsh_simhash_sparse(np.take_along_axis(indices, perm, 1),
                           np.take_along_axis(weights, perm, 1), proj, 4).numpy()
    np.testing.assert_array_equal(a, b)


def test_simhash_validation():
    proj = simhash_projection(4, 2, 3)
    x = np.ones((2, 4), np.float32)
    with pytest.raises(BAD, match="rank|shape"):
        lsh_simhash(np.ones(4, np.float32), proj, 2)
    with pytest.raises(BAD):
        lsh_simhash(np.ones((2, 5), np.float32), proj, 2)
    with pytest.raises(BAD, match="multiple"):
        lsh_simhash(x, proj, 4)  # 6 hash functions, K = 4
    with pytest.raises(BAD, match="bucket_bits"):
        lsh_simhash(x, proj, 2, bucket_bits=25)
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(BAD, match=r"vectors\[1\]"):
        lsh_simhash(bad, proj, 2)
    bad_proj = proj.copy()
    bad_proj[0, 0] = np.inf
    with pytest.raises(BAD, match="projection"):
        lsh_simhash(x, bad_proj, 2)
    idx = np.zeros((2, 3), np.int32)
    w = np.ones((2, 3), np.float32)
    with pytest.raises(BAD, match="shape"):
        lsh_simhash_sparse(idx, np.ones((2, 2), np.float32), proj, 2)
    bad_idx = idx.copy()
    bad_idx[1, 2] = 4
    with pytest.raises(BAD, match=r"indices\[1, 2\] = 4"):
        lsh_simhash_sparse(bad_idx, w, proj, 2)
    bad_idx[1, 2] = -1
    with pytest.raises(BAD, match=r"indices\[1, 2\] = -1"):
        lsh_simhash_sparse(bad_idx, w, proj, 2)
    bad_w = w.copy()
    bad_w[0, 1] = np.nan
    with pytest.raises(BAD, match=r"weights\[0\]"):
        lsh_simhash_sparse(idx, bad_w, proj, 2)


def test_simhash_empty_batch_and_graph_shape():
    proj = simhash_projection(4, 2, 3)
    assert lsh_simhash(np.zeros((0, 4), np.float32), proj, 2).shape == (0, 3)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(x):
        out = lsh_simhash(x, proj, 2)
        assert out.shape.as_list() == [None, 3]
        return out

    assert f(tf.ones((5, 4))).shape == (5, 3)


# ----------------------------------------------------------------------------
# DWTA.


@pytest.mark.parametrize("w,K,bb", [(4, 3, 16), (8, 6, 10), (2, 5, 16)])
def test_dwta_matches_numpy_reference(w, K, bb):
    rng = np.random.default_rng(10)
    d, n, L, seed = 24, 25, 4, 11
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[x < 0.3] = 0.0  # ReLU-like sparsity: some bins empty
    x[0] = 0.0  # all-zero vector
    x[1] = 0.0
    x[1, 5] = 2.0  # one non-zero: heavy densification
    x[2, :4] = 1.0  # ties: the lowest position wins
    bins = dwta_bins(d, K * L, w, seed=12)
    codes = lsh_dwta_hash(x, bins, K, bb, seed=seed).numpy()
    values = ref_dwta_values(x, bins, seed)
    ref = ref_codes_from_values(values, K, int(math.log2(w)), bb)
    np.testing.assert_array_equal(codes, ref)
    if K * math.log2(w) <= bb:
        assert (codes[0] == 0).all()  # all-zero vector: value 0 everywhere


def test_dwta_sparse_equals_densified():
    rng = np.random.default_rng(13)
    e, n, s, K, L, w = 64, 80, 6, 4, 10, 8
    indices, weights = sparse_rows(rng, n, s, e)
    bins = dwta_bins(e, K * L, w, seed=14)
    sparse = lsh_dwta_hash_sparse(indices, weights, bins, e, K, seed=3).numpy()
    dense = lsh_dwta_hash(densify(indices, weights, e), bins, K,
                          seed=3).numpy()
    np.testing.assert_array_equal(sparse, dense)
    # Negative values compete as values (largest non-zero wins).
    neg_idx = np.array([[1, 2, 3]], np.int32)
    neg_w = np.array([[-3.0, -1.0, -2.0]], np.float32)
    np.testing.assert_array_equal(
        lsh_dwta_hash_sparse(neg_idx, neg_w, bins, e, K).numpy(),
        lsh_dwta_hash(densify(neg_idx, neg_w, e), bins, K).numpy())


def test_dwta_seed_changes_only_densification():
    rng = np.random.default_rng(15)
    d, K, L, w = 32, 2, 8, 4
    bins = dwta_bins(d, K * L, w, seed=1)
    dense_x = rng.uniform(0.1, 1.0, size=(10, d)).astype(np.float32)
    np.testing.assert_array_equal(lsh_dwta_hash(dense_x, bins, K, seed=1),
                                  lsh_dwta_hash(dense_x, bins, K, seed=2))
    sparse_x = np.zeros((10, d), np.float32)
    sparse_x[:, 0] = rng.uniform(0.1, 1, 10)
    sparse_x[:, 7] = rng.uniform(0.1, 1, 10)
    a = lsh_dwta_hash(sparse_x, bins, K, seed=1).numpy()
    assert np.array_equal(a, lsh_dwta_hash(sparse_x, bins, K, seed=1).numpy())
    # Most bins are empty: the densification probes, hence the codes, move.
    assert not np.array_equal(a, lsh_dwta_hash(sparse_x, bins, K,
                                               seed=2).numpy())


def test_dwta_validation():
    bins = dwta_bins(8, 6, 4, seed=0)
    x = np.ones((2, 8), np.float32)
    with pytest.raises(BAD, match="power of two"):
        lsh_dwta_hash(x, np.zeros((6, 3), np.int32), 2)
    with pytest.raises(BAD, match="multiple"):
        lsh_dwta_hash(x, bins, 4)
    with pytest.raises(BAD, match=r"bins\[0, 0\] = 8"):
        lsh_dwta_hash(x, np.full((6, 4), 8, np.int32), 2)
    with pytest.raises(BAD, match="<= 64"):
        lsh_dwta_hash(x, dwta_bins(8, 33, 4), 33)
    bad = x.copy()
    bad[0, 0] = np.inf
    with pytest.raises(BAD, match=r"vectors\[0\]"):
        lsh_dwta_hash(bad, bins, 2)
    idx = np.zeros((2, 3), np.int32)
    w = np.ones((2, 3), np.float32)
    with pytest.raises(BAD, match=r"bins\[0, 0\] = 8"):
        lsh_dwta_hash_sparse(idx, w, np.full((6, 4), 8, np.int32), 8, 2)
    idx[0, 1] = 9
    with pytest.raises(BAD, match=r"indices\[0, 1\] = 9"):
        lsh_dwta_hash_sparse(idx, w, bins, 8, 2)


# ----------------------------------------------------------------------------
# Tables.


def random_codes(rng, m, L, B):
    return rng.integers(0, B, (m, L)).astype(np.int32)


def test_build_tables_matches_reference():
    rng = np.random.default_rng(20)
    codes = random_codes(rng, 500, 6, 16)
    codes[:, 2] = 3  # one bucket holds every label
    offsets, labels = lsh_build_tables(codes, 16)
    ref_off, ref_lab = ref_tables(codes, 16)
    np.testing.assert_array_equal(offsets, ref_off)
    np.testing.assert_array_equal(labels, ref_lab)


def test_build_tables_validation():
    codes = np.zeros((4, 2), np.int32)
    codes[2, 1] = 8
    with pytest.raises(BAD, match=r"codes\[2, 1\] = 8"):
        lsh_build_tables(codes, 8)
    codes[2, 1] = -1
    with pytest.raises(BAD, match=r"codes\[2, 1\] = -1"):
        lsh_build_tables(codes, 8)
    with pytest.raises(BAD):
        lsh_build_tables(np.zeros(4, np.int32), 8)


@pytest.mark.parametrize("case", ["few", "all", "repeated", "none", "same"])
def test_update_equals_full_rebuild(case):
    rng = np.random.default_rng(21)
    m, L, B = 400, 5, 32
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    if case == "few":
        rows = np.array([3, 399, 0, 200], np.int32)
    elif case == "all":
        rows = rng.permutation(m).astype(np.int32)
    elif case == "repeated":
        rows = np.array([7, 8, 7, 9, 7], np.int32)
    elif case == "none":
        rows = np.zeros(0, np.int32)
    else:
        rows = np.array([1, 2], np.int32)
    new = random_codes(rng, len(rows), L, B)
    if case == "same":
        new = codes[rows]
    o2, l2, c2 = lsh_update_tables(offsets, labels, codes, rows, new)
    expect = codes.copy()
    for r, c in zip(rows, new):  # the last occurrence wins
        expect[r] = c
    ref_off, ref_lab = ref_tables(expect, B)
    np.testing.assert_array_equal(c2, expect)
    np.testing.assert_array_equal(o2, ref_off)
    np.testing.assert_array_equal(l2, ref_lab)
    # Chained updates stay exact.
    rows2 = rng.integers(0, m, 30).astype(np.int32)
    new2 = random_codes(rng, 30, L, B)
    o3, l3, c3 = lsh_update_tables(o2, l2, c2, rows2, new2)
    for r, c in zip(rows2, new2):
        expect[r] = c
    ref_off, ref_lab = ref_tables(expect, B)
    np.testing.assert_array_equal(o3, ref_off)
    np.testing.assert_array_equal(l3, ref_lab)
    np.testing.assert_array_equal(c3, expect)


def test_update_validation():
    rng = np.random.default_rng(22)
    m, L, B = 20, 3, 8
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    rows = np.array([1], np.int32)
    new = np.zeros((1, L), np.int32)
    with pytest.raises(BAD, match=r"rows\[0\] = 20"):
        lsh_update_tables(offsets, labels, codes, [20], new)
    with pytest.raises(BAD, match=r"rows\[0\] = -1"):
        lsh_update_tables(offsets, labels, codes, [-1], new)
    with pytest.raises(BAD, match=r"row_codes\[0, 1\] = 8"):
        lsh_update_tables(offsets, labels, codes, rows, [[0, 8, 0]])
    with pytest.raises(BAD, match="row_codes shape"):
        lsh_update_tables(offsets, labels, codes, rows, np.zeros((2, L), np.int32))
    with pytest.raises(BAD, match="codes shape"):
        lsh_update_tables(offsets, labels, codes[:, :2], rows, new)
    with pytest.raises(BAD, match="labels.shape"):
        lsh_update_tables(offsets, labels[:2], codes, rows, new)
    bad_off = offsets.numpy().copy()
    bad_off[1, 3], bad_off[1, 4] = 15, 2
    with pytest.raises(BAD, match="decreases"):
        lsh_update_tables(bad_off, labels, codes, rows, new)
    # Codes that do not match the tables: label 1 is not where codes say.
    lying = codes.copy()
    lying[1] = (codes[1] + 1) % B
    with pytest.raises(BAD, match="does not match codes"):
        lsh_update_tables(offsets, labels, lying, rows, codes[1:2])


# ----------------------------------------------------------------------------
# Query.


def union_of_probes(offsets, labels, query_codes):
    offsets, labels = np.asarray(offsets), np.asarray(labels)
    out, total = set(), 0
    for q in query_codes:
        for l, c in enumerate(q):
            if c < 0:
                continue
            bucket = labels[l, offsets[l, c]:offsets[l, c + 1]]
            total += len(bucket)
            out.update(bucket.tolist())
    return out, total


def test_query_exact_union_when_buckets_are_small():
    rng = np.random.default_rng(30)
    m, L, B = 300, 4, 64
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    qc = np.stack([codes[[5, 9]], codes[[11, 11]], -np.ones((2, L), int)]
                  ).astype(np.int32)
    qc[0, 1, 2] = -1  # one probe switched off
    k = 200
    res = lsh_query(offsets, labels, codes, qc, k, step=3, seed=1)
    for i in range(3):
        union, total = union_of_probes(offsets, labels, qc[i])
        assert total <= k
        got = res.ids.numpy()[i][res.valid.numpy()[i]]
        assert len(got) == len(set(got.tolist()))
        assert set(got.tolist()) == union
        assert int(res.probed[i]) == total
        assert float(res.rate[i]) == 1.0
        assert (res.ids.numpy()[i][~res.valid.numpy()[i]] == 0).all()
        assert res.valid.numpy()[i][:len(got)].all()  # valid first
        # Collisions: number of probed (query, table) buckets holding j.
        for j, c in zip(got, res.collisions.numpy()[i][:len(got)]):
            expect = sum(int(codes[j, l] == qc[i, q, l])
                         for q in range(2) for l in range(L))
            assert c == expect
    assert not res.valid.numpy()[2].any()  # no probe at all


def test_query_subsamples_k_distinct_labels():
    rng = np.random.default_rng(31)
    m, L, B, k = 5000, 6, 4, 50  # huge buckets: T >> k
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    qc = codes[[1, 2, 3]][:, None, :]
    res = lsh_query(offsets, labels, codes, qc, k, step=7, seed=2)
    for i in range(3):
        union, total = union_of_probes(offsets, labels, qc[i])
        valid = res.valid.numpy()[i]
        got = res.ids.numpy()[i][valid]
        assert set(got.tolist()) <= union
        assert len(got) == len(set(got.tolist())) and len(got) >= k * 0.7
        assert int(res.probed[i]) == total
        assert float(res.rate[i]) == pytest.approx(k / total, rel=1e-6)
    # Stateless draws: same (seed, step) -> same; another step or seed differs.
    again = lsh_query(offsets, labels, codes, qc, k, step=7, seed=2)
    np.testing.assert_array_equal(res.ids, again.ids)
    other_step = lsh_query(offsets, labels, codes, qc, k, step=8, seed=2)
    other_seed = lsh_query(offsets, labels, codes, qc, k, step=7, seed=3)
    assert not np.array_equal(res.ids, other_step.ids)
    assert not np.array_equal(res.ids, other_seed.ids)


def test_query_entries_drawn_uniformly():
    """Each probed entry is read with probability k / T."""
    m, L, B, k = 400, 1, 2, 20
    codes = np.zeros((m, L), np.int32)
    codes[300:] = 1  # bucket 0 holds labels 0..299
    offsets, labels = lsh_build_tables(codes, B)
    qc = np.zeros((1, 1, 1), np.int32)
    counts = np.zeros(m)
    draws = 1500
    for step in range(draws):
        res = lsh_query(offsets, labels, codes, qc, k, step=step, seed=0,
                        count_collisions=False)
        counts[res.ids.numpy()[0][res.valid.numpy()[0]]] += 1
    assert counts[300:].sum() == 0
    p = k / 300
    freq = counts[:300] / draws
    se = math.sqrt(p * (1 - p) / draws)
    assert abs(freq.mean() - p) < 3 * se / math.sqrt(300) + 1e-3
    assert np.abs(freq - p).max() < 5 * se
    # Chi-square-like check of the spread across labels.
    assert freq.std() < 1.5 * se


def controlled_label_set(rng, d, angles, per_angle, background):
    """A unit query and labels at the given angles to it, plus random ones."""
    q = rng.normal(size=d)
    q /= np.linalg.norm(q)
    vecs, thetas = [], []
    for theta in angles:
        for _ in range(per_angle):
            v = rng.normal(size=d)
            v -= (v @ q) * q
            v /= np.linalg.norm(v)
            vecs.append(math.cos(theta) * q + math.sin(theta) * v)
            thetas.append(theta)
    for _ in range(background):
        v = rng.normal(size=d)
        vecs.append(v / np.linalg.norm(v))
        thetas.append(math.acos(np.clip(vecs[-1] @ q, -1, 1)))
    return q.astype(np.float32), np.array(vecs, np.float32), np.array(thetas)


@pytest.mark.parametrize("subsample", [False, True])
def test_sampling_frequency_matches_lsh_inclusion_probability(subsample):
    """LNS Sec. 1.3: label j is drawn with prob. 1 - (1 - r alpha_j^K)^L.

    Without subsampling (k >= T) r = 1, the paper's formula; with it, each
    probed entry is read with probability r = k / T.  The empirical
    frequency over independent hash draws (seeds) must match the mean
    predicted probability for every angle class.
    """
    rng = np.random.default_rng(40)
    d, K, L = 24, 3, 4
    angles = [0.15, 0.5, 0.9, 1.3, 1.8]
    per_angle = 12
    background = 400 if subsample else 0
    q, vecs, thetas = controlled_label_set(rng, d, angles, per_angle, background)
    m = len(vecs)
    k = 40 if subsample else L * m  # r = 1: every probed entry is read
    trials = 250
    hits = np.zeros(m)
    predicted = np.zeros(m)
    cos = np.cos(thetas).astype(np.float32)
    for seed in range(trials):
        proj = simhash_projection(d, K, L, seed=1000 + seed)
        codes = lsh_simhash(vecs, proj, K)
        offsets, labels = lsh_build_tables(codes, 2**K)
        qc = lsh_simhash(q[None], proj, K)[:, None, :]
        res = lsh_query(offsets, labels, codes, qc, k, step=seed, seed=seed,
                        count_collisions=False)
        hits[res.ids.numpy()[0][res.valid.numpy()[0]]] += 1
        predicted += simhash_inclusion_probability(
            np.tile(cos, (1, 1))[:, :, None], np.ones((1, 1), bool), K, L,
            res.rate).numpy()[0]
    freq = hits / trials
    predicted /= trials
    if not subsample:
        alpha = 1 - thetas / math.pi
        np.testing.assert_allclose(predicted, 1 - (1 - alpha**K)**L,
                                   rtol=1e-5)
    for a in range(len(angles)):
        sl = slice(a * per_angle, (a + 1) * per_angle)
        f, p = freq[sl].mean(), predicted[sl].mean()
        se = math.sqrt(max(p * (1 - p), 0.01) / (trials * per_angle))
        assert abs(f - p) < 4.5 * se, (angles[a], f, p)
    # Monotone in the similarity (LNS Theorem 2).
    means = [freq[a * per_angle:(a + 1) * per_angle].mean()
             for a in range(len(angles))]
    assert means == sorted(means, reverse=True)


def test_query_validation():
    rng = np.random.default_rng(32)
    m, L, B = 30, 3, 8
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    qc = codes[:2][:, None, :].copy()
    bad = qc.copy()
    bad[1, 0, 2] = 8
    with pytest.raises(BAD, match=r"query_codes\[1, 0, 2\] = 8"):
        lsh_query(offsets, labels, codes, bad, 5)
    bad[1, 0, 2] = -2
    with pytest.raises(BAD, match=r"query_codes\[1, 0, 2\] = -2"):
        lsh_query(offsets, labels, codes, bad, 5)
    with pytest.raises(BAD):
        lsh_query(offsets, labels, codes, qc[:, :, :2], 5)
    with pytest.raises(BAD):
        lsh_query(offsets, labels, codes, qc[:, 0], 5)
    with pytest.raises(BAD, match="step"):
        _loader.load().xmc_lsh_query(offsets, labels, codes, qc,
                           tf.constant([1, 2], tf.int64), num_candidates=5)
    with pytest.raises(BAD):
        lsh_query(offsets, labels, codes, qc, 0)
    with pytest.raises(BAD, match="codes shape"):
        lsh_query(offsets, labels, codes[:5], qc, 5)
    corrupt = labels.numpy().copy()
    corrupt[:, :] = m + 5
    with pytest.raises(BAD, match="corrupt"):
        lsh_query(offsets, corrupt, codes, qc, 50)
    bad_off = offsets.numpy().copy()
    bad_off[:, 1:] = 10 * m
    with pytest.raises(BAD, match="corrupt"):
        lsh_query(bad_off, labels, codes, qc, 50)


# ----------------------------------------------------------------------------
# Cosines and inclusion probabilities.


def test_sparse_cosine_matches_densified():
    rng = np.random.default_rng(50)
    m, s, e = 40, 5, 30
    indices, weights = sparse_rows(rng, m, s, e)  # row 0 is zero
    ids = rng.integers(0, m, (3, 6))
    qids = np.array([[4, 0], [1, 7], [9, 9]])
    cos = lsh_sparse_cosine(indices[ids], weights[ids], indices[qids],
                            weights[qids], e).numpy()
    assert cos.shape == (3, 6, 2)
    x = densify(indices, weights, e).astype(np.float64)
    norms = np.linalg.norm(x, axis=1)
    for i in range(3):
        for j in range(6):
            for p in range(2):
                den = norms[ids[i, j]] * norms[qids[i, p]]
                expect = (x[ids[i, j]] @ x[qids[i, p]] / den if den > 0
                          else 0.0)
                assert cos[i, j, p] == pytest.approx(expect, abs=1e-6)
    # Rows of different widths.
    wide = lsh_sparse_cosine(indices[ids], weights[ids],
                             np.concatenate([indices[qids]] * 2, -1),
                             np.concatenate([weights[qids]] * 2, -1), e)
    np.testing.assert_allclose(wide, cos, atol=1e-6)


def test_sparse_cosine_validation():
    idx = np.zeros((2, 3, 2), np.int32)
    w = np.ones((2, 3, 2), np.float32)
    qi = np.zeros((2, 1, 4), np.int32)
    qw = np.ones((2, 1, 4), np.float32)
    with pytest.raises(BAD, match="batch size"):
        lsh_sparse_cosine(idx, w, qi[:1], qw[:1], 5)
    with pytest.raises(BAD, match="shape"):
        lsh_sparse_cosine(idx, w[:, :, :1], qi, qw, 5)
    with pytest.raises(BAD):
        lsh_sparse_cosine(idx[0], w[0], qi, qw, 5)
    bad = idx.copy()
    bad[1, 2, 1] = 5
    with pytest.raises(BAD, match=r"a_indices\[1, 2, 1\] = 5"):
        lsh_sparse_cosine(bad, w, qi, qw, 5)
    bad = qi.copy()
    bad[1, 0, 3] = -1
    with pytest.raises(BAD, match=r"b_indices\[1, 0, 3\] = -1"):
        lsh_sparse_cosine(idx, w, bad, qw, 5)
    bad_w = qw.copy()
    bad_w[0, 0, 0] = np.nan
    with pytest.raises(BAD, match=r"b_weights\[0, 0\]"):
        lsh_sparse_cosine(idx, w, qi, bad_w, 5)


def test_inclusion_probability_formulas():
    cos = np.array([[[1.0, 0.0], [0.5, -1.0]]], np.float32)  # [1, 2, 2]
    mask = np.array([[True, False]])
    K, L = 2, 3
    p = simhash_inclusion_probability(cos, mask, K, L, [0.5]).numpy()
    alpha = 1 - np.arccos(cos[0, :, 0].astype(np.float64)) / np.pi
    np.testing.assert_allclose(p[0], 1 - (1 - 0.5 * alpha**K)**L, rtol=1e-6)
    both = simhash_inclusion_probability(cos, np.ones((1, 2), bool), K, L,
                                         [1.0]).numpy()
    a = 1 - np.arccos(cos[0].astype(np.float64)) / np.pi
    expect = 1 - np.prod((1 - a**K)**L, axis=1)
    np.testing.assert_allclose(both[0], expect, rtol=1e-6)
    c = collision_inclusion_probability([[3, 0]], [12], [0.25]).numpy()
    np.testing.assert_allclose(c[0], [1 - (1 - 0.25 * 3 / 12)**12, 0.0],
                               rtol=1e-6)


# ----------------------------------------------------------------------------
# Strict input checking (issue 30, item 7): each defect found by fuzzing is
# an InvalidArgument naming the bad argument, or the right answer.

IAE = tf.errors.InvalidArgumentError

# Cases that crashed the interpreter (SIGSEGV / SIGABRT, or an allocation
# the size of num_features) run in a child process: a regression fails the
# test instead of killing pytest.  Each prints "RESULT <name> <type> <msg>".
_CHILD_CASES = r'''
import faulthandler, resource, sys
faulthandler.enable()
# 8 GiB of address space (TensorFlow needs < 2): an allocation per
# coordinate of 2^31 features fails here instead of exhausting the machine.
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
import numpy as np
import tensorflow as tf
from xmc_tf.ops.lsh import (dwta_bins, lsh_build_tables, lsh_dwta_hash,
                            lsh_dwta_hash_sparse, lsh_sparse_cosine)

def run(name, fn):
    print("CASE", name, flush=True)
    try:
        out = fn()
        msg = "none " + repr(np.asarray(out).tolist())
    except Exception as e:  # noqa: BLE001 - reported to the parent
        msg = type(e).__name__ + " " + " ".join(str(e).split())
    print("RESULT", name, msg, flush=True)

one_idx = np.array([[1]], np.int32)
one_w = np.ones((1, 1), np.float32)
bins = dwta_bins(16, 4, 4)
run("dwta_sparse_num_features/eager", lambda: lsh_dwta_hash_sparse(
    one_idx, one_w, bins, num_features=2**40, num_bits=2))
run("dwta_sparse_num_features/function", lambda: tf.function(
    lambda i, w: lsh_dwta_hash_sparse(i, w, bins, num_features=2**40,
                                      num_bits=2))(one_idx, one_w))
run("build_tables_num_buckets/eager", lambda: lsh_build_tables(
    np.zeros((5, 0), np.int32), 2**63 - 1)[0])
run("build_tables_num_buckets/function", lambda: tf.function(
    lambda c: lsh_build_tables(c, 2**63 - 1)[0])(np.zeros((5, 0), np.int32)))
run("build_tables_num_buckets/function_unknown_shape", lambda: tf.function(
    lambda c: lsh_build_tables(c, 2**63 - 1)[0],
    input_signature=[tf.TensorSpec([None, None], tf.int32)])(
        np.zeros((5, 0), np.int32)))
run("sparse_cosine_num_features/eager", lambda: lsh_sparse_cosine(
    one_idx[None], one_w[None], one_idx[None], one_w[None], 2**40))
# The largest num_features, bins spread over it: valid, and it must not
# allocate per coordinate (the dense result on compacted coordinates).
rng = np.random.default_rng(0)
coords = np.sort(rng.choice(2**31 - 1, 16, replace=False)).astype(np.int32)
x = rng.normal(size=(3, 16)).astype(np.float32)
idx = np.tile(np.arange(16, dtype=np.int32), (3, 1))
small = dwta_bins(16, 8, 4, seed=1)
want = lsh_dwta_hash(x, small, 2).numpy()
got = lsh_dwta_hash_sparse(coords[idx], x, coords[small], 2**31 - 1, 2)
run("dwta_sparse_huge_space", lambda: int((got.numpy() == want).all()))
a = np.array([[[5, 2**31 - 2, 9]]], np.int32)
aw = np.array([[[1.0, 2.0, 3.0]]], np.float32)
run("sparse_cosine_huge_space", lambda: lsh_sparse_cosine(
    a, aw, a[:, :, :2], aw[:, :, :2], 2**31 - 1))
'''


@pytest.fixture(scope="module")
def child_results():
    """Runs _CHILD_CASES in a child interpreter (same op library)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", _CHILD_CASES], env=env,
                          cwd=root, capture_output=True, text=True,
                          timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            _, name, kind, *msg = line.split(" ", 3) + [""]
            results[name] = (kind, " ".join(msg).strip())
    cases = [ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
           else f"exit code {proc.returncode}")
    info = (f"child {how}; last case: {cases[-1] if cases else None}\n"
            f"--- stderr (tail) ---\n{proc.stderr[-3000:]}")
    return results, info


@pytest.mark.parametrize("name,error,text", [
    # eager and inside a tf.function: the kernel rejects the attribute.
    ("dwta_sparse_num_features/eager", "InvalidArgumentError",
     "num_features must be in [1, 2^31 - 1]"),
    ("dwta_sparse_num_features/function", "InvalidArgumentError",
     "num_features must be in [1, 2^31 - 1]"),
    ("build_tables_num_buckets/eager", "InvalidArgumentError",
     "num_buckets must be in [1, 2^24]"),
    # In a graph the shape function rejects it (before B + 1): TensorFlow
    # raises a shape function's InvalidArgument as ValueError.
    ("build_tables_num_buckets/function", "ValueError",
     "num_buckets must be in [1, 2^24]"),
    ("build_tables_num_buckets/function_unknown_shape", "ValueError",
     "num_buckets must be in [1, 2^24]"),
    ("sparse_cosine_num_features/eager", "InvalidArgumentError",
     "num_features must be in [1, 2^31 - 1]"),
])
def test_former_crashes_are_invalid_argument(child_results, name, error,
                                             text):
    results, info = child_results
    assert name in results, f"{name} did not finish: {info}"
    kind, msg = results[name]
    assert kind == error, (name, kind, msg)
    assert text in msg, (name, msg)


def test_huge_num_features_is_valid_without_dense_scratch(child_results):
    """num_features = 2^31 - 1 with coordinates spread over it: DWTA equals
    the dense hash of the compacted vectors, the cosine is exact."""
    results, info = child_results
    for name in ("dwta_sparse_huge_space", "sparse_cosine_huge_space"):
        assert name in results, f"{name} did not finish: {info}"
    assert results["dwta_sparse_huge_space"] == ("none", "1")
    kind, msg = results["sparse_cosine_huge_space"]
    assert kind == "none", msg
    cos = float(msg.strip("[]"))
    assert cos == pytest.approx(math.sqrt(5 / 14), abs=1e-7)


def test_num_bucket_limits():
    """num_buckets in [1, 2^24]; 2^24 itself is valid (no table: L = 0)."""
    offsets, labels = lsh_build_tables(np.zeros((3, 0), np.int32), 2**24)
    assert offsets.shape == (0, 2**24 + 1) and labels.shape == (0, 3)
    with pytest.raises(IAE, match=r"num_buckets must be in \[1, 2\^24\] "
                                  r"\(bucket ids of at most 24 bits\), "
                                  r"got 16777217"):
        lsh_build_tables(np.zeros((3, 1), np.int32), 2**24 + 1)


def _small_tables(m=8, L=2, B=4, seed=60):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, m, L, B)
    offsets, labels = lsh_build_tables(codes, B)
    return codes, offsets.numpy(), labels.numpy()


def _eager_and_graph(fn, *args):
    """[fn(*args), tf.function(fn)(*args)] as callables."""
    return [lambda: fn(*args), lambda: tf.function(fn)(*args)]


@pytest.mark.parametrize("value", [100, -7, 8])
def test_update_rejects_label_ids_out_of_range(value):
    """Label ids of the tables in [0, m): 100, -7 or m are not copied."""
    codes, offsets, labels = _small_tables()
    labels[1, 5] = value
    rows, new = np.array([0], np.int32), np.zeros((1, 2), np.int32)
    for call in _eager_and_graph(lsh_update_tables, offsets, labels, codes,
                                 rows, new):
        with pytest.raises(IAE, match=rf"labels\[1, 5\] = {value} is not in "
                                      r"\[0, 8\) \(num_labels\)"):
            call()


def test_update_rejects_a_non_permutation():
    """Every table holds each label once: a repeated id is rejected (here
    in a table the update does not touch, which is block-copied)."""
    codes, offsets, labels = _small_tables()
    first = labels[0, 2]
    labels[0, 6] = first  # label labels[0, 6] vanishes, `first` repeats
    rows = np.array([3], np.int32)
    new = codes[3:4].copy()  # no move at all: every table copied
    for call in _eager_and_graph(lsh_update_tables, offsets, labels, codes,
                                 rows, new):
        with pytest.raises(IAE, match=rf"labels\[0, 6\] = {first} repeats an "
                                      r"earlier label id: labels\[0\] must "
                                      r"be a permutation of \[0, 8\)"):
            call()


def test_update_rejects_codes_out_of_range_anywhere():
    """codes [m, L] are all bucket ids, also those of labels not moved
    (they are copied to new_codes)."""
    codes, offsets, labels = _small_tables()
    bad = codes.copy()
    bad[6, 1] = 4
    rows, new = np.array([0], np.int32), np.zeros((1, 2), np.int32)
    for call in _eager_and_graph(lsh_update_tables, offsets, labels, bad,
                                 rows, new):
        with pytest.raises(IAE, match=r"codes\[6, 1\] = 4 is not in \[0, 4\) "
                                      r"\(num_buckets\)"):
            call()
    bad[6, 1] = -3
    with pytest.raises(IAE, match=r"codes\[6, 1\] = -3 is not in"):
        lsh_update_tables(offsets, labels, bad, rows, new)


@pytest.mark.parametrize("value", [4, 9, -5])
def test_query_rejects_candidate_codes_out_of_range(value):
    """codes outside [0, B) used to count 0 collisions; now the codes rows
    read for the collision counts are checked."""
    codes, offsets, labels = _small_tables()
    bad = codes.copy()
    bad[:, 0] = value  # every label's code in table 0
    qc = codes[:1][:, None, :]
    k = 16  # >= every probed entry: all candidates are read
    fn = lambda o, lab, c, q: lsh_query(o, lab, c, q, k).collisions
    for call in _eager_and_graph(fn, offsets, labels, bad, qc):
        with pytest.raises(IAE, match=rf"codes\[\d+, 0\] = {value} is not in "
                                      r"\[0, 4\) \(num_buckets; read for the "
                                      r"collision counts of batch row 0\)"):
            call()
    # Without collision counts the codes are not read (documented).
    res = lsh_query(offsets, labels, bad, qc, k, count_collisions=False)
    assert res.valid.numpy().any()


@pytest.mark.parametrize("a_w,b_w,want", [
    ([[[3e38, 3e38]]], [[[1.0]]], 1.0),          # the fuzzed case
    ([[[3e38, 3e38]]], [[[-3e38]]], -1.0),
    ([[[3e38, -3e38]]], [[[1.0]]], 0.0),          # cancels to a zero vector
    ([[[3.4e38, 3.4e38]]], [[[3.4e38]]], 1.0),
])
def test_sparse_cosine_sums_duplicates_in_float64(a_w, b_w, want):
    """Duplicates summed in float64 as documented: 3e38 + 3e38 is no inf,
    and the norms do not overflow (NaN before)."""
    a_i, b_i = [[[0, 0]]], [[[0]]]
    for call in _eager_and_graph(
            lambda *a: lsh_sparse_cosine(*a, 4),
            np.array(a_i, np.int32), np.array(a_w, np.float32),
            np.array(b_i, np.int32), np.array(b_w, np.float32)):
        got = call().numpy()
        assert got.shape == (1, 1, 1)
        assert got[0, 0, 0] == want


def test_sparse_hash_rejects_overflowing_duplicate_sums():
    """A float32 duplicate sum that overflows makes the densified row
    infinite, which the dense ops reject: so do the sparse ones."""
    idx = np.array([[0, 1], [2, 2]], np.int32)
    w = np.array([[1.0, 2.0], [3e38, 3e38]], np.float32)
    proj = simhash_projection(4, 2, 2)
    bins = dwta_bins(4, 4, 2)
    with np.errstate(over="ignore"):
        dense = densify(idx, w, 4)  # row 1 holds inf
    with pytest.raises(IAE, match=r"vectors\[1\]"):
        lsh_simhash(dense, proj, 2)
    for call in (
            lambda: lsh_simhash_sparse(idx, w, proj, 2),
            lambda: lsh_dwta_hash_sparse(idx, w, bins, 4, 2),
            lambda: tf.function(lambda i: lsh_simhash_sparse(i, w, proj,
                                                             2))(idx)):
        with pytest.raises(IAE, match=r"weights\[1\]: the weights of index "
                                      r"2 sum to an infinite value"):
            call()
    # Large but finite sums are fine.
    w[1] = [1e38, 1e38]
    np.testing.assert_array_equal(lsh_simhash_sparse(idx, w, proj, 2),
                                  lsh_simhash(densify(idx, w, 4), proj, 2))
