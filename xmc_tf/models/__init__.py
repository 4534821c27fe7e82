"""Keras models a user wraps around their own model to train its head on a
few scored labels per step: :class:`SampledTrainer` (positives + sampled
negatives: uniform, in-batch, ANN / ASTRA, LSH) and :class:`ScentTrainer`
(SCENT's full softmax on in-batch classes)."""

from xmc_tf.models.candidates import CandidateTrainer
from xmc_tf.models.distributed import DistributedModel, DistributedTrainerMixin
from xmc_tf.models.sampled import SampledTrainer
from xmc_tf.models.scent import ScentTrainer, scent_optimizer

__all__ = ["CandidateTrainer", "DistributedModel", "DistributedTrainerMixin",
           "SampledTrainer", "ScentTrainer",
           "scent_optimizer"]
