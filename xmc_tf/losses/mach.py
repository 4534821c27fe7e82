"""MACH training losses from label-id targets.

Targets follow the project's contract: an integer tensor ``[batch, n]`` of
label ids padded with ``-1`` (what :func:`xmc_tf.data.make_tf_dataset`
yields).  The losses hash the ids to buckets per batch
(``h_r(j) = ((a_r j + b_r) mod p) mod B``) and build ``[batch, R, B]``
targets by scatter; no ``[batch, m]`` tensor exists.  Predictions are the
logits ``[batch, R, B]`` of :class:`xmc_tf.layers.mach.MachHead`.

Source: Medini et al., "Extreme Classification in Log Memory using Count-Min
Sketch: A Case Study of Amazon Search with 50M Products", NeurIPS 2019:
Sec. 3 / Algorithm 1 (each repetition r is a B-way softmax classifier on
``(x, h_r(y))``) and the end of Sec. 3 (multi-label: binary cross-entropy
instead of softmax cross-entropy).

Both losses take the hash family from the head (``Loss(head)``), a
:class:`xmc_tf.ops.mach.MachHashing` or its config dict, and store it in
their config, so a compiled model survives ``.keras`` save/load.

Argument order: a MACH loss takes the hash family first
(``MachSoftmaxCrossentropy(hashing)``); the MACH metric takes ``k`` first,
like every P@k metric, and the hash family second
(``MachPrecisionAtK(k, hashing)``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.losses.targets import target_label_ids
from xmc_tf.ops.mach import MachHashing

__all__ = ["MachSoftmaxCrossentropy", "MachBinaryCrossentropy",
           "mach_bucket_targets"]


def mach_bucket_targets(label_ids, hashing, normalize=False,
                        dtype=tf.float32) -> tf.Tensor:
    """Per-repetition bucket targets ``[batch, R, B]`` from label ids.

    Args:
      label_ids: integer ``[batch, n]`` (or ``[batch]``) label ids padded
        with negative values.
      hashing: :class:`~xmc_tf.ops.mach.MachHashing`, a ``MachHead`` or a
        hashing config dict.
      normalize: ``False``: 0/1 indicator of the buckets holding at least
        one label (multi-label targets); ``True``: the fraction of the row's
        labels in each bucket (a distribution per repetition: the softmax
        targets; one label gives the one-hot bucket of Algorithm 1).
      dtype: float dtype of the result.

    Returns:
      ``[batch, R, B]`` tensor; all zeros for a row without labels.

    Example:
      >>> h = MachHashing.random(10, 4, 2, seed=0)
      >>> t = mach_bucket_targets(tf.constant([[1, 3], [2, -1]]), h,
      ...                         normalize=True)
      >>> t.shape.as_list(), t.numpy().sum(axis=-1).tolist()
      ([2, 2, 4], [[1.0, 1.0], [1.0, 1.0]])
    """
    hashing = MachHashing.from_any(hashing)
    ids = tf.convert_to_tensor(label_ids)
    if ids.shape.rank == 1:
        ids = ids[:, tf.newaxis]
    R, B = hashing.num_repetitions, hashing.num_buckets
    buckets = tf.cast(hashing.buckets(ids), tf.int64)  # [b, n, R], -1 = pad
    batch = tf.shape(buckets, out_type=tf.int64)[0]
    n = tf.shape(buckets, out_type=tf.int64)[1]
    valid = buckets >= 0
    rows = tf.range(batch, dtype=tf.int64)[:, None, None]
    reps = tf.range(R, dtype=tf.int64)[None, None, :]
    # Flat index into [batch * R * B]; padding goes to one extra dummy slot.
    flat = (rows * R + reps) * B + buckets
    size = batch * R * B
    flat = tf.where(valid, flat, size)
    if normalize:
        count = tf.reduce_sum(tf.cast(valid[..., 0], dtype), axis=1)  # [b]
        weight = tf.math.divide_no_nan(tf.ones([], dtype), count)
        updates = tf.broadcast_to(weight[:, None, None],
                                  tf.stack([batch, n, R]))
    else:
        updates = tf.ones(tf.stack([batch, n, R]), dtype)
    dense = tf.scatter_nd(tf.reshape(flat, [-1, 1]),
                          tf.reshape(updates, [-1]),
                          tf.reshape(size + 1, [1]))[:-1]
    if not normalize:
        dense = tf.minimum(dense, tf.ones([], dtype))
    return tf.reshape(dense, tf.stack([batch, R, B]))


class _MachLoss(keras.losses.Loss):
    """Base: holds the hash family; turns label ids into bucket targets.

    Keras' ``Loss.__call__`` casts targets to the loss dtype, which would
    corrupt label ids above 2^24; this override hashes the ids first.
    Targets of rank <= 2 (ids, float ids, a ``[batch, num_labels]``
    multi-hot or ``tf.SparseTensor``: :func:`xmc_tf.losses.target_label_ids`)
    are hashed; targets of rank 3 ``[batch, R, B]`` are taken as ready-made
    bucket targets.
    """

    _normalize = False

    def __init__(self, hashing, reduction="sum_over_batch_size", name=None,
                 dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.hashing = MachHashing.from_any(hashing)

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.convert_to_tensor(y_pred)
        if isinstance(y_true, tf.SparseTensor) or (
                tf.convert_to_tensor(y_true).shape.rank or 0) <= 2:
            # Ids, float ids (a strategy's cast), multi-hot or SparseTensor
            # [batch, num_labels]: the one rule of xmc_tf.losses.targets.
            y_true = target_label_ids(y_true, self.hashing.num_labels)
            y_true = mach_bucket_targets(y_true, self.hashing,
                                         normalize=self._normalize,
                                         dtype=y_pred.dtype)
        return super().__call__(y_true, y_pred, sample_weight)

    def get_config(self):
        config = super().get_config()
        config["hashing"] = self.hashing.get_config()
        return config


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachSoftmaxCrossentropy(_MachLoss):
    """Softmax cross-entropy of every repetition, averaged over repetitions.

    ``loss_i = (1/R) sum_r [logsumexp_c z[i,r,c] - sum_c t[i,r,c] z[i,r,c]]``
    with ``t[i, r, :]`` the bucket distribution of the row's labels: for one
    label ``y``, the one-hot of ``h_r(y)`` (Medini et al. 2019, Sec. 3,
    Algorithm 1: each repetition is a B-way classifier on ``(x, h_r(y))``);
    for several labels, each label gets weight ``1/n`` (the usual
    multi-label -> multi-class reduction).  Rows without labels give 0.

    Args:
      hashing: the head (``MachHead``), its :class:`MachHashing`, or a
        hashing config dict.
      reduction, name, dtype: as for ``keras.losses.Loss``.

    Call arguments:
      y_true: int ``[batch, n]`` label ids padded with -1 (or ``[batch]``;
        float ids as a strategy casts them), a ``[batch, num_labels]``
        multi-hot or ``tf.SparseTensor``, or float ``[batch, R, B]`` bucket
        distributions.
      y_pred: logits ``[batch, R, B]``.

    Returns:
      The reduced loss (scalar by default); per-row losses with
      ``reduction=None``.

    Example:
      >>> h = MachHashing.random(10, 4, 2, seed=0)
      >>> loss = MachSoftmaxCrossentropy(h)
      >>> value = loss(tf.constant([[3]]), tf.zeros([1, 2, 4]))
      >>> round(float(value), 4)  # log(4)
      1.3863
    """

    _normalize = True

    def __init__(self, hashing, reduction="sum_over_batch_size",
                 name="mach_softmax_crossentropy", dtype=None):
        super().__init__(hashing, reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        logp = tf.nn.log_softmax(y_pred, axis=-1)
        per_rep = -tf.reduce_sum(y_true * logp, axis=-1)  # [b, R]
        return tf.reduce_mean(per_rep, axis=-1)


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachBinaryCrossentropy(_MachLoss):
    """Binary cross-entropy over the bucket indicators (multi-label MACH).

    ``t[i, r, c] = 1`` iff some label ``j`` of row ``i`` has ``h_r(j) = c``
    (built per batch by scatter from the ids).  ``loss_i = (1/R) sum_r
    sum_c BCE(t[i,r,c], sigmoid(z[i,r,c]))``: summed over buckets (one-vs-all
    over meta-labels), averaged over repetitions (Medini et al. 2019, end of
    Sec. 3: "change softmax cross-entropy loss to binary cross-entropy").

    Args:
      hashing: the head (``MachHead``), its :class:`MachHashing`, or a
        hashing config dict.
      reduction, name, dtype: as for ``keras.losses.Loss``.

    Call arguments:
      y_true: int ``[batch, n]`` label ids padded with -1 (float ids as a
        strategy casts them), a ``[batch, num_labels]`` multi-hot or
        ``tf.SparseTensor``, or float ``[batch, R, B]`` 0/1 bucket
        indicators.
      y_pred: logits ``[batch, R, B]``.

    Example:
      >>> h = MachHashing.random(10, 4, 2, seed=0)
      >>> loss = MachBinaryCrossentropy(h)
      >>> value = loss(tf.constant([[3, -1]]), tf.zeros([1, 2, 4]))
      >>> round(float(value), 4)  # 4 log(2)
      2.7726
    """

    def __init__(self, hashing, reduction="sum_over_batch_size",
                 name="mach_binary_crossentropy", dtype=None):
        super().__init__(hashing, reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=y_true,
                                                      logits=y_pred)
        return tf.reduce_mean(tf.reduce_sum(bce, axis=-1), axis=-1)
