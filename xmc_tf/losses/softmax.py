"""Softmax cross-entropy over all labels, for multi-class and multi-label rows.

The full-softmax baseline of extreme multi-class training (the SCENT and LSH
papers' reference): for an instance with positives ``P`` and scores ``s``
over all ``m`` labels::

    loss = (1 / |P|) * sum_{p in P} ( logsumexp_j s_j - s_p ),

i.e. the cross-entropy against the uniform distribution over the positives
(one positive: the usual softmax cross-entropy).  A row without positives
contributes 0.  Cost ``O(m)`` per instance: the sampled softmax of
:mod:`xmc_tf.losses.sampled` estimates it from a few candidates.

Source: Bengio & Senecal (2008) / Jean et al. (2015), the full objective
that sampled softmax approximates; the multi-label normalisation is that of
Jain et al. (2019, "SLICE", Sec. 3) and of ``SampledSoftmax``.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.losses.hinge import _MultiLabelLoss

__all__ = ["SoftmaxCrossentropy"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class SoftmaxCrossentropy(_MultiLabelLoss):
    """Softmax cross-entropy averaged over each row's positives.

    Shapes: ``y_true`` int ``[batch, n]`` label ids padded with -1 (or a
    float multi-hot ``[batch, num_labels]``); ``y_pred`` float logits
    ``[batch, num_labels]``.  Returns a scalar (per-instance ``[batch]``
    with ``reduction=None``).

    >>> import tensorflow as tf
    >>> round(float(SoftmaxCrossentropy()(tf.constant([[0]]),
    ...                                   tf.constant([[0.0, 0.0]]))), 4)
    0.6931
    """

    _prior_loss = "softmax"

    def __init__(self, reduction="sum_over_batch_size",
                 name="softmax_crossentropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        num_pos = tf.reduce_sum(y_true, axis=-1)
        log_z = tf.reduce_logsumexp(y_pred, axis=-1)
        pos_sum = tf.reduce_sum(y_true * y_pred, axis=-1)
        return tf.math.divide_no_nan(num_pos * log_z - pos_sum, num_pos)

    def prior_scores(self, label_frequency):
        """``log p`` per label: a constant softmax over these logits is the
        label distribution, the best constant prediction (softmax logits are
        defined up to a shift; ``p`` is clipped below at ``1e-12``).  Exact
        for multi-class rows; for multi-label rows the best constant weights
        each instance's labels by ``1 / (its number of labels)``, which
        frequencies approximate.

        >>> SoftmaxCrossentropy().prior_scores([1.0, 0.5]).round(4)
        array([ 0.    , -0.6931], dtype=float32)
        """
        p = np.maximum(np.asarray(label_frequency, np.float64), 1e-12)
        return np.log(p).astype(np.float32)
