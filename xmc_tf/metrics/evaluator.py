"""Offline (NumPy) XMC evaluation: P@k, nDCG@k, PSP@k and recall@k.

For score or top-k batches too large to hold at once: :func:`top_k`,
:class:`XMCEvaluator` (streaming, batch by batch; reports **percentages**)
and :func:`evaluate_scores`; :func:`inverse_propensities` for PSP@k.
A decoder (a function from a feature batch to its top-k labels) is run over
a data set in batches by :func:`decode_batches` and scored by
:func:`evaluate_top_k` (:class:`xmc_tf.callbacks.TopKEvaluation`, and
:mod:`xmc_tf.job.scoring` with a model's decoder), in batches of at most
:func:`score_batch_size` rows.
Definitions and conventions: see :mod:`xmc_tf.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["inverse_propensities", "top_k", "XMCEvaluator", "evaluate_scores",
           "decode_batches", "evaluate_top_k", "score_batch_size",
           "SCORE_BLOCK_BYTES", "FREQUENCY_EDGES", "frequency_buckets",
           "evaluate_by_frequency"]


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
        :func:`xmc_tf.job.scoring.top_k_function` of a model.
      dataset: an :class:`xmc_tf.data.XCDataset` (features already
        normalised as the model expects; labels unused).
      batch_size: instances per batch (memory is ``O(batch_size * m)`` for a
        decoder that scores every label).

    Yields:
      ``(ids int32 [b, k], scores float32 [b, k])`` NumPy arrays per batch,
      in row order.
    """
    # (TensorFlow, imported when used: the rest of this module is NumPy.)
    from xmc_tf.data.pipeline import make_tf_dataset
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


# ---------------------------------------------------------------------------
# Metrics per label-frequency bucket
# ---------------------------------------------------------------------------

#: Default bucket edges of :func:`evaluate_by_frequency`: labels with 1,
#: 2-3, 4-8, 9-32 and 33 or more training instances.
FREQUENCY_EDGES = (1, 2, 4, 9, 33)


def frequency_buckets(train_counts, edges=FREQUENCY_EDGES):
    """Assigns every label to a bucket of its training frequency.

    Args:
        train_counts: int array ``[L]``: training instances per label.
        edges: increasing positive ints ``e_0 < e_1 < ...``: bucket ``b``
            holds the labels with ``e_b <= count < e_{b+1}`` (the last one
            is open); labels below ``e_0`` (e.g. never seen in training)
            get bucket ``-1``.

    Returns:
        ``(bucket_of_label, names)``: int64 array ``[L]`` and the bucket
        names, e.g. ``["1", "2-3", "4-8", "9-32", "33+"]``.

    Raises:
        ValueError: ``train_counts`` is not 1-D or has negative entries, or
            ``edges`` is empty, not increasing or holds a value < 1.

    >>> b, names = frequency_buckets(np.array([0, 1, 3, 40]))
    >>> b.tolist(), names
    ([-1, 0, 1, 4], ['1', '2-3', '4-8', '9-32', '33+'])
    """
    counts = np.asarray(train_counts)
    if counts.ndim != 1:
        raise ValueError(f"train_counts must be 1-D, got shape {counts.shape}")
    if counts.size and counts.min() < 0:
        raise ValueError("train_counts must be non-negative")
    edges = [int(e) for e in edges]
    if not edges or edges[0] < 1 or any(
            b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be increasing ints >= 1, got {edges}")
    names = []
    for lo, hi in zip(edges, edges[1:]):
        names.append(str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}")
    names.append(f"{edges[-1]}+")
    bucket = np.searchsorted(np.asarray(edges), counts, side="right") - 1
    return bucket.astype(np.int64), names


def evaluate_by_frequency(topk_ids, true_labels, train_counts, ks=(1, 5),
                          inv_propensities=None, edges=FREQUENCY_EDGES):
    """P@k, nDCG@k, R@k (and PSP@k) restricted to labels of each frequency.

    For bucket ``B`` (labels whose training frequency falls in it, see
    :func:`frequency_buckets`) the evaluated instances are those with at
    least one true label in ``B``, and their ground truth is cut to the
    labels in ``B``; the ranking is not cut (a correct prediction of a label
    outside ``B`` is not a hit there).  So on multi-class data P@1 of a
    bucket is the accuracy on the instances whose class has that many
    training instances; on multi-label data it is the precision on the
    bucket's labels, as in the tail-label tables of e.g. Jain et al.
    (KDD 2016) and Dahiya et al. (DECAF, WSDM 2021).  PSP@k uses
    ``inv_propensities`` over the cut ground truth.

    Args:
        topk_ids: int array ``[n, K]``, ``K >= max(ks)``: predicted label
            ids per instance, best first (negative: no prediction).
        true_labels: the instances' true labels in any form that
            :meth:`XMCEvaluator.update` takes.
        train_counts: int array ``[L]``: training instances per label.
        ks: cut-offs.
        inv_propensities: optional float array ``[L]`` (PSP@k).
        edges: bucket edges (:func:`frequency_buckets`).

    Returns:
        list of dicts, one per bucket that holds a true label of some
        instance (bucket ``"0"`` for labels never seen in training, first,
        when present): ``"bucket"`` (name), ``"labels"`` (labels of the
        bucket among the true labels), ``"num_instances"``, and the metrics
        of :meth:`XMCEvaluator.result` in percent.

    Raises:
        ValueError: as :func:`frequency_buckets` and
            :meth:`XMCEvaluator.update`, or a true label id ``>= L``.

    >>> ids = np.array([[0, 1], [1, 0], [2, 0]])
    >>> rows = evaluate_by_frequency(ids, [[0], [0], [2]], np.array([1, 5, 40]),
    ...                              ks=(1,))
    >>> [(r["bucket"], r["num_instances"], r["P@1"]) for r in rows]
    [('1', 2, 50.0), ('33+', 1, 100.0)]
    """
    topk_ids = np.asarray(topk_ids)
    if topk_ids.ndim != 2:
        raise ValueError(
            f"topk_ids must be 2-D [n, K], got shape {topk_ids.shape}")
    n = topk_ids.shape[0]
    counts = np.asarray(train_counts)
    bucket, names = frequency_buckets(counts, edges)
    rows, ids = _label_pairs(true_labels, n)
    if ids.size and ids.max() >= counts.size:
        raise ValueError(f"true label id {int(ids.max())} >= the "
                         f"{counts.size} labels of train_counts")
    pair_bucket = bucket[ids]
    out = []
    for b, name in [(-1, "0")] + list(enumerate(names)):
        keep = pair_bucket == b
        if not keep.any():
            continue
        inst = np.unique(rows[keep])
        local = np.searchsorted(inst, rows[keep])
        truth = sp.csr_matrix(
            (np.ones(local.size), (local, ids[keep])),
            shape=(inst.size, counts.size))
        ev = XMCEvaluator(ks=ks, inv_propensities=inv_propensities)
        ev.update(topk_ids[inst], truth)
        out.append({"bucket": name, "labels": int(np.unique(ids[keep]).size),
                    **ev.result()})
    return out
