"""Losses of xmc_tf; targets may be label ids padded with -1 (see hinge.py)."""

from xmc_tf.losses.hinge import (BinaryCrossEntropy, SquaredHinge, dense_targets,
                                 smoothed_label_frequency)
from xmc_tf.losses.mach import (MachBinaryCrossentropy, MachSoftmaxCrossentropy,
                                mach_bucket_targets)
from xmc_tf.losses.softmax import SoftmaxCrossEntropy
from xmc_tf.losses.sampled import (SampledBinaryCrossEntropy, SampledSoftmax,
                                   SampledSquaredHinge)

__all__ = ["BinaryCrossEntropy", "MachBinaryCrossentropy",
           "MachSoftmaxCrossentropy", "SquaredHinge", "dense_targets",
           "mach_bucket_targets", "smoothed_label_frequency"]
__all__ += ["SoftmaxCrossEntropy"]
__all__ += ["SampledBinaryCrossEntropy", "SampledSoftmax", "SampledSquaredHinge"]
from xmc_tf.losses.scent import ScentLoss, multiclass_labels  # noqa: E402
__all__ += ["ScentLoss", "multiclass_labels"]
