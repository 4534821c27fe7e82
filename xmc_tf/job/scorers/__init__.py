"""The job's fused scorers, one module per kind (registration order is the
fusion order): the label tree, the label centroids, the neighbour votes.
See :mod:`xmc_tf.job.scorers.base` for what a kind declares; a new scorer
is a new module imported here."""

from xmc_tf.job.scorers.base import (BuiltScorer, FusedScorer, Variant,
                                     fusion_weight, get, kinds, register)
from xmc_tf.job.scorers import tree  # noqa: F401  (registers, in order)
from xmc_tf.job.scorers import centroids  # noqa: F401
from xmc_tf.job.scorers import neighbours  # noqa: F401

__all__ = ["BuiltScorer", "FusedScorer", "Variant", "fusion_weight", "get",
           "kinds", "register"]
