"""Uniform-sparse scores of per-instance candidates on a sparse batch.

Op family ``ops/sparse_candidates/``: ``Xmc>SparseInputSampledMatmul``
scores, for each instance of a sparse batch, the ``C`` candidate labels of
a uniform-sparse layer applied to the sparse features directly (the label
centroids, the job's wide path), at ``nnz + C * s`` per instance: no
``[batch, num_features]`` batch, no ``[batch, num_labels]`` scores.
Inside ``xmc_tf.ops.stock.stock_ops(formulations=True)`` (portable
SavedModels) it traces as :func:`sparse_input_sampled_matmul_stock`
(binary searches of the batch's sorted keys, :mod:`xmc_tf.ops.pairs`).
Inference only: the op has no gradient.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock
from xmc_tf.ops.pairs import lookup, sparse_keys

__all__ = ["sparse_input_sampled_matmul",
           "sparse_input_sampled_matmul_stock"]

tf.no_gradient("Xmc>SparseInputSampledMatmul")


def _ops():
    lib = _loader.load()
    if not hasattr(lib, "xmc_sparse_input_sampled_matmul"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>SparseInputSampledMatmul op"
            " (built before ops/sparse_candidates/ existed): rebuild the op "
            "library (`pip install .` or tools/build_ops.py)")
    return lib


def sparse_input_sampled_matmul(sp_input: tf.SparseTensor, connections,
                                weights, candidates):
    """``scores[i, j] = sum_k x_i[connections[r, k]] * weights[r, k]`` with
    ``r = candidates[i, j]``, ``x_i`` row ``i`` of ``sp_input`` (repeated
    entries add up).

    Args:
      sp_input: ``tf.SparseTensor`` float32 ``[batch, D]``, entries in any
        order.
      connections: int32 ``[m, s]`` feature ids in ``[0, D)``.
      weights: float32 ``[m, s]`` (a tensor or a variable's value).
      candidates: int32 ``[batch, C]`` label ids in ``[0, m)``.

    Returns:
      float32 ``[batch, C]``.

    Raises:
      tf.errors.InvalidArgumentError: a candidate, feature or connection
        id out of range, or shapes that disagree.
      xmc_tf.errors.OpLibraryError: the op library lacks the op.
    """
    if stock.stock_formulations():
        return sparse_input_sampled_matmul_stock(sp_input, connections,
                                                 weights, candidates)
    return _ops().xmc_sparse_input_sampled_matmul(
        tf.cast(sp_input.indices, tf.int64),
        tf.cast(sp_input.values, tf.float32),
        tf.cast(sp_input.dense_shape, tf.int64),
        tf.cast(connections, tf.int32), tf.cast(weights, tf.float32),
        tf.cast(candidates, tf.int32))


def sparse_input_sampled_matmul_stock(sp_input, connections, weights,
                                      candidates):
    """:func:`sparse_input_sampled_matmul` in TensorFlow's ops: each
    candidate's connections looked up among the row's stored entries (a
    binary search of the batch's sorted ``(row, feature)`` keys), ``O(batch
    * C * s * log nnz)``.  Candidates are not range-checked here (the
    caller does); a connection outside the batch's width reads 0."""
    keys, values = sparse_keys(sp_input)
    candidates = tf.cast(candidates, tf.int32)
    cols = tf.cast(tf.gather(connections, candidates), tf.int64)
    rows = tf.gather(tf.cast(weights, tf.float32), candidates)
    batch = tf.range(tf.shape(candidates, out_type=tf.int64)[0])
    width = tf.cast(sp_input.dense_shape[1], tf.int64)
    x = lookup(keys, tf.cast(values, tf.float32),
               batch[:, None, None] * width + cols)
    return tf.reduce_sum(x * rows, axis=-1)
