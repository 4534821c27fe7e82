"""Top-k decoding of a data set in batches, and its P@k, nDCG@k, PSP@k, R@k.

The loop shared by :mod:`xmc_tf.predict` (which finds a model's decoder
through its head) and :class:`xmc_tf.callbacks.TopKEvaluation` (which is
given one).  It takes the decoder -- a function from a feature batch to its
top-k labels -- as an argument, so it depends on neither the heads nor
:mod:`xmc_tf.predict`: callbacks that evaluate can be imported by the heads
that create them without an import cycle.
"""

from __future__ import annotations

import numpy as np

from xmc_tf.data.pipeline import make_tf_dataset
from xmc_tf.metrics.evaluator import XMCEvaluator

__all__ = ["decode_batches", "evaluate_top_k", "format_table",
           "score_batch_size", "SCORE_BLOCK_BYTES"]

#: Largest float32 score block ``[batch, num_labels]`` (bytes) that
#: evaluation asks a model for: 256 MiB, 100 rows at 670k labels (a
#: ``[1024, 670k]`` block was 2.7 GB, more than a training step holds).
SCORE_BLOCK_BYTES = 256 << 20


def score_batch_size(batch_size: int, model,
                     max_bytes: int = SCORE_BLOCK_BYTES) -> int:
    """``batch_size`` capped so that the model's float32 output block
    ``[batch, *output_shape]`` stays within ``max_bytes``.

    Args:
      batch_size: the requested instances per batch (>= 1).
      model: a Keras model (or a training wrapper with ``inference_model``)
        whose first output has a known shape past the batch axis; other
        models leave ``batch_size`` as it is.
      max_bytes: the block budget, bytes.

    Returns:
      int in ``[1, batch_size]``.

    >>> import keras
    >>> x = keras.Input((4,))
    >>> model = keras.Model(x, keras.layers.Dense(1_000_000)(x))
    >>> score_batch_size(1024, model)   # 256 MiB / 4 MB per row
    67
    >>> score_batch_size(16, model)
    16
    """
    batch_size = max(1, int(batch_size))
    model = getattr(model, "inference_model", None) or model
    try:
        width = int(np.prod([int(d) for d in model.outputs[0].shape[1:]]))
    except (AttributeError, IndexError, TypeError, ValueError):
        return batch_size
    return max(1, min(batch_size, int(max_bytes) // max(1, 4 * width)))


def decode_batches(top_k, dataset, batch_size: int = 1024):
    """Top-k labels of every instance of ``dataset``, one batch at a time.

    Args:
      top_k: the decoder, ``x -> (ids [b, k], scores [b, k])`` best first,
        where ``x`` is a batch of features as
        :func:`xmc_tf.data.make_tf_dataset` yields them (a
        ``tf.SparseTensor``, or a dense float32 ``[b, D]`` tensor); e.g.
        :func:`xmc_tf.predict.top_k_function` of a model.
      dataset: an :class:`xmc_tf.data.XCDataset` (features already
        normalised as the model expects; labels unused).
      batch_size: instances per batch (memory is ``O(batch_size * m)`` for a
        decoder that scores every label).

    Yields:
      ``(ids int32 [b, k], scores float32 [b, k])`` NumPy arrays per batch,
      in row order.
    """
    for features, _ in make_tf_dataset(dataset, batch_size):
        ids, scores = top_k(features)
        yield np.asarray(ids), np.asarray(scores)


def evaluate_top_k(top_k, dataset, inv_propensities=None, ks=(1, 3, 5),
                   batch_size: int = 1024) -> dict:
    """P@k, nDCG@k, PSP@k and recall@k (percent) of a decoder on ``dataset``.

    No ``[num_instances, num_labels]`` array is held: each batch's top
    labels (:func:`decode_batches`) are scored as they come.

    Args:
      top_k: the decoder, as for :func:`decode_batches`, returning at least
        ``max(ks)`` labels per row.
      dataset: :class:`xmc_tf.data.XCDataset` with labels.
      inv_propensities: float ``[m]`` inverse propensities for PSP@k
        (:func:`xmc_tf.metrics.inverse_propensities`); ``None`` omits PSP@k.
      ks: cut-offs.
      batch_size: instances per batch.

    Returns:
      The dict of :meth:`xmc_tf.metrics.XMCEvaluator.result` (keys ``P@k``,
      ``nDCG@k``, ``PSP@k``, ``R@k``, ``num_instances``).

    Raises:
      ValueError: bad ``ks`` or ``inv_propensities``
        (:class:`~xmc_tf.metrics.XMCEvaluator`).
    """
    evaluator = XMCEvaluator(ks=ks, inv_propensities=inv_propensities)
    start = 0
    for ids, _ in decode_batches(top_k, dataset, batch_size):
        stop = start + ids.shape[0]
        evaluator.update(ids, dataset.labels[start:stop])
        start = stop
    return evaluator.result()


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
