"""LSH hash tables over label vectors: the ops behind LSH negative sampling.

Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
Sec. 1.2-2.3 and Algorithm 1.  ``L`` hash tables are keyed by a meta-hash of
``K`` concatenated LSH functions of the label vectors (the rows of the output
layer).  A query, the instance embedding ("LSH-embedding") or the vectors of
its positive labels ("LSH-label"), probes one bucket per table; the union of
the probed buckets are the negatives, so label ``j`` is drawn with
probability ``1 - (1 - alpha_j^K)^L`` (Sec. 1.3), ``alpha_j`` being the
collision probability of one hash function (SimHash: ``1 - theta / pi``,
Appendix A.2).  After an update only the changed label rows are re-hashed
(Sec. 1.2, cost ``2 K L`` per row).

Hash families: SimHash / signed random projections (Charikar 2002) and
densified winner-take-all, DWTA (Chen & Shrivastava, UAI 2018).  Both hash
dense vectors ``[n, d]`` and uniform-sparse vectors (``indices``/``weights``
``[n, s]`` in an input space of ``e`` coordinates) without densifying them,
with identical codes for a sparse vector and its densified copy.

Data layout (int32 throughout): ``codes [m, L]`` bucket ids; tables in CSR
form, ``offsets [L, B + 1]`` and ``labels [L, m]`` (bucket ``c`` of table
``l`` holds ``labels[l, offsets[l, c]:offsets[l, c + 1]]``, sorted).

Querying (:func:`lsh_query`) returns fixed-size candidate lists
``[batch, k]``: when the probed buckets hold ``T > k`` entries, ``k`` of them
are drawn uniformly (so the cost per instance does not grow with ``m``) and
every label's inclusion probability becomes
``1 - prod_q (1 - r alpha_q^K)^L`` with ``r = k / T``
(:func:`simhash_inclusion_probability`).

Example:
  >>> import numpy as np
  >>> family = LshHashFamily("simhash", num_bits=4, num_tables=3,
  ...                        input_dim=8, seed=0)
  >>> w = np.random.default_rng(0).normal(size=(20, 8)).astype("float32")
  >>> codes = family.hash_dense(w)
  >>> offsets, labels = lsh_build_tables(codes, family.num_buckets)
  >>> tuple(offsets.shape), tuple(labels.shape)
  ((3, 17), (3, 20))
  >>> res = lsh_query(offsets, labels, codes, tf.expand_dims(codes[:2], 1),
  ...                 num_candidates=5, step=0)
  >>> tuple(res.ids.shape)
  (2, 5)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from xmc_tf.ops import _loader

__all__ = ["HASHES", "LshHashFamily", "LshQueryResult",
           "collision_inclusion_probability", "dwta_bins",
           "lsh_build_tables", "lsh_dwta_hash", "lsh_dwta_hash_sparse",
           "lsh_query", "lsh_simhash", "lsh_simhash_gemm", "lsh_simhash_sparse",
           "lsh_sparse_cosine", "lsh_update_tables", "simhash_inclusion_probability",
           "simhash_projection"]

#: The supported hash families.
HASHES = ("simhash", "dwta")


def _ops():
    return _loader.load()


# ----------------------------------------------------------------------------
# Hash parameters (NumPy, deterministic given the seed).


def simhash_projection(input_dim: int, num_bits: int, num_tables: int,
                       seed: int = 0) -> np.ndarray:
    """Gaussian projection of SimHash: float32 ``[input_dim, K * L]``.

    Column ``j`` is the random hyperplane of hash function ``j``; i.i.d.
    N(0, 1) entries give the collision probability ``1 - theta / pi`` (LNS
    Appendix A.2, Goemans & Williamson 1995).  Drawn with NumPy's PCG64 from
    ``seed``, so the same arguments give the same matrix on every platform.

    Args:
      input_dim: d (or e, the input space of sparse label vectors), >= 1.
      num_bits: K, hash functions per table, >= 1.
      num_tables: L, >= 1.
      seed: int seed.

    Returns:
      float32 ``[input_dim, num_bits * num_tables]``.

    Raises:
      ValueError: an argument < 1.

    >>> simhash_projection(5, 3, 2, seed=1).shape
    (5, 6)
    """
    if min(int(input_dim), int(num_bits), int(num_tables)) < 1:
        raise ValueError("input_dim, num_bits and num_tables must be >= 1, "
                         f"got {input_dim}, {num_bits}, {num_tables}")
    rng = np.random.default_rng(seed)
    return rng.standard_normal((int(input_dim), int(num_bits) * int(num_tables)),
                               dtype=np.float32)


def dwta_bins(input_dim: int, num_hashes: int, bin_size: int = 8,
              seed: int = 0) -> np.ndarray:
    """Coordinates examined by each DWTA hash function: int32 ``[H, w]``.

    As in WTA / DWTA hashing (Chen & Shrivastava 2018; LNS Appendix A.3):
    random permutations of the ``input_dim`` coordinates are concatenated
    and cut into bins of ``bin_size`` coordinates (``input_dim // bin_size``
    bins per permutation, leftover coordinates of a permutation unused);
    hash function ``j`` uses bin ``j``.  Deterministic given ``seed``.

    Args:
      input_dim: number of coordinates d, >= ``bin_size``.
      num_hashes: H = K * L, >= 1.
      bin_size: w, a power of two in [2, 256].
      seed: int seed.

    Returns:
      int32 ``[num_hashes, bin_size]``, distinct coordinates within a bin.

    Raises:
      ValueError: ``bin_size`` not a power of two in [2, 256], or
        ``input_dim < bin_size``, or ``num_hashes < 1``.

    >>> dwta_bins(16, 5, bin_size=4, seed=0).shape
    (5, 4)
    """
    w = int(bin_size)
    if w < 2 or w > 256 or w & (w - 1):
        raise ValueError(f"bin_size must be a power of two in [2, 256], got {w}")
    if int(input_dim) < w:
        raise ValueError(f"input_dim ({input_dim}) must be >= bin_size ({w})")
    if int(num_hashes) < 1:
        raise ValueError(f"num_hashes must be >= 1, got {num_hashes}")
    rng = np.random.default_rng(seed)
    per_perm = int(input_dim) // w
    blocks, have = [], 0
    while have < num_hashes:
        perm = rng.permutation(int(input_dim))[:per_perm * w]
        blocks.append(perm.reshape(per_perm, w))
        have += per_perm
    return np.concatenate(blocks)[:num_hashes].astype(np.int32)


# ----------------------------------------------------------------------------
# Op wrappers.


def lsh_simhash(vectors, projection, num_bits: int, bucket_bits: int = 16):
    """SimHash bucket ids of dense vectors (op ``Xmc>LshSimHash``).

    Bit ``j`` of a vector ``x`` is ``x . projection[:, j] > 0``; table ``l``'s
    bucket reads bits ``l K .. l K + K - 1`` as an integer (first bit lowest),
    folded to ``bucket_bits`` bits by a mixing hash if ``K > bucket_bits``.
    Source: LNS Appendix A.2 (Charikar 2002).

    Args:
      vectors: float32 ``[n, d]``, finite.
      projection: float32 ``[d, K * L]`` (:func:`simhash_projection`).
      num_bits: K.
      bucket_bits: cap on the bits of a bucket id, in [1, 24].

    Returns:
      int32 ``[n, L]`` bucket ids in ``[0, 2^min(K, bucket_bits))``.

    Raises:
      tf.errors.InvalidArgumentError: shape mismatch, NaN/inf, bad attribute.
    """
    return _ops().xmc_lsh_sim_hash(
        tf.convert_to_tensor(vectors, tf.float32),
        tf.convert_to_tensor(projection, tf.float32),
        num_bits=int(num_bits), bucket_bits=int(bucket_bits))


#: Rows per matrix product of :func:`lsh_simhash_gemm` (bounds the
#: ``[rows, K L]`` float32 projections to 64 MiB at K L = 1,024).
_GEMM_CHUNK = 16384


def lsh_simhash_gemm(vectors, projection, num_bits: int):
    """SimHash bucket ids of dense vectors by one matrix product.

    The same codes as :func:`lsh_simhash` when ``K <= bucket_bits`` (no
    folding): bit ``j`` is ``x . projection[:, j] > 0`` and table ``l`` reads
    bits ``l K .. l K + K - 1`` as an integer, first bit lowest.  The
    products come from TensorFlow's GEMM (``tf.matmul``, blocked and
    vectorised) instead of the op's per-row dot products: 2.8x faster for
    a rehash of 50,000 label vectors of width 512 at K L = 450 (73 vs 203
    ms, 2 cores).  Its summation order differs from the op's, so a bit whose
    product is within float32 rounding of 0 may differ (measure zero for
    real-valued vectors; never for the sign of an exact 0).  Rows are
    multiplied in chunks of 16,384 when the row count is static.

    Args:
      vectors: float32 ``[n, d]``, finite.
      projection: float32 ``[d, K * L]``.
      num_bits: K (<= 24: the id is the raw K-bit meta-hash).

    Returns:
      int32 ``[n, L]`` bucket ids in ``[0, 2^K)``.

    Raises:
      tf.errors.InvalidArgumentError: NaN/inf in ``vectors``, or ``d`` not
        ``projection``'s first dimension.
      ValueError: ``projection``'s width not a multiple of ``num_bits``, or
        ``num_bits`` outside [1, 24].
    """
    k = int(num_bits)
    vectors = tf.convert_to_tensor(vectors, tf.float32)
    projection = tf.convert_to_tensor(projection, tf.float32)
    width = int(projection.shape[-1])
    if not 1 <= k <= 24 or width % k:
        raise ValueError(f"lsh_simhash_gemm: num_bits must be in [1, 24] and "
                         f"divide the projection's width {width}, got {k}")
    # Bits of the raw meta-hash as float weights 2^j (exact up to 2^24).
    powers = tf.constant(2.0 ** np.arange(k), tf.float32)

    def codes(rows):
        products = tf.matmul(rows, projection)  # [r, K L]
        # a NaN / inf coordinate makes its row's products NaN / inf
        finite = tf.debugging.assert_equal(
            tf.reduce_all(tf.math.is_finite(tf.reduce_sum(products, 1))), True,
            message="lsh_simhash: vectors must be finite")
        with tf.control_dependencies([finite]):
            bits = tf.cast(products > 0, tf.float32)
        bits = tf.reshape(bits, [-1, width // k, k])
        return tf.cast(tf.linalg.matvec(bits, powers), tf.int32)

    n = vectors.shape[0]
    if n is None or n <= _GEMM_CHUNK:
        return codes(vectors)
    return tf.concat([codes(vectors[i:i + _GEMM_CHUNK])
                      for i in range(0, n, _GEMM_CHUNK)], 0)


def lsh_simhash_sparse(indices, weights, projection, num_bits: int,
                       bucket_bits: int = 16):
    """SimHash of uniform-sparse vectors (op ``Xmc>LshSimHashSparse``).

    Row ``i`` is ``x_i[indices[i, t]] += weights[i, t]`` in
    ``e = projection.shape[0]`` coordinates.  O(s K L) per row, and
    bit-identical to :func:`lsh_simhash` on the densified rows.

    Args:
      indices: int32 ``[n, s]`` in ``[0, e)``.
      weights: float32 ``[n, s]``, finite; duplicate indices are summed in
        float32 (as in the densified row), and those sums must be finite.
      projection: float32 ``[e, K * L]``.
      num_bits: K.
      bucket_bits: cap on the bits of a bucket id.

    Returns:
      int32 ``[n, L]``.

    Raises:
      tf.errors.InvalidArgumentError: an index out of ``[0, e)`` (the
        message names ``indices[i, t]``), ``weights`` shape differing from
        ``indices``, a NaN/inf weight, duplicate weights whose float32 sum
        overflows (``weights[i]``: the densified row would not be finite),
        or a bad attribute.
    """
    return _ops().xmc_lsh_sim_hash_sparse(
        tf.convert_to_tensor(indices, tf.int32),
        tf.convert_to_tensor(weights, tf.float32),
        tf.convert_to_tensor(projection, tf.float32),
        num_bits=int(num_bits), bucket_bits=int(bucket_bits))


def lsh_dwta_hash(vectors, bins, num_bits: int, bucket_bits: int = 16,
                  seed: int = 0):
    """DWTA bucket ids of dense vectors (op ``Xmc>LshDwtaHash``).

    Hash ``j`` is the position of the largest non-zero coordinate among
    ``bins[j]`` (``log2(w)`` bits); empty bins are densified from other bins
    (Chen & Shrivastava 2018).  Table ``l`` concatenates hashes
    ``l K .. l K + K - 1``.  Source: LNS Appendix A.3.

    Args:
      vectors: float32 ``[n, d]``.
      bins: int32 ``[K * L, w]`` (:func:`dwta_bins`).
      num_bits: K.
      bucket_bits: cap on the bits of a bucket id.
      seed: seed of the densification.

    Returns:
      int32 ``[n, L]`` in ``[0, 2^min(K log2 w, bucket_bits))``.

    Raises:
      tf.errors.InvalidArgumentError: bin coordinate out of range, bad bin
        size, NaN/inf.
    """
    return _ops().xmc_lsh_dwta_hash(
        tf.convert_to_tensor(vectors, tf.float32),
        tf.convert_to_tensor(bins, tf.int32), num_bits=int(num_bits),
        bucket_bits=int(bucket_bits), seed=int(seed))


def lsh_dwta_hash_sparse(indices, weights, bins, num_features: int,
                         num_bits: int, bucket_bits: int = 16, seed: int = 0):
    """DWTA of uniform-sparse vectors (op ``Xmc>LshDwtaHashSparse``).

    Same codes as :func:`lsh_dwta_hash` on the densified rows; visits only
    the bins that contain a non-zero coordinate.

    Scratch memory follows the coordinates held by ``bins``, never
    ``num_features``: one slot per coordinate up to ``max(bins)`` while that
    is below ``max(2^22, 8 K L w)``, else ``O(K L w)`` (sorted coordinates,
    searched by bisection).

    Args:
      indices: int32 ``[n, s]`` in ``[0, num_features)``.
      weights: float32 ``[n, s]``, finite (duplicate sums too, see
        :func:`lsh_simhash_sparse`).
      bins: int32 ``[K * L, w]`` in ``[0, num_features)``.
      num_features: e, in ``[1, 2^31 - 1]`` (int32 coordinates).
      num_bits: K.
      bucket_bits: cap on the bits of a bucket id.
      seed: seed of the densification.

    Returns:
      int32 ``[n, L]``.

    Raises:
      tf.errors.InvalidArgumentError: as :func:`lsh_dwta_hash`; an index
        out of range (``indices[i, t]``); ``num_features`` outside
        ``[1, 2^31 - 1]`` (the message names ``num_features``); duplicate
        weights whose float32 sum overflows.
    """
    return _ops().xmc_lsh_dwta_hash_sparse(
        tf.convert_to_tensor(indices, tf.int32),
        tf.convert_to_tensor(weights, tf.float32),
        tf.convert_to_tensor(bins, tf.int32), num_features=int(num_features),
        num_bits=int(num_bits), bucket_bits=int(bucket_bits), seed=int(seed))


def lsh_build_tables(codes, num_buckets: int):
    """CSR hash tables of ``m`` labels (op ``Xmc>LshBuildTables``).

    LNS Sec. 1.2, pre-processing phase.  Counting sort per table.

    Args:
      codes: int32 ``[m, L]`` in ``[0, num_buckets)``.
      num_buckets: B, in ``[1, 2^24]`` (bucket ids have at most 24 bits;
        :attr:`LshHashFamily.num_buckets` always is).

    Returns:
      ``(offsets, labels)``: int32 ``[L, B + 1]`` and ``[L, m]``; bucket
      ``c`` of table ``l`` is ``labels[l, offsets[l, c]:offsets[l, c + 1]]``
      in increasing label order (every label once per table).

    Raises:
      tf.errors.InvalidArgumentError: a code out of range (the message names
        ``codes[j, l]``), ``m`` above ``2^31 - 1``, or ``num_buckets``
        outside ``[1, 2^24]`` (message names ``num_buckets``).
      ValueError: ``num_buckets`` out of range or ``codes`` not a matrix
        while a graph is built (``tf.function``): the op's shape function
        rejects them with InvalidArgument, which TensorFlow raises as
        ``ValueError`` at graph construction.
    """
    return _ops().xmc_lsh_build_tables(tf.convert_to_tensor(codes, tf.int32),
                                       num_buckets=int(num_buckets))


def lsh_update_tables(offsets, labels, codes, rows, row_codes):
    """Moves re-hashed labels to their new buckets (``Xmc>LshUpdateTables``).

    LNS Sec. 1.2, update phase.  Equal, array for array, to
    :func:`lsh_build_tables` on the updated codes.  A row listed twice takes
    its last ``row_codes``.

    Every input is validated in O(input) passes (each label and code is
    read once besides the copy), so invalid tables are never propagated.

    Args:
      offsets: int32 ``[L, B + 1]``, non-decreasing from 0 to ``m`` per
        table.
      labels: int32 ``[L, m]``, a permutation of ``[0, m)`` per table (as
        :func:`lsh_build_tables` returns them).
      codes: int32 ``[m, L]`` in ``[0, B)``, the codes the tables were built
        from.
      rows: int32 ``[r]`` label ids in ``[0, m)``.
      row_codes: int32 ``[r, L]`` their new codes, in ``[0, B)``.

    Returns:
      ``(offsets, labels, codes)`` updated: int32 ``[L, B + 1]``,
      ``[L, m]`` and ``[m, L]``.

    Raises:
      tf.errors.InvalidArgumentError: shape mismatch; ``rows[i]``,
        ``row_codes[i, l]`` or ``codes[j, l]`` out of range; malformed
        ``offsets``; ``labels[l, t]`` out of ``[0, m)`` or repeating an
        earlier label of table ``l`` (not a permutation); or tables that do
        not match ``codes``.  Messages name the offending entry.
    """
    return _ops().xmc_lsh_update_tables(
        tf.convert_to_tensor(offsets, tf.int32),
        tf.convert_to_tensor(labels, tf.int32),
        tf.convert_to_tensor(codes, tf.int32),
        tf.convert_to_tensor(rows, tf.int32),
        tf.convert_to_tensor(row_codes, tf.int32))


class LshQueryResult(NamedTuple):
    """Output of :func:`lsh_query` (``b`` instances, ``k`` candidates).

    Attributes:
      ids: int32 ``[b, k]`` label ids (distinct per row, then padding 0).
      valid: bool ``[b, k]``, False for padding.
      collisions: int32 ``[b, k]``, number of probed (query, table) buckets
        holding the candidate (0 without ``count_collisions``).
      rate: float32 ``[b]``, the read rate ``r = min(1, k / T)``.
      probed: int64 ``[b]``, ``T``, the entries of the probed buckets.
    """

    ids: tf.Tensor
    valid: tf.Tensor
    collisions: tf.Tensor
    rate: tf.Tensor
    probed: tf.Tensor


def lsh_query(offsets, labels, codes, query_codes, num_candidates: int,
              step=0, seed: int = 0,
              count_collisions: bool = True) -> LshQueryResult:
    """``k`` LSH candidates per instance in O(q L + k log k) (``Xmc>LshQuery``).

    LNS Algorithm 1 lines 6-10.  Every instance probes its ``q * L``
    buckets ``query_codes[i]`` (-1 = none).  If they hold ``T <= k``
    entries all are returned (the exact union); otherwise ``k`` distinct
    entries are drawn uniformly, keyed by ``(seed, step, i)`` (stateless).
    Duplicated labels are returned once.

    Args:
      offsets: int32 ``[L, B + 1]``.
      labels: int32 ``[L, m]``.
      codes: int32 ``[m, L]``.
      query_codes: int32 ``[b, q, L]``, -1 or in ``[0, B)``.
      num_candidates: k, in ``[1, 2^24]``.
      step: int64 scalar keying the draws (the optimizer step).
      seed: int seed of the draws.
      count_collisions: whether to fill ``collisions`` (O(k q L)).

    Returns:
      :class:`LshQueryResult`.

    Raises:
      tf.errors.InvalidArgumentError: shape mismatch, a query code out of
        range (``query_codes[i, q, l]``), ``num_candidates`` out of range, or
        malformed tables, checked on what is read so that the cost stays
        independent of ``m``: an offset of a probed bucket or a label id
        read out of range, or, with ``count_collisions``, a code of a
        candidate (``codes[j, l]``) outside ``[0, B)``.
      ValueError: ``num_candidates`` out of range or inconsistent static
        shapes while a graph is built (shape function).
    """
    out = _ops().xmc_lsh_query(
        tf.convert_to_tensor(offsets, tf.int32),
        tf.convert_to_tensor(labels, tf.int32),
        tf.convert_to_tensor(codes, tf.int32),
        tf.convert_to_tensor(query_codes, tf.int32),
        tf.cast(step, tf.int64), num_candidates=int(num_candidates),
        seed=int(seed), count_collisions=bool(count_collisions))
    return LshQueryResult(*out)


def lsh_sparse_cosine(a_indices, a_weights, b_indices, b_weights,
                      num_features: int):
    """Cosines between batches of sparse vectors (op ``Xmc>LshSparseCosine``).

    ``cos[i, j, p] = cos(a_ij, b_ip)`` where ``a_ij`` is ``a_weights[i, j]``
    at coordinates ``a_indices[i, j]``; duplicates are summed, and dot
    products and norms accumulated, in float64 (weights near the float32
    limit cannot overflow); 0 when a vector is zero.  Feed it the gathered
    rows of a uniform-sparse head (candidates, positives) to get LSH-label
    collision probabilities without densifying the head.

    Args:
      a_indices: int32 ``[b, k, s_a]`` in ``[0, num_features)``.
      a_weights: float32 ``[b, k, s_a]``.
      b_indices: int32 ``[b, n, s_b]`` in ``[0, num_features)``.
      b_weights: float32 ``[b, n, s_b]``.
      num_features: e, in ``[1, 2^31 - 1]`` (int32 coordinates; scratch
        memory does not grow with it beyond ``2^22``).

    Returns:
      float32 ``[b, k, n]``.

    Raises:
      tf.errors.InvalidArgumentError: an index out of range
        (``a_indices[i, j, t]`` / ``b_indices[i, p, t]``), a NaN/inf weight,
        mismatched shapes or batch sizes, or ``num_features`` outside
        ``[1, 2^31 - 1]`` (message names ``num_features``).
    """
    return _ops().xmc_lsh_sparse_cosine(
        tf.convert_to_tensor(a_indices, tf.int32),
        tf.convert_to_tensor(a_weights, tf.float32),
        tf.convert_to_tensor(b_indices, tf.int32),
        tf.convert_to_tensor(b_weights, tf.float32),
        num_features=int(num_features))


# ----------------------------------------------------------------------------
# Inclusion probabilities.


def simhash_inclusion_probability(cosines, query_mask, num_bits: int,
                                  num_tables: int, rate):
    """Probability that SimHash LSH sampling returns a label (LNS Sec. 1.3).

    With ``alpha_q = 1 - arccos(cos_q) / pi`` (SimHash collision
    probability, LNS Eq. 3) for each valid query ``q`` of the row::

        p = 1 - prod_q (1 - r * alpha_q^K)^L

    which is LNS's ``1 - (1 - alpha^K)^L`` for one query and ``r = 1``
    (every probed entry read); ``r = k / T < 1`` when :func:`lsh_query`
    subsampled ``k`` of the ``T`` probed entries (each entry is then read with
    probability ``r``).  Tables are independent given the query; queries are
    treated as independent (an approximation for several positives).
    Computed as ``-expm1(sum_q L log1p(-r alpha_q^K))`` for accuracy.

    Args:
      cosines: float ``[b, k, n]`` cosine of each candidate with each query.
      query_mask: bool ``[b, n]``, which queries are real.
      num_bits: K.
      num_tables: L.
      rate: float ``[b]``, ``r`` from :func:`lsh_query`.

    Returns:
      float32 ``[b, k]`` in ``[0, 1]``.

    >>> p = simhash_inclusion_probability(tf.constant([[[1.0]]]),
    ...                                   tf.constant([[True]]), 4, 2, [1.0])
    >>> float(p[0, 0])
    1.0
    """
    cos = tf.clip_by_value(tf.cast(cosines, tf.float64), -1.0, 1.0)
    alpha = 1.0 - tf.acos(cos) / math.pi
    a = tf.pow(alpha, float(num_bits))
    r = tf.cast(tf.convert_to_tensor(rate), tf.float64)[:, None, None]
    term = float(num_tables) * tf.math.log1p(-tf.minimum(r * a, 1.0))
    term = tf.where(tf.cast(query_mask, tf.bool)[:, None, :], term,
                    tf.zeros_like(term))
    p = -tf.math.expm1(tf.reduce_sum(term, axis=-1))
    return tf.cast(tf.clip_by_value(p, 0.0, 1.0), tf.float32)


def collision_inclusion_probability(collisions, num_probes, rate):
    """Plug-in inclusion probability from observed collision counts.

    For hash families without a closed-form collision probability (DWTA):
    the per-probe collision probability ``alpha^K`` is estimated by
    ``c / P``, the fraction of the row's ``P`` probed (query, table) buckets
    that hold the candidate, and ``p = 1 - (1 - r c / P)^P``.  Conditioned on
    the candidate having been found (``c >= 1``) this overestimates ``p`` for
    rarely colliding labels.

    Args:
      collisions: int ``[b, k]`` from :func:`lsh_query`.
      num_probes: int ``[b]``, ``P`` = (valid queries) * L.
      rate: float ``[b]``.

    Returns:
      float32 ``[b, k]`` in ``[0, 1]``.
    """
    c = tf.cast(collisions, tf.float64)
    P = tf.maximum(tf.cast(num_probes, tf.float64), 1.0)[:, None]
    r = tf.cast(tf.convert_to_tensor(rate), tf.float64)[:, None]
    a = tf.minimum(r * c / P, 1.0)
    p = -tf.math.expm1(P * tf.math.log1p(-a))
    return tf.cast(tf.clip_by_value(p, 0.0, 1.0), tf.float32)


# ----------------------------------------------------------------------------
# A hash family with its parameters.


class LshHashFamily:
    """``L`` tables of ``K`` SimHash or DWTA functions over ``input_dim``.

    Holds the parameters (SimHash projection or DWTA bins, drawn from
    ``seed`` unless given) and hashes dense or uniform-sparse vectors into
    bucket ids ``[n, L]`` in ``[0, num_buckets)``.

    Args:
      kind: ``"simhash"`` or ``"dwta"``.
      num_bits: K, hash functions per table (SimHash: bits per table).
      num_tables: L.
      input_dim: d (dense vectors) or e (input space of sparse vectors).
      seed: seed of the parameters and of DWTA's densification.
      bin_size: DWTA window w (power of two; ``log2 w`` bits per function).
      bucket_bits: cap on the bits of a bucket id (codes of
        ``K * bits_per_hash`` bits are folded by a mixing hash above it).
      params: optional parameters to use instead of drawing them
        (float32 ``[input_dim, K * L]`` or int32 ``[K * L, bin_size]``).

    Raises:
      ValueError: an unknown ``kind``, an argument out of range, or
        ``params`` of the wrong shape.

    >>> f = LshHashFamily("dwta", num_bits=3, num_tables=2, input_dim=16,
    ...                   bin_size=4)
    >>> f.num_buckets
    64
    """

    def __init__(self, kind: str, num_bits: int, num_tables: int,
                 input_dim: int, seed: int = 0, bin_size: int = 8,
                 bucket_bits: int = 16, params=None):
        if kind not in HASHES:
            raise ValueError(f"hash must be one of {HASHES}, got {kind!r}")
        self.kind = kind
        self.num_bits = int(num_bits)
        self.num_tables = int(num_tables)
        self.input_dim = int(input_dim)
        self.seed = int(seed)
        self.bin_size = int(bin_size)
        self.bucket_bits = int(bucket_bits)
        if min(self.num_bits, self.num_tables, self.input_dim) < 1:
            raise ValueError("num_bits, num_tables and input_dim must be >= 1")
        if not 1 <= self.bucket_bits <= 24:
            raise ValueError(f"bucket_bits must be in [1, 24], got {bucket_bits}")
        if kind == "simhash":
            self.bits_per_hash = 1
            shape = (self.input_dim, self.num_bits * self.num_tables)
            if params is None:
                params = simhash_projection(self.input_dim, self.num_bits,
                                            self.num_tables, self.seed)
            params = np.asarray(params, np.float32)
        else:
            w = self.bin_size
            if w < 2 or w > 256 or w & (w - 1):
                raise ValueError(
                    f"bin_size must be a power of two in [2, 256], got {w}")
            self.bits_per_hash = int(math.log2(w))
            shape = (self.num_bits * self.num_tables, w)
            if params is None:
                params = dwta_bins(self.input_dim, shape[0], w, self.seed)
            params = np.asarray(params, np.int32)
        if self.num_bits * self.bits_per_hash > 64:
            raise ValueError("num_bits * bits per hash must be <= 64, got "
                             f"{self.num_bits} * {self.bits_per_hash}")
        if params.shape != shape:
            raise ValueError(f"{kind} parameters must have shape {shape}, got "
                             f"{params.shape}")
        self.params = params

    @property
    def code_bits(self) -> int:
        """Bits of a table's raw meta-hash, ``K * bits_per_hash``."""
        return self.num_bits * self.bits_per_hash

    @property
    def num_buckets(self) -> int:
        """B = ``2 ** min(code_bits, bucket_bits)``."""
        return 2 ** min(self.code_bits, self.bucket_bits)

    def hash_dense(self, vectors, params=None):
        """int32 ``[n, L]`` codes of float32 ``[n, input_dim]`` vectors.

        SimHash without folding (``K <= bucket_bits``) goes through
        :func:`lsh_simhash_gemm` (one matrix product), the rest through the
        ops.

        Args:
          vectors: float32 ``[n, input_dim]``.
          params: parameters to use instead of ``self.params`` (e.g. a
            variable holding them), same shape and dtype.
        """
        params = self.params if params is None else params
        if self.kind == "simhash" and self.num_bits <= self.bucket_bits:
            return lsh_simhash_gemm(vectors, params, self.num_bits)
        if self.kind == "simhash":
            return lsh_simhash(vectors, params, self.num_bits,
                               self.bucket_bits)
        return lsh_dwta_hash(vectors, params, self.num_bits,
                             self.bucket_bits, self.seed)

    def hash_sparse(self, indices, weights, params=None):
        """int32 ``[n, L]`` codes of uniform-sparse vectors ``[n, s]``.

        Args:
          indices: int32 ``[n, s]`` in ``[0, input_dim)``.
          weights: float32 ``[n, s]``.
          params: as in :meth:`hash_dense`.
        """
        params = self.params if params is None else params
        if self.kind == "simhash":
            return lsh_simhash_sparse(indices, weights, params,
                                      self.num_bits, self.bucket_bits)
        return lsh_dwta_hash_sparse(indices, weights, params,
                                    self.input_dim, self.num_bits,
                                    self.bucket_bits, self.seed)

    def get_config(self) -> dict:
        """Constructor arguments without ``params`` (JSON-serialisable)."""
        return {"kind": self.kind, "num_bits": self.num_bits,
                "num_tables": self.num_tables, "input_dim": self.input_dim,
                "seed": self.seed, "bin_size": self.bin_size,
                "bucket_bits": self.bucket_bits}
