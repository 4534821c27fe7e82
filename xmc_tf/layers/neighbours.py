"""Label scores voted by an instance's nearest training instances (a
non-trainable Keras layer).

A k-nearest-neighbour classifier over sparse features: the cosine of the
instance and every training instance (through an inverted index of the
training rows, so an instance reads only the postings of its own features),
the ``k`` most similar training instances kept, and each votes
``cosine ** power`` for each of its labels.  Where labels have a handful of
training instances this is a strong scorer of its own, which a network
learns slowly.  Sources: the kNN classifier of extreme classification
(e.g. the kNN shortlists of SiameseXML, Dahiya et al. ICML 2021, Sec. 3;
the instance-based rankers compared in Bhatia et al., SLEEC, NeurIPS 2015,
Sec. 3), similarity-weighted voting (Dudani, IEEE SMC 1976).
"""

from __future__ import annotations

import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.layers.label_tree import as_sparse_batch
from xmc_tf.ops.neighbours import nearest_neighbours
from xmc_tf.ops.pairs import lookup, merge_keys, row_top_k

__all__ = ["NearestNeighbourScores"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class NearestNeighbourScores(keras.layers.Layer):
    """Label scores ``[batch, num_labels]`` from the ``k`` nearest training
    instances.

    ``outputs[i, j] = sum over t in N_k(i) with label j of
    max(0, x_i . t) ** power``, where ``N_k(i)`` are the ``k`` training
    instances ``t`` of largest dot product ``x_i . t`` (the cosine, for
    l2-normalised rows; ties: the lower instance id first) among those
    sharing a feature with ``x_i``.

    Build it with :meth:`from_data`; the stored training rows are used as
    they are, so pass them normalised as the inputs will be.

    Args:
      num_features: ``D``, the input width.
      num_labels: ``m``.
      num_instances: ``n``, the stored training instances.
      num_entries: their stored feature values.
      num_label_entries: their stored labels.
      neighbours: ``k >= 1``, the instances that vote.
      power: the vote's exponent (``>= 0``; 0: every neighbour votes 1).
      chunk_rows: kept for the files of earlier versions, which scored
        this many instances at a time (the op needs no chunks).
      **kwargs: base layer arguments (``name``...).

    Input shape:
      ``tf.SparseTensor`` float ``[batch, D]`` (rank 2, int64 indices; any
      entry order); a dense tensor is made sparse first.

    Output shape:
      float32 ``[batch, num_labels]``, each ``>= 0``.

    Attributes (non-trainable variables, set by :meth:`set_data`):
      indptr: int64 ``[D + 1]``, instances: int32 ``[num_entries]``,
      values: float32 ``[num_entries]`` -- the training rows feature-major
      (an inverted index); label_indptr: int64 ``[n + 1]``, label_ids:
      int32 ``[num_label_entries]`` -- each instance's labels.  Memory:
      ``8 (D + n) + 8 num_entries + 4 num_label_entries`` bytes.  Cost per
      instance: the summed postings of its features (multiply-adds into a
      scratch of ``n`` floats, op ``Xmc>NearestNeighbours``), a selection
      of the ``k`` best, then their labels' votes; :meth:`score_candidates`
      and :meth:`shortlist` keep the votes sparse (no ``[batch,
      num_labels]`` tensor).

    Raises:
      ValueError: bad sizes or ``neighbours``/``power``/``chunk_rows``; in
        :meth:`set_data`, arrays of other sizes.
      tf.errors.InvalidArgumentError: at run time, a feature id outside
        ``[0, D)``.

    Example:
      >>> import scipy.sparse as sp
      >>> x = sp.csr_matrix(np.array([[1., 0.], [.6, .8], [0., 1.]], np.float32))
      >>> y = sp.csr_matrix(np.array([[1, 0], [1, 0], [0, 1]]))
      >>> layer = NearestNeighbourScores.from_data(x, y, neighbours=2)
      >>> layer(tf.SparseTensor([[0, 1]], [1.0], [1, 2])).numpy().round(2)
      array([[0.64, 1.  ]], dtype=float32)
    """

    def __init__(self, num_features: int, num_labels: int,
                 num_instances: int, num_entries: int,
                 num_label_entries: int, neighbours: int = 100,
                 power: float = 2.0, chunk_rows: int = 64, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        sizes = dict(num_features=num_features, num_labels=num_labels,
                     num_instances=num_instances)
        for key, value in sizes.items():
            if int(value) < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        for key, value in dict(num_entries=num_entries,
                               num_label_entries=num_label_entries).items():
            if int(value) < 0:
                raise ValueError(f"{key} must be >= 0, got {value}")
        if int(neighbours) < 1:
            raise ValueError(f"neighbours must be >= 1, got {neighbours}")
        if not float(power) >= 0:
            raise ValueError(f"power must be >= 0, got {power}")
        if int(chunk_rows) < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.num_features = int(num_features)
        self.num_labels = int(num_labels)
        self.num_instances = int(num_instances)
        self.num_entries = int(num_entries)
        self.num_label_entries = int(num_label_entries)
        self.neighbours = int(neighbours)
        self.power = float(power)
        self.chunk_rows = int(chunk_rows)

    @classmethod
    def from_data(cls, features, labels, neighbours: int = 100,
                  power: float = 2.0, **kwargs) -> "NearestNeighbourScores":
        """A built layer holding the training instances.

        Args:
          features: ``scipy.sparse`` ``[n, D]`` float, the training rows as
            the layer's inputs will be (e.g. l2-normalised, for cosines).
          labels: ``scipy.sparse`` ``[n, m]``, non-zero = positive.
          neighbours, power: as the constructor's.
          kwargs: the constructor's other arguments (``name``...).

        Raises:
          ValueError: ``features`` and ``labels`` with different numbers of
            rows, or as the constructor.
        """
        x = sp.csr_matrix(features, dtype=np.float32)
        y = sp.csr_matrix(labels)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"features have {x.shape[0]} rows, labels "
                             f"{y.shape[0]}")
        x.eliminate_zeros()
        y.eliminate_zeros()
        layer = cls(x.shape[1], y.shape[1], x.shape[0], x.nnz, y.nnz,
                    neighbours=neighbours, power=power, **kwargs)
        layer.build((None, x.shape[1]))
        layer.set_data(x, y)
        return layer

    def build(self, input_shape):
        def var(name, shape, dtype):
            return self.add_weight(name=name, shape=shape, dtype=dtype,
                                   initializer="zeros", trainable=False)
        self.indptr = var("indptr", (self.num_features + 1,), "int64")
        self.instances = var("instances", (self.num_entries,), "int32")
        self.values = var("values", (self.num_entries,), "float32")
        self.label_indptr = var("label_indptr", (self.num_instances + 1,),
                                "int64")
        self.label_ids = var("label_ids", (self.num_label_entries,), "int32")
        super().build(input_shape)

    def set_data(self, features, labels) -> None:
        """Assigns the training rows ``features`` (``scipy.sparse`` ``[n,
        D]``) and their ``labels`` (``[n, m]``), of the layer's sizes."""
        x = sp.csr_matrix(features, dtype=np.float32)
        y = sp.csr_matrix(labels)
        x.eliminate_zeros()
        y.eliminate_zeros()
        want = (self.num_instances, self.num_features, self.num_labels,
                self.num_entries, self.num_label_entries)
        got = (x.shape[0], x.shape[1], y.shape[1], x.nnz, y.nnz)
        if want != got or y.shape[0] != x.shape[0]:
            raise ValueError(f"data sizes (instances, features, labels, "
                             f"entries, label entries) {got} != the "
                             f"layer's {want}")
        xt = sp.csr_matrix(x.T)  # feature-major: the inverted index
        xt.sort_indices()
        y.sort_indices()
        self.indptr.assign(xt.indptr.astype(np.int64))
        self.instances.assign(xt.indices.astype(np.int32))
        self.values.assign(xt.data.astype(np.float32))
        self.label_indptr.assign(y.indptr.astype(np.int64))
        self.label_ids.assign(y.indices.astype(np.int32))

    def nearest(self, inputs):
        """The ``k`` nearest training instances of each row
        (:func:`xmc_tf.ops.neighbours.nearest_neighbours`): ``(ids int32
        [batch, k], similarities float32 [batch, k])``, best first, -1 / 0
        where fewer share a feature with positive dot product."""
        inputs = as_sparse_batch(inputs)
        return nearest_neighbours(inputs, self.indptr, self.instances,
                                  self.values, self.num_instances,
                                  self.neighbours)

    def votes(self, inputs):
        """The non-zero votes of a batch as merged keys: ``(keys int64
        [u], votes float32 [u])``, ``keys = row * num_labels + label``
        sorted (:func:`xmc_tf.ops.pairs.merge_keys`)."""
        ids, sims = self.nearest(inputs)
        keep = ids >= 0
        row = tf.where(keep)[:, 0]
        inst = tf.cast(tf.boolean_mask(ids, keep), tf.int64)
        vote = tf.pow(tf.boolean_mask(sims, keep), self.power)
        lstart = tf.gather(self.label_indptr, inst)
        lend = tf.gather(self.label_indptr, inst + 1)
        lpos = tf.ragged.range(lstart, lend).flat_values
        lentry = tf.repeat(tf.range(tf.size(inst, out_type=tf.int64)),
                           lend - lstart)
        keys = (tf.gather(row, lentry) * self.num_labels +
                tf.cast(tf.gather(self.label_ids, lpos), tf.int64))
        return merge_keys(keys, tf.gather(vote, lentry))

    def call(self, inputs):
        inputs = as_sparse_batch(inputs)
        keys, votes = self.votes(inputs)
        batch = inputs.dense_shape[0]
        out = tf.math.unsorted_segment_sum(votes, keys,
                                           batch * self.num_labels)
        return tf.reshape(out, [batch, self.num_labels])

    def score_candidates(self, inputs, candidates):
        """The votes of given labels, float32 ``[batch, C]``: ``call(inputs)``
        gathered at ``candidates`` (int ``[batch, C]``; -1: padding, 0),
        without the ``[batch, num_labels]`` tensor."""
        inputs = as_sparse_batch(inputs)
        keys, votes = self.votes(inputs)
        candidates = tf.cast(candidates, tf.int64)
        rows = tf.range(tf.shape(candidates, out_type=tf.int64)[0])[:, None]
        found = lookup(keys, votes, rows * self.num_labels + candidates)
        return tf.where(candidates >= 0, found, 0.0)

    def shortlist(self, inputs, k: int):
        """The ``k`` labels of most votes per row: ``(ids int32 [batch, k],
        votes float32 [batch, k])``, best first (ties: the lower label id);
        -1 / -inf where the neighbours vote for fewer labels."""
        inputs = as_sparse_batch(inputs)
        keys, votes = self.votes(inputs)
        return row_top_k(keys, votes, inputs.dense_shape[0], self.num_labels,
                         int(k))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_labels)

    def get_config(self):
        config = super().get_config()
        config.update(num_features=self.num_features,
                      num_labels=self.num_labels,
                      num_instances=self.num_instances,
                      num_entries=self.num_entries,
                      num_label_entries=self.num_label_entries,
                      neighbours=self.neighbours, power=self.power,
                      chunk_rows=self.chunk_rows)
        return config
