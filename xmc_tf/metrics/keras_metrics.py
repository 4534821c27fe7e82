"""Keras 3 streaming XMC metrics for ``model.compile(metrics=[...])``.

:class:`PrecisionAtK`, :class:`NDCGAtK`, :class:`RecallAtK` and
:class:`PSPAtK` report **fractions** (values in [0, 1]) like Keras'
built-in metrics, and agree with :mod:`xmc_tf.metrics.evaluator`.
Definitions and conventions: see :mod:`xmc_tf.metrics`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.losses.targets import target_label_ids
from xmc_tf.ops.topk import top_k as _select_top_k
from xmc_tf.metrics.evaluator import (_check_inv_propensities, _check_k,
                                      _discounts)

__all__ = ["PrecisionAtK", "NDCGAtK", "RecallAtK", "PSPAtK"]


# ---------------------------------------------------------------------------
# Keras 3 streaming metrics
# ---------------------------------------------------------------------------


def _hits_and_positives(ids, topk):
    """Per-instance hit indicators at ranks 1..k and label counts.

    Args:
        ids: int64 ``[b, n]`` label ids, negative = padding (from
            :func:`xmc_tf.losses.target_label_ids`).
        topk: int32 tensor ``[b, k]`` of predicted ids.

    Returns:
        ``(hits, num_pos, ids, valid)``: float64 ``[b, k]``, float64 ``[b]``,
        the sorted ids ``[b, n]`` and their validity mask (unique,
        non-negative).
    """
    ids = tf.sort(ids, axis=-1)
    prev = tf.concat([tf.fill([tf.shape(ids)[0], 1], tf.constant(-1, tf.int64)),
                      ids[:, :-1]], axis=1)
    valid = (ids >= 0) & (ids != prev)
    masked = tf.where(valid, ids, tf.constant(-1, tf.int64))
    eq = tf.equal(tf.cast(topk, tf.int64)[:, :, None], masked[:, None, :])
    hits = tf.cast(tf.reduce_any(eq, axis=-1), tf.float64)
    num_pos = tf.reduce_sum(tf.cast(valid, tf.float64), axis=-1)
    return hits, num_pos, ids, valid


def _prepare(y_true, y_pred, k):
    """Checks shapes; returns (label ids int64 [b, n], y_pred, topk).

    ``y_true`` may take any form of :mod:`xmc_tf.losses.targets` (ids,
    float ids, multi-hot, ``tf.SparseTensor``).
    """
    y_pred = tf.convert_to_tensor(y_pred)
    if y_pred.shape.rank is not None and y_pred.shape.rank != 2:
        raise ValueError(f"y_pred must be [batch, num_labels], got {y_pred.shape}")
    num_labels = y_pred.shape[-1]
    if num_labels is not None and k > num_labels:
        raise ValueError(f"k={k} exceeds the number of labels {num_labels}")
    ids = target_label_ids(
        y_true, num_labels if num_labels is not None else tf.shape(y_pred)[-1])
    # Xmc>TopK where it applies (float32 on the CPU): the same ids as
    # tf.math.top_k, without its ~1 ns per score at m in the 100,000s.
    topk = _select_top_k(y_pred, k).indices
    return ids, y_pred, topk


def _sample_weights(sample_weight, values):
    """Returns float64 weights ``[b]`` (ones if ``sample_weight`` is None)."""
    if sample_weight is None:
        return tf.ones_like(values)
    w = tf.cast(tf.convert_to_tensor(sample_weight), tf.float64)
    return tf.broadcast_to(tf.reshape(w, [-1]) if w.shape.rank else w,
                           tf.shape(values))


class _RankingMetric(keras.metrics.Metric):
    """Base for metrics that average a per-instance value over instances."""

    _prefix = "metric"

    def __init__(self, k, name=None, dtype=None):
        k = _check_k(k)
        super().__init__(name=name or f"{self._prefix}_at_{k}", dtype=dtype)
        self.k = k
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="total")
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="count")

    def _per_instance(self, hits, num_pos):
        raise NotImplementedError

    def _true_and_top_k(self, y_true, y_pred):
        """(label ids int64 [b, n], top-k ids int32 [b, k]) from scores."""
        ids, _, topk = _prepare(y_true, y_pred, self.k)
        return ids, topk

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Accumulates a batch.

        Args:
            y_true: integer ``[b, n]`` label ids padded with ``-1`` (or
                ``[b]``: one id per instance), the same ids as floats (as a
                ``tf.distribute`` strategy casts them), a float/bool
                multi-hot ``[b, L]``, or a ``tf.SparseTensor`` ``[b, L]``
                (a scipy CSR ``y`` given to ``fit``); see
                :mod:`xmc_tf.losses.targets`.
            y_pred: float scores ``[b, L]``.
            sample_weight: optional per-instance weights ``[b]``.
        """
        ids, topk = self._true_and_top_k(y_true, y_pred)
        hits, num_pos, _, _ = _hits_and_positives(ids, topk)
        values = self._per_instance(hits, num_pos)
        w = _sample_weights(sample_weight, values)
        self.total.assign_add(tf.reduce_sum(w * values))
        self.count.assign_add(tf.reduce_sum(w))

    def result(self):
        """Mean over instances, as a **fraction** in [0, 1]."""
        return tf.cast(tf.math.divide_no_nan(self.total, self.count), self.dtype)

    def get_config(self):
        config = super().get_config()
        config["k"] = self.k
        return config


@keras.saving.register_keras_serializable(package="xmc_tf")
class PrecisionAtK(_RankingMetric):
    """Streaming precision at k, ``P@k = (1/k) sum_{r<=k} [l_r in y]``.

    Jain et al. (KDD 2016), XC repo. Averaged over all instances (instances
    without labels contribute 0); reported as a **fraction** in [0, 1]
    (multiply by 100 to compare with :class:`XMCEvaluator`). Ties in
    ``y_pred`` are broken by the lower label id (``tf.math.top_k``'s order;
    the top k comes from :func:`xmc_tf.ops.topk.top_k`).

    Args:
        k: cut-off, int >= 1 and <= L.
        name: metric name; default ``"precision_at_{k}"``.
        dtype: dtype of the result (accumulators are float64).

    ``update_state(y_true, y_pred, sample_weight=None)``: ``y_pred`` float
    scores ``[b, L]``; ``y_true`` integer label ids ``[b, n]`` padded with
    ``-1`` (or ``[b]``), the same ids cast to float by a ``tf.distribute``
    strategy (a float ``[b, n]`` with ``n != L``), a float/bool multi-hot
    ``[b, L]`` or a ``tf.SparseTensor`` ``[b, L]`` (entries ``!= 0``; what
    Keras makes of a scipy CSR ``y``).

    Raises:
        ValueError: If ``k < 1``, ``k > L``, ``y_pred`` not of rank 2, or a
            ``SparseTensor`` ``y_true`` not ``L`` wide (when shapes are
            known).

    Example:
        >>> m = PrecisionAtK(1)
        >>> m.update_state([[1, -1]], [[0.1, 0.9, 0.0]])
        >>> float(m.result())
        1.0
    """

    _prefix = "precision"

    def _per_instance(self, hits, num_pos):
        return tf.reduce_sum(hits, axis=-1) / self.k


@keras.saving.register_keras_serializable(package="xmc_tf")
class RecallAtK(_RankingMetric):
    """Streaming recall at k, ``R@k = |top-k ∩ y| / |y|`` (0 if ``|y| = 0``).

    Averaged over all instances, including those without labels (which count
    0); reported as a **fraction** in [0, 1]. Inputs and ties as in
    :class:`PrecisionAtK`.

    Args:
        k: cut-off, int >= 1 and <= L.
        name: metric name; default ``"recall_at_{k}"``.
        dtype: dtype of the result.

    Raises:
        ValueError: If ``k < 1``.

    Example:
        >>> m = RecallAtK(2)
        >>> m.update_state([[0, 2, -1]], [[0.9, 0.5, 0.1]])
        >>> float(m.result())
        0.5
    """

    _prefix = "recall"

    def _per_instance(self, hits, num_pos):
        return tf.math.divide_no_nan(tf.reduce_sum(hits, axis=-1), num_pos)


@keras.saving.register_keras_serializable(package="xmc_tf")
class NDCGAtK(_RankingMetric):
    """Streaming normalised discounted cumulative gain at k.

    ``nDCG@k = DCG@k / IDCG@k`` with ``DCG@k = sum_{r<=k} [l_r in y] /
    log2(r + 1)`` and ``IDCG@k = sum_{r<=min(k, |y|)} 1 / log2(r + 1)``
    (Jain et al., KDD 2016; XC repo). Instances without labels count 0
    (pyxclib convention). Reported as a **fraction** in [0, 1]. Inputs and
    ties as in :class:`PrecisionAtK`.

    Args:
        k: cut-off, int >= 1 and <= L.
        name: metric name; default ``"ndcg_at_{k}"``.
        dtype: dtype of the result.

    Raises:
        ValueError: If ``k < 1``.

    Example:
        >>> m = NDCGAtK(2)
        >>> m.update_state([[1, -1]], [[0.9, 0.5, 0.1]])
        >>> round(float(m.result()), 4)  # hit at rank 2: 1/log2(3)
        0.6309
    """

    _prefix = "ndcg"

    def __init__(self, k, name=None, dtype=None):
        super().__init__(k, name=name, dtype=dtype)
        disc = _discounts(self.k)
        self._disc = tf.constant(disc, tf.float64)
        self._idcg = tf.constant(np.concatenate([[0.0], np.cumsum(disc)]),
                                 tf.float64)

    def _per_instance(self, hits, num_pos):
        dcg = tf.reduce_sum(hits * self._disc, axis=-1)
        idx = tf.cast(tf.minimum(num_pos, float(self.k)), tf.int32)
        return tf.math.divide_no_nan(dcg, tf.gather(self._idcg, idx))


@keras.saving.register_keras_serializable(package="xmc_tf")
class PSPAtK(keras.metrics.Metric):
    """Streaming normalised propensity-scored precision at k.

    Jain et al. (KDD 2016, Eq. 2), normalised as in the XC repo / pyxclib
    ``psprecision``::

        PSP@k = sum_i num_i / sum_i den_i,
        num_i = sum_{r<=k} [l_r in y_i] / p_{l_r},
        den_i = sum of the min(k, |y_i|) largest 1/p_l over l in y_i,

    i.e. the data-set averages of numerator and denominator are accumulated
    separately and divided (equal to :class:`XMCEvaluator`'s ``PSP@k`` / 100).
    Reported as a **fraction**; 0 while no instance with labels was seen.

    The inverse propensities are kept as a float64 constant ``[L]``. By
    default :meth:`get_config` stores them as a list so that the metric (and
    a compiled model using it) round-trips through Keras serialisation. For
    very large label sets (a list of millions of floats bloats the model
    config) pass ``serialize_propensities=False``: the config then stores
    ``inv_propensities=None`` and the metric cannot be rebuilt from it --
    load such models with ``compile=False`` and re-compile with a fresh
    ``PSPAtK(k, inv_propensities)``.

    Args:
        k: cut-off, int >= 1 and <= L.
        inv_propensities: float array ``[L]`` of ``1 / p_l``
            (:func:`inverse_propensities`).
        name: metric name; default ``"psp_at_{k}"``.
        dtype: dtype of the result (accumulators are float64).
        serialize_propensities: whether :meth:`get_config` includes the
            propensities.

    ``update_state(y_true, y_pred, sample_weight=None)``: as
    :class:`PrecisionAtK`. Label ids must be ``< L``.

    Raises:
        ValueError: If ``k < 1``, or ``inv_propensities`` is missing
            (e.g. from a config saved with ``serialize_propensities=False``),
            not 1-D or not finite.

    Example:
        >>> m = PSPAtK(1, inv_propensities=[1.0, 4.0])
        >>> m.update_state([[0, 1]], [[0.9, 0.1]])
        >>> float(m.result())  # predicted label 0 (w=1), best is 1 (w=4)
        0.25
    """

    def __init__(self, k, inv_propensities=None, name=None, dtype=None,
                 serialize_propensities=True):
        k = _check_k(k)
        if inv_propensities is None:
            raise ValueError(
                "PSPAtK needs inv_propensities (a [num_labels] array of 1/p_l);"
                " if this comes from a config saved with "
                "serialize_propensities=False, load the model with "
                "compile=False and compile it with a new PSPAtK")
        w = _check_inv_propensities(inv_propensities)
        super().__init__(name=name or f"psp_at_{k}", dtype=dtype)
        self.k = k
        self.serialize_propensities = bool(serialize_propensities)
        self._inv_np = w
        self._inv = tf.constant(w, tf.float64)
        self.numerator = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="numerator")
        self.denominator = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="denominator")
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype="float64", name="count")

    @property
    def inv_propensities(self):
        """The inverse propensities, float64 NumPy array ``[L]``."""
        return self._inv_np

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Accumulates a batch; inputs as ``PrecisionAtK.update_state``."""
        ids, _, topk = _prepare(y_true, y_pred, self.k)
        hits, num_pos, ids, valid = _hits_and_positives(ids, topk)
        num = tf.reduce_sum(hits * tf.gather(self._inv, topk), axis=-1)
        wl = tf.where(valid, tf.gather(self._inv, tf.maximum(ids, 0)),
                      tf.constant(0.0, tf.float64))
        kk = tf.minimum(self.k, tf.shape(wl)[1])
        den = tf.reduce_sum(tf.math.top_k(wl, k=kk).values, axis=-1)
        w = _sample_weights(sample_weight, num)
        self.numerator.assign_add(tf.reduce_sum(w * num))
        self.denominator.assign_add(tf.reduce_sum(w * den))
        self.count.assign_add(tf.reduce_sum(w))

    def result(self):
        """``sum num / sum den`` as a **fraction** (0 if the sum den is 0)."""
        return tf.cast(tf.math.divide_no_nan(self.numerator, self.denominator),
                       self.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            k=self.k,
            inv_propensities=(self._inv_np.tolist()
                              if self.serialize_propensities else None),
            serialize_propensities=self.serialize_propensities,
        )
        return config
