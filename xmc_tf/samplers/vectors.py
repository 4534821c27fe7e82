"""Label vectors of a head layer, for inner-product (MIPS) indexes.

An ANN index over the classifier weights (ASTRA, Mehta et al., Sec. 3.1,
Idea 1: "build ANNS-indices on classifier weights") needs, for every label
``l``, a dense vector ``v_l`` and, for every instance, a query vector ``u``
such that ``<u, v_l>`` equals (or approximates) the head's score of ``l``.
:func:`label_vectors` defines both for the two head layouts of xmc_tf:

* **Label-major dense head** (``xmc_tf.layers.LabelDense``: ``kernel``
  ``[m, d]``, ``bias`` ``[m]``): ``v_l = [kernel[l], bias[l]]`` and
  ``u = [x, 1]``, so ``<u, v_l> = x . kernel[l] + bias[l]``, exactly the
  score.
* **Uniform-sparse head** (:class:`xmc_tf.layers.UniformSparseDense`:
  ``indices`` int32 ``[m, s]``, ``kernel`` ``[m, s]``, ``bias`` ``[m]``,
  input width ``e = num_features``): label ``l`` is the e-dimensional vector
  ``w_l`` with ``kernel[l, k]`` at coordinate ``indices[l, k]`` (s non-zeros
  out of e).  Two encodings:

  - *scatter* (exact): ``v_l = [w_l, bias[l]]`` densified, ``[m, e + 1]``
    float32.  Used when ``m * (e + 1) * 4`` bytes fits ``max_bytes`` and
    the search stays cheap (``m * (e + 1) <= MAX_EXACT_ENTRIES``).
  - *projection* (approximate, the default beyond the budget): a matrix
    ``R`` ``[e, p]``, ``v_l = [R^T w_l, bias[l]]`` and ``u = [R^T x, 1]``.
    ``R^T w_l = sum_k kernel[l, k] * R[indices[l, k]]`` is computed from the
    s non-zeros in row chunks, so the ``[m, e]`` matrix is never formed
    (memory ``O(chunk * s * p)``).  The bias coordinate stays exact.  ``R``
    is either

    * the top-p principal directions of a sample of head inputs
      (``queries=``; uncentred, by a randomized SVD): then ``<u, v_l> =
      <x, B B^T w_l>`` is exact for the part of ``x`` inside the subspace,
      which holds most of the energy of real intermediate representations;
    * or, without queries, a fixed Gaussian matrix with i.i.d. ``N(0, 1/p)``
      entries drawn from ``seed`` (Johnson-Lindenstrauss): ``E[<R^T x,
      R^T w_l>] = <x, w_l>``, but one score's error has standard deviation
      about ``|x| |w_l| / sqrt(p)``, which is of the order of the score
      differences that decide the top-k.

    Measured recall@10 of the exact top-10 (tests/test_samplers.py,
    m = 3000, e = 256, s = 16, clustered ReLU inputs, p = 64): 1.0 scattered,
    ~0.8 with the query basis, ~0.2 with the Gaussian one.
    ``benchmarks/ann_index.py`` (m = 100k, e = 4096, s = 32, p = 128, exact
    search): recall@50 0.83 with the query basis, 0.015 Gaussian.

  The dense head can be projected the same way (``projection=p``) when its
  ``d`` is large.  The projection is the same linear map for labels and
  queries; a query basis changes at every refresh, together with the index.

Heads without a bias (``use_bias=False``) get no extra coordinate.

The vectors depend on the head's weights *and* (uniform-sparse head) on its
connections, which :class:`xmc_tf.callbacks.SetRewiring` changes: an index
built from them is stale until it is rebuilt (see
:class:`xmc_tf.callbacks.RefreshIndex`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from xmc_tf.layers.scorer import label_layout, scatter_label_rows

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_PROJECTION_DIM", "MAX_EXACT_ENTRIES",
           "QueryTransform",
           "gaussian_projection", "label_vectors", "projection_dim",
           "query_basis"]

#: Budget of the exact (scatter) encoding of a uniform-sparse head: 1 GiB.
DEFAULT_MAX_BYTES = 1 << 30
#: Width p of the random projection chosen by ``projection="auto"``.
DEFAULT_PROJECTION_DIM = 128
#: ``projection="auto"`` projects label spaces with more than this many
#: entries ``m * (e + 1)`` (2^24: e.g. 4,096 labels of a 4,096-wide head):
#: a search then scans ``m * (e + 1)`` floats per query, and an IVF index
#: over 50k labels of width 4,097 took 0.32 s per batch of 64 queries on 2
#: cores (ManNextWord, 188 s per epoch against 38 s without hard negatives);
#: at width 129 the scan is 32x smaller.
MAX_EXACT_ENTRIES = 1 << 24
# Rows per chunk of the sparse x dense projection (bounds the [chunk, s, p]
# gather to a few tens of MB).
_CHUNK = 8192


def _numpy(variable):
    if variable is None:
        return None
    if hasattr(variable, "numpy"):
        return np.asarray(variable.numpy())
    return np.asarray(variable)


def gaussian_projection(num_inputs: int, dim: int, seed: int) -> np.ndarray:
    """The fixed projection matrix ``R`` of :func:`label_vectors`.

    Args:
      num_inputs: e, rows (the head's input width).
      dim: p, columns (>= 1).
      seed: int seed of ``numpy.random.default_rng``.

    Returns:
      float32 ``[num_inputs, dim]`` with i.i.d. ``N(0, 1/dim)`` entries, so
      ``E[R R^T] = I`` and projected inner products are unbiased.

    Raises:
      ValueError: ``dim < 1``.

    >>> gaussian_projection(5, 3, seed=0).shape
    (5, 3)
    """
    if int(dim) < 1:
        raise ValueError(f"projection dim must be >= 1, got {dim}")
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((num_inputs, dim), dtype=np.float32)
            / np.float32(np.sqrt(dim)))


def query_basis(queries, dim: int, seed: int, power_iterations: int = 3):
    """Top-``dim`` right singular vectors of a sample of head inputs.

    Randomized SVD (Halko, Martinsson & Tropp 2011, Alg. 4.4: range finder
    with power iterations) of the uncentred ``[n, e]`` sample, cost
    ``O(n e (dim + 10))`` per iteration instead of ``O(n e^2)``.

    Args:
      queries: float ``[n, e]`` sample, ``n >= dim``.
      dim: p, number of directions (``1 <= p <= e``).
      seed: seed of the random start.
      power_iterations: subspace iterations (3 is plenty for decaying
        spectra).

    Returns:
      float32 ``[e, p]`` with orthonormal columns, ordered by decreasing
      singular value.

    Raises:
      ValueError: ``queries`` not 2-D, ``n < dim`` or ``dim > e``.

    >>> x = np.outer(np.arange(1.0, 9.0), [1.0, 0.0, 0.0])
    >>> abs(query_basis(x, 1, seed=0)[:, 0]).round(3).tolist()
    [1.0, 0.0, 0.0]
    """
    x = np.asarray(queries, np.float32)
    if x.ndim != 2 or not 1 <= dim <= x.shape[1] or x.shape[0] < dim:
        raise ValueError(f"need a [n >= {dim}, e >= {dim}] query sample, got "
                         f"shape {x.shape}")
    width = min(x.shape[1], dim + 10)
    rng = np.random.default_rng(seed)
    y = x.T @ (x @ rng.standard_normal((x.shape[1], width), dtype=np.float32))
    for _ in range(power_iterations):
        y = x.T @ (x @ _orthonormal_columns(y))
    q = _orthonormal_columns(y)                            # [e, width]
    # The QR and SVD run in TensorFlow (Eigen), not NumPy's LAPACK: in a
    # process that has loaded TensorFlow, OpenBLAS' threaded QR / SVD of
    # these tall matrices took 0.2-0.5 s a call on 2 cores (40-100x their
    # single-threaded time), which made the index refresh of the shared
    # ASTRA head cost seconds (issue 31).
    _, _, v = tf.linalg.svd(x @ q, full_matrices=False)   # [width, width]
    return np.ascontiguousarray(q @ v.numpy()[:, :dim], dtype=np.float32)


def _orthonormal_columns(y: np.ndarray) -> np.ndarray:
    """Q of the thin QR of float32 ``[e, w]`` (Householder, TensorFlow)."""
    return tf.linalg.qr(y, full_matrices=False).q.numpy()


@dataclasses.dataclass
class QueryTransform:
    """Maps head inputs to index queries: ``u = [x @ matrix, 1]``.

    Attributes:
      input_dim: e (or d), the width of the head's input ``x``.
      matrix: float32 ``[input_dim, p]`` projection, or None (identity).
      append_one: whether a constant-1 coordinate is appended (the bias
        coordinate of the label vectors).
    """

    input_dim: int
    matrix: np.ndarray | None = None
    append_one: bool = True

    @property
    def output_dim(self) -> int:
        """Width of the query vectors (= width of the label vectors)."""
        base = self.input_dim if self.matrix is None else self.matrix.shape[1]
        return int(base) + int(self.append_one)

    def __call__(self, queries) -> np.ndarray:
        """Transforms a batch of head inputs.

        Args:
          queries: float ``[b, input_dim]``.

        Returns:
          C-contiguous float32 ``[b, output_dim]`` (what faiss wants).

        Raises:
          ValueError: ``queries`` is not ``[b, input_dim]``.
        """
        x = np.asarray(queries, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ValueError(f"queries must be [batch, {self.input_dim}], got "
                             f"shape {x.shape}")
        if self.matrix is not None:
            x = x @ self.matrix
        if self.append_one:
            x = np.concatenate([x, np.ones((x.shape[0], 1), np.float32)], 1)
        return np.ascontiguousarray(x, dtype=np.float32)


def _resolve_projection(projection, num_labels, width, max_bytes):
    if projection == "auto":
        entries = int(num_labels) * int(width)
        exact = (entries * 4 <= max_bytes and (
            entries <= MAX_EXACT_ENTRIES or width <= DEFAULT_PROJECTION_DIM))
        return None if exact else DEFAULT_PROJECTION_DIM
    if projection in (None, "none"):
        return None
    if isinstance(projection, (int, np.integer)) and int(projection) >= 1:
        return int(projection)
    raise ValueError(f"projection must be 'auto', 'none' or an int >= 1, got "
                     f"{projection!r}")


def projection_dim(layer, projection="auto", max_bytes=DEFAULT_MAX_BYTES):
    """The projection width :func:`label_vectors` would use, None = exact.

    Args:
      layer, projection, max_bytes: as for :func:`label_vectors`.

    Returns:
      int p, or None for the exact encoding.

    Raises:
      ValueError: as :func:`label_vectors`.
    """
    layout = _layout(layer)
    return _resolve_projection(projection, layout.num_labels,
                               layout.input_dim + int(layout.bias is not None),
                               max_bytes)


def _layout(layer):
    """The layer's label-major :class:`~xmc_tf.layers.scorer.LabelLayout`."""
    try:
        layout = label_layout(layer)
    except ValueError:
        layout = None
    if layout is None or layout.feature_major:
        raise ValueError(f"{type(layer).__name__} is not a built head layer "
                         "with a label-major [num_labels, *] kernel")
    return layout


def label_vectors(layer, projection="auto", max_bytes=DEFAULT_MAX_BYTES,
                  seed=0, queries=None):
    """Dense label vectors of a head layer and the matching query transform.

    See the module docstring for the encodings.  For every label ``l`` and
    head input ``x``: ``transform(x) @ vectors[l] == score(x, l)`` exactly
    without projection (up to float32 rounding), approximately with it.

    Args:
      layer: a built head layer whose
        :func:`~xmc_tf.layers.scorer.label_layout` is label-major: a
        :class:`~xmc_tf.layers.scorer.LabelScorer`
        (:class:`xmc_tf.layers.UniformSparseDense`: sparse connections;
        :class:`xmc_tf.layers.LabelDense`: rows) or another layer with a
        label-major ``kernel`` ``[m, d]`` (and ``bias`` ``[m]`` or None).
      projection: ``"auto"`` (exact -- the scattered uniform-sparse
        vectors or the dense kernel rows -- when the ``m * (e + 1)``
        entries fit ``max_bytes`` and are at most :data:`MAX_EXACT_ENTRIES`
        or ``e + 1 <= 128``, else a projection to
        ``DEFAULT_PROJECTION_DIM`` = 128), ``"none"`` (always exact) or an
        int p (always project to p dimensions).
      max_bytes: memory budget of the exact encoding, bytes.
      seed: seed of the Gaussian projection / of the randomized SVD.
      queries: optional float ``[n, e]`` sample of head inputs; when
        projecting and ``n >= p``, the projection is their top-p principal
        subspace (:func:`query_basis`) instead of a Gaussian matrix.

    Returns:
      ``(vectors, transform)``: C-contiguous float32 ``[m, d']`` and a
      :class:`QueryTransform` with ``output_dim == d'``.

    Raises:
      ValueError: the layer is not built, has no label-major layout
        (:func:`xmc_tf.layers.scorer.label_layout`), or ``projection`` is
        invalid.

    >>> import keras, xmc_tf
    >>> head = xmc_tf.layers.UniformSparseDense(6, 2, seed=0)
    >>> _ = head(keras.ops.ones((1, 4)))
    >>> v, t = label_vectors(head)
    >>> v.shape, t.output_dim       # e + 1 = 5 (bias coordinate)
    ((6, 5), 5)
    """
    layout = _layout(layer)
    kernel = _numpy(layout.kernel).astype(np.float32, copy=False)
    bias = _numpy(layout.bias)
    has_bias = bias is not None
    m = kernel.shape[0]
    if layout.sparse:
        indices = _numpy(layout.indices).astype(np.int64, copy=False)
        e = int(layout.input_dim)
        if indices.shape != kernel.shape:
            raise ValueError(f"indices {indices.shape} and kernel "
                             f"{kernel.shape} differ in shape")
    else:
        indices, e = None, kernel.shape[1]
    dim = _resolve_projection(projection, m, e + int(has_bias), max_bytes)
    if queries is not None:
        queries = np.asarray(queries, np.float32)
        if queries.ndim != 2 or queries.shape[1] != e:
            raise ValueError(f"queries must be [n, {e}], got {queries.shape}")
    width = (e if dim is None else dim) + int(has_bias)
    vectors = np.zeros((m, width), np.float32)
    matrix = None
    if dim is None:
        if indices is None:
            vectors[:, :e] = kernel
        else:
            scatter_label_rows(indices, kernel, e, out=vectors)
    else:
        if queries is not None and len(queries) >= dim and dim <= e:
            matrix = query_basis(queries, dim, seed)
        else:
            matrix = gaussian_projection(e, dim, seed)
        for start in range(0, m, _CHUNK):
            stop = min(m, start + _CHUNK)
            if indices is None:
                vectors[start:stop, :dim] = kernel[start:stop] @ matrix
            else:
                gathered = matrix[indices[start:stop]]  # [c, s, p]
                vectors[start:stop, :dim] = np.einsum(
                    "cs,csp->cp", kernel[start:stop], gathered)
    if has_bias:
        vectors[:, -1] = bias.astype(np.float32, copy=False)
    transform = QueryTransform(input_dim=e, matrix=matrix, append_one=has_bias)
    return vectors, transform
