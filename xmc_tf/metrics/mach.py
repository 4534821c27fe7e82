"""Streaming P@k of a MACH head, decoded exactly (Medini et al. 2019, Eq. 2)."""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.losses.targets import target_label_ids
from xmc_tf.metrics.keras_metrics import PrecisionAtK
from xmc_tf.ops.mach import (ACTIVATIONS, MachHashing, mach_top_k,
                             meta_probabilities)

__all__ = ["MachPrecisionAtK"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachPrecisionAtK(PrecisionAtK):
    """Streaming P@k of a MACH head, decoded exactly from its logits.

    ``y_pred`` is the ``[b, R, B]`` logits of a
    :class:`xmc_tf.layers.mach.MachHead`; the top-k labels are those of
    MACH's estimator (Medini et al. 2019, Eq. 2: mean over repetitions of
    the probability of the label's bucket), found by the op
    ``Xmc>MachTopK`` (:func:`xmc_tf.ops.mach_top_k`) without a
    ``[b, num_labels]`` tensor.  Otherwise as :class:`PrecisionAtK`
    (same default name ``precision_at_{k}``, so callbacks can monitor
    ``val_precision_at_3`` whatever the head).

    Args:
        k: cut-off, ``1 <= k <= num_labels``.
        hashing: the head's hash family: a ``MachHead``, a
            :class:`xmc_tf.ops.MachHashing` or its config dict.
        activation: ``"softmax"`` or ``"sigmoid"`` (how the head was
            trained; see :func:`xmc_tf.ops.meta_probabilities`); ``None``
            takes a ``MachHead``'s ``decode_activation``.
        name, dtype: as for :class:`PrecisionAtK`.

    ``update_state(y_true, y_pred, sample_weight=None)``: ``y_true``
    label ids ``[b, n]`` padded with ``-1`` (float ids, as Keras passes
    under a ``tf.distribute`` strategy, are rounded), a multi-hot or a
    ``tf.SparseTensor`` ``[b, num_labels]`` (see
    :mod:`xmc_tf.losses.targets`).

    Argument order: ``k`` first, as for every P@k metric of
    :mod:`xmc_tf.metrics` (``PrecisionAtK(k)``, ``PSPAtK(k,
    inv_propensities)``), then the head's hash family, which is the first
    argument of the MACH losses (``MachSoftmaxCrossentropy(hashing)``):
    ``MachPrecisionAtK(k, hashing)``.

    Raises:
        ValueError: bad ``k``, ``activation`` or hash family; ``y_pred`` not
            ``[b, R, B]``.

    Example:
        >>> from xmc_tf.ops import MachHashing
        >>> h = MachHashing.random(10, 4, 2, seed=0)
        >>> logits = tf.one_hot(h.buckets([[3]])[:, 0], 4) * 5.0  # [1, 2, 4]
        >>> m = MachPrecisionAtK(1, h, activation="softmax")
        >>> m.update_state([[3, -1]], logits)
        >>> float(m.result())
        1.0
    """

    def __init__(self, k, hashing, activation=None, name=None, dtype=None):
        if activation is None:
            activation = getattr(hashing, "decode_activation", "softmax")
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        super().__init__(k, name=name, dtype=dtype)
        self.hashing = MachHashing.from_any(hashing)
        if self.k > self.hashing.num_labels:
            raise ValueError(f"k={self.k} exceeds the number of labels "
                             f"{self.hashing.num_labels}")
        self.activation = activation

    def _true_and_top_k(self, y_true, y_pred):
        ids = target_label_ids(y_true, self.hashing.num_labels)
        probs = meta_probabilities(y_pred, self.activation)
        topk, _ = mach_top_k(probs, self.k, self.hashing)
        return ids, topk

    def get_config(self):
        config = super().get_config()
        config.update({"hashing": self.hashing.get_config(),
                       "activation": self.activation})
        return config
