"""Feature normalisation and the ``tf.data`` input pipeline for XMC training.

:func:`make_tf_dataset` turns an :class:`~xmc_tf.data.XCDataset` into a
``tf.data.Dataset`` of ``(features, label_ids)`` batches:

* ``features``: ``tf.SparseTensor`` float32 ``[b, num_features]`` (sorted,
  canonical indices) for CSR features, or a dense float32
  ``[b, num_features]`` tensor for ``np.ndarray`` (embedding) features.
* ``label_ids``: int32 ``[b, max(1, max_labels_in_batch)]``, the label ids of
  each instance in increasing order, right-padded with ``-1``. This is the
  integer-target contract of the xmc_tf losses and metrics (ids, ``-1`` =
  padding). An instance without labels is a row of ``-1``.
* with ``with_example_ids=True`` a third element, ``example_ids``: int64
  ``[b]``, the row number of each instance in ``data`` (``0 ..
  num_instances - 1``), for losses that keep per-instance state such as
  SCENT's dual variables (:class:`xmc_tf.losses.ScentLoss`).  Keras' default
  ``train_step`` would take a third element for sample weights: use it with
  a trainer that reads ids (:class:`xmc_tf.heads.scent.ScentTrainer`).

The CSR arrays are held once as constant tensors; each batch is a slice of
a (shuffled) permutation of row ids, gathered with ragged ``tf.gather`` on
the CSR row splits inside a parallel ``map``. Neither a dense
``[N, num_labels]`` nor a dense ``[N, num_features]`` matrix is ever built
(per batch, only the sparse rows).

Keras 3 notes (verified with Keras 3.15 / TF 2.21, see
``tests/data/test_data_pipeline.py``):

* ``model.fit(make_tf_dataset(...))`` works with ``keras.Input(shape=(D,),
  sparse=True)`` followed by ``keras.layers.Dense``: the ``SparseTensor``
  is fed as is (``tf.sparse.sparse_dense_matmul``); no workaround needed.
  The static shape of ``features`` is ``[None, num_features]`` (``[batch_size,
  num_features]`` with ``drop_remainder=True``), as ``keras.Input`` needs.
* ``keras.losses.Loss.__call__`` casts ``y_true`` to the loss dtype
  (float32) before calling the loss function, so a loss sees the padded ids
  as float32 and must cast them back (``tf.cast(y_true, tf.int32)``); a
  plain function passed to ``compile(loss=...)`` is wrapped the same way.
  Ids are exact in float32 only up to ``2**24 = 16,777,216``; for larger
  label spaces use a ``keras.losses.Loss`` subclass constructed with
  ``dtype="float64"`` (then ``y_true`` *and* ``y_pred`` arrive as float64;
  ids exact to ``2**53``), or compute the loss in an overridden
  ``Model.compute_loss``.
* ``fit`` ignores its own ``shuffle`` argument for a ``tf.data.Dataset``
  (Keras 3.15 warns "`shuffle=True` was passed, but will be ignored" because
  ``fit(shuffle=True)`` is the default): shuffle with
  ``make_tf_dataset(..., shuffle=True)`` and call ``fit(..., shuffle=False)``
  to silence the warning.
* With ``repeat=True`` the data set is infinite: pass ``steps_per_epoch`` to
  ``fit``. With ``repeat=False`` its cardinality is known, and Keras
  re-iterates it each epoch (a fresh shuffle each time when
  ``shuffle=True``).  Shuffled orders are keyed by ``(seed, epoch)``
  (``first_epoch`` names the first), never by how many epochs the process
  has run, so a resumed run sees the batches of an uninterrupted one.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.data.dataset import XCDataset

__all__ = ["make_tf_dataset", "normalize_features"]


# ---------------------------------------------------------------------------
# Feature normalisation.


def _row_l2_normalize(x):
    if sp.issparse(x):
        x = sp.csr_matrix(x, dtype=np.float32, copy=True)
        sq = np.bincount(np.repeat(np.arange(x.shape[0]), np.diff(x.indptr)),
                         weights=np.square(x.data, dtype=np.float64),
                         minlength=x.shape[0])
        norms = np.sqrt(sq)
        norms[norms == 0] = 1.0
        x.data /= np.repeat(norms, np.diff(x.indptr)).astype(np.float32)
        return x
    x = np.array(x, dtype=np.float32, copy=True)
    norms = np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    x /= norms.astype(np.float32)
    return x


def normalize_features(features, method: str = "l2", idf=None):
    """Normalises instance feature vectors (rows), returning a new matrix.

    Methods:

    * ``"none"``: a float32 copy, unchanged.
    * ``"l2"``: each row scaled to unit l2 norm (all-zero rows stay zero).
    * ``"tfidf"``: each column ``j`` scaled by the smoothed inverse document
      frequency ``idf_j = ln((1 + N) / (1 + df_j)) + 1`` (``df_j``: number of
      rows with a non-zero feature ``j``; the scikit-learn default), then
      rows l2-normalised. Fit ``idf`` on the training set and pass it back
      for the test set.

    Args:
      features: ``[N, D]`` CSR matrix (or any scipy sparse matrix) or dense
        array, e.g. ``XCDataset.features``.
      method: ``"l2"``, ``"tfidf"`` or ``"none"``.
      idf: float ``[D]`` idf weights to reuse (``"tfidf"`` only); ``None``
        fits them on ``features``.

    Returns:
      ``(normalised, idf)``: the normalised float32 matrix, of the same kind
      as the input (CSR or ndarray), and the float32 ``[D]`` idf vector used
      (``None`` for ``"l2"`` and ``"none"``).

    Raises:
      ValueError: unknown ``method``; ``idf`` given with another method or
        with a length other than ``D``.

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> train = sp.csr_matrix(np.array([[1., 1.], [0., 2.]], np.float32))
        >>> x, idf = normalize_features(train, "tfidf")
        >>> [round(float(v), 4) for v in idf]
        [1.4055, 1.0]
        >>> test, _ = normalize_features(train[1:], "tfidf", idf=idf)
        >>> test.toarray().tolist()
        [[0.0, 1.0]]
    """
    if method not in ("l2", "tfidf", "none"):
        raise ValueError(f"normalize_features: unknown method {method!r}; "
                         "expected 'l2', 'tfidf' or 'none'")
    if idf is not None and method != "tfidf":
        raise ValueError("normalize_features: idf is only used with "
                         "method='tfidf'")
    num_rows, num_cols = features.shape
    if method == "none":
        if sp.issparse(features):
            return sp.csr_matrix(features, dtype=np.float32, copy=True), None
        return np.array(features, dtype=np.float32, copy=True), None
    if method == "l2":
        return _row_l2_normalize(features), None
    # tf-idf
    if idf is None:
        if sp.issparse(features):
            b = sp.csr_matrix(features, copy=True)
            b.sum_duplicates()  # a row counts once per feature
            b.eliminate_zeros()
            df = np.bincount(b.indices, minlength=num_cols)
        else:
            df = np.count_nonzero(np.asarray(features), axis=0)
        idf = (np.log((1.0 + num_rows) / (1.0 + df)) + 1.0).astype(np.float32)
    else:
        idf = np.asarray(idf, dtype=np.float32).reshape(-1)
        if idf.shape[0] != num_cols:
            raise ValueError(f"normalize_features: idf has {idf.shape[0]} "
                             f"entries but features have {num_cols} columns")
    if sp.issparse(features):
        x = sp.csr_matrix(features, dtype=np.float32, copy=True)
        x.data *= idf[x.indices]
    else:
        x = np.asarray(features, dtype=np.float32) * idf[None, :]
    return _row_l2_normalize(x), idf


# ---------------------------------------------------------------------------
# tf.data pipeline.


def _batch_rows(num_instances: int, batch_size: int, shuffle: bool,
                seed, drop_remainder: bool, repeat: bool,
                first_epoch: int) -> tf.data.Dataset:
    """Dataset of int64 row-id vectors, one per batch.

    Epoch ``e``'s order is a pure function of ``(seed, e)``, so a process
    that starts at epoch ``e`` (a resumed run) sees the same batches as one
    that ran epochs ``0 .. e-1`` before.
    """
    n = num_instances
    num_batches = n // batch_size if drop_remainder else math.ceil(
        n / batch_size)
    if shuffle and seed is None:
        seed = secrets.randbits(63)
    if repeat:
        # first_epoch, first_epoch + 1, ... in one stream.
        epochs = tf.data.Dataset.counter(start=first_epoch)
    elif shuffle:
        # One epoch per iteration of this Dataset object: iteration k is
        # epoch first_epoch + k (the counter lives with the object).
        counter = tf.Variable(int(first_epoch), dtype=tf.int64,
                              trainable=False, name="xmc_tf_epoch_counter")
        epochs = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(
            lambda _: counter.assign_add(1) - 1)
    else:
        epochs = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))

    def epoch_batches(epoch):
        if shuffle:
            perm = tf.random.experimental.stateless_shuffle(
                tf.range(n, dtype=tf.int64),
                seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        else:
            perm = tf.range(n, dtype=tf.int64)

        def batch(i):
            start = i * batch_size
            rows = perm[start:tf.minimum(start + batch_size, n)]
            if drop_remainder:  # static batch dimension
                rows = tf.ensure_shape(rows, [batch_size])
            return rows

        return tf.data.Dataset.range(num_batches).map(batch)

    rows = epochs.flat_map(epoch_batches)
    # flat_map hides the cardinality; restore it (Keras needs "infinite" to
    # require steps_per_epoch, and a finite count for its progress bar).
    rows = rows.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if repeat else num_batches))
    return rows


def make_tf_dataset(data: XCDataset,
                    batch_size: int,
                    *,
                    shuffle: bool = False,
                    seed: int | None = None,
                    drop_remainder: bool = False,
                    repeat: bool = False,
                    first_epoch: int = 0,
                    with_example_ids: bool = False) -> tf.data.Dataset:
    """Builds a ``tf.data.Dataset`` of ``(features, label_ids)`` batches.

    Args:
      data: the :class:`XCDataset`; CSR features become sparse batches,
        ``np.ndarray`` features dense batches.
      batch_size: instances per batch (the last batch of an epoch may be
        smaller unless ``drop_remainder``).
      shuffle: visit the instances in a new random order every epoch (each
        epoch still covers every instance exactly once).  The order of
        epoch ``e`` is ``stateless_shuffle`` keyed by ``(seed, e)``: it does
        not depend on the process, so a run resumed at epoch ``e`` sees the
        batches an uninterrupted run sees.
      seed: seed of the shuffle; with a fixed seed the sequence of epochs is
        reproducible. ``None``: nondeterministic.
      drop_remainder: drop the last incomplete batch of each epoch.
      repeat: repeat epochs forever (pass ``steps_per_epoch`` to ``fit``):
        the stream is epoch ``first_epoch``, then ``first_epoch + 1``, ...
        Without ``repeat`` the data set is one epoch, and with ``shuffle``
        its ``k``-th iteration (0-based; a new iterator per Keras epoch) is
        epoch ``first_epoch + k``.
      first_epoch: number of the first epoch (0-based), e.g. the
        ``initial_epoch`` of a resumed ``fit``; only the shuffle uses it.
      with_example_ids: also yield each instance's row number in ``data``
        (SCENT's dual variables, Algorithm 26 of
        ``scent-extreme-multiclass``, are indexed by it).

    Returns:
      A ``tf.data.Dataset`` yielding ``(features, label_ids)``:

      * ``features``: ``tf.SparseTensor`` float32 ``[b, num_features]``
        (indices in row-major order), or dense float32 ``[b, num_features]``
        for embeddings.
      * ``label_ids``: int32 ``[b, max(1, max_labels_in_batch)]`` label ids,
        sorted per row, padded with ``-1``.
      * only with ``with_example_ids``, a third element ``example_ids``:
        int64 ``[b]``, row numbers in ``data`` (static ``[batch_size]``
        with ``drop_remainder``).

      Without ``repeat`` the cardinality is ``ceil(N / batch_size)`` (or
      ``N // batch_size`` with ``drop_remainder``).

    Raises:
      ValueError: ``batch_size < 1``, ``first_epoch < 0``, an empty data
        set, or ``drop_remainder`` with fewer instances than
        ``batch_size``.

    Example:
        >>> from xmc_tf.data import load_bundled
        >>> ds = make_tf_dataset(load_bundled("bibtex", "test"), 32)
        >>> x, y = next(iter(ds))
        >>> x.dense_shape.numpy().tolist(), y.dtype.name
        ([32, 1836], 'int32')
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = data.num_instances
    if n == 0:
        raise ValueError("make_tf_dataset: the data set has no instances")
    if int(first_epoch) < 0:
        raise ValueError(f"first_epoch must be >= 0, got {first_epoch}")
    if drop_remainder and n < batch_size:
        raise ValueError(f"make_tf_dataset: drop_remainder with batch_size "
                         f"{batch_size} > num_instances {n} leaves no batch")
    num_features = data.num_features

    y = sp.csr_matrix(data.labels)
    if not y.has_canonical_format:
        y = y.copy()
        y.sum_duplicates()
    lab_splits = tf.constant(y.indptr.astype(np.int64))
    lab_ids = tf.constant(y.indices.astype(np.int32))

    if data.is_sparse:
        x = sp.csr_matrix(data.features, dtype=np.float32)
        if not x.has_canonical_format:
            x = x.copy()
            x.sum_duplicates()
        feat_splits = tf.constant(x.indptr.astype(np.int64))
        feat_ids = tf.constant(x.indices.astype(np.int32))
        feat_vals = tf.constant(x.data.astype(np.float32, copy=False))
    else:
        dense = tf.constant(np.asarray(data.features, dtype=np.float32))

    def gather(rows):
        static_b = rows.shape[0]  # batch_size with drop_remainder, else None
        b = (tf.constant(static_b, tf.int64) if static_b is not None else
             tf.shape(rows, out_type=tf.int64)[0])
        labels = tf.gather(
            tf.RaggedTensor.from_row_splits(lab_ids, lab_splits,
                                            validate=False), rows)
        label_ids = labels.to_tensor(default_value=-1)
        width = tf.shape(label_ids)[1]
        label_ids = tf.pad(label_ids, [[0, 0], [0, tf.maximum(1 - width, 0)]],
                           constant_values=-1)
        label_ids.set_shape([static_b, None])
        if data.is_sparse:
            ids = tf.gather(
                tf.RaggedTensor.from_row_splits(feat_ids, feat_splits,
                                                validate=False), rows)
            vals = tf.gather(
                tf.RaggedTensor.from_row_splits(feat_vals, feat_splits,
                                                validate=False), rows)
            indices = tf.stack(
                [ids.value_rowids(),
                 tf.cast(ids.flat_values, tf.int64)], axis=1)
            features = tf.SparseTensor(
                indices, vals.flat_values,
                dense_shape=tf.stack([b, tf.constant(num_features,
                                                     tf.int64)]))
        else:
            features = tf.gather(dense, rows)
        if with_example_ids:
            return features, label_ids, rows
        return features, label_ids

    rows = _batch_rows(n, batch_size, shuffle, seed, drop_remainder, repeat,
                       int(first_epoch))
    ds = rows.map(gather, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)
