"""Python wrappers and gradients of the uniform-sparse ops.

Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces -- Learning with 500k Labels on a Single
Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.
`uniform_sparse_matmul_sparse_input` applies the same layer to a sparse input
batch through the inverted index of its connections.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.ops import _loader


def uniform_sparse_matmul(features, indices, weights, name=None):
    """Scores of a uniformly sparse output layer (Algorithm 1).

    ``scores[i, j] = sum_k features[i, indices[j, k]] * weights[j, k]``: every
    label ``j`` has exactly ``fan_in`` incoming connections.

    The connection matrices are label-major, ``[num_labels, fan_in]`` (the
    paper's Fig. 1c stores the transpose): one label's connections are
    contiguous, so a CPU thread reads them in one cache line and a GPU warp in
    one coalesced load, SET rewiring operates on rows, and the matrices shard
    by label.  Storage is 8 bytes per structural non-zero (int32 index and
    float32 weight), against 20 for a ``tf.SparseTensor`` (two int64 indices).

    The gradients skip zero entries of the back-propagated signal without
    reading the operands they would multiply (Sec. 3.3, implicit negative
    mining): with the squared hinge most entries are zero.

    Args:
      features: ``[batch, num_features]`` float32, float16 or bfloat16.
      indices: ``[num_labels, fan_in]`` int32, entries in
        ``[0, num_features)``.
      weights: ``[num_labels, fan_in]``, same dtype as ``features``.
      name: optional op name.

    Returns:
      ``[batch, num_labels]`` scores, dtype of ``features`` (accumulated in
      float32).

    Raises:
      tf.errors.InvalidArgumentError: an operand is not a matrix, ``weights``
        and ``indices`` differ in shape, or an index is out of range (the
        message names the entry, e.g. ``indices[3, 7] = 600``).
      xmc_tf.errors.OpLibraryError: the op library is missing or was built for
        another TensorFlow.

    >>> import numpy as np, xmc_tf
    >>> x = np.array([[1., 2., 3.]], np.float32)
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)      # 2 labels, fan-in 2
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> xmc_tf.ops.uniform_sparse_matmul(x, idx, w).numpy()
    array([[4., 2.]], dtype=float32)
    """
    return _loader.load().xmc_uniform_sparse_matmul(
        features=features, indices=indices, weights=weights, name=name)


@tf.RegisterGradient("Xmc>UniformSparseMatmul")
def _uniform_sparse_matmul_grad(op, grad):
    """Gradients w.r.t. features (Algorithm 2) and weights (Algorithm 3),
    from one pass over ``grad`` (``Xmc>UniformSparseMatmulGrad``)."""
    features, indices, weights = op.inputs
    grad_features, grad_weights = _loader.load().xmc_uniform_sparse_matmul_grad(
        backward=grad, features=features, indices=indices, weights=weights)
    return grad_features, None, grad_weights


_INT32_MAX = 2**31 - 1


def uniform_sparse_inverted_index(indices, num_features, name=None):
    """Inverted index (CSR of the transpose) of uniform-sparse connections.

    A counting sort of the flat positions ``p = j * s + k`` by their feature
    ``indices[j, k]``: the positions connected to feature ``f`` are
    ``entries[offsets[f]:offsets[f + 1]]``, in increasing ``p`` (label ``p //
    s``).  ``O(m s + D)`` time and memory, multi-threaded.  The index depends
    on ``indices`` only: a caller whose connections rarely change (SET
    rewiring) can keep it and pass it to `uniform_sparse_matmul_sparse_input`.

    Args:
      indices: ``[m, s]`` int32, entries in ``[0, num_features)``.
      num_features: int or scalar int64 tensor ``D >= 0``.
      name: optional op name.

    Returns:
      ``(offsets, entries)``: ``[D + 1]`` int64 and ``[m s]`` int32 (int64
      when ``m s`` does not fit int32 or is not statically known).

    Raises:
      tf.errors.InvalidArgumentError: an index out of ``[0, D)`` (the message
        names the entry, e.g. ``indices[3, 7] = 600``) or ``D < 0``.

    >>> import numpy as np, xmc_tf
    >>> offsets, entries = xmc_tf.ops.uniform_sparse_inverted_index(
    ...     np.array([[0, 2], [1, 1]], np.int32), 3)
    >>> offsets.numpy().tolist(), entries.numpy().tolist()
    ([0, 1, 3, 4], [0, 2, 3, 1])
    """
    indices = tf.convert_to_tensor(indices, tf.int32)
    num_connections = indices.shape.num_elements()
    narrow = num_connections is not None and num_connections <= _INT32_MAX
    return _loader.load().xmc_uniform_sparse_inverted_index(
        indices=indices, num_features=tf.cast(num_features, tf.int64),
        Tidx=tf.int32 if narrow else tf.int64, name=name)


def uniform_sparse_matmul_sparse_input(sp_input, indices, weights, name=None,
                                       inverted_index=None):
    """Uniform-sparse layer scores on a sparse input batch (no densifying).

    The same scores as ``uniform_sparse_matmul(tf.sparse.to_dense(sp_input),
    indices, weights)`` (up to float32 rounding), for the layer used as a
    per-label sparse linear classifier directly on sparse (tf-idf) input
    features: ``scores[i, j] = sum_k x[i, indices[j, k]] * weights[j, k]``.

    Instead of gathering ``x[i, indices[j, k]]`` for every label (``b * m *
    s`` multiply-adds, nearly all against zeros), the connections are
    traversed feature by feature: ``Xmc>UniformSparseInvertedIndex`` sorts
    the flat positions ``p = j * s + k`` by feature (CSR of the transposed
    connection matrix, ``O(m s + D)``), and
    ``Xmc>UniformSparseMatmulSparseInput`` adds ``v * weights_flat[p]`` to
    ``scores[i, p // s]`` for every stored entry ``(i, f, v)`` and every
    position ``p`` connected to ``f``.  Cost: ``O(b m)`` to zero the output
    plus one multiply-add per (stored entry, connected position) pair, about
    ``nnz * m * s / D``; no ``[b, D]`` dense batch is materialised.  The
    gradient w.r.t. ``weights``
    (``Xmc>UniformSparseMatmulSparseInputGradWeights``) groups the batch's
    entries by feature and costs the same; there is no gradient w.r.t. the
    input (``sp_input`` is data: its gradient is ``None``), nor w.r.t.
    ``indices``.

    Repeated ``(i, f)`` entries of ``sp_input`` add up (``tf.sparse.to_dense``
    would reject them); the order of the entries does not matter.  Only
    stored entries form products: an inf/NaN weight reaches only the rows
    that store a value (even an explicit 0) for its feature, where the dense
    path would spread ``0 * inf = NaN`` to every row.

    float32 only.  CPU kernels only: under a GPU device scope TensorFlow
    places these ops on the CPU (soft placement).  Source: Schultheis &
    Babbar's uniform-sparse layer (Sec. 3.1-3.3), applied to sparse inputs
    with the transposed (inverted) traversal.

    Args:
      sp_input: ``tf.SparseTensor`` ``[b, D]`` float32, the input batch.
      indices: ``[m, s]`` int32, entries in ``[0, D)``.
      weights: ``[m, s]`` float32.
      name: optional name scope.
      inverted_index: optional ``(offsets, entries)`` of ``indices`` from
        `uniform_sparse_inverted_index` with ``D`` features (e.g. kept while
        the connections do not change: building it is a sort of the ``m s``
        connections, often the largest part of the op's time); built from
        ``indices`` when None.

    Returns:
      ``[b, m]`` float32 scores.

    Raises:
      tf.errors.InvalidArgumentError: an index out of ``[0, D)`` (the
        message names the entry, e.g. ``indices[3, 7] = 600``), a
        ``sp_input`` entry whose row or column is out of range, ``weights``
        and ``indices`` of different shapes not known statically, or a
        non-float32 dtype (from the ops' type attributes; in graph
        construction this surfaces as a ``TypeError`` instead).
      ValueError: ``weights`` and ``indices`` of statically different
        shapes, or ``sp_input`` not of rank 2.
      xmc_tf.errors.OpLibraryError: the op library is missing or was built for
        another TensorFlow.

    >>> import numpy as np, tensorflow as tf, xmc_tf
    >>> x = tf.sparse.from_dense(np.array([[1., 0., 3.]], np.float32))
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)      # 2 labels, fan-in 2
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> xmc_tf.ops.uniform_sparse_matmul_sparse_input(x, idx, w).numpy()
    array([[4., 0.]], dtype=float32)
    """
    with tf.name_scope(name or "uniform_sparse_matmul_sparse_input"):
        lib = _loader.load()
        if not isinstance(sp_input, tf.SparseTensor):
            sp_input = tf.SparseTensor.from_value(sp_input)
        if sp_input.shape.rank not in (None, 2):
            raise ValueError("sp_input must be a [batch, num_features] "
                             f"SparseTensor, got shape {sp_input.shape}")
        weights = tf.convert_to_tensor(weights)
        indices = tf.convert_to_tensor(indices, tf.int32)
        # The ops see only m * s through the index: check [m, s] here.
        if not indices.shape.is_compatible_with(weights.shape):
            raise ValueError(f"weights shape {weights.shape} must equal "
                             f"indices shape {indices.shape} ([m, s])")
        if not (indices.shape.is_fully_defined() and
                weights.shape.is_fully_defined()):
            with tf.control_dependencies([tf.debugging.assert_equal(
                    tf.shape(indices), tf.shape(weights),
                    message="weights shape must equal indices shape")]):
                weights = tf.identity(weights)
        dense_shape = tf.cast(sp_input.dense_shape, tf.int64)
        if inverted_index is None:
            inverted_index = uniform_sparse_inverted_index(indices,
                                                           dense_shape[-1])
        offsets, entries = inverted_index
        coords = tf.cast(sp_input.indices, tf.int64)
        scores = lib.xmc_uniform_sparse_matmul_sparse_input(
            rows=coords[:, 0], cols=coords[:, 1], values=sp_input.values,
            batch_size=dense_shape[0], offsets=offsets, entries=entries,
            weights=weights)
        if sp_input.shape.rank == 2:
            scores.set_shape([sp_input.shape[0], None])
        return scores


tf.no_gradient("Xmc>UniformSparseInvertedIndex")


@tf.RegisterGradient("Xmc>UniformSparseMatmulSparseInput")
def _uniform_sparse_matmul_sparse_input_grad(op, grad):
    """Gradient w.r.t. weights only; rows, cols and values are input data,
    batch_size and the inverted index integers: all None."""
    rows, cols, values, _, offsets, entries, weights = op.inputs
    lib = _loader.load()
    grad_weights = lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
        backward=grad, rows=rows, cols=cols, values=values, offsets=offsets,
        entries=entries, weights=weights)
    return None, None, None, None, None, None, grad_weights


tf.no_gradient("Xmc>SetRewire")


def set_rewire_supported() -> bool:
    """Whether the op library has ``Xmc>SetRewire``.

    Returns:
      bool; False when the library is missing, stale or lacks the op.
    """
    try:
        return hasattr(_loader.load(), "xmc_set_rewire")
    except Exception:  # OpLibraryError, or a library that fails to load
        return False


def set_rewire(indices, weights, num_moved, num_features, seed, name=None):
    """One SET prune/regrow step of uniform-sparse connections (op).

    Per label ``j``: the ``num_moved`` connections of smallest
    ``|weights[j, k]|`` (ties: lower ``k`` first; NaN counts as larger
    than every number) are removed and as many sources are drawn uniformly,
    distinct, among those the label was not connected to before (when
    ``num_features - fan_in >= num_moved``), else among those it is not
    connected to after the removal: the contract of
    :func:`xmc_tf.callbacks.rewiring.rewire`, in one multi-threaded pass of
    ``O(num_labels * fan_in)`` (op ``Xmc>SetRewire``).  The draws depend on
    ``seed`` only (a counter-based generator keyed by seed and label), not
    on the number of threads.  CPU only.

    Source: Mocanu et al., SET (Nature Communications 2018), applied to the
    output layer by Schultheis & Babbar, Sec. 2 and 4.1.

    Args:
      indices: ``[m, s]`` int32, entries in ``[0, num_features)``.
      weights: ``[m, s]`` float32.
      num_moved: int ``n``, ``0 <= n <= s`` (an op attribute).
      num_features: int ``e``, ``s <= e < 2^31``.
      seed: two int64 values.
      name: optional op name.

    Returns:
      ``(new_indices, positions)``: ``[m, s]`` int32 (``indices`` with the
      moved positions replaced) and ``[m, n]`` int64 (the moved positions,
      sorted per row).

    Raises:
      tf.errors.InvalidArgumentError: shapes, an index out of range (the
        message names the entry), ``n > s`` or ``e < s``.
      xmc_tf.errors.OpLibraryError: the op library is missing or stale.

    >>> import numpy as np, xmc_tf
    >>> new, pos = xmc_tf.ops.uniform_sparse.set_rewire(
    ...     np.array([[0, 1, 2]], np.int32), np.array([[0.5, -0.1, 2.0]],
    ...     np.float32), 1, 10, [1, 2])
    >>> pos.numpy().tolist(), int(new[0, 1]) not in (0, 1, 2)
    ([[1]], True)
    """
    return _loader.load().xmc_set_rewire(
        indices=tf.convert_to_tensor(indices, tf.int32),
        weights=tf.convert_to_tensor(weights, tf.float32),
        num_features=tf.cast(num_features, tf.int64),
        seed=tf.cast(tf.convert_to_tensor(seed), tf.int64),
        num_moved=int(num_moved), name=name)
