"""The label tree's shortlist and path scores on a sparse batch.

Op family ``ops/label_tree/``: ``Xmc>LabelTreeBeamSearch`` (Parabel's beam
search, Prabhu et al. WWW 2018, Sec. 3.3: the ``k`` best labels of each
instance) and ``Xmc>LabelTreePathScores`` (the path log-scores of given
labels).  Both read the tree's classifiers feature-major, so an instance
costs the summed weight rows of its own features, and neither makes a
``[batch, num_labels]`` tensor.  :class:`xmc_tf.layers.LabelTreeScores`
holds the arrays; inside ``xmc_tf.ops.stock.stock_ops(formulations=True)``
(portable SavedModels) both trace as TensorFlow's own ops
(:func:`label_tree_beam_search_stock`, :func:`label_tree_path_scores_stock`):
the same labels, scores equal up to float32 rounding.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

__all__ = ["TreeArrays", "label_tree_beam_search", "label_tree_path_scores",
           "label_tree_beam_search_stock", "label_tree_path_scores_stock",
           "label_tree_column_scores"]

tf.no_gradient("Xmc>LabelTreeBeamSearch")
tf.no_gradient("Xmc>LabelTreePathScores")


class TreeArrays:
    """The arrays of a label tree, as the ops take them (tensors or
    variables; nothing is copied).

    Args:
      indptr: int64 ``[D + 1]``, columns: int32 ``[W]``, values: float32
        ``[W]`` -- the classifiers feature-major (CSR ``[D, C]``).
      bias: float32 ``[C]``.
      paths: int32 ``[m, depth]``, each label's columns (padding ``C``).
      child_indptr: int64 ``[N + 1]``, children: int32 ``[C]``,
        column_node: int32 ``[C]``, column_label: int32 ``[C]`` -- the
        topology (:class:`xmc_tf.shortlist.TreeTopology`).
    """

    def __init__(self, indptr, columns, values, bias, paths, child_indptr,
                 children, column_node, column_label):
        self.indptr, self.columns, self.values = indptr, columns, values
        self.bias, self.paths = bias, paths
        self.child_indptr, self.children = child_indptr, children
        self.column_node, self.column_label = column_node, column_label


def _ops():
    lib = _loader.load()
    if not hasattr(lib, "xmc_label_tree_beam_search"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>LabelTreeBeamSearch op "
            "(built before ops/label_tree/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


def _parts(sp_input):
    return (tf.cast(sp_input.indices, tf.int64),
            tf.cast(sp_input.values, tf.float32),
            tf.cast(sp_input.dense_shape, tf.int64))


def label_tree_beam_search(sp_input: tf.SparseTensor, tree: TreeArrays,
                           beam: int, k: int):
    """The ``k`` best labels of each instance by beam search down the tree.

    Level by level from the root, every child of the frontier is scored
    (its parent's path log-score plus its column's
    ``-max(0, 1 - (x . w_c + b_c))^2``); a label's column makes the label a
    candidate, an internal column competes for the ``beam`` places of the
    next frontier (ties: the lower node id).

    Args:
      sp_input: ``tf.SparseTensor`` float32 ``[batch, D]`` (entries in any
        order; repeats add up).
      tree: the :class:`TreeArrays`.
      beam: frontier width (>= 1).
      k: labels returned per instance (>= 1).

    Returns:
      ``(label_ids int32 [batch, k], scores float32 [batch, k])``, best
      first (ties: the lower label id); -1 / -inf where fewer than ``k``
      labels were reached (at most ``beam x`` a leaf's labels are).

    Raises:
      tf.errors.InvalidArgumentError: a feature id outside ``[0, D)``, a
        batch whose width is not ``D``, or a tree array entry out of range
        (the message names it).
      xmc_tf.errors.OpLibraryError: the op library lacks the op.
    """
    if stock.stock_formulations():
        return label_tree_beam_search_stock(sp_input, tree, beam, k)
    return _ops().xmc_label_tree_beam_search(
        *_parts(sp_input), tree.indptr, tree.columns, tree.values, tree.bias,
        tree.child_indptr, tree.children, tree.column_node,
        tree.column_label, beam=int(beam), k=int(k))


def label_tree_path_scores(sp_input: tf.SparseTensor, tree: TreeArrays,
                           label_ids):
    """The tree's path log-scores of given labels: float32 ``[batch, k]``,
    ``sum over the columns c of label_ids[i, j]'s path of -max(0, 1 -
    (x_i . w_c + b_c))^2``, 0 where ``label_ids[i, j] = -1``.

    Args:
      sp_input: ``tf.SparseTensor`` float32 ``[batch, D]``.
      tree: the :class:`TreeArrays`.
      label_ids: int32 ``[batch, k]`` in ``[-1, m)``.

    Raises:
      tf.errors.InvalidArgumentError: as :func:`label_tree_beam_search`, or
        a label id outside ``[-1, m)``.
    """
    if stock.stock_formulations():
        return label_tree_path_scores_stock(sp_input, tree, label_ids)
    return _ops().xmc_label_tree_path_scores(
        *_parts(sp_input), tree.indptr, tree.columns, tree.values, tree.bias,
        tree.paths, tf.cast(label_ids, tf.int32))


# ---------------------------------------------------------------------------
# TensorFlow's ops only (portable SavedModels).

def label_tree_column_scores(rows, feats, values, num_rows, tree: TreeArrays):
    """Every column's log-score of a chunk of entries, in TensorFlow's ops:
    float32 ``[num_rows, C + 1]`` (the last column, padding, 0).

    Args:
      rows: int64 entry rows in ``[0, num_rows)``; feats: int64 feature ids
        (checked by the caller); values: float32.
      num_rows: int64 scalar.
      tree: the :class:`TreeArrays`.
    """
    starts = tf.gather(tree.indptr, feats)
    ends = tf.gather(tree.indptr, feats + 1)
    pos = tf.ragged.range(starts, ends).flat_values
    entry = tf.repeat(tf.range(tf.size(feats, out_type=tf.int64)),
                      ends - starts)
    contrib = tf.gather(values, entry) * tf.gather(tree.values, pos)
    ncols = tf.shape(tree.bias, out_type=tf.int64)[0]
    target = (tf.gather(rows, entry) * ncols +
              tf.cast(tf.gather(tree.columns, pos), tf.int64))
    col = tf.math.unsorted_segment_sum(contrib, target, num_rows * ncols)
    col = tf.reshape(col, [num_rows, ncols]) + tf.convert_to_tensor(tree.bias)
    col = -tf.square(tf.nn.relu(1.0 - col))
    return tf.concat([col, tf.zeros([num_rows, 1], col.dtype)], axis=1)


def _entries(sp_input):
    sp_input = tf.sparse.reorder(sp_input)
    return (sp_input.indices[:, 0], sp_input.indices[:, 1],
            tf.cast(sp_input.values, tf.float32),
            sp_input.dense_shape[0])


def _best(scores, ids, keep):
    """The ``keep`` best of each row by (score desc, id asc): a stable sort
    by id, then a stable sort by score (``keep`` <= columns)."""
    by_id = tf.argsort(ids, axis=1, stable=True)
    scores = tf.gather(scores, by_id, batch_dims=1)
    ids = tf.gather(ids, by_id, batch_dims=1)
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
    order = order[:, :keep]
    return (tf.gather(ids, order, batch_dims=1),
            tf.gather(scores, order, batch_dims=1))


def label_tree_beam_search_stock(sp_input, tree: TreeArrays, beam: int,
                                 k: int):
    """:func:`label_tree_beam_search` in TensorFlow's ops: every column's
    log-score (``[batch, C]``, :func:`label_tree_column_scores`), then one
    gather of the frontier's children per level of the tree (``depth`` =
    ``paths.shape[1]`` levels), the frontier and the output chosen by two
    stable sorts (score, then id, as the op orders them).  NaN scores sort
    as the op's (below every number) only where no NaN occurs."""
    rows, feats, values, batch = _entries(sp_input)
    col = label_tree_column_scores(rows, feats, values, batch, tree)
    kids = tf.RaggedTensor.from_row_splits(
        tf.convert_to_tensor(tree.children),
        tf.convert_to_tensor(tree.child_indptr)).to_tensor(default_value=-1)
    depth = int(tree.paths.shape[1])
    neg = tf.constant(float("-inf"))
    nodes = tf.zeros([batch, 1], tf.int32)
    path = tf.zeros([batch, 1], tf.float32)
    found_ids, found_scores = [], []
    column_label = tf.convert_to_tensor(tree.column_label)
    column_node = tf.convert_to_tensor(tree.column_node)
    for _ in range(depth):
        child = tf.gather(kids, tf.maximum(nodes, 0))  # [b, F, width]
        valid = (child >= 0) & (nodes >= 0)[:, :, None]
        child = tf.maximum(child, 0)
        flat = tf.reshape(child, [batch, -1])
        s = tf.reshape(path[:, :, None], [batch, -1, 1]) + tf.reshape(
            tf.gather(col, flat, batch_dims=1), tf.shape(child))
        label = tf.gather(column_label, child)
        is_label = valid & (label >= 0)
        is_node = valid & (label < 0)
        found_ids.append(tf.reshape(tf.where(is_label, label, -1), [batch, -1]))
        found_scores.append(tf.reshape(tf.where(is_label, s, neg), [batch, -1]))
        node = tf.reshape(tf.where(is_node, tf.gather(column_node, child),
                                   tf.int32.max), [batch, -1])
        node_score = tf.reshape(tf.where(is_node, s, neg), [batch, -1])
        width = tf.minimum(tf.shape(node)[1], beam)
        nodes, path = _best(node_score, node, width)
        nodes = tf.where(tf.math.is_inf(path), -1, nodes)
    ids = tf.concat(found_ids, axis=1)
    scores = tf.concat(found_scores, axis=1)
    ids = tf.where(ids < 0, tf.int32.max, ids)
    pad = tf.maximum(k - tf.shape(ids)[1], 0)
    ids = tf.pad(ids, [[0, 0], [0, pad]], constant_values=tf.int32.max)
    scores = tf.pad(scores, [[0, 0], [0, pad]], constant_values=neg)
    ids, scores = _best(scores, ids, k)
    ids = tf.where(tf.math.is_inf(scores) & (scores < 0), -1, ids)
    return ids, scores


def label_tree_path_scores_stock(sp_input, tree: TreeArrays, label_ids):
    """:func:`label_tree_path_scores` in TensorFlow's ops: every column's
    log-score (:func:`label_tree_column_scores`) gathered at the labels'
    paths and summed."""
    rows, feats, values, batch = _entries(sp_input)
    col = label_tree_column_scores(rows, feats, values, batch, tree)
    label_ids = tf.cast(label_ids, tf.int32)
    paths = tf.gather(tree.paths, tf.maximum(label_ids, 0))  # [b, k, depth]
    shape = tf.shape(paths)
    flat = tf.reshape(paths, [batch, -1])
    scores = tf.reduce_sum(tf.reshape(tf.gather(col, flat, batch_dims=1),
                                      shape), axis=-1)
    return tf.where(label_ids >= 0, scores, 0.0)
