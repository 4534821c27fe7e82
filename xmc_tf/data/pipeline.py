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
  a trainer that reads ids (:class:`xmc_tf.models.ScentTrainer`).

The data set stays in NumPy (or memory-mapped ``.npy`` files,
:mod:`xmc_tf.data.cache`): each batch is a slice of a (shuffled)
permutation of row ids, whose CSR rows a ``tf.numpy_function`` gathers
inside a parallel ``map``.  No graph constant grows with the data set
(the 2 GB ``GraphDef`` limit does not apply), and neither a dense
``[N, num_labels]`` nor a dense ``[N, num_features]`` matrix is ever built
(per batch, only the sparse rows).  :func:`distribute_tf_dataset` shards
the same stream over the replicas of a ``tf.distribute`` strategy.

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

__all__ = ["count_non_finite", "distribute_tf_dataset", "fit_idf",
           "make_tf_dataset", "normalize_features", "resolve_normalization"]


# ---------------------------------------------------------------------------
# Feature normalisation.


def count_non_finite(features) -> int:
    """The NaN and infinite values among ``features``' stored entries.

    Args:
      features: a scipy sparse matrix (its stored entries are counted) or a
        float NumPy array (every entry).

    Returns:
      The count, 0 for finite features (the check that the trainers,
      :class:`xmc_tf.ExtremeClassifier` and the job make before training).

    >>> count_non_finite(np.array([[1.0, np.nan], [np.inf, 0.0]]))
    2
    """
    values = features.data if sp.issparse(features) else np.asarray(features)
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def fit_idf(features) -> np.ndarray:
    """Smoothed inverse document frequencies of the columns of ``features``.

    ``idf_j = ln((1 + N) / (1 + df_j)) + 1`` with ``df_j`` the number of rows
    with a non-zero feature ``j`` (a row counts once per feature): the
    scikit-learn ``TfidfTransformer`` default, what
    :func:`normalize_features` fits for ``"tfidf"``.

    Args:
      features: ``[N, D]`` scipy sparse matrix or dense array.

    Returns:
      float32 ``[D]``.

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> [round(float(v), 4) for v in fit_idf(
        ...     sp.csr_matrix(np.array([[1., 1.], [0., 2.]])))]
        [1.4055, 1.0]
    """
    num_rows, num_cols = features.shape
    if sp.issparse(features):
        b = sp.csr_matrix(features, copy=True)
        b.sum_duplicates()  # a row counts once per feature
        b.eliminate_zeros()
        df = np.bincount(b.indices, minlength=num_cols)
    else:
        df = np.count_nonzero(np.asarray(features), axis=0)
    return (np.log((1.0 + num_rows) / (1.0 + df)) + 1.0).astype(np.float32)


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


def resolve_normalization(method: str, features) -> str:
    """The normalisation ``"auto"`` stands for on ``features``; others as given.

    XC-repo files come two ways: raw term counts or binary bag-of-words
    values (Bibtex, Delicious, ManNextWord), and values that are already
    tf-idf weights (EURLex-4K, Wiki10-31K, AmazonCat-13K, Amazon-670K, ...).
    Weighting the latter by idf again would square the idf factor.
    ``"auto"`` therefore picks ``"tfidf"`` when every stored value is a
    non-negative whole number (counts; also an all-zero matrix) and ``"l2"``
    otherwise.  Resolve it once, on the training features, and reuse the
    result for every other split.

    Args:
      method: ``"auto"``, ``"tfidf"``, ``"l2"`` or ``"none"``.
      features: ``[N, D]`` scipy sparse matrix or dense array (any dtype).

    Returns:
      ``"tfidf"``, ``"l2"`` or ``"none"``.

    Raises:
      ValueError: an unknown ``method``.

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> resolve_normalization("auto", sp.csr_matrix(np.array([[0., 2.]])))
        'tfidf'
        >>> resolve_normalization("auto", sp.csr_matrix(np.array([[0., .3]])))
        'l2'
    """
    if method not in ("auto", "l2", "tfidf", "none"):
        raise ValueError(f"unknown method {method!r}; expected 'auto', "
                         "'l2', 'tfidf' or 'none'")
    if method != "auto":
        return method
    values = features.data if sp.issparse(features) else np.asarray(features)
    values = values.reshape(-1)
    for start in range(0, values.size, 1 << 22):  # blocks: no full copy
        block = values[start:start + (1 << 22)]
        if np.any(block < 0) or np.any(block != np.floor(block)):
            return "l2"
    return "tfidf"


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
    num_cols = features.shape[1]
    if method == "none":
        if sp.issparse(features):
            return sp.csr_matrix(features, dtype=np.float32, copy=True), None
        return np.array(features, dtype=np.float32, copy=True), None
    if method == "l2":
        return _row_l2_normalize(features), None
    # tf-idf
    if idf is None:
        idf = fit_idf(features)
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
                first_epoch: int, num_shards: int = 1,
                shard_ids=(0,)) -> tf.data.Dataset:
    """Dataset of int64 row-id vectors, one per batch (per shard batch).

    Epoch ``e``'s order is a pure function of ``(seed, e)``, so a process
    that starts at epoch ``e`` (a resumed run) sees the same batches as one
    that ran epochs ``0 .. e-1`` before.  With ``num_shards > 1`` every
    global batch of ``num_shards * batch_size`` rows is cut into
    ``num_shards`` consecutive chunks of ``batch_size`` rows and the chunks
    ``shard_ids`` are yielded, in that order.
    """
    n = num_instances
    global_batch = batch_size * num_shards
    num_batches = n // global_batch if drop_remainder else math.ceil(
        n / global_batch)
    shard_ids = [int(i) for i in shard_ids]
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
            # Chunk k of global batch j: i = j * len(shard_ids) + position
            # of k in shard_ids.
            j = i // len(shard_ids)
            k = tf.gather(tf.constant(shard_ids, tf.int64),
                          i % len(shard_ids))
            start = tf.minimum(j * global_batch + k * batch_size, n)
            stop = tf.minimum(tf.minimum(start + batch_size,
                                         (j + 1) * global_batch), n)
            rows = perm[start:stop]
            if drop_remainder:  # static batch dimension
                rows = tf.ensure_shape(rows, [batch_size])
            return rows

        return tf.data.Dataset.range(num_batches * len(shard_ids)).map(batch)

    rows = epochs.flat_map(epoch_batches)
    # flat_map hides the cardinality; restore it (Keras needs "infinite" to
    # require steps_per_epoch, and a finite count for its progress bar).
    rows = rows.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY if repeat else
        num_batches * len(shard_ids)))
    return rows


def _ragged_take(splits: np.ndarray, rows: np.ndarray):
    """Positions of the entries of CSR rows ``rows``, in row order.

    Returns ``(lengths int64 [b], row_of int64 [nnz], col int64 [nnz],
    src int64 [nnz])``: entry ``t`` of the batch is entry ``src[t]`` of the
    CSR arrays, in batch row ``row_of[t]`` at position ``col[t]`` of it.
    """
    starts = splits[rows]
    lengths = splits[rows + 1] - starts
    total = int(lengths.sum())
    row_of = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    first = np.cumsum(lengths) - lengths  # first batch entry of each row
    col = np.arange(total, dtype=np.int64) - first[row_of]
    src = starts[row_of] + col
    return lengths, row_of, col, src


class _CsrBatcher:
    """Gathers batches of rows from NumPy CSR arrays (no TensorFlow).

    Holds references to the arrays of the data set (no copy when they are
    already canonical CSR with int32 indices and float32 values; memory-
    mapped arrays stay mapped) and is called through ``tf.numpy_function``
    with the int64 row ids of one batch.
    """

    def __init__(self, data: XCDataset):
        y = data.labels
        if not y.has_canonical_format:
            y = y.copy()
            y.sum_duplicates()
        self.lab_splits = np.asarray(y.indptr, dtype=np.int64)
        self.lab_ids = np.asarray(y.indices, dtype=np.int32)
        self.num_instances = data.num_instances
        self.sparse = data.is_sparse
        if self.sparse:
            x = data.features
            if x.dtype != np.float32:
                x = sp.csr_matrix(x, dtype=np.float32)
            if not x.has_canonical_format:
                x = x.copy()
                x.sum_duplicates()
            self.feat_splits = np.asarray(x.indptr, dtype=np.int64)
            self.feat_ids = x.indices  # int32 or int64
            self.feat_vals = x.data
        else:
            self.dense = np.asarray(data.features, dtype=np.float32)

    def __call__(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or
                          rows.max() >= self.num_instances):
            raise ValueError("make_tf_dataset: row id out of range")
        lengths, row_of, col, src = _ragged_take(self.lab_splits, rows)
        width = max(1, int(lengths.max()) if lengths.size else 1)
        label_ids = np.full((rows.size, width), -1, np.int32)
        label_ids[row_of, col] = self.lab_ids[src]
        if not self.sparse:
            return self.dense[rows], label_ids
        _, row_of, _, src = _ragged_take(self.feat_splits, rows)
        indices = np.empty((src.size, 2), np.int64)
        indices[:, 0] = row_of
        indices[:, 1] = self.feat_ids[src]
        return indices, self.feat_vals[src], label_ids


def make_tf_dataset(data: XCDataset,
                    batch_size: int,
                    *,
                    shuffle: bool = False,
                    seed: int | None = None,
                    drop_remainder: bool = False,
                    repeat: bool = False,
                    first_epoch: int = 0,
                    with_example_ids: bool = False,
                    num_shards: int = 1,
                    shard_index=0) -> tf.data.Dataset:
    """Builds a ``tf.data.Dataset`` of ``(features, label_ids)`` batches.

    The data set stays in NumPy: the dataset graph holds only the row-id
    schedule (a ``stateless_shuffle`` of ``range(N)`` per epoch) and one
    ``tf.numpy_function`` that gathers each batch's CSR rows from the
    arrays of ``data`` (no graph constant grows with the data set, so the
    2 GB ``GraphDef`` limit does not apply and the arrays are not copied
    into TensorFlow; memory-mapped arrays, e.g. from
    :func:`xmc_tf.data.cache.read_cache`, stay mapped).  Gathering a batch
    of 256 Amazon-670K-sized rows costs well under a millisecond
    (``benchmarks/scale.py --pipeline``), against seconds for a training
    step at that scale.

    Args:
      data: the :class:`XCDataset`; CSR features become sparse batches,
        ``np.ndarray`` features dense batches.  Its arrays are referenced,
        not copied: do not modify them while the data set is in use.
      batch_size: instances per batch (the last batch of an epoch may be
        smaller unless ``drop_remainder``); with ``num_shards > 1``, per
        shard.
      shuffle: visit the instances in a new random order every epoch (each
        epoch still covers every instance exactly once).  The order of
        epoch ``e`` is ``stateless_shuffle`` keyed by ``(seed, e)``: it does
        not depend on the process, so a run resumed at epoch ``e`` sees the
        batches an uninterrupted run sees.
      seed: seed of the shuffle; with a fixed seed the sequence of epochs is
        reproducible. ``None``: nondeterministic.
      drop_remainder: drop the last incomplete (global) batch of each
        epoch.
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
      num_shards: split every global batch of ``num_shards * batch_size``
        instances (the unsharded stream's batch, in the same order) into
        ``num_shards`` consecutive chunks of ``batch_size``, one per
        replica of a data-parallel run (see :func:`distribute_tf_dataset`).
        The last global batch of an epoch gives short, possibly empty,
        chunks unless ``drop_remainder``.
      shard_index: the chunk(s) this data set yields: an int in ``[0,
        num_shards)``, or a sequence of them (yielded in that order for
        every global batch: the replicas of one worker).

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
      ``N // batch_size`` with ``drop_remainder``; with shards, the number
      of global batches times the number of shard indices).

    Raises:
      ValueError: ``batch_size < 1``, ``first_epoch < 0``, an empty data
        set, ``drop_remainder`` with fewer instances than one (global)
        batch, ``num_shards < 1`` or a shard index outside ``[0,
        num_shards)``.

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
    if int(num_shards) < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    shard_ids = ([int(shard_index)] if np.ndim(shard_index) == 0 else
                 [int(i) for i in shard_index])
    if not shard_ids or any(not 0 <= i < num_shards for i in shard_ids):
        raise ValueError(f"shard_index={shard_index!r} must be in [0, "
                         f"num_shards={num_shards})")
    global_batch = batch_size * int(num_shards)
    if drop_remainder and n < global_batch:
        raise ValueError(f"make_tf_dataset: drop_remainder with batch_size "
                         f"{global_batch} > num_instances {n} leaves no "
                         "batch")
    num_features = data.num_features
    batcher = _CsrBatcher(data)

    def gather(rows):
        static_b = rows.shape[0]  # batch_size with drop_remainder, else None
        b = (tf.constant(static_b, tf.int64) if static_b is not None else
             tf.shape(rows, out_type=tf.int64)[0])
        if data.is_sparse:
            indices, values, label_ids = tf.numpy_function(
                batcher, [rows], [tf.int64, tf.float32, tf.int32],
                stateful=False, name="xmc_tf_gather_csr_rows")
            indices.set_shape([None, 2])
            values.set_shape([None])
            features = tf.SparseTensor(
                indices, values,
                dense_shape=tf.stack([b, tf.constant(num_features,
                                                     tf.int64)]))
        else:
            features, label_ids = tf.numpy_function(
                batcher, [rows], [tf.float32, tf.int32], stateful=False,
                name="xmc_tf_gather_rows")
            features.set_shape([static_b, num_features])
        label_ids.set_shape([static_b, None])
        if with_example_ids:
            return features, label_ids, rows
        return features, label_ids

    rows = _batch_rows(n, batch_size, shuffle, seed, drop_remainder, repeat,
                       int(first_epoch), int(num_shards), shard_ids)
    ds = rows.map(gather, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def distribute_tf_dataset(strategy, data: XCDataset, global_batch_size: int,
                          **kwargs):
    """:func:`make_tf_dataset` for a data-parallel ``tf.distribute`` run.

    Each input pipeline (worker) builds only its own part of every global
    batch (``strategy.distribute_datasets_from_function``): replica ``r``
    of worker ``w`` gets chunk ``w * R + r`` (``R`` replicas per worker) of
    the global batch, so the union of the replicas' step-``i`` batches is
    batch ``i`` of ``make_tf_dataset(data, global_batch_size, **kwargs)``
    in one process (same order, same epoch keying, same resume).  Every
    worker holds the whole data set in memory (or memory-mapped) and
    gathers only its rows.

    Args:
      strategy: a ``tf.distribute.Strategy`` (e.g.
        ``MultiWorkerMirroredStrategy``, ``MirroredStrategy``).
      data: the :class:`XCDataset` (the same on every worker).
      global_batch_size: instances per step over all replicas; a multiple
        of ``strategy.num_replicas_in_sync``.
      **kwargs: other :func:`make_tf_dataset` arguments (``shuffle``,
        ``seed`` -- the same on every worker --, ``repeat``,
        ``drop_remainder``, ``first_epoch``, ``with_example_ids``).

    Returns:
      A ``tf.distribute.DistributedDataset`` to pass to ``Model.fit``.

    Raises:
      ValueError: ``global_batch_size`` not a multiple of the number of
        replicas; as :func:`make_tf_dataset`.
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch_size < 1 or global_batch_size % replicas:
        raise ValueError(f"global_batch_size={global_batch_size} must be a "
                         f"positive multiple of the {replicas} replicas")
    for key in ("num_shards", "shard_index"):
        if key in kwargs:
            raise ValueError(f"distribute_tf_dataset sets {key} itself")

    def dataset_fn(ctx):
        per_worker = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        first = ctx.input_pipeline_id * per_worker
        return make_tf_dataset(
            data, ctx.get_per_replica_batch_size(global_batch_size),
            num_shards=ctx.num_replicas_in_sync,
            shard_index=list(range(first, first + per_worker)), **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)
