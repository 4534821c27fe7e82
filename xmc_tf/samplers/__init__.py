"""Negative samplers for sampled training heads (see :mod:`.base`)."""

from xmc_tf.samplers.base import Candidates, NegativeSampler, mask_accidental_hits
from xmc_tf.samplers.ann import AnnNegativeSampler
from xmc_tf.samplers.in_batch import InBatchSampler
from xmc_tf.samplers.mixture import MixtureSampler
from xmc_tf.samplers.uniform import UniformNegativeSampler
from xmc_tf.samplers.vectors import label_vectors

__all__ = ["Candidates", "NegativeSampler", "mask_accidental_hits"]
__all__ += ["AnnNegativeSampler", "InBatchSampler", "MixtureSampler",
            "UniformNegativeSampler", "label_vectors"]
from xmc_tf.samplers.lsh import LshNegativeSampler, lsh_auto_K  # noqa: E402

__all__ += ["LshNegativeSampler", "lsh_auto_K"]
