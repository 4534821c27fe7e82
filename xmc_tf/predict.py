"""Top-k prediction for any xmc_tf model, without ``[batch, m]`` for MACH.

A model whose last layer scores every label (``UniformSparseDense``,
``keras.layers.Dense``) is reduced with ``tf.math.top_k``; a model whose
last layer is a :class:`~xmc_tf.layers.MachHead` is decoded exactly by the
op ``Xmc>MachTopK`` (Medini et al., NeurIPS 2019, Eq. 2) with the head's
hashes and ``decode_activation``, so no ``[batch, num_labels]`` tensor is
formed.  Used by training (validation P@k), evaluation, ``xmc-tf predict``
and the SavedModel export.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf import data as xdata
from xmc_tf import metrics as xmetrics
from xmc_tf.layers import MachDecoder, MachHead

__all__ = ["mach_head", "top_k_function", "predict_top_k", "evaluate_model"]


def mach_head(model: keras.Model) -> MachHead | None:
    """The model's last layer if it is a :class:`MachHead`, else ``None``."""
    layers = getattr(model, "layers", None) or []
    return layers[-1] if layers and isinstance(layers[-1], MachHead) else None


def top_k_function(model: keras.Model, k: int):
    """A ``tf.function`` mapping a feature batch to its top-k labels.

    Args:
      model: a Keras model mapping features to ``[b, m]`` label scores, or
        ending in a :class:`MachHead` (``[b, R, B]`` logits).
      k: labels per row (``1 <= k <= m``).

    Returns:
      A function ``x -> (ids int32 [b, k], scores float32 [b, k])``, best
      first (ties: lower label id); ``x`` is what the model takes (a
      ``tf.SparseTensor`` or a dense ``[b, D]`` tensor).

    Raises:
      ValueError: ``k`` out of range for a MACH head.
    """
    head = mach_head(model)
    if head is not None:
        decoder = MachDecoder.from_head(head, k=k)
        return tf.function(lambda x: decoder(model(x, training=False)))

    def top_k(x):
        top = tf.math.top_k(model(x, training=False), k=k)
        return top.indices, top.values
    return tf.function(top_k)


def predict_top_k(model, dataset, k=5, batch_size=1024):
    """Top-k labels of every instance of an :class:`xmc_tf.data.XCDataset`.

    Scores are computed one batch of ``batch_size`` instances at a time
    (:func:`top_k_function`), so memory is ``O(batch_size * m)`` for a
    label-wise head and ``O(batch_size * (R B + k))`` for MACH.

    Yields:
      ``(ids int32 [b, k], scores float32 [b, k])`` NumPy arrays per batch,
      in row order.
    """
    predict = top_k_function(model, k)
    for features, _ in xdata.make_tf_dataset(dataset, batch_size):
        ids, scores = predict(features)
        yield ids.numpy(), scores.numpy()


def evaluate_model(model, dataset, inv_propensities=None, ks=(1, 3, 5),
                   batch_size=1024) -> dict:
    """P@k, nDCG@k, PSP@k and recall@k (percent) of ``model`` on ``dataset``.

    Predictions come from :func:`predict_top_k` (top ``max(ks)`` labels per
    batch), so no ``[num_instances, num_labels]`` array is held.

    Args:
      model: as for :func:`top_k_function`.
      dataset: :class:`xmc_tf.data.XCDataset` with labels.
      inv_propensities: float ``[m]`` inverse propensities for PSP@k
        (:func:`xmc_tf.metrics.inverse_propensities`); ``None`` omits PSP@k.
      ks: cut-offs.
      batch_size: instances per prediction batch.

    Returns:
      The dict of :meth:`xmc_tf.metrics.XMCEvaluator.result` (keys ``P@k``,
      ``nDCG@k``, ``PSP@k``, ``R@k``, ``num_instances``).
    """
    evaluator = xmetrics.XMCEvaluator(ks=ks, inv_propensities=inv_propensities)
    start = 0
    for ids, _ in predict_top_k(model, dataset, max(ks), batch_size):
        stop = start + ids.shape[0]
        evaluator.update(ids, dataset.labels[start:stop])
        start = stop
    return evaluator.result()
