"""Synthetic XMC data with power-law label frequencies and a planted signal.

Generative model of :func:`make_synthetic` (all vectorised, memory
``O(num_instances * (labels_per_instance + features_per_instance) +
num_labels)`` -- never ``O(num_instances * num_labels)``):

1. **Label frequencies** follow a Zipf law: label ``l`` (0-based) is drawn
   with probability proportional to ``(l + 1) ** -power_law_exponent``, so
   label 0 is the most frequent ("head") and high ids are the rare "tail",
   as in real XMC data.
2. **Label sets**: instance ``i`` gets ``k_i = 1 + Poisson(
   labels_per_instance - 1)`` labels (at most ``num_labels``), drawn from
   that law without repeats (duplicates are redrawn a few rounds, so a row
   can end up with slightly fewer labels when the head is very heavy).
3. **Prototypes**: label ``l`` has a sparse prototype of ``prototype_size``
   feature ids, ``h(l, p) mod num_features`` for ``p < prototype_size``,
   where ``h`` is a seeded 64-bit hash (so no ``[num_labels, ...]`` table is
   stored).
4. **Features** (a bag of words): instance ``i`` has ``n_i = 1 + Poisson(
   features_per_instance - 1)`` tokens. Each token is noise with probability
   ``noise`` (a uniformly random feature id), otherwise it is a uniformly
   random prototype entry of a uniformly random label of the instance.
   Feature values are token counts (float32), like raw term frequencies;
   apply :func:`xmc_tf.data.normalize_features` for tf-idf / l2 rows.

Hence a linear one-vs-all model (or even ``X^T Y`` label centroids) can
recover the labels from the features; ``noise`` and ``prototype_size``
control the difficulty.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.dataset import XCDataset

__all__ = ["make_synthetic"]

_U64 = np.uint64


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised SplitMix64 finaliser on uint64 (wrap-around arithmetic)."""
    z = x + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


_BLOCK_ROWS = 1 << 16


def _sorted_unique(keys):
    """Sorted unique int64 keys and their counts (sort-based; faster here
    than ``np.unique``, which may take a slow hash path in NumPy 2)."""
    keys = np.sort(keys)
    if keys.size == 0:
        return keys, np.zeros(0, np.int64)
    first = np.empty(keys.size, bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return keys[starts], np.diff(starts, append=keys.size)


def _csr_from_sorted_keys(keys, values, num_rows, num_cols):
    """CSR from sorted unique ``row * num_cols + col`` int64 keys."""
    rows = keys // num_cols
    cols = (keys - rows * num_cols).astype(np.int32)
    indptr = np.zeros(num_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=indptr[1:])
    if indptr[-1] < 2**31:
        indptr = indptr.astype(np.int32)
    m = sp.csr_matrix((values, cols, indptr), shape=(num_rows, num_cols))
    m.has_sorted_indices = True
    m.has_canonical_format = True
    return m


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def make_synthetic(num_instances: int,
                   num_features: int,
                   num_labels: int,
                   *,
                   labels_per_instance: float = 5.0,
                   power_law_exponent: float = 1.0,
                   features_per_instance: float = 32.0,
                   noise: float = 0.1,
                   prototype_size: int | None = None,
                   seed: int = 0) -> XCDataset:
    """Generates a sparse multi-label data set with a learnable structure.

    See the module docstring for the generative model.

    Args:
      num_instances: ``N``, number of instances (rows).
      num_features: ``D``, feature dimension.
      num_labels: ``L``, number of labels; millions are fine (cost is
        ``O(L)`` for the Zipf table only).
      labels_per_instance: mean number of labels per instance (>= 1).
      power_law_exponent: Zipf exponent ``a >= 0`` of the label frequencies
        (0 = uniform; real XMC data sets are roughly 0.5-1.5).
      features_per_instance: mean number of feature tokens per instance
        (>= 1); the number of distinct non-zero features is a bit lower
        because repeated tokens are summed.
      noise: probability in ``[0, 1]`` that a token is a random feature
        instead of one of the instance's labels' prototype features.
      prototype_size: feature ids per label prototype; default
        ``max(2, ceil(features_per_instance / labels_per_instance))``.
      seed: seed of ``numpy.random.default_rng``; equal seeds give identical
        data sets.

    Returns:
      :class:`XCDataset` with float32 CSR ``features [N, D]`` (token counts,
      sorted indices) and float32 CSR ``labels [N, L]`` (1.0 entries, sorted
      indices, every instance has at least one label). Label 0 is the most
      frequent label.

    Raises:
      ValueError: an argument out of range.

    Example:
        >>> ds = make_synthetic(1000, 500, 100_000, seed=1)
        >>> ds.features.shape, ds.labels.shape
        ((1000, 500), (1000, 100000))
        >>> freq = ds.labels.sum(axis=0).A1
        >>> bool(freq[:10].mean() > 10 * freq[1000:2000].mean())
        True
    """
    n = _check_positive_int("num_instances", num_instances)
    d = _check_positive_int("num_features", num_features)
    num_l = _check_positive_int("num_labels", num_labels)
    if not labels_per_instance >= 1:
        raise ValueError(
            f"labels_per_instance must be >= 1, got {labels_per_instance}")
    if not features_per_instance >= 1:
        raise ValueError(f"features_per_instance must be >= 1, got "
                         f"{features_per_instance}")
    if not power_law_exponent >= 0:
        raise ValueError(
            f"power_law_exponent must be >= 0, got {power_law_exponent}")
    if not 0 <= noise <= 1:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    if prototype_size is None:
        prototype_size = max(
            2, int(np.ceil(features_per_instance / labels_per_instance)))
    psize = _check_positive_int("prototype_size", prototype_size)

    rng = np.random.default_rng(seed)
    hash_key = _U64(rng.integers(0, 2**63 - 1, dtype=np.int64))

    # 1. Zipf CDF over label ids (float64, O(L)).
    cdf = np.cumsum(np.arange(1, num_l + 1, dtype=np.float64)
                    **(-float(power_law_exponent)))
    cdf /= cdf[-1]

    def draw_labels(size):
        out = np.searchsorted(cdf, rng.random(size), side="right")
        return np.minimum(out, num_l - 1).astype(np.int32)

    # 2. Label sets without repeats: dedupe (row, label) keys, redraw.
    k = np.minimum(1 + rng.poisson(labels_per_instance - 1, size=n), num_l)
    keys = np.zeros(0, np.int64)
    deficit = k
    for _ in range(12):
        extra_rows = np.repeat(np.arange(n, dtype=np.int64), deficit)
        keys, _ = _sorted_unique(np.concatenate(
            [keys, extra_rows * num_l + draw_labels(extra_rows.size)]))
        deficit = k - np.bincount(keys // num_l, minlength=n)
        if not deficit.any():
            break
    y = _csr_from_sorted_keys(keys, np.ones(keys.size, np.float32), n, num_l)
    del keys

    # 4. Feature tokens, in blocks of rows to bound temporary memory.
    ntok = 1 + rng.poisson(features_per_instance - 1, size=n)
    nlab = np.diff(y.indptr).astype(np.int64)
    x_keys, x_vals = [], []
    for r0 in range(0, n, _BLOCK_ROWS):
        r1 = min(n, r0 + _BLOCK_ROWS)
        tok_rows = np.repeat(np.arange(r0, r1, dtype=np.int64), ntok[r0:r1])
        is_noise = rng.random(tok_rows.size) < noise
        feat = np.empty(tok_rows.size, np.int64)
        feat[is_noise] = rng.integers(0, d, size=int(is_noise.sum()))
        sig_rows = tok_rows[~is_noise]
        pick = (rng.random(sig_rows.size) * nlab[sig_rows]).astype(np.int64)
        pick = np.minimum(pick, nlab[sig_rows] - 1)
        lab = y.indices[y.indptr[sig_rows] + pick].astype(np.uint64)
        pos = rng.integers(0, psize, size=sig_rows.size).astype(np.uint64)
        # 3. Prototype entry (label, position) -> feature id (seeded hash).
        h = _splitmix64((lab * _U64(psize) + pos) ^ hash_key)
        feat[~is_noise] = (h % _U64(d)).astype(np.int64)
        del sig_rows, pick, lab, pos, h, is_noise
        uniq, counts = _sorted_unique(tok_rows * d + feat)
        x_keys.append(uniq)
        x_vals.append(counts.astype(np.float32))
    x = _csr_from_sorted_keys(np.concatenate(x_keys), np.concatenate(x_vals),
                              n, d)
    return XCDataset(features=x, labels=y)
