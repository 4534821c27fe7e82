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

from xmc_tf.heads.base import OUTPUT_LAYER, Head, register
from xmc_tf.layers import LabelDense, SparseEmbeddingBag
from xmc_tf.losses import BinaryCrossEntropy, SoftmaxCrossEntropy, SquaredHinge

__all__ = ["DenseHead", "LABEL_WISE_LOSSES"]

#: ``config.loss`` -> loss class of the heads that score every label.
LABEL_WISE_LOSSES = {"squared_hinge": SquaredHinge, "bce": BinaryCrossEntropy,
                     "softmax": SoftmaxCrossEntropy}


@register
class DenseHead(Head):
    """``config.model.head = "dense"``: a fully connected output layer."""

    name = "dense"
    losses = tuple(LABEL_WISE_LOSSES)
    layer_types = (keras.layers.Dense, LabelDense, SparseEmbeddingBag)

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        if sparse_input:
            # A linear model on sparse features: row-sparse gradients over
            # the batch's features instead of a dense [D, m] one.
            return SparseEmbeddingBag(num_labels, name=OUTPUT_LAYER)
        return keras.layers.Dense(num_labels, name=OUTPUT_LAYER)

    def make_loss(self, layer):
        return LABEL_WISE_LOSSES[self.config.loss]()
