"""Evaluation metrics for extreme multi-label classification (XMC).

Modules: :mod:`~xmc_tf.metrics.evaluator` (offline NumPy evaluation),
:mod:`~xmc_tf.metrics.keras_metrics` (Keras streaming metrics) and
:mod:`~xmc_tf.metrics.mach` (P@k decoded from a MACH head).

Two families of implementations that agree with each other:

* NumPy, for offline evaluation of score matrices too large to hold in
  memory: :func:`top_k`, :class:`XMCEvaluator` (streaming, batch by batch)
  and :func:`evaluate_scores`; :func:`evaluate_by_frequency` splits them by
  the labels' training frequency (the tail: labels with few instances). :meth:`XMCEvaluator.result` reports
  **percentages** (values in [0, 100]).
* Keras 3 streaming metrics for ``model.compile(metrics=[...])``:
  :class:`PrecisionAtK`, :class:`NDCGAtK`, :class:`RecallAtK` and
  :class:`PSPAtK`. Like Keras' built-in metrics, they report **fractions**
  (values in [0, 1]).

Definitions (Jain, Prabhu & Varma, "Extreme Multi-label Loss Functions for
Recommendation, Tagging, Ranking & Other Missing Label Applications",
KDD 2016, and the Extreme Classification Repository, "XC repo"). For one
instance with true label set ``y`` (``|y|`` labels) and predicted ranking
``l_1, l_2, ...`` (descending score):

* ``P@k    = (1/k) * sum_{r<=k} [l_r in y]``
* ``DCG@k  = sum_{r<=k} [l_r in y] / log2(r + 1)``,
  ``IDCG@k = sum_{r<=min(k, |y|)} 1 / log2(r + 1)``,
  ``nDCG@k = DCG@k / IDCG@k``, and ``nDCG@k = 0`` when ``|y| = 0``
  (XC repo / pyxclib convention).
* ``R@k    = (sum_{r<=k} [l_r in y]) / |y|``, and ``0`` when ``|y| = 0``.
* Propensity-scored precision (Jain et al. 2016, Eq. 2 normalised as in the
  XC repo and ``xclib.evaluation.xc_metrics.psprecision``): with inverse
  propensities ``w_l = 1 / p_l`` (see :func:`inverse_propensities`),
  ``num_i@k = sum_{r<=k} [l_r in y_i] * w_{l_r}`` and
  ``den_i@k = sum of the min(k, |y_i|) largest w_l over l in y_i``,
  ``PSP@k = mean_i(num_i@k) / mean_i(den_i@k)`` -- a ratio of data-set
  averages, not an average of per-instance ratios. (The ``1/k`` of the
  paper's Eq. 2 cancels in the ratio.)

P@k, nDCG@k and R@k are averaged over *all* instances, including those
without any true label (which contribute 0), exactly like pyxclib.

Conventions shared by every function here:

* Ties in scores are broken by the lower label id (the order of
  ``tf.math.top_k``).
* True labels given as integer ids: negative ids (conventionally ``-1``)
  are padding and ignored; duplicated ids count once.
* True labels given as a dense float/bool matrix (multi-hot): every entry
  ``> 0`` (``!= 0`` for sparse matrices) is a positive label.

Example:
    >>> import numpy as np
    >>> scores = np.array([[0.1, 0.9, 0.3], [0.8, 0.1, 0.5]])
    >>> labels = [np.array([1]), np.array([2])]
    >>> ev = XMCEvaluator(ks=(1,))
    >>> ev.update_scores(scores, labels)
    >>> ev.result()["P@1"]
    50.0
"""

from xmc_tf.metrics.evaluator import (XMCEvaluator, evaluate_by_frequency,
                                      evaluate_scores, frequency_buckets,
                                      inverse_propensities, top_k)
from xmc_tf.metrics.keras_metrics import (NDCGAtK, PrecisionAtK, PSPAtK,
                                          RecallAtK)
from xmc_tf.metrics.mach import MachPrecisionAtK

__all__ = [
    "inverse_propensities",
    "top_k",
    "XMCEvaluator",
    "evaluate_scores",
    "frequency_buckets",
    "evaluate_by_frequency",
    "PrecisionAtK",
    "NDCGAtK",
    "RecallAtK",
    "PSPAtK",
    "MachPrecisionAtK",
]
