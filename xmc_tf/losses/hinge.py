"""One-vs-all multi-label losses: squared hinge and binary cross-entropy.

Targets arrive either as label ids (an integer tensor ``[batch, n]`` padded
with -1: what :func:`xmc_tf.data.make_tf_dataset` yields) or as a dense
multi-hot float tensor ``[batch, num_labels]``.  Ids are expanded to dense
targets one batch at a time; no ``[num_instances, num_labels]`` array exists.

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for Extremely
Large Output Spaces", Sec. 2 (one-vs-all reduction, eq. 2) and Sec. 3.3
(the squared hinge gives exactly zero gradient for satisfied margins, which
the uniform-sparse backward kernels skip).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
# Private, but stable here (TensorFlow is pinned to one release): whether
# the graph being built is compiled by XLA (tf.function(jit_compile=True),
# Keras' jit_compile), which cannot compile the custom op.
from tensorflow.python.ops import control_flow_util

from xmc_tf.losses.targets import _dispatch_targets, dense_targets
from xmc_tf.ops.hinge import squared_hinge_loss, squared_hinge_loss_supported


class _MultiLabelLoss(keras.losses.Loss):
    """Base: expands label-id targets to a per-batch multi-hot tensor.

    Keras' ``Loss.__call__`` casts targets to the loss dtype, which would turn
    label ids above 2**24 into wrong floats; this override expands integer
    ids first, exactly.  Float targets narrower than the scores are ids too
    (the replica-mean batch of Keras' build under ``tf.distribute``; see
    :func:`dense_targets`).
    """

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.convert_to_tensor(y_pred)
        num_labels = y_pred.shape[-1]
        if num_labels is None:
            num_labels = tf.shape(y_pred)[-1]
        y_true = dense_targets(y_true, num_labels, y_pred.dtype)
        return super().__call__(y_true, y_pred, sample_weight)

    def prior_scores(self, label_frequency):
        """The score per label that minimises the loss of a constant model.

        An output layer whose bias starts here (and whose weights start
        near 0) starts at the best model that ignores the input, instead of
        spending its first steps learning that almost every label is a
        negative: the prior initialisation of Lin et al., "Focal Loss for
        Dense Object Detection", ICCV 2017, Sec. 4.1, for each loss.

        Args:
          label_frequency: float ``[num_labels]``, the fraction of training
            instances that carry each label, in ``[0, 1]`` (a smoothed
            estimate: see :func:`smoothed_label_frequency`).

        Returns:
          float32 numpy ``[num_labels]``.
        """
        raise NotImplementedError

    #: This loss's name in :data:`xmc_tf.initializers.PRIOR_LOSSES`.
    _prior_loss = None

    def bias_initializer(self, labels_per_instance=None):
        """A Keras initializer of an output bias at this loss's prior score.

        :class:`xmc_tf.initializers.PriorBias` for this loss: every label
        starts at :meth:`prior_scores` of ``labels_per_instance /
        num_labels``, the label frequency when all labels are equally
        frequent.  Pass it as ``bias_initializer`` of the output layer
        (``UniformSparseDense``, ``LabelDense``, ``keras.layers.Dense``).
        Per-label frequencies, when known, do better:
        ``layer.bias.assign(loss.prior_scores(freq))`` (what ``xmc-tf
        train`` does, ``config.model.output_bias_init="prior"``).

        Args:
          labels_per_instance: float > 0, the mean number of positive labels
            per training instance.  None: rare labels (squared hinge only:
            ``-margin``).

        Returns:
          A serializable :class:`xmc_tf.initializers.PriorBias`.

        Raises:
          ValueError: ``labels_per_instance`` not > 0, or None for a loss
            other than the squared hinge.

        >>> SquaredHinge().bias_initializer()
        PriorBias(loss='squared_hinge', labels_per_instance=None, margin=1.0)
        """
        from xmc_tf.initializers import PriorBias
        return PriorBias(self._prior_loss, labels_per_instance,
                         margin=getattr(self, "margin", 1.0))


class _PerInstanceValues(keras.losses.Loss):
    """Keras' reduction of per-instance values computed elsewhere.

    ``reducer(values, y_pred, sample_weight)`` returns what a
    ``keras.losses.Loss`` whose ``call`` gave ``values`` returns: weighted,
    masked (``y_pred``'s Keras mask) and reduced by ``reduction``.
    """

    def call(self, y_true, y_pred):
        return y_true


@keras.saving.register_keras_serializable(package="xmc_tf")
class SquaredHinge(_MultiLabelLoss):
    """Squared hinge over all labels: ``sum_j max(0, 1 - t_j * s_j)**2``.

    ``t_j = 2 y_j - 1`` maps {0, 1} targets to {-1, +1}; ``s_j`` are the raw
    scores.  The gradient is exactly zero where the margin is satisfied
    (``t_j s_j >= 1``), so the uniform-sparse backward kernels skip those
    entries (Sec. 3.3, implicit negative mining).  Summed over labels (Sec. 2,
    eq. 2), averaged over the batch by the default reduction.

    Args:
      margin: the margin (1.0 in the paper).
      reduction, name, dtype: as for ``keras.losses.Loss``.

    Shapes: ``y_true`` int ``[batch, n]`` ids padded with -1, or float
    ``[batch, num_labels]``; ``y_pred`` float ``[batch, num_labels]``.
    Returns a scalar (per-instance ``[batch]`` with ``reduction=None``).

    >>> loss = SquaredHinge()
    >>> float(loss(tf.constant([[0]]), tf.constant([[2.0, -0.5]])))
    0.25
    """

    _prior_loss = "squared_hinge"

    def __init__(self, margin=1.0, reduction="sum_over_batch_size",
                 name="squared_hinge", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.margin = float(margin)

    def __call__(self, y_true, y_pred, sample_weight=None):
        """The loss, from label ids through the fused op when it can.

        Label ids (integer, or float ids: see :func:`dense_targets`) go to
        :func:`xmc_tf.ops.squared_hinge_loss` (one pass over the scores
        and one for the gradient; negative ids are padding, as for
        :func:`dense_targets`), then through Keras' reduction
        (``sample_weight``, masks, ``reduction``) as the per-instance values
        of :meth:`call` would.  Multi-hot targets, a loss ``dtype`` other
        than float32, a graph compiled by XLA (``jit_compile=True``: XLA
        cannot compile the custom op) or an op library without
        ``Xmc>SquaredHingeLoss`` take the dense path (:func:`dense_targets`,
        then :meth:`call`).
        """
        if (self.dtype != "float32" or not squared_hinge_loss_supported()
                or control_flow_util.GraphOrParentsInXlaContext(
                    tf.compat.v1.get_default_graph())):
            return super().__call__(y_true, y_pred, sample_weight)
        y_pred = tf.convert_to_tensor(y_pred)
        num_labels = y_pred.shape[-1]
        if num_labels is None:
            num_labels = tf.shape(y_pred)[-1]
        with tf.name_scope(self.name):
            scores = tf.cast(y_pred, tf.float32)
            per_instance = _dispatch_targets(
                y_true, num_labels,
                on_ids=lambda ids: squared_hinge_loss(
                    scores, tf.maximum(ids, -1), self.margin),
                on_dense=lambda y: self.call(tf.cast(y, tf.float32), scores))
        reducer = _PerInstanceValues(name=self.name, reduction=self.reduction,
                                     dtype=self.dtype)
        return reducer(per_instance, y_pred, sample_weight)

    def call(self, y_true, y_pred):
        signs = 2.0 * y_true - 1.0
        return tf.reduce_sum(tf.square(tf.nn.relu(self.margin - signs * y_pred)),
                             axis=-1)

    def prior_scores(self, label_frequency):
        """``margin * (2 p - 1)`` per label: the minimiser over constant
        scores ``c`` of ``p (margin - c)^2 + (1 - p) (margin + c)^2`` (both
        hinges active for ``|c| <= margin``), so ``-margin`` for a rare
        label.  See ``_MultiLabelLoss.prior_scores``.

        >>> SquaredHinge().prior_scores([0.0, 0.25, 1.0])
        array([-1. , -0.5,  1. ], dtype=float32)
        """
        p = np.asarray(label_frequency, np.float64)
        return (self.margin * (2.0 * p - 1.0)).astype(np.float32)

    def get_config(self):
        return {**super().get_config(), "margin": self.margin}


@keras.saving.register_keras_serializable(package="xmc_tf")
class BinaryCrossentropy(_MultiLabelLoss):
    """Binary cross-entropy from logits, summed over labels (Sec. 2, eq. 2).

    Every label gets a non-zero gradient, so the backward kernels cannot skip
    any entry: the comparison baseline for :class:`SquaredHinge`.

    Shapes as for :class:`SquaredHinge`; ``y_pred`` are logits.

    >>> float(BinaryCrossentropy()(tf.constant([[1]]), tf.constant([[0.0, 0.0]])))
    1.3862943649291992
    """

    _prior_loss = "bce"

    def __init__(self, reduction="sum_over_batch_size",
                 name="binary_crossentropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        return tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=y_true, logits=y_pred),
            axis=-1)

    def prior_scores(self, label_frequency):
        """``log(p / (1 - p))`` per label, the logit of its frequency (the
        minimiser of the expected binary cross-entropy of a constant logit;
        Lin et al. 2017, Sec. 4.1).  ``p`` is clipped to ``[1e-7, 1 - 1e-7]``
        (pass smoothed frequencies for finite, meaningful logits).

        >>> BinaryCrossentropy().prior_scores([0.5, 0.1]).round(4)
        array([ 0.    , -2.1972], dtype=float32)
        """
        p = np.clip(np.asarray(label_frequency, np.float64), 1e-7, 1 - 1e-7)
        return np.log(p / (1.0 - p)).astype(np.float32)


def smoothed_label_frequency(label_counts, num_instances):
    """Per-label positive rate ``(count + 0.5) / (num_instances + 1)``.

    The Krichevsky-Trofimov (add-1/2) estimate: never 0 or 1, so a label
    without training instances gets a finite prior score (about the score
    of a label seen once in ``2 num_instances`` instances).

    Args:
      label_counts: int ``[num_labels]``, training instances per label.
      num_instances: number of training instances (>= 0).

    Returns:
      float64 numpy ``[num_labels]`` in ``(0, 1)``.

    Raises:
      ValueError: a count is negative or exceeds ``num_instances``.

    >>> smoothed_label_frequency([0, 1, 3], 3)
    array([0.125, 0.375, 0.875])
    """
    counts = np.asarray(label_counts, np.float64)
    if counts.size and (counts.min() < 0 or counts.max() > num_instances):
        raise ValueError(f"label counts must be in [0, num_instances="
                         f"{num_instances}], got [{counts.min()}, {counts.max()}]")
    return (counts + 0.5) / (num_instances + 1.0)
