"""Sparse scores kept as sorted ``(row, column)`` keys, in TensorFlow's ops:
the lookups of the scorers that score given ``(instance, label)`` pairs
(:meth:`xmc_tf.layers.NearestNeighbourScores.score_candidates`, the
uniform-sparse layers' candidates on sparse input) and the per-row top k of
sparse scores (a shortlist without a ``[batch, num_labels]`` tensor).

:func:`merge_shortlists` unites several shortlists of the same rows.
A key is ``row * num_columns + column`` (int64); :func:`merge_keys` sorts
keys and adds up the values of repeated ones, after which a lookup is a
binary search (``tf.searchsorted``).  Stock ops only: these trace
unchanged into portable SavedModels.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["merge_keys", "sparse_keys", "lookup", "row_top_k",
           "merge_shortlists"]


def merge_keys(keys, values):
    """Sorted distinct ``keys`` (int64 ``[n]``) with the ``values`` (float
    ``[n]``) of equal keys added up: ``(keys [u], values [u])``."""
    keys = tf.cast(keys, tf.int64)
    order = tf.argsort(keys, stable=True)
    keys, values = tf.gather(keys, order), tf.gather(values, order)
    previous = tf.concat([tf.constant([-1], tf.int64), keys[:-1]], 0)
    first = tf.not_equal(keys, previous)
    segment = tf.cumsum(tf.cast(first, tf.int64)) - 1
    return tf.boolean_mask(keys, first), tf.math.segment_sum(values, segment)


def sparse_keys(sp_input: tf.SparseTensor):
    """The entries of a rank-2 sparse batch as merged keys ``row *
    dense_shape[1] + column`` (:func:`merge_keys`; repeats add up)."""
    width = tf.cast(sp_input.dense_shape[1], tf.int64)
    keys = sp_input.indices[:, 0] * width + sp_input.indices[:, 1]
    return merge_keys(keys, sp_input.values)


def lookup(keys, values, queries):
    """``values`` at ``queries`` (int64, any shape): the value of the equal
    key of ``keys`` (sorted, distinct), 0 where there is none."""
    queries = tf.cast(queries, tf.int64)
    flat = tf.reshape(queries, [-1])
    n = tf.size(keys, out_type=tf.int64)
    pos = tf.searchsorted(keys, flat, side="left", out_type=tf.int64)
    safe = tf.minimum(pos, n)  # n: the padding entry
    padded_keys = tf.concat([keys, tf.constant([-1], tf.int64)], 0)
    padded_values = tf.concat([values, tf.zeros([1], values.dtype)], 0)
    found = (pos < n) & tf.equal(tf.gather(padded_keys, safe), flat)
    out = tf.where(found, tf.gather(padded_values, safe),
                   tf.zeros_like(flat, values.dtype))
    return tf.reshape(out, tf.shape(queries))


def row_top_k(keys, values, num_rows, num_columns, k: int):
    """The ``k`` largest values of each row of sparse scores.

    Args:
      keys: sorted distinct int64 keys ``row * num_columns + column``.
      values: float ``[u]``, their scores.
      num_rows, num_columns: int64 scalars.
      k: entries per row (>= 1).

    Returns:
      ``(columns int32 [num_rows, k], scores [num_rows, k])``, best first
      (ties: the lower column); -1 / -inf where a row has fewer entries.
    """
    num_columns = tf.cast(num_columns, tf.int64)
    rows = keys // num_columns
    # keys are row-major: a stable sort by -value, then a stable one by
    # row, leaves each row's entries by value, ties by column.
    by_value = tf.argsort(-values, stable=True)
    rows_v = tf.gather(rows, by_value)
    by_row = tf.argsort(rows_v, stable=True)
    order = tf.gather(by_value, by_row)
    rows = tf.gather(rows, order)
    cols = tf.gather(keys, order) - rows * num_columns
    vals = tf.gather(values, order)
    first = tf.searchsorted(rows, rows, side="left", out_type=tf.int64)
    rank = tf.range(tf.size(rows, out_type=tf.int64)) - first
    keep = rank < k
    where = tf.stack([tf.boolean_mask(rows, keep),
                      tf.boolean_mask(rank, keep)], 1)
    shape = tf.stack([tf.cast(num_rows, tf.int64), tf.constant(k, tf.int64)])
    ids = tf.tensor_scatter_nd_update(
        tf.fill(tf.cast(shape, tf.int32), tf.constant(-1, tf.int32)), where,
        tf.cast(tf.boolean_mask(cols, keep), tf.int32))
    scores = tf.tensor_scatter_nd_update(
        tf.fill(tf.cast(shape, tf.int32),
                tf.constant(float("-inf"), values.dtype)), where,
        tf.boolean_mask(vals, keep))
    return ids, scores


def merge_shortlists(parts, min_width: int = 1):
    """The union of several shortlists of the same rows, sorted by label id.

    Args:
      parts: int ``[batch, k_i]`` label ids (-1: padding), at least one.
      min_width: the result has at least this many columns (padded).

    Returns:
      int32 ``[batch, sum k_i]`` (at least ``min_width`` columns): each
      row's distinct labels in ascending order, then -1.
    """
    ids = tf.concat([tf.cast(p, tf.int32) for p in parts], axis=1)
    pad = tf.maximum(int(min_width) - tf.shape(ids)[1], 0)
    ids = tf.pad(ids, [[0, 0], [0, pad]], constant_values=-1)
    big = tf.int32.max
    ids = tf.sort(tf.where(ids < 0, big, ids), axis=1)
    previous = tf.concat([tf.fill([tf.shape(ids)[0], 1], -1), ids[:, :-1]],
                         axis=1)
    ids = tf.where(tf.equal(ids, previous) | tf.equal(ids, big), big, ids)
    ids = tf.sort(ids, axis=1)
    return tf.where(tf.equal(ids, big), -1, ids)
