"""Scoring a model: top-k prediction and P@k, nDCG@k, PSP@k, R@k.

The decoder of any xmc_tf model (:func:`top_k_function`,
:func:`predict_top_k`, :func:`evaluate_model`) and the metrics table
(:func:`format_table`).  A (loaded) model is decoded by the type of its
scoring layer (:mod:`xmc_tf.decoding`): models that score every label
(``UniformSparseDense``, ``Dense``) keep the top ``k`` of the scores; a
:class:`~xmc_tf.layers.MachHead` is decoded exactly by the op ``Xmc>MachTopK`` (Medini et al., NeurIPS 2019,
Eq. 2) without a ``[batch, num_labels]`` tensor.  Used by training (test metrics),
``xmc-tf evaluate``/``predict`` and the benchmarks.  The batch loops, which
take the decoder as an argument, are the library's
(:func:`xmc_tf.metrics.evaluator.evaluate_top_k`,
:func:`~xmc_tf.metrics.evaluator.decode_batches`,
:func:`~xmc_tf.metrics.evaluator.score_batch_size`), so that
:class:`xmc_tf.callbacks.TopKEvaluation` uses them without the job.
"""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf.metrics.evaluator import (decode_batches, evaluate_top_k,
                                      score_batch_size)

__all__ = ["format_table", "top_k_function", "predict_top_k",
           "evaluate_model"]


def format_table(results: dict) -> str:
    """A plain-text table of the metrics dict (percent metrics first; nested
    entries such as the ``run`` marker are left out)."""
    results = {k: v for k, v in results.items() if not isinstance(v, dict)}
    keys = [k for k in results if "@" in k] + [k for k in results if "@" not in k]
    width = max(len(k) for k in keys)
    lines = []
    for k in keys:
        v = results[k]
        lines.append(f"{k:<{width}}  {v:.2f}" if isinstance(v, float)
                     else f"{k:<{width}}  {v}")
    return "\n".join(lines)

#: model -> {k: tf.function}; weak keys, and the functions reach the model
#: only through a weak reference, so a cached entry never keeps a model alive.
_TOP_K_FUNCTIONS = weakref.WeakKeyDictionary()


def top_k_function(model: keras.Model, k: int):
    """A ``tf.function`` mapping a feature batch to its top-k labels.

    One function per ``(model, k)``, made on the first call and returned
    again by later ones, with ``reduce_retracing=True``: evaluating once
    per epoch (:class:`xmc_tf.callbacks.TopKEvaluation`) traces it at most
    twice in a whole run (the first batch's shape, then a shape with an
    unknown batch size that also serves a shorter last batch), instead of
    a new function, traced again, on every call.

    Args:
      model: a Keras model built by xmc_tf, or any Keras model whose
        output scores labels (:func:`xmc_tf.decoding.scoring_layer`).
      k: labels per row (``1 <= k <= m``).

    Returns:
      A function ``x -> (ids int32 [b, k], scores float32 [b, k])``, best
      first (ties: lower label id); ``x`` is what the model takes (a
      ``tf.SparseTensor`` or a dense ``[b, D]`` tensor).

    Raises:
      ValueError: ``k`` out of range (:func:`xmc_tf.decoding.top_k_function`).
    """
    k = int(k)
    cached = _TOP_K_FUNCTIONS.get(model, {}).get(k)
    if cached is not None:
        return cached
    decoding.top_k_function(model, k)  # checks k now, not at the first trace
    model_ref = weakref.ref(model)

    def top_k(x):
        # Built at trace time from the live model (held weakly).
        return decoding.top_k_function(model_ref(), k)(x)

    function = tf.function(top_k, reduce_retracing=True)
    _TOP_K_FUNCTIONS.setdefault(model, {})[k] = function
    return function


def predict_top_k(model, dataset, k=5, batch_size=1024):
    """Top-k labels of every instance of an :class:`xmc_tf.data.XCDataset`.

    Scores are computed one batch of ``batch_size`` instances at a time
    (:func:`top_k_function`, :func:`xmc_tf.metrics.evaluator.decode_batches`), so
    memory is ``O(batch_size * m)`` for a label-wise head and
    ``O(batch_size * (R B + k))`` for MACH; ``batch_size`` is capped so
    that the score block stays within 256 MiB
    (:func:`xmc_tf.metrics.evaluator.score_batch_size`).

    Yields:
      ``(ids int32 [b, k], scores float32 [b, k])`` NumPy arrays per batch,
      in row order.

    Raises:
      ValueError: as :func:`top_k_function` (at the first batch).
    """
    yield from decode_batches(top_k_function(model, k), dataset,
                              score_batch_size(batch_size, model))


def evaluate_model(model, dataset, inv_propensities=None, ks=(1, 3, 5),
                   batch_size=1024) -> dict:
    """P@k, nDCG@k, PSP@k and recall@k (percent) of ``model`` on ``dataset``.

    The model's decoder (:func:`top_k_function`, top ``max(ks)`` labels)
    run by :func:`xmc_tf.metrics.evaluator.evaluate_top_k`, so no
    ``[num_instances, num_labels]`` array is held.

    Args:
      model: as for :func:`top_k_function`.
      dataset: :class:`xmc_tf.data.XCDataset` with labels.
      inv_propensities: float ``[m]`` inverse propensities for PSP@k
        (:func:`xmc_tf.metrics.inverse_propensities`); ``None`` omits PSP@k.
      ks: cut-offs.
      batch_size: instances per prediction batch (capped by
        :func:`xmc_tf.metrics.evaluator.score_batch_size`).

    Returns:
      The dict of :meth:`xmc_tf.metrics.XMCEvaluator.result` (keys ``P@k``,
      ``nDCG@k``, ``PSP@k``, ``R@k``, ``num_instances``).

    Raises:
      ValueError: bad ``ks`` (empty, or a ``k`` out of ``[1, m]``) or
        ``inv_propensities``; no head recognises the model.
    """
    ks = tuple(ks)
    if not ks:
        raise ValueError("ks must not be empty")
    return evaluate_top_k(top_k_function(model, max(ks)), dataset,
                          inv_propensities, ks,
                          score_batch_size(batch_size, model))
