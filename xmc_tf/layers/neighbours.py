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

from xmc_tf.layers.label_tree import sparse_row_chunks

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
      chunk_rows: instances scored at a time (memory: each stored entry
        of an instance expands to its feature's postings).
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
      instance: the summed postings of its features (multiply-adds, then a
      sort of the distinct instances met).

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

    def _chunk_scores(self, rows, feats, values, num_rows):
        """Votes ``[num_rows, num_labels]`` of the entries ``(rows, feats,
        values)`` (rows in ``[0, num_rows)``)."""
        n = tf.constant(self.num_instances, tf.int64)
        m = tf.constant(self.num_labels, tf.int64)
        # Every (row, training instance) sharing a feature: its dot product.
        starts = tf.gather(self.indptr, feats)
        ends = tf.gather(self.indptr, feats + 1)
        pos = tf.ragged.range(starts, ends).flat_values
        entry = tf.repeat(tf.range(tf.size(feats, out_type=tf.int64)),
                          ends - starts)
        contrib = tf.gather(values, entry) * tf.gather(self.values, pos)
        key = (tf.gather(rows, entry) * n +
               tf.cast(tf.gather(self.instances, pos), tf.int64))
        # Sum the products of each (row, instance) pair: sorted by pair,
        # a run of equal keys is one pair.
        order = tf.argsort(key)
        key, contrib = tf.gather(key, order), tf.gather(contrib, order)
        previous = tf.concat([tf.constant([-1], tf.int64), key], 0)[:-1]
        first = tf.not_equal(key, previous)
        sims = tf.math.segment_sum(
            contrib, tf.cumsum(tf.cast(first, tf.int64)) - 1)
        pairs = tf.boolean_mask(key, first)
        positive = sims > 0
        pairs, sims = (tf.boolean_mask(pairs, positive),
                       tf.boolean_mask(sims, positive))
        # Per row, the k largest: a stable sort by (row, -similarity) keeps
        # the instance order of ties (a positive float32's bits order as
        # the float); the rank is the distance to the row's first pair.
        row = pairs // n
        descending = (tf.constant(2**31 - 1, tf.int64) -
                      tf.cast(tf.bitcast(sims, tf.int32), tf.int64))
        order = tf.argsort(row * 2**31 + descending, stable=True)
        pairs, sims = tf.gather(pairs, order), tf.gather(sims, order)
        row = pairs // n
        first = tf.searchsorted(row, row, side="left", out_type=tf.int64)
        rank = tf.range(tf.size(row, out_type=tf.int64)) - first
        keep = rank < self.neighbours
        row = tf.boolean_mask(row, keep)
        inst = tf.boolean_mask(pairs % n, keep)
        vote = tf.pow(tf.boolean_mask(sims, keep), self.power)
        # Each kept neighbour's labels receive its vote.
        lstart = tf.gather(self.label_indptr, inst)
        lend = tf.gather(self.label_indptr, inst + 1)
        lpos = tf.ragged.range(lstart, lend).flat_values
        lentry = tf.repeat(tf.range(tf.size(inst, out_type=tf.int64)),
                           lend - lstart)
        target = (tf.gather(row, lentry) * m +
                  tf.cast(tf.gather(self.label_ids, lpos), tf.int64))
        out = tf.math.unsorted_segment_sum(tf.gather(vote, lentry), target,
                                           num_rows * m)
        return tf.reshape(out, [num_rows, self.num_labels])

    def call(self, inputs):
        return sparse_row_chunks(inputs, self.num_features, self.num_labels,
                                 self.chunk_rows, self._chunk_scores,
                                 "NearestNeighbourScores")

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
