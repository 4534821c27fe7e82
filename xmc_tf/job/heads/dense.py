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
import numpy as np
import scipy.sparse as sp
from absl import logging

from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import (OUTPUT_LAYER, WIDE_LAYER, Head, register,
                                   wide_fan_in)
from xmc_tf.layers import (LabelDense, SparseEmbeddingBag,
                            label_feature_connections)
from xmc_tf.losses import (BinaryCrossentropy, SoftmaxCrossentropy, SquaredHinge,
                            smoothed_label_frequency)

__all__ = ["DenseHead", "LABEL_WISE_LOSSES", "LabelWiseHead", "OUTPUT_BIAS_INITS",
           "WIDE_INITS"]

#: ``config.loss`` -> loss class of the heads that score every label.
LABEL_WISE_LOSSES = {"squared_hinge": SquaredHinge, "bce": BinaryCrossentropy,
                     "softmax": SoftmaxCrossentropy}


#: ``config.model.output_bias_init`` values of the label-wise heads.
OUTPUT_BIAS_INITS = ("prior", "zeros")


#: ``config.model.wide_init`` values: the wide kernel starts at 0, or at
#: each label's centroid cosine scaled so that a positive pair scores 1.
WIDE_INITS = ("zeros", "centroid")


def _centroid_scale(train_data, indices, weights) -> float:
    """``1 / mean`` over the training positives ``(i, j)`` of ``x_i . w_j``
    (``w_j``: label ``j``'s uniform-sparse row ``indices``/``weights``)."""
    pos = train_data.labels.tocoo()
    s = indices.shape[1]
    label_rows = sp.csr_matrix(
        (weights[pos.col].ravel(), indices[pos.col].ravel(),
         np.arange(pos.nnz + 1) * s),
        shape=(pos.nnz, train_data.num_features))
    scores = train_data.features[pos.row].multiply(label_rows).sum(axis=1)
    return 1.0 / max(float(np.mean(scores)), 1e-3)


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
    _wide_connections = None
    _wide_scale = 0.0

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
        """Counts the training instances of each label (``"prior"``) and,
        with ``config.model.wide_connections`` on sparse features, picks
        the wide path's connections
        (:func:`~xmc_tf.layers.label_feature_connections`;
        :func:`~xmc_tf.job.heads.wide_fan_in` of them per label)."""
        self._label_frequency = self._wide_connections = None
        self._wide_scale = 0.0
        wide = wide_fan_in(self.config.model, train_data.num_features,
                           train_data.num_labels)
        if wide and train_data.is_sparse:
            self._wide_connections = label_feature_connections(
                train_data.features, train_data.labels, wide,
                self.config.seed, return_weights=True)
            if self.config.model.wide_init == "centroid":
                self._wide_scale = _centroid_scale(train_data,
                                                   *self._wide_connections)
        if self.config.model.output_bias_init != "prior":
            return
        self._label_frequency = smoothed_label_frequency(
            train_data.label_counts(), train_data.num_instances)

    def initialize(self, layer, model=None):
        """Assigns the prior scores to ``layer.bias`` (``"prior"``) and the
        connections :meth:`prepare` picked to the ``model``'s wide layer.
        The head keeps no copy of the wide connections once they are
        assigned (two ``[m, s]`` arrays: 0.7 GB at 670k labels, s = 128).

        Raises:
          ValueError: :meth:`prepare` saw another number of labels.
        """
        if self._wide_connections is not None and model is not None and any(
                l.name == WIDE_LAYER for l in model.layers):
            # (a linear model, no hidden layer, is built without the wide
            # path: xmc_tf.job.build.build_model)
            wide = model.get_layer(WIDE_LAYER)
            indices, weights = self._wide_connections
            wide.indices.assign(indices)
            if self._wide_scale:
                wide.kernel.assign(weights * (self._wide_scale /
                                              wide.kernel_scale))
            logging.info("wide path: %d connections per label from the "
                         "labels' positive instances, kernel %s",
                         indices.shape[1], f"the centroids x {self._wide_scale:.3g}"
                         if self._wide_scale else "zeros")
            self._wide_connections = None  # the layer holds them now
            del indices, weights
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
    layer_types = (keras.layers.Dense, LabelDense, SparseEmbeddingBag)

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        if sparse_input:
            # A linear model on sparse features: row-sparse gradients over
            # the batch's features instead of a dense [D, m] one.
            return SparseEmbeddingBag(num_labels, name=OUTPUT_LAYER)
        return keras.layers.Dense(num_labels, name=OUTPUT_LAYER)
