"""The MACH head: R meta-classifiers over B hashed buckets.

Medini et al., "Extreme Classification in Log Memory using Count-Min Sketch"
(NeurIPS 2019), Sec. 3 and Algorithm 1.  The head outputs ``[b, R, B]``
bucket logits; top-k labels come from the exact decoder op ``Xmc>MachTopK``
(Eq. 2), so no ``[b, num_labels]`` tensor is ever formed.  Decoding every
training batch would cost ``O(m R)`` per row while the head is untrained
(flat meta-probabilities), so validation P@k is computed once per epoch by
:class:`xmc_tf.callbacks.TopKEvaluation`.
"""

from __future__ import annotations

from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import OUTPUT_LAYER, Head, register
from xmc_tf.layers import MachHead as MachHeadLayer
from xmc_tf.losses import MachBinaryCrossentropy, MachSoftmaxCrossentropy

__all__ = ["MachOutputHead", "MACH_LOSSES"]

#: ``config.loss`` -> (loss class, decoding activation): "bce" over bucket
#: indicators (multi-label), "softmax" per repetition (multi-class).
MACH_LOSSES = {"bce": (MachBinaryCrossentropy, "sigmoid"),
               "softmax": (MachSoftmaxCrossentropy, "softmax")}


@register
class MachOutputHead(Head):
    """``config.model.head = "mach"``: ``MachHead(num_labels,
    config.model.num_buckets, config.model.num_repetitions)``."""

    name = "mach"
    config_defaults = xconfig.HEAD_DEFAULTS["mach"]
    losses = tuple(MACH_LOSSES)
    full_scores_in_training = False
    scores_every_label = False  # bucket scores, decoded by Xmc>MachTopK

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        mc = self.config.model
        return MachHeadLayer(num_labels, mc.num_buckets, mc.num_repetitions,
                             seed=self.config.seed,
                             decode_activation=MACH_LOSSES[self.config.loss][1],
                             name=OUTPUT_LAYER)

    def make_loss(self, layer):
        return MACH_LOSSES[self.config.loss][0](layer)

    def results(self, layer):
        return {"num_buckets": layer.num_buckets,
                "num_repetitions": layer.num_repetitions}
