"""The wide path of the job's models: per label a sparse linear classifier
on the input features, its scores added to the head's -- planned (how many
connections per label fit the memory cap), built and initialised from the
training data here, by the model builder (:mod:`xmc_tf.job.build`) and the
job (:func:`xmc_tf.job.run.build`).

Source: the "wide" part of Cheng et al., "Wide & Deep Learning for
Recommender Systems" (DLRS 2016): a linear model on the sparse features
trained jointly with the deep one; here each label keeps the features of
its positive instances (PIFA, as the label representations of Parabel /
PECOS) as uniform-sparse connections
(:func:`xmc_tf.layers.label_feature_connections`), and the kernel trains
``config.model.wide_lr_multiplier`` times faster.
"""

from __future__ import annotations

import keras
import numpy as np
import scipy.sparse as sp
from absl import logging

from xmc_tf.layers import UniformSparseDense, label_feature_connections

__all__ = ["WIDE_BYTES_PER_CONNECTION", "WIDE_INITS", "wide_fan_in",
           "plan_fan_in", "build_wide", "initialize_wide"]

#: Training bytes per wide-path connection: float32 weight, int32 index,
#: two float32 Adam moments and the float32 gradient.
WIDE_BYTES_PER_CONNECTION = 20
#: ``config.model.wide_init`` values: the wide kernel starts at 0, or at
#: each label's centroid cosine scaled so that a positive pair scores 1.
WIDE_INITS = ("zeros", "centroid")


def wide_fan_in(model_config, num_features: int, num_labels: int) -> int:
    """Connections per label of the wide path for a data set.

    ``model_config.wide_connections``, at most ``num_features``, and cut so
    that the wide path's training memory,
    ``WIDE_BYTES_PER_CONNECTION * num_labels * s`` bytes, stays within
    ``model_config.wide_max_mib`` MiB (None or a config without the field:
    no cap).  With the defaults (128 connections, 64 MiB) every label keeps
    128 connections up to 26,214 labels, Amazon-670K gets 5 and a label
    space of more than 3.3M labels none.

    Args:
      model_config: ``config.model`` (``wide_connections``, optionally
        ``wide_max_mib``).
      num_features: input width ``e`` (>= 0).
      num_labels: ``m`` (>= 0).

    Returns:
      int ``s`` in ``[0, wide_connections]``; 0 means no wide path.

    >>> from xmc_tf import config as xconfig
    >>> mc = xconfig.base().model
    >>> wide_fan_in(mc, 1836, 159), wide_fan_in(mc, 135909, 670091)
    (128, 5)
    >>> mc.wide_max_mib = None
    >>> wide_fan_in(mc, 135909, 670091), wide_fan_in(mc, 100, 670091)
    (128, 100)
    """
    fan_in = max(0, min(int(model_config.wide_connections), int(num_features)))
    max_mib = model_config.get("wide_max_mib")
    if max_mib is not None and num_labels > 0:
        fan_in = min(fan_in, (int(max_mib) << 20) //
                     (WIDE_BYTES_PER_CONNECTION * int(num_labels)))
    return fan_in


def plan_fan_in(config, head, num_features: int, num_labels: int,
                sparse_input: bool, linear: bool) -> int:
    """Connections per label the model gets (0: no wide path): the wide
    path reads sparse features, beside a hidden network (not a linear
    model), for heads with :attr:`~xmc_tf.job.heads.Head.wide_path`;
    :func:`wide_fan_in` of ``config.model`` (each cut logged)."""
    mc = config.model
    wide = mc.wide_connections if sparse_input else 0
    if wide and not head.wide_path:
        logging.info("config.model.wide_connections=%s: head %r has no wide "
                     "path; built without it", wide, mc.head)
        return 0
    if not wide or linear:
        return 0
    fan_in = wide_fan_in(mc, num_features, num_labels)
    if fan_in < min(int(wide), num_features):
        full = WIDE_BYTES_PER_CONNECTION * num_labels * min(int(wide),
                                                            num_features)
        logging.info(
            "wide path: %d connections per label would take %.2f GiB at %d "
            "labels (%d bytes per connection in training); "
            "config.model.wide_max_mib=%s allows %d%s",
            min(int(wide), num_features), full / 2**30, num_labels,
            WIDE_BYTES_PER_CONNECTION, mc.wide_max_mib, fan_in,
            "" if fan_in else ": built without it")
    return fan_in


def build_wide(config, num_labels: int, fan_in: int) -> UniformSparseDense:
    """The wide layer (named ``"wide"``): ``num_labels`` labels of
    ``fan_in`` connections, kernel 0, connections set by
    :func:`initialize_wide`."""
    mc = config.model
    return UniformSparseDense(
        num_labels, fan_in, use_bias=False, kernel_initializer="zeros",
        seed=config.seed, kernel_scale=mc.wide_lr_multiplier,
        kernel_regularizer=(keras.regularizers.L2(mc.wide_l2)
                            if mc.wide_l2 else None), name="wide")


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


def initialize_wide(layer: UniformSparseDense, config, train_data) -> None:
    """Connects each label of the built wide ``layer`` to the features
    strongest in its training instances
    (:func:`~xmc_tf.layers.label_feature_connections`, seed
    ``config.seed``) and, with ``config.model.wide_init="centroid"``, starts
    the kernel at the label centroids scaled so a positive pair scores 1.
    Called on a fresh model only (a resume restores its checkpoint).

    Args:
      layer: the built wide layer (``[m, s]`` connections).
      config: the job config.
      train_data: the normalised :class:`xmc_tf.data.XCDataset` ``fit``
        trains on (sparse features).
    """
    fan_in = int(layer.indices.shape[1])
    ratio = config.model.get("wide_max_fan_out")
    max_fan_out = None
    if ratio is not None:
        max_fan_out = max(1, int(np.ceil(
            float(ratio) * layer.units * fan_in / train_data.num_features)))
    indices, weights = label_feature_connections(
        train_data.features, train_data.labels, fan_in, config.seed,
        return_weights=True, max_fan_out=max_fan_out)
    layer.indices.assign(indices)
    scale = 0.0
    if config.model.wide_init == "centroid":
        scale = _centroid_scale(train_data, indices, weights)
        layer.kernel.assign(weights * (scale / layer.kernel_scale))
    logging.info("wide path: %d connections per label from the labels' "
                 "positive instances%s, kernel %s", indices.shape[1],
                 f", at most {max_fan_out} labels per feature"
                 if max_fan_out else "",
                 f"the centroids x {scale:.3g}" if scale else "zeros")
