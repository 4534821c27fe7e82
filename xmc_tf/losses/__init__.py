"""Losses of xmc_tf; targets may be label ids padded with -1 (see hinge.py)."""

from xmc_tf.losses.hinge import BinaryCrossEntropy, SquaredHinge, dense_targets

__all__ = ["BinaryCrossEntropy", "SquaredHinge", "dense_targets"]
