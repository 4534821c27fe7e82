"""Negative samplers for sampled training heads (see :mod:`.base`)."""

from xmc_tf.samplers.base import Candidates, NegativeSampler, mask_accidental_hits

__all__ = ["Candidates", "NegativeSampler", "mask_accidental_hits"]
