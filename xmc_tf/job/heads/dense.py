"""The dense output head: ``keras.layers.Dense(num_labels)``.

Directly on sparse input features (a linear, DiSMEC-like one-vs-all model,
``configs/linear.py``) the layer is a
:class:`~xmc_tf.layers.SparseEmbeddingBag` (same function, row-sparse
gradient).  Trained models whose head layer is a label-major
:class:`~xmc_tf.layers.LabelDense` (the dense layer of sampled heads) are
decoded by this head too.

The paper's baseline (Schultheis & Babbar, Sec. 4): every label is
connected to every unit of the intermediate layer, ``4 (d + 1) m`` bytes.
Losses: squared hinge or binary cross-entropy over all labels
(:mod:`xmc_tf.losses.hinge`), or the full softmax cross-entropy
(:mod:`xmc_tf.losses.softmax`, multi-class data).
"""

from __future__ import annotations

import keras
from absl import logging

from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import OUTPUT_LAYER, Head, register
from xmc_tf.job.wide import WIDE_INITS
from xmc_tf.layers import SparseEmbeddingBag
from xmc_tf.losses import (BinaryCrossentropy, SoftmaxCrossentropy, SquaredHinge,
                            smoothed_label_frequency)

__all__ = ["DenseHead", "LABEL_WISE_LOSSES", "LabelWiseHead", "OUTPUT_BIAS_INITS"]

#: ``config.loss`` -> loss class of the heads that score every label.
LABEL_WISE_LOSSES = {"squared_hinge": SquaredHinge, "bce": BinaryCrossentropy,
                     "softmax": SoftmaxCrossentropy}


#: ``config.model.output_bias_init`` values of the label-wise heads.
OUTPUT_BIAS_INITS = ("prior", "zeros")


class LabelWiseHead(Head):
    """Base of the heads that score every label with a label-wise loss
    (:data:`LABEL_WISE_LOSSES`): the output bias starts at the loss's best
    constant score per label (``config.model.output_bias_init="prior"``,
    :meth:`~xmc_tf.losses.SquaredHinge.prior_scores` of the smoothed
    training label frequencies) or at 0 (``"zeros"``).

    With the squared hinge and a zero bias, every one of the ``m`` labels
    violates its margin at the start, the loss is about ``m`` per instance
    and the first epochs are spent pushing all scores below -1; the
    prior start skips that phase (on a 19.6k-label set the validation P@1
    after one epoch went from 35 % to 87 %).  Heads whose config has no
    ``output_bias_init`` field start at 0.
    """

    losses = tuple(LABEL_WISE_LOSSES)
    wide_path = True
    _label_frequency = None

    def check_config(self):
        super().check_config()
        init = self.config.model.output_bias_init
        if init not in OUTPUT_BIAS_INITS:
            raise ValueError(f"config.model.output_bias_init={init!r}; "
                             f"expected one of {OUTPUT_BIAS_INITS}")
        wide_init = self.config.model.wide_init
        if wide_init not in WIDE_INITS:
            raise ValueError(f"config.model.wide_init={wide_init!r}; "
                             f"expected one of {WIDE_INITS}")

    def make_loss(self, layer):
        return LABEL_WISE_LOSSES[self.config.loss]()

    def prepare(self, train_data):
        """Counts the training instances of each label (``"prior"``)."""
        self._label_frequency = None
        if self.config.model.output_bias_init != "prior":
            return
        self._label_frequency = smoothed_label_frequency(
            train_data.label_counts(), train_data.num_instances)

    def initialize(self, layer, model=None):
        """Assigns the prior scores to ``layer.bias`` (``"prior"``).

        Raises:
          ValueError: :meth:`prepare` saw another number of labels.
        """
        del model
        if self._label_frequency is None or getattr(layer, "bias", None) is None:
            return
        if self._label_frequency.shape[0] != layer.bias.shape[0]:
            raise ValueError(
                f"the training data has {self._label_frequency.shape[0]} "
                f"labels, the output layer {layer.bias.shape[0]}")
        prior = self.make_loss(layer).prior_scores(self._label_frequency)
        layer.bias.assign(keras.ops.cast(prior, layer.bias.dtype))
        logging.info("output bias: the %s prior of each label's training "
                     "frequency, in [%.3f, %.3f]", self.config.loss,
                     float(prior.min()), float(prior.max()))


@register
class DenseHead(LabelWiseHead):
    """``config.model.head = "dense"``: a fully connected output layer."""

    name = "dense"
    config_defaults = xconfig.HEAD_DEFAULTS["dense"]

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        if sparse_input:
            # A linear model on sparse features: row-sparse gradients over
            # the batch's features instead of a dense [D, m] one.
            return SparseEmbeddingBag(num_labels, name=OUTPUT_LAYER)
        return keras.layers.Dense(num_labels, name=OUTPUT_LAYER)
