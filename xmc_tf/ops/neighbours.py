"""The k nearest stored instances of sparse queries over an inverted index.

Op family ``ops/neighbours/``: ``Xmc>NearestNeighbours`` sums, per query,
the products of its entries with the postings of their features (the
stored instances feature-major, CSR ``[D, n]``) and keeps the ``k``
largest positive dot products (ties: the lower instance id), one thread
per query.  :class:`xmc_tf.layers.NearestNeighbourScores` holds the index.
Inside ``xmc_tf.ops.stock.stock_ops(formulations=True)`` (portable
SavedModels) it traces as :func:`nearest_neighbours_stock`, TensorFlow's
ops with the op's order.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

__all__ = ["nearest_neighbours", "nearest_neighbours_stock"]

tf.no_gradient("Xmc>NearestNeighbours")


def _ops():
    lib = _loader.load()
    if not hasattr(lib, "xmc_nearest_neighbours"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>NearestNeighbours op (built "
            "before ops/neighbours/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


def nearest_neighbours(sp_input: tf.SparseTensor, indptr, instances, values,
                       num_instances: int, k: int):
    """The ``k`` stored instances of largest positive dot product with each
    query.

    Args:
      sp_input: ``tf.SparseTensor`` float32 ``[batch, D]`` (entries in any
        order; repeats add up).
      indptr: int64 ``[D + 1]``, instances: int32 ``[E]``, values: float32
        ``[E]`` -- the stored instances feature-major (CSR ``[D, n]``).
      num_instances: ``n``.
      k: neighbours per query (>= 1).

    Returns:
      ``(neighbours int32 [batch, k], similarities float32 [batch, k])``,
      best first (ties: the lower instance id); -1 / 0 where fewer than
      ``k`` instances have a positive dot product.

    Raises:
      tf.errors.InvalidArgumentError: a feature id outside ``[0, D)``, a
        batch whose width is not ``D``, or an index entry out of range.
      xmc_tf.errors.OpLibraryError: the op library lacks the op.
    """
    if stock.stock_formulations():
        return nearest_neighbours_stock(sp_input, indptr, instances, values,
                                        num_instances, k)
    return _ops().xmc_nearest_neighbours(
        tf.cast(sp_input.indices, tf.int64),
        tf.cast(sp_input.values, tf.float32),
        tf.cast(sp_input.dense_shape, tf.int64), indptr, instances, values,
        tf.constant(int(num_instances), tf.int64), k=int(k))


def nearest_neighbours_stock(sp_input, indptr, instances, values,
                             num_instances: int, k: int):
    """:func:`nearest_neighbours` in TensorFlow's ops: every (query, stored
    instance) product, summed per pair after a sort of the pair keys, then
    a stable sort by (query, -similarity) ranks each query's neighbours
    (ties: the lower instance id)."""
    sp_input = tf.sparse.reorder(sp_input)
    rows, feats = sp_input.indices[:, 0], sp_input.indices[:, 1]
    x = tf.cast(sp_input.values, tf.float32)
    batch = sp_input.dense_shape[0]
    n = tf.constant(int(num_instances), tf.int64)
    starts = tf.gather(indptr, feats)
    ends = tf.gather(indptr, feats + 1)
    pos = tf.ragged.range(starts, ends).flat_values
    entry = tf.repeat(tf.range(tf.size(feats, out_type=tf.int64)),
                      ends - starts)
    contrib = tf.gather(x, entry) * tf.gather(values, pos)
    key = (tf.gather(rows, entry) * n +
           tf.cast(tf.gather(instances, pos), tf.int64))
    order = tf.argsort(key)
    key, contrib = tf.gather(key, order), tf.gather(contrib, order)
    previous = tf.concat([tf.constant([-1], tf.int64), key], 0)[:-1]
    first = tf.not_equal(key, previous)
    sims = tf.math.segment_sum(contrib,
                               tf.cumsum(tf.cast(first, tf.int64)) - 1)
    pairs = tf.boolean_mask(key, first)
    positive = sims > 0
    pairs, sims = tf.boolean_mask(pairs, positive), tf.boolean_mask(
        sims, positive)
    # a positive float32's bits order as the float
    row = pairs // n
    descending = (tf.constant(2**31 - 1, tf.int64) -
                  tf.cast(tf.bitcast(sims, tf.int32), tf.int64))
    order = tf.argsort(row * 2**31 + descending, stable=True)
    pairs, sims = tf.gather(pairs, order), tf.gather(sims, order)
    row = pairs // n
    rank = (tf.range(tf.size(row, out_type=tf.int64)) -
            tf.searchsorted(row, row, side="left", out_type=tf.int64))
    keep = rank < k
    where = tf.stack([tf.boolean_mask(row, keep),
                      tf.boolean_mask(rank, keep)], 1)
    shape = tf.cast(tf.stack([batch, tf.constant(k, tf.int64)]), tf.int32)
    ids = tf.tensor_scatter_nd_update(
        tf.fill(shape, tf.constant(-1, tf.int32)), where,
        tf.cast(tf.boolean_mask(pairs % n, keep), tf.int32))
    out = tf.tensor_scatter_nd_update(tf.zeros(shape, tf.float32), where,
                                      tf.boolean_mask(sims, keep))
    return ids, out
