"""The report of a run: the dict written to ``metrics.json`` (test metrics,
sizes, seconds, bytes), built by one function for single runs and
ensembles, and the byte counts it holds.
"""

from __future__ import annotations

import json
import resource

import keras
import numpy as np


__all__ = ["peak_memory_bytes", "variable_bytes", "layer_bytes",
           "model_bytes", "run_report", "MEMBER_KEYS"]

#: What an ensemble's ``metrics.json`` keeps of each member's.
MEMBER_KEYS = ("P@1", "P@3", "P@5", "train_seconds", "epochs")


def peak_memory_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def variable_bytes(variables) -> int:
    """Bytes of ``variables`` (shape x dtype size, summed)."""
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                   for v in variables))


def layer_bytes(layer) -> int:
    """Bytes of a layer's variables (the head's: weights, indices, bias;
    ``metrics.json`` ``output_layer_bytes``)."""
    return variable_bytes(layer.weights)


def model_bytes(model: keras.Model) -> int:
    """Bytes of all the model's variables (every layer; no optimizer state)."""
    return variable_bytes(model.weights)


def run_report(config, summary, num_test: int, model, *, metrics: dict,
               train_seconds: float, epochs: int, head_bytes: int,
               regime: dict, **extra) -> dict:
    """The ``metrics.json`` dict of a run (before its completion marker).

    Args:
      config: the run's config (resolved: recorded as ``"config"``).
      summary: the training data's :class:`xmc_tf.job.plan.DataSummary`.
      num_test: test instances (0 without a test set).
      model: the exported model (``model_bytes``).
      metrics: the evaluation's ``P@k``, ``nDCG@k``, ``PSP@k``, ``R@k``
        (percent), and for ensembles ``val_...``; ``{}`` without a test set.
      train_seconds: seconds of training (all processes, resumes summed).
      epochs: epochs trained.
      head_bytes: bytes of the head layer(s) (:func:`layer_bytes`).
      regime: the values the data chose (``{}`` if none).
      **extra: more keys (the head's results, the label tree, the
        strategy, an ensemble's members), added last.

    Returns:
      The dict; ``peak_memory_bytes`` and ``run`` are added by the caller.
    """
    report = dict(metrics)
    report.update({
        "train_seconds": round(train_seconds, 2),
        "epochs": int(epochs),
        "num_labels": summary.num_labels,
        "num_features": summary.num_features,
        "num_train_instances": summary.num_instances,
        "num_test_instances": int(num_test),
        "output_layer_bytes": int(head_bytes),
        "model_bytes": model_bytes(model),
        "head": config.model.head,
    })
    if regime:
        report["regime"] = regime
    # The config the run trained with: every automatic field resolved.
    report["config"] = json.loads(config.to_json_best_effort())
    report.update(extra)
    return report
