"""Evaluation metrics for extreme multi-label classification (XMC).

Two families of implementations that agree with each other:

* NumPy, for offline evaluation of score matrices too large to hold in
  memory: :func:`top_k`, :class:`XMCEvaluator` (streaming, batch by batch)
  and :func:`evaluate_scores`. :meth:`XMCEvaluator.result` reports
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

from __future__ import annotations

from collections.abc import Iterable, Sequence

import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.ops.mach import (ACTIVATIONS, MachHashing, mach_top_k,
                             meta_probabilities)

__all__ = [
    "inverse_propensities",
    "top_k",
    "XMCEvaluator",
    "evaluate_scores",
    "PrecisionAtK",
    "NDCGAtK",
    "RecallAtK",
    "PSPAtK",
    "MachPrecisionAtK",
]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _check_k(k) -> int:
    """Validates a cut-off ``k``; returns it as a Python int."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def _check_inv_propensities(inv_propensities) -> np.ndarray:
    """Validates an inverse-propensity vector; returns float64 [L]."""
    w = np.asarray(inv_propensities, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(
            f"inv_propensities must be 1-D [num_labels], got shape {w.shape}")
    if w.size == 0:
        raise ValueError("inv_propensities must not be empty")
    if not np.all(np.isfinite(w)):
        raise ValueError("inv_propensities must be finite")
    return w


def _discounts(n: int) -> np.ndarray:
    """``1 / log2(r + 1)`` for ranks ``r = 1..n``; float64 [n]."""
    return 1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64))


# ---------------------------------------------------------------------------
# Propensities
# ---------------------------------------------------------------------------


def inverse_propensities(train_labels, num_instances=None, A=0.55, B=1.5):
    """Inverse label propensities ``1 / p_l`` of Jain et al. (KDD 2016).

    The propensity model of Jain et al. 2016 (Sec. 4.1) is::

        p_l = 1 / (1 + C * exp(-A * log(N_l + B))),
        C   = (log(N) - 1) * (B + 1)**A,

    so ``1 / p_l = 1 + C * (N_l + B)**(-A)``, where ``N`` is the number of
    training instances, ``N_l`` the number of training instances tagged with
    label ``l`` and ``log`` the natural logarithm. This is the same formula as
    ``xclib.evaluation.xc_metrics.compute_inv_propesity``. The XC repo uses
    ``A=0.55, B=1.5`` by default, ``A=0.5, B=0.4`` for Wikipedia-LSHTC and
    ``A=0.6, B=2.6`` for Amazon data sets.

    Args:
        train_labels: Either the training label matrix, ``[N, L]``
            (``scipy.sparse`` matrix or 2-D array; every nonzero entry is a
            positive label, so ``N_l`` is the number of nonzeros in column
            ``l``), or a 1-D array ``[L]`` of label frequencies ``N_l``.
        num_instances: ``N``. Required when ``train_labels`` is a frequency
            vector; defaults to the number of rows of a label matrix.
        A: Propensity model parameter ``A``.
        B: Propensity model parameter ``B``.

    Returns:
        float64 array ``[L]`` of inverse propensities ``1 / p_l`` (>= 1 when
        ``N >= e``; rare labels get large weights).

    Raises:
        ValueError: If ``train_labels`` is not 1-D or 2-D, frequencies are
            negative, ``num_instances`` is missing for a frequency vector, or
            ``num_instances < 1``.

    Example:
        >>> w = inverse_propensities(np.array([0, 10, 1000]), num_instances=1000)
        >>> w.round(3).tolist()
        [8.824, 3.552, 1.219]
    """
    if sp.issparse(train_labels):
        y = sp.csr_matrix(train_labels)
        counts = np.asarray((y != 0).sum(axis=0)).ravel()
        n = y.shape[0] if num_instances is None else num_instances
    else:
        arr = np.asarray(train_labels)
        if arr.ndim == 2:
            counts = np.count_nonzero(arr, axis=0)
            n = arr.shape[0] if num_instances is None else num_instances
        elif arr.ndim == 1:
            if num_instances is None:
                raise ValueError(
                    "num_instances is required when train_labels is a vector "
                    "of label frequencies")
            counts = arr
            n = num_instances
        else:
            raise ValueError(
                "train_labels must be a [N, L] label matrix or a [L] frequency "
                f"vector, got shape {arr.shape}")
    counts = np.asarray(counts, dtype=np.float64)
    if np.any(counts < 0):
        raise ValueError("label frequencies must be non-negative")
    if n < 1:
        raise ValueError(f"num_instances must be >= 1, got {n}")
    c = (np.log(float(n)) - 1.0) * (B + 1.0) ** A
    return 1.0 + c * np.power(counts + B, -A)


# ---------------------------------------------------------------------------
# NumPy evaluation
# ---------------------------------------------------------------------------


def top_k(scores, k):
    """Ids of the ``k`` highest scores of each row, best first.

    Uses ``np.argpartition`` (``O(L)`` per row) and sorts only the candidates.
    Ties are broken by the lower label id, also across the k-th position
    (the order of ``tf.math.top_k``).

    Args:
        scores: float array ``[b, L]``; must not contain NaN.
        k: number of labels to return, ``1 <= k <= L``.

    Returns:
        int64 array ``[b, k]``: row ``i`` lists label ids by descending
        ``scores[i]``, ties by ascending id.

    Raises:
        ValueError: If ``scores`` is not 2-D, contains NaN, or ``k`` is not in
            ``[1, L]``.

    Example:
        >>> top_k(np.array([[0.2, 0.5, 0.2, 0.1]]), 3).tolist()
        [[1, 0, 2]]
    """
    k = _check_k(k)
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D [b, L], got shape {scores.shape}")
    b, num_labels = scores.shape
    if k > num_labels:
        raise ValueError(f"k={k} exceeds the number of labels L={num_labels}")
    if b == 0:
        return np.zeros((0, k), dtype=np.int64)
    if not np.issubdtype(scores.dtype, np.floating):
        scores = scores.astype(np.float64)
    if np.isnan(scores).any():
        raise ValueError("scores must not contain NaN")
    if k == num_labels:
        cand = np.broadcast_to(np.arange(num_labels), scores.shape)
    else:
        cand = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        cand_scores = np.take_along_axis(scores, cand, axis=1)
        kth = cand_scores.min(axis=1)
        # Labels tied with the k-th score may straddle the partition
        # boundary, and argpartition does not pick them by id. Rows where
        # more labels than k reach the k-th score get an exact fix-up.
        n_ge = np.count_nonzero(scores >= kth[:, None], axis=1)
        bad = np.nonzero(n_ge > k)[0]
        if bad.size:
            cand = np.array(cand)
            for i in bad:
                row = scores[i]
                above = np.nonzero(row > kth[i])[0]
                tied = np.nonzero(row == kth[i])[0][: k - above.size]
                cand[i] = np.concatenate([above, tied])
    cand = np.asarray(cand, dtype=np.int64)
    cand_scores = np.take_along_axis(scores, cand, axis=1)
    # Sort candidates by (-score, id): lexsort uses the last key as primary.
    order = np.lexsort((cand, -cand_scores), axis=1)
    return np.take_along_axis(cand, order, axis=1)


def _label_pairs(true_labels, b: int):
    """Normalises a batch of true labels to unique sorted (row, id) pairs.

    Args:
        true_labels: ``scipy.sparse`` matrix ``[b, L]``, a length-``b``
            sequence of integer id arrays, an integer array ``[b, n]`` (ids,
            negative = padding), or a float/bool array ``[b, L]``
            (multi-hot).
        b: expected number of rows.

    Returns:
        ``(rows, ids)``: int64 arrays of equal length, lexicographically
        sorted by ``(row, id)``, without duplicates or padding.
    """
    if sp.issparse(true_labels):
        y = sp.csr_matrix(true_labels)
        if y.shape[0] != b:
            raise ValueError(
                f"true_labels has {y.shape[0]} rows, expected {b}")
        rows = np.repeat(np.arange(b, dtype=np.int64), np.diff(y.indptr))
        ids = y.indices.astype(np.int64)
        keep = y.data != 0
        rows, ids = rows[keep], ids[keep]
    elif isinstance(true_labels, np.ndarray) and true_labels.dtype != object:
        arr = true_labels
        if arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer):
            arr = arr[:, None]  # one label id per instance
        if arr.ndim != 2:
            raise ValueError(
                f"true_labels array must be 2-D, got shape {arr.shape}")
        if arr.shape[0] != b:
            raise ValueError(
                f"true_labels has {arr.shape[0]} rows, expected {b}")
        if np.issubdtype(arr.dtype, np.integer):
            rows, col = np.nonzero(arr >= 0)
            ids = arr[rows, col]
        elif np.issubdtype(arr.dtype, np.floating) or arr.dtype == np.bool_:
            rows, ids = np.nonzero(arr > 0)
        else:
            raise ValueError(f"unsupported true_labels dtype {arr.dtype}")
    elif isinstance(true_labels, (Sequence, np.ndarray)):
        if len(true_labels) != b:
            raise ValueError(
                f"true_labels has {len(true_labels)} rows, expected {b}")
        parts = [np.asarray(t).reshape(-1) for t in true_labels]
        for t in parts:
            if t.size and not np.issubdtype(t.dtype, np.integer):
                raise ValueError(
                    "true_labels rows must be integer label ids, got dtype "
                    f"{t.dtype}")
        lens = np.array([t.size for t in parts], dtype=np.int64)
        rows = np.repeat(np.arange(b, dtype=np.int64), lens)
        ids = (np.concatenate(parts).astype(np.int64) if lens.sum()
               else np.zeros(0, dtype=np.int64))
        keep = ids >= 0
        rows, ids = rows[keep], ids[keep]
    else:
        raise ValueError(
            "true_labels must be a scipy.sparse matrix, a sequence of id "
            f"arrays or a 2-D array, got {type(true_labels).__name__}")
    rows = np.asarray(rows, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size:
        stride = int(ids.max()) + 1
        keys = np.unique(rows * stride + ids)
        rows, ids = keys // stride, keys % stride
    return rows, ids


class XMCEvaluator:
    """Streaming XMC evaluator: P@k, nDCG@k, PSP@k and R@k in percent.

    Feed batches of predictions (top-k ids, or full score rows) with their
    true labels, in any order; :meth:`result` averages over all instances
    seen. Memory is ``O(b * max(ks))`` per batch, so score matrices that do
    not fit in memory can be evaluated batch by batch. See the module
    docstring for the exact metric definitions and conventions (no-label
    instances count 0 for P, nDCG and R; PSP is the ratio of averaged
    numerator and denominator, as in pyxclib).

    Args:
        ks: cut-offs, positive ints (e.g. ``(1, 3, 5)``).
        inv_propensities: optional float array ``[L]`` of inverse
            propensities ``1 / p_l`` (:func:`inverse_propensities`); PSP@k is
            reported only when given.

    Raises:
        ValueError: If ``ks`` is empty or holds a value < 1, or
            ``inv_propensities`` is not a finite 1-D array.

    Example:
        >>> ev = XMCEvaluator(ks=(1, 2))
        >>> ev.update(np.array([[2, 0], [1, 2]]), [np.array([0, 2]), np.array([0])])
        >>> r = ev.result()
        >>> r["P@1"], r["P@2"], r["R@2"], r["num_instances"]
        (50.0, 50.0, 50.0, 2)
    """

    def __init__(self, ks=(1, 3, 5), inv_propensities=None):
        ks = [_check_k(k) for k in np.atleast_1d(np.asarray(ks)).tolist()]
        if not ks:
            raise ValueError("ks must not be empty")
        self.ks = tuple(sorted(set(ks)))
        self.max_k = self.ks[-1]
        self.inv_propensities = (
            None if inv_propensities is None
            else _check_inv_propensities(inv_propensities))
        self._disc_cum = np.concatenate(
            [[0.0], np.cumsum(_discounts(self.max_k))])
        self.reset()

    def reset(self):
        """Clears all accumulated statistics."""
        self._n = 0
        self._p = np.zeros(len(self.ks))
        self._ndcg = np.zeros(len(self.ks))
        self._recall = np.zeros(len(self.ks))
        self._psp_num = np.zeros(len(self.ks))
        self._psp_den = np.zeros(len(self.ks))

    def update(self, topk_ids, true_labels):
        """Accumulates a batch of ranked predictions.

        Args:
            topk_ids: integer array ``[b, K]``, ``K >= max(ks)``: predicted
                label ids per instance, best first (e.g. from :func:`top_k`);
                only the first ``max(ks)`` columns are used. A negative id
                marks "no prediction" at that rank (never a hit). Ids must
                not repeat within a row.
            true_labels: the batch's true labels, one of: ``scipy.sparse``
                matrix ``[b, L]`` (nonzeros are positives); a length-``b``
                sequence of integer id arrays; an integer array ``[b, n]`` of
                ids padded with ``-1``; a float/bool multi-hot array
                ``[b, L]`` (entries ``> 0`` are positives).

        Raises:
            ValueError: On a shape or row-count mismatch, too few columns in
                ``topk_ids``, non-integer ids, repeated ids in a row, or ids
                outside ``inv_propensities`` when PSP is computed.
        """
        topk_ids = np.asarray(topk_ids)
        if topk_ids.ndim != 2:
            raise ValueError(
                f"topk_ids must be 2-D [b, K], got shape {topk_ids.shape}")
        if topk_ids.size and not np.issubdtype(topk_ids.dtype, np.integer):
            raise ValueError(
                f"topk_ids must hold integer ids, got dtype {topk_ids.dtype}")
        b, kcols = topk_ids.shape
        if kcols < self.max_k:
            raise ValueError(
                f"topk_ids has {kcols} columns, need >= max(ks)={self.max_k}")
        pred = topk_ids[:, : self.max_k].astype(np.int64)
        pred = np.where(pred < 0, -1, pred)
        srt = np.sort(pred, axis=1)
        if np.any((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)):
            raise ValueError("topk_ids rows must not contain repeated ids")
        rows, ids = _label_pairs(true_labels, b)
        if b == 0:
            return
        num_pos = np.bincount(rows, minlength=b).astype(np.float64)

        # hits[i, r] = 1 iff pred[i, r] is a true label of instance i.
        stride = int(max(pred.max(initial=-1), ids.max(initial=-1))) + 2
        true_keys = rows * stride + ids  # sorted, unique
        pred_keys = np.arange(b, dtype=np.int64)[:, None] * stride + pred
        if true_keys.size:
            pos = np.minimum(np.searchsorted(true_keys, pred_keys),
                             true_keys.size - 1)
            hits = (pred >= 0) & (true_keys[pos] == pred_keys)
        else:
            hits = np.zeros(pred.shape, dtype=bool)
        hits = hits.astype(np.float64)

        hits_cum = np.cumsum(hits, axis=1)
        dcg_cum = np.cumsum(hits * _discounts(self.max_k), axis=1)
        has_pos = num_pos > 0

        if self.inv_propensities is not None:
            w = self.inv_propensities
            if pred.max(initial=-1) >= w.size or ids.max(initial=-1) >= w.size:
                raise ValueError(
                    f"label id out of range for inv_propensities of length "
                    f"{w.size}")
            num_cum = np.cumsum(hits * w[np.maximum(pred, 0)], axis=1)
            # Best achievable: the max_k largest weights of each row's labels.
            wl = w[ids]
            order = np.lexsort((-wl, rows))
            starts = np.concatenate([[0], np.cumsum(num_pos[:-1])]).astype(
                np.int64)
            rank = np.arange(rows.size) - starts[rows[order]]
            keep = rank < self.max_k
            best = np.zeros((b, self.max_k))
            best[rows[order][keep], rank[keep]] = wl[order][keep]
            den_cum = np.cumsum(best, axis=1)

        for j, k in enumerate(self.ks):
            self._p[j] += hits_cum[:, k - 1].sum() / k
            self._recall[j] += (hits_cum[:, k - 1][has_pos]
                                / num_pos[has_pos]).sum()
            idcg = self._disc_cum[np.minimum(num_pos, k).astype(np.int64)]
            self._ndcg[j] += (dcg_cum[:, k - 1][has_pos] / idcg[has_pos]).sum()
            if self.inv_propensities is not None:
                self._psp_num[j] += num_cum[:, k - 1].sum()
                self._psp_den[j] += den_cum[:, k - 1].sum()
        self._n += b

    def update_scores(self, scores, true_labels):
        """Accumulates a batch of score rows (takes the top-k itself).

        Args:
            scores: float array ``[b, L]``, higher is better, no NaN.
            true_labels: as in :meth:`update`.

        Raises:
            ValueError: As :func:`top_k` (e.g. ``max(ks) > L``) and
                :meth:`update`.
        """
        self.update(top_k(scores, self.max_k), true_labels)

    def result(self):
        """Returns the metrics averaged over all instances seen so far.

        Returns:
            dict: ``"P@k"``, ``"nDCG@k"``, ``"R@k"`` (recall) and, when
            ``inv_propensities`` was given, ``"PSP@k"`` for every ``k`` in
            ``ks``, as Python floats in **percent** ([0, 100]); plus
            ``"num_instances"`` (int). All metrics are 0.0 before any
            update (PSP@k also when no instance has a label).
        """
        n = max(self._n, 1)
        out = {}
        for name, acc in (("P", self._p), ("nDCG", self._ndcg)):
            for j, k in enumerate(self.ks):
                out[f"{name}@{k}"] = float(100.0 * acc[j] / n)
        if self.inv_propensities is not None:
            for j, k in enumerate(self.ks):
                den = self._psp_den[j]
                out[f"PSP@{k}"] = float(
                    100.0 * self._psp_num[j] / den if den > 0 else 0.0)
        for j, k in enumerate(self.ks):
            out[f"R@{k}"] = float(100.0 * self._recall[j] / n)
        out["num_instances"] = int(self._n)
        return out


def evaluate_scores(score_batches: Iterable[np.ndarray], labels, ks=(1, 3, 5),
                    inv_propensities=None):
    """Evaluates consecutive row batches of a score matrix.

    Args:
        score_batches: iterable of float arrays ``[b_j, L]`` that, stacked in
            order, form the score matrix ``[N, L]`` (e.g. a generator that
            scores the test set batch by batch).
        labels: true labels ``[N, L]``, ``scipy.sparse`` (nonzeros are
            positives) or a dense multi-hot array, rows in the same order.
        ks: cut-offs.
        inv_propensities: optional float array ``[L]`` of ``1 / p_l``;
            enables PSP@k.

    Returns:
        dict as :meth:`XMCEvaluator.result` (metrics in percent).

    Raises:
        ValueError: If the batches cover more or fewer rows than ``labels``,
            or as :meth:`XMCEvaluator.update_scores`.

    Example:
        >>> import scipy.sparse as sp
        >>> y = sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 1]]))
        >>> batches = iter([np.array([[0.9, 0.1, 0.0]]), np.array([[0.9, 0.1, 0.0]])])
        >>> evaluate_scores(batches, y, ks=(1,))["P@1"]
        50.0
    """
    if sp.issparse(labels):
        labels = sp.csr_matrix(labels)
    else:
        labels = np.asarray(labels)
        if labels.ndim != 2:
            raise ValueError(f"labels must be 2-D [N, L], got {labels.shape}")
    ev = XMCEvaluator(ks=ks, inv_propensities=inv_propensities)
    start = 0
    for scores in score_batches:
        scores = np.asarray(scores)
        if scores.ndim != 2:
            raise ValueError(
                f"each score batch must be 2-D [b, L], got {scores.shape}")
        stop = start + scores.shape[0]
        if stop > labels.shape[0]:
            raise ValueError(
                f"score batches cover more rows than labels ({labels.shape[0]})")
        ev.update_scores(scores, labels[start:stop])
        start = stop
    if start != labels.shape[0]:
        raise ValueError(
            f"score batches cover {start} rows, labels has {labels.shape[0]}")
    return ev.result()


# ---------------------------------------------------------------------------
# Keras 3 streaming metrics
# ---------------------------------------------------------------------------


def _hits_and_positives(y_true, topk):
    """Per-instance hit indicators at ranks 1..k and label counts.

    Args:
        y_true: integer tensor ``[b, n]`` of label ids (negative = padding)
            or ``[b]`` (one id per instance), or a float/bool multi-hot
            tensor ``[b, L]`` (entries ``> 0`` are positives).
        topk: int32 tensor ``[b, k]`` of predicted ids.

    Returns:
        ``(hits, num_pos, ids, valid)``: float64 ``[b, k]``, float64 ``[b]``;
        for id input also the sorted ids ``[b, n]`` and their validity mask
        (unique, non-negative), else ``None, None``.
    """
    if y_true.dtype.is_integer:
        ids = tf.cast(y_true, tf.int64)
        if ids.shape.rank == 1:
            ids = ids[:, None]
        ids = tf.sort(ids, axis=-1)
        prev = tf.concat([tf.fill([tf.shape(ids)[0], 1], tf.constant(-1, tf.int64)),
                          ids[:, :-1]], axis=1)
        valid = (ids >= 0) & (ids != prev)
        masked = tf.where(valid, ids, tf.constant(-1, tf.int64))
        eq = tf.equal(tf.cast(topk, tf.int64)[:, :, None], masked[:, None, :])
        hits = tf.cast(tf.reduce_any(eq, axis=-1), tf.float64)
        num_pos = tf.reduce_sum(tf.cast(valid, tf.float64), axis=-1)
        return hits, num_pos, ids, valid
    pos = tf.cast(y_true, tf.float32) > 0 if y_true.dtype != tf.bool else y_true
    hits = tf.cast(tf.gather(pos, topk, batch_dims=1), tf.float64)
    num_pos = tf.reduce_sum(tf.cast(pos, tf.float64), axis=-1)
    return hits, num_pos, None, None


def _prepare(y_true, y_pred, k):
    """Converts inputs and checks shapes; returns (y_true, y_pred, topk)."""
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if y_pred.shape.rank is not None and y_pred.shape.rank != 2:
        raise ValueError(f"y_pred must be [batch, num_labels], got {y_pred.shape}")
    if not y_true.dtype.is_integer:
        if (y_true.shape.rank is not None and y_pred.shape.rank is not None
                and not y_true.shape.is_compatible_with(y_pred.shape)):
            raise ValueError(
                "multi-hot y_true must have the shape of y_pred, got "
                f"{y_true.shape} vs {y_pred.shape}")
    num_labels = y_pred.shape[-1]
    if num_labels is not None and k > num_labels:
        raise ValueError(f"k={k} exceeds the number of labels {num_labels}")
    topk = tf.math.top_k(y_pred, k=k, sorted=True).indices
    return y_true, y_pred, topk


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
        """(checked y_true, top-k ids int32 [b, k]) from label scores."""
        y_true, _, topk = _prepare(y_true, y_pred, self.k)
        return y_true, topk

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Accumulates a batch.

        Args:
            y_true: integer ``[b, n]`` label ids padded with ``-1`` (or
                ``[b]``: one id per instance), or float/bool multi-hot
                ``[b, L]``; integer dtype means ids.
            y_pred: float scores ``[b, L]``.
            sample_weight: optional per-instance weights ``[b]``.
        """
        y_true, topk = self._true_and_top_k(y_true, y_pred)
        hits, num_pos, _, _ = _hits_and_positives(y_true, topk)
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
    ``y_pred`` are broken by the lower label id (``tf.math.top_k``).

    Args:
        k: cut-off, int >= 1 and <= L.
        name: metric name; default ``"precision_at_{k}"``.
        dtype: dtype of the result (accumulators are float64).

    ``update_state(y_true, y_pred, sample_weight=None)``: ``y_pred`` float
    scores ``[b, L]``; ``y_true`` either integer label ids ``[b, n]`` padded
    with ``-1`` (integer dtype) or float/bool multi-hot ``[b, L]``.

    Raises:
        ValueError: If ``k < 1``, or ``k > L`` / shape mismatch when shapes
            are known.

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
        """Accumulates a batch; inputs as :meth:`PrecisionAtK.update_state`."""
        y_true, _, topk = _prepare(y_true, y_pred, self.k)
        hits, num_pos, ids, valid = _hits_and_positives(y_true, topk)
        num = tf.reduce_sum(hits * tf.gather(self._inv, topk), axis=-1)
        if ids is not None:
            wl = tf.where(valid, tf.gather(self._inv, tf.maximum(ids, 0)),
                          tf.constant(0.0, tf.float64))
            kk = tf.minimum(self.k, tf.shape(wl)[1])
        else:
            pos = (tf.cast(y_true, tf.float32) > 0 if y_true.dtype != tf.bool
                   else y_true)
            wl = tf.where(pos, self._inv[None, :], tf.constant(0.0, tf.float64))
            kk = self.k
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


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachPrecisionAtK(PrecisionAtK):
    """Streaming P@k of a MACH head, decoded exactly from its logits.

    ``y_pred`` is the ``[b, R, B]`` logits of a
    :class:`xmc_tf.layers.mach.MachHead`; the top-k labels are those of
    MACH's estimator (Medini et al. 2019, Eq. 2: mean over repetitions of
    the probability of the label's bucket), found by the op
    ``Xmc>MachTopK`` (:func:`xmc_tf.ops.mach_top_k`) without a
    ``[b, num_labels]`` tensor.  Otherwise as :class:`PrecisionAtK`
    (same default name ``precision_at_{k}``, so callbacks can monitor
    ``val_precision_at_3`` whatever the head).

    Args:
        k: cut-off, ``1 <= k <= num_labels``.
        hashing: the head's hash family: a ``MachHead``, a
            :class:`xmc_tf.ops.MachHashing` or its config dict.
        activation: ``"softmax"`` or ``"sigmoid"`` (how the head was
            trained; see :func:`xmc_tf.ops.meta_probabilities`); ``None``
            takes a ``MachHead``'s ``decode_activation``.
        name, dtype: as for :class:`PrecisionAtK`.

    ``update_state(y_true, y_pred, sample_weight=None)``: ``y_true``
    label ids ``[b, n]`` padded with ``-1`` (float ids, as Keras passes
    under a ``tf.distribute`` strategy, are rounded).

    Raises:
        ValueError: bad ``k``, ``activation`` or hash family; ``y_pred`` not
            ``[b, R, B]``.

    Example:
        >>> from xmc_tf.ops import MachHashing
        >>> h = MachHashing.random(10, 4, 2, seed=0)
        >>> logits = tf.one_hot(h.buckets([[3]])[:, 0], 4) * 5.0  # [1, 2, 4]
        >>> m = MachPrecisionAtK(1, h, activation="softmax")
        >>> m.update_state([[3, -1]], logits)
        >>> float(m.result())
        1.0
    """

    def __init__(self, k, hashing, activation=None, name=None, dtype=None):
        if activation is None:
            activation = getattr(hashing, "decode_activation", "softmax")
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        super().__init__(k, name=name, dtype=dtype)
        self.hashing = MachHashing.from_any(hashing)
        if self.k > self.hashing.num_labels:
            raise ValueError(f"k={self.k} exceeds the number of labels "
                             f"{self.hashing.num_labels}")
        self.activation = activation

    def _true_and_top_k(self, y_true, y_pred):
        y_true = tf.convert_to_tensor(y_true)
        if not y_true.dtype.is_integer:
            y_true = tf.cast(tf.round(y_true), tf.int64)
        probs = meta_probabilities(y_pred, self.activation)
        topk, _ = mach_top_k(probs, self.k, self.hashing)
        return y_true, topk

    def get_config(self):
        config = super().get_config()
        config.update({"hashing": self.hashing.get_config(),
                       "activation": self.activation})
        return config
