"""The label tree as a Keras layer (non-trainable): a shortlister and a
scorer of given labels.

Holds a fitted :class:`xmc_tf.shortlist.LabelTree` and gives, for a
sparse batch, a label's log-score ``sum over the label's path of -max(0, 1
- w_j . x - b_j)^2`` (Parabel, Prabhu et al. WWW 2018, Sec. 3: the
squared-hinge probabilities of the node and leaf classifiers multiplied
along the path): of every label (``call``), of given labels
(:meth:`LabelTreeScores.score_candidates`), or of the labels a beam search
reaches (:meth:`LabelTreeScores.shortlist`, Sec. 3.3).  The weights are
stored feature-major (CSR rows = features), so an instance reads only the
rows of its own features: the cost is ``sum over its features of the row's
length`` multiply-adds, then ``depth`` gathers of ``[batch, num_labels]``
for every label, ``depth`` per given label, or ``beam x`` children per
level for the beam.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.ops.label_tree import (TreeArrays, label_tree_beam_search,
                                   label_tree_column_scores,
                                   label_tree_path_scores)
from xmc_tf.shortlist.tree import TreeTopology

__all__ = ["LabelTreeScores", "sparse_row_chunks", "as_sparse_batch"]


def as_sparse_batch(inputs):
    """``inputs`` as a ``tf.SparseTensor`` (a dense batch, e.g. Keras'
    tracing, made sparse, float32): what the scorers of sparse features
    take."""
    if isinstance(inputs, tf.SparseTensor):
        if inputs.values.dtype == tf.float32:
            return inputs
        return tf.SparseTensor(inputs.indices,
                               tf.cast(inputs.values, tf.float32),
                               inputs.dense_shape)
    return tf.sparse.from_dense(tf.cast(tf.convert_to_tensor(inputs),
                                        tf.float32))


def sparse_row_chunks(inputs, num_features: int, width: int,
                      chunk_rows: int, chunk_fn, name: str):
    """``chunk_fn`` applied to a sparse batch ``chunk_rows`` rows at a time,
    the ``[rows, width]`` float32 results concatenated: the loop of the
    scorers that expand each stored entry into a row of their own index
    (:class:`LabelTreeScores`' exact scores of every label).

    Args:
      inputs: ``tf.SparseTensor`` ``[batch, num_features]`` (any entry
        order) or a dense tensor (made sparse first).
      num_features: the input width; a feature id outside ``[0,
        num_features)`` fails.
      width: the output columns.
      chunk_rows: rows per call of ``chunk_fn``.
      chunk_fn: ``(rows, feats, values, num_rows) -> [num_rows, width]``:
        int64 row ids in ``[0, num_rows)``, int64 feature ids, float32
        values of one chunk's entries.
      name: the layer's name for the error messages.

    Returns:
      float32 ``[batch, width]``.

    Raises:
      tf.errors.InvalidArgumentError: a feature id outside ``[0,
        num_features)``.
    """
    inputs = tf.sparse.reorder(as_sparse_batch(inputs))  # row-major: rows in chunks
    rows, feats = inputs.indices[:, 0], inputs.indices[:, 1]
    feats = tf.ensure_shape(feats, [None])
    with tf.control_dependencies([tf.debugging.assert_less(
            feats, tf.constant(num_features, tf.int64),
            message=f"{name}: feature id >= num_features"),
            tf.debugging.assert_non_negative(
                feats, message=f"{name}: negative feature id")]):
        feats = tf.identity(feats)
    values = tf.cast(inputs.values, tf.float32)
    batch = inputs.dense_shape[0]
    chunk = tf.constant(chunk_rows, tf.int64)
    num_chunks = (batch + chunk - 1) // chunk
    bounds = tf.searchsorted(rows, tf.range(num_chunks + 1) * chunk,
                             side="left", out_type=tf.int64)

    def body(i, parts):
        lo, hi = bounds[i], bounds[i + 1]
        first = i * chunk
        out = chunk_fn(rows[lo:hi] - first, feats[lo:hi], values[lo:hi],
                       tf.minimum(chunk, batch - first))
        return i + 1, parts.write(tf.cast(i, tf.int32), out)

    parts = tf.TensorArray(tf.float32, size=tf.cast(num_chunks, tf.int32),
                           infer_shape=False, element_shape=[None, width])
    _, parts = tf.while_loop(lambda i, _: i < num_chunks, body,
                             (tf.constant(0, tf.int64), parts))
    return tf.cond(batch > 0, parts.concat,
                   lambda: tf.zeros([0, width], tf.float32))


@keras.saving.register_keras_serializable(package="xmc_tf")
class LabelTreeScores(keras.layers.Layer):
    """Log-scores ``[batch, num_labels]`` of a label tree of linear rankers.

    Args:
      num_features: ``D``, the input width.
      num_labels: ``m``.
      num_columns: classifiers in the tree (internal-node children and
        labels).
      num_weights: stored (non-zero) weights.
      depth: the longest path (columns per label, padded).
      chunk_rows: instances scored at a time by ``call`` (memory: each
        stored entry of an instance expands to its feature's row of
        weights).
      beam: the frontier width of :meth:`shortlist` (Parabel's and
        Omikuji's default: 10).
      **kwargs: base layer arguments (``name``...).

    Input shape:
      ``tf.SparseTensor`` float32 ``[batch, D]`` (rank 2, int64 indices; any
      entry order), the features the tree was fit on; a dense ``[batch, D]``
      tensor is made sparse first.

    Output shape:
      float32 ``[batch, num_labels]``, each ``<= 0``.

    Attributes (non-trainable variables, set by :meth:`set_tree`):
      indptr: int64 ``[D + 1]``; columns: int32 ``[num_weights]``;
      values: float32 ``[num_weights]``; bias: float32 ``[num_columns]``;
      paths: int32 ``[num_labels, depth]`` (padding = ``num_columns``);
      child_indptr: int64 ``[num_columns - num_labels + 2]``, children,
      column_node, column_label: int32 ``[num_columns]`` -- the
      :class:`~xmc_tf.shortlist.TreeTopology` the beam search walks (a
      ``.keras`` file of an earlier version, without them, gets them from
      ``paths`` when it loads).

    Raises:
      ValueError: a tree of other sizes in :meth:`set_tree`.
      tf.errors.InvalidArgumentError: at run time, a feature id outside
        ``[0, D)``.

    Example:
      >>> import scipy.sparse as sp
      >>> from xmc_tf.shortlist import fit_label_tree
      >>> x = sp.csr_matrix(np.eye(4, dtype=np.float32))
      >>> tree = fit_label_tree(x, sp.csr_matrix(np.eye(4)), leaf_size=2)
      >>> layer = LabelTreeScores.from_tree(tree)
      >>> st = tf.SparseTensor([[0, 2]], [1.0], [1, 4])
      >>> int(np.argmax(layer(st).numpy()[0]))
      2
    """

    def __init__(self, num_features: int, num_labels: int, num_columns: int,
                 num_weights: int, depth: int, chunk_rows: int = 64,
                 beam: int = 10, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.num_features = int(num_features)
        self.num_labels = int(num_labels)
        self.num_columns = int(num_columns)
        self.num_weights = int(num_weights)
        self.depth = int(depth)
        if int(chunk_rows) < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.chunk_rows = int(chunk_rows)
        if int(beam) < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam = int(beam)

    @classmethod
    def from_tree(cls, tree, **kwargs) -> "LabelTreeScores":
        """A built layer holding ``tree``
        (:class:`~xmc_tf.shortlist.LabelTree`)."""
        layer = cls(tree.num_features, tree.num_labels, tree.num_columns,
                    tree.weights.nnz, tree.paths.shape[1], **kwargs)
        layer.build((None, tree.num_features))
        layer.set_tree(tree)
        return layer

    def build(self, input_shape):
        def var(name, shape, dtype):
            return self.add_weight(name=name, shape=shape, dtype=dtype,
                                   initializer="zeros", trainable=False)
        self.indptr = var("indptr", (self.num_features + 1,), "int64")
        self.columns = var("columns", (self.num_weights,), "int32")
        self.values = var("values", (self.num_weights,), "float32")
        self.bias = var("bias", (self.num_columns,), "float32")
        self.paths = var("paths", (self.num_labels, self.depth), "int32")
        self.child_indptr = var("child_indptr", (self.num_nodes + 1,),
                                "int64")
        self.children = var("children", (self.num_columns,), "int32")
        self.column_node = var("column_node", (self.num_columns,), "int32")
        self.column_label = var("column_label", (self.num_columns,), "int32")
        super().build(input_shape)

    @property
    def num_nodes(self) -> int:
        """The tree's nodes: the root and one per internal column."""
        return self.num_columns - self.num_labels + 1

    def set_tree(self, tree) -> None:
        """Assigns the arrays of ``tree`` (same sizes as the layer's)."""
        a = tree.to_arrays()
        want = (self.num_features, self.num_labels, self.num_columns,
                self.num_weights, self.depth)
        got = (tree.num_features, tree.num_labels, tree.num_columns,
               tree.weights.nnz, tree.paths.shape[1])
        if want != got:
            raise ValueError(f"tree sizes (features, labels, columns, "
                             f"weights, depth) {got} != the layer's {want}")
        self.indptr.assign(a["indptr"])
        self.columns.assign(a["indices"])
        self.values.assign(a["data"])
        self.bias.assign(a["bias"])
        self.paths.assign(a["paths"])
        self._set_topology(tree.topology())

    def _set_topology(self, topo: TreeTopology) -> None:
        if topo.num_nodes != self.num_nodes:
            raise ValueError(f"the tree has {topo.num_nodes} nodes, the "
                             f"layer {self.num_nodes}")
        self.child_indptr.assign(topo.child_indptr)
        self.children.assign(topo.children)
        self.column_node.assign(topo.column_node)
        self.column_label.assign(topo.column_label)

    def load_own_variables(self, store):
        # A file of an earlier version holds the five arrays before the
        # topology: the topology is derived from its paths.
        if len(store.keys()) == 5:
            for i, v in enumerate((self.indptr, self.columns, self.values,
                                   self.bias, self.paths)):
                v.assign(store[str(i)])
            self._set_topology(TreeTopology.from_paths(
                np.asarray(store["4"]), self.num_columns))
            return
        super().load_own_variables(store)

    def _arrays(self) -> TreeArrays:
        return TreeArrays(self.indptr, self.columns, self.values, self.bias,
                          self.paths, self.child_indptr, self.children,
                          self.column_node, self.column_label)

    def shortlist(self, inputs, k: int, beam: int | None = None):
        """The ``k`` best labels of each row by beam search down the tree
        (Parabel, Sec. 3.3; op ``Xmc>LabelTreeBeamSearch``,
        :func:`xmc_tf.ops.label_tree.label_tree_beam_search`): a frontier
        of ``beam`` nodes per level; every label of a leaf the frontier
        reaches is a candidate.

        Args:
          inputs: ``tf.SparseTensor`` float32 ``[batch, D]`` (a dense
            tensor is made sparse).
          k: labels per row (>= 1; at most ``beam x`` the labels of a leaf
            are reached).
          beam: frontier width (>= 1; None: the layer's ``beam``).

        Returns:
          ``(ids int32 [batch, k], scores float32 [batch, k])``: the path
          log-scores, best first (ties: the lower label id); -1 / -inf
          where fewer labels were reached.

        Raises:
          tf.errors.InvalidArgumentError: a feature id outside ``[0, D)``.
        """
        return label_tree_beam_search(
            as_sparse_batch(inputs), self._arrays(),
            int(self.beam if beam is None else beam), int(k))

    def score_candidates(self, inputs, candidates):
        """The path log-scores of given labels, float32 ``[batch, C]``:
        ``call(inputs)`` gathered at ``candidates`` (int ``[batch, C]``;
        -1: padding, scored 0), without the ``[batch, num_labels]`` tensor
        (op ``Xmc>LabelTreePathScores``).

        Raises:
          tf.errors.InvalidArgumentError: a feature id outside ``[0, D)``
            or a candidate outside ``[-1, num_labels)``.
        """
        return label_tree_path_scores(as_sparse_batch(inputs), self._arrays(),
                                      candidates)

    def _chunk_scores(self, rows, feats, values, num_rows):
        """Log-scores ``[num_rows, num_labels]`` of the entries ``(rows,
        feats, values)`` (rows in ``[0, num_rows)``)."""
        col = label_tree_column_scores(rows, feats, values, num_rows,
                                       self._arrays())
        paths = tf.convert_to_tensor(self.paths)
        out = tf.gather(col, paths[:, 0], axis=1)
        for d in range(1, self.depth):
            out += tf.gather(col, paths[:, d], axis=1)
        return out

    def call(self, inputs):
        # Rows a chunk at a time: an entry of feature f expands to the
        # row's length of f (tens of thousands of products per instance on
        # a 10k-label tree), so a whole batch of 1,024 would hold GBs.
        return sparse_row_chunks(inputs, self.num_features, self.num_labels,
                                 self.chunk_rows, self._chunk_scores,
                                 "LabelTreeScores")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_labels)

    def get_config(self):
        config = super().get_config()
        config.update(num_features=self.num_features,
                      num_labels=self.num_labels,
                      num_columns=self.num_columns,
                      num_weights=self.num_weights, depth=self.depth,
                      chunk_rows=self.chunk_rows, beam=self.beam)
        return config
