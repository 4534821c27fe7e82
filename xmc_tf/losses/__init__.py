"""Losses of xmc_tf.

Targets (``y_true``) may be padded label ids, the same ids cast to float
by a ``tf.distribute`` strategy, a dense multi-hot or a ``tf.SparseTensor``
(a scipy CSR ``y`` given to ``fit``): see :mod:`xmc_tf.losses.targets`.
The sampled losses and :class:`ScentLoss` score sampled candidates and are
called by :class:`xmc_tf.models.SampledTrainer` / :class:`xmc_tf.models.ScentTrainer`,
not by ``model.compile(loss=...)``.
"""

from xmc_tf.losses.hinge import (BinaryCrossentropy, SquaredHinge,
                                 smoothed_label_frequency)
from xmc_tf.losses.mach import (MachBinaryCrossentropy, MachSoftmaxCrossentropy,
                                mach_bucket_targets)
from xmc_tf.losses.softmax import SoftmaxCrossentropy
from xmc_tf.losses.sampled import (SampledBinaryCrossentropy, SampledSoftmax,
                                   SampledSquaredHinge)
from xmc_tf.losses.targets import dense_targets, target_label_ids
from xmc_tf.losses.scent import ScentLoss, multiclass_labels

__all__ = ["BinaryCrossentropy", "MachBinaryCrossentropy",
           "MachSoftmaxCrossentropy", "SquaredHinge", "dense_targets",
           "mach_bucket_targets", "smoothed_label_frequency",
           "SoftmaxCrossentropy", "SampledBinaryCrossentropy",
           "SampledSoftmax", "SampledSquaredHinge", "ScentLoss",
           "multiclass_labels", "target_label_ids"]
