"""Label targets in every form Keras hands a loss or a metric.

``y_true`` of the losses of :mod:`xmc_tf.losses` and the metrics of
:mod:`xmc_tf.metrics` may be

1. integer label ids padded with negative values, ``[batch, n]``, or one id
   per instance, ``[batch]`` (what :func:`xmc_tf.data.make_tf_dataset` and
   :func:`xmc_tf.data.padded_label_ids` give);
2. the same ids as floats, as Keras' build under a ``tf.distribute``
   strategy makes them (``TensorFlowTrainer._maybe_symbolic_build`` feeds
   the replica-*mean* of the first batch): a float ``[batch, n]`` whose
   width ``n`` differs from ``num_labels``, or a float ``[batch]``; rounded
   to the nearest integer (exact below ``2**24`` in float32);
3. a dense multi-hot ``[batch, num_labels]`` (float or bool; entries
   ``> 0`` are positives);
4. a ``tf.SparseTensor`` ``[batch, num_labels]`` (entries ``!= 0`` are
   positives): what Keras 3.15 makes of a scipy CSR ``y`` passed to
   ``Model.fit`` (a float32 ``SparseTensor`` per batch, not densified).

:func:`target_label_ids` turns any of them into padded ids without a
``[batch, num_labels]`` tensor for forms 1, 2 and 4; :func:`dense_targets`
into a multi-hot tensor.  One rule decides the form
(``_dispatch_targets``), for the losses and the metrics alike.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["dense_targets", "target_label_ids"]


def _positions_to_ids(rows, cols, batch):
    """Padded ids ``int64 [batch, width]`` from the (row, column) pairs of
    the positives, ``rows`` ascending (row-major order); width is the most
    positives of a row, at least 1; padding is -1."""
    rows = tf.cast(rows, tf.int64)
    counts = tf.math.bincount(tf.cast(rows, tf.int32),
                              minlength=tf.cast(batch, tf.int32),
                              maxlength=tf.cast(batch, tf.int32),
                              dtype=tf.int64)
    starts = tf.cumsum(counts, exclusive=True)
    pos = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(starts, rows)
    width = tf.maximum(tf.reduce_max(tf.concat([counts, [0]], 0)), 1)
    shape = tf.stack([tf.cast(batch, tf.int64), width])
    # Scatter id + 1 into zeros, then subtract 1: empty slots become -1.
    return tf.scatter_nd(tf.stack([rows, pos], axis=1),
                         tf.cast(cols, tf.int64) + 1, shape) - 1


def _sparse_to_ids(y_true, num_labels):
    """Padded ids from a ``tf.SparseTensor`` ``[batch, num_labels]``."""
    if y_true.shape.rank is not None and y_true.shape.rank != 2:
        raise ValueError("a SparseTensor y_true must be [batch, num_labels], "
                         f"got shape {y_true.shape}")
    width, m = y_true.shape[-1], tf.get_static_value(num_labels)
    if width is not None and m is not None and width != int(m):
        raise ValueError(f"y_true is a SparseTensor with {width} columns but "
                         f"the predictions have {int(m)} labels")
    if width is None:  # a scipy matrix's batches: checked when they come
        m_text = f"{int(m)}" if m is not None else "num_labels"
        with tf.control_dependencies([tf.debugging.assert_equal(
                y_true.dense_shape[1], tf.cast(num_labels, tf.int64),
                message=(f"the label matrix is not {m_text} columns wide, "
                         "the width of the predictions (the head num_labels):"
                         " x = its columns, y = the labels"))]):
            y_true = tf.SparseTensor(tf.identity(y_true.indices),
                                     y_true.values, y_true.dense_shape)
    y_true = tf.sparse.reorder(y_true)
    keep = tf.not_equal(y_true.values, tf.zeros([], y_true.dtype))
    indices = tf.boolean_mask(y_true.indices, keep)
    return _positions_to_ids(indices[:, 0], indices[:, 1],
                             y_true.dense_shape[0])


def _dense_to_ids(y_true):
    """Padded ids from a dense multi-hot ``[batch, num_labels]``."""
    positives = y_true if y_true.dtype == tf.bool else y_true > 0
    where = tf.where(positives)  # row-major
    return _positions_to_ids(where[:, 0], where[:, 1],
                             tf.shape(y_true, out_type=tf.int64)[0])


def _dispatch_targets(y_true, num_labels, on_ids, on_dense):
    """``on_ids(int64 ids [batch, n])`` or ``on_dense(y_true)``, by form.

    The rules of the module docstring: a ``tf.SparseTensor`` is turned into
    ids; any rank-1 ``y_true`` holds one id per instance (floats rounded);
    an integer ``[batch, n]`` holds ids; a float ``[batch, n]`` holds ids
    when ``n != num_labels`` (rounded), else it is multi-hot, as is a bool
    one.  When the width is only known at run time, both branches are traced
    and ``tf.cond`` picks one (their results must agree in dtype and rank).

    Raises:
      ValueError: a SparseTensor whose width differs from ``num_labels``,
        a bool ``[batch]``, or ``y_true`` of rank other than 1 or 2 (when
        ``on_dense`` does not take it: see the callers).
    """
    if isinstance(y_true, (tf.SparseTensor, tf.compat.v1.SparseTensorValue)):
        return on_ids(_sparse_to_ids(tf.SparseTensor.from_value(y_true),
                                     num_labels))
    y_true = tf.convert_to_tensor(y_true)
    if y_true.shape.rank == 1:
        if y_true.dtype == tf.bool:
            raise ValueError("a bool y_true must be a [batch, num_labels] "
                             "multi-hot, got shape " + str(y_true.shape))
        if not y_true.dtype.is_integer:
            y_true = tf.round(y_true)
        return on_ids(tf.cast(y_true, tf.int64)[:, tf.newaxis])
    if y_true.dtype.is_integer:
        return on_ids(tf.cast(y_true, tf.int64))
    if y_true.dtype == tf.bool or y_true.shape.rank != 2:
        return on_dense(y_true)

    def float_ids():
        return on_ids(tf.cast(tf.round(y_true), tf.int64))

    width = y_true.shape[-1]
    static_m = tf.get_static_value(num_labels)
    if width is not None and static_m is not None:
        if width > int(static_m):  # no padded ids are wider than m
            raise ValueError(f"y_true has {width} columns but the predictions "
                             f"have {int(static_m)} labels (the head's "
                             "num_labels)")
        return on_dense(y_true) if width == int(static_m) else float_ids()
    return tf.cond(
        tf.equal(tf.shape(y_true, out_type=tf.int64)[-1],
                 tf.cast(num_labels, tf.int64)),
        lambda: on_dense(y_true), float_ids)


def target_label_ids(y_true, num_labels):
    """Padded label ids ``int64 [batch, n]`` from targets in any form.

    Builds no ``[batch, num_labels]`` tensor for ids or a ``SparseTensor``;
    a dense multi-hot is read once (``tf.where``).  Row ``i`` holds the
    ids of instance ``i``'s positives: in the order given for ids (repeats
    and negative padding kept as they are), in ascending order for a
    multi-hot or sparse matrix, then -1.

    Args:
      y_true: any of the four forms of the module docstring: int (or float,
        as a strategy casts them) ``[batch, n]`` / ``[batch]`` ids padded
        with negative values, a float/bool ``[batch, num_labels]``
        multi-hot, or a ``tf.SparseTensor`` ``[batch, num_labels]``.
      num_labels: int or scalar tensor, the number of labels m (the width
        that marks a float matrix as multi-hot).

    Returns:
      int64 ``[batch, n]`` ids; ``n >= 1``.

    Raises:
      ValueError: a SparseTensor whose width differs from ``num_labels``
        (``tf.errors.InvalidArgumentError`` at run time where the width is
        only known then, as for a scipy matrix's batches in ``fit``), a
        float ``[batch, n]`` with ``n > num_labels``, a bool ``[batch]``, or
        a float/bool ``y_true`` of rank above 2.

    Source: the label formats of the Extreme Classification Repository
    (sparse label matrices) and of :func:`xmc_tf.data.make_tf_dataset`.

    >>> target_label_ids(tf.constant([[0., 1., 1.], [1., 0., 0.]]), 3).numpy()
    array([[ 1,  2],
           [ 0, -1]])
    >>> sparse = tf.sparse.from_dense(tf.constant([[0., 0., 1.], [0., 0., 0.]]))
    >>> target_label_ids(sparse, 3).numpy()
    array([[ 2],
           [-1]])
    """
    def on_dense(y):
        if y.shape.rank != 2:
            raise ValueError("a multi-hot y_true must be [batch, num_labels],"
                             f" got shape {y.shape}")
        return _dense_to_ids(y)

    return _dispatch_targets(y_true, num_labels, on_ids=lambda ids: ids,
                             on_dense=on_dense)


def _ids_to_dense(ids, num_labels, dtype):
    """Multi-hot ``[batch, num_labels]`` from int64 ids ``[batch, n]``."""
    positions = tf.where(ids >= 0)  # [nnz, 2] (row, column of ids)
    label_ids = tf.gather_nd(ids, positions)
    coords = tf.stack([positions[:, 0], label_ids], axis=1)
    shape = tf.stack([tf.shape(ids, out_type=tf.int64)[0],
                      tf.cast(num_labels, tf.int64)])
    counts = tf.scatter_nd(coords, tf.ones_like(label_ids, dtype), shape)
    return tf.minimum(counts, tf.ones([], dtype))


def dense_targets(y_true, num_labels, dtype=tf.float32):
    """Multi-hot ``[batch, num_labels]`` targets for one batch.

    Which form ``y_true`` has follows the module's rules: integer ids,
    float ids (a float ``[batch, n]`` with ``n != num_labels``, or
    ``[batch]``: rounded), a float/bool multi-hot of width ``num_labels``
    (returned cast), or a ``tf.SparseTensor`` (through its ids).  A float
    id matrix exactly ``num_labels`` wide is read as multi-hot: pass ids as
    integers.

    Args:
      y_true: targets in any of the four forms (see :func:`target_label_ids`).
      num_labels: int or scalar tensor, the number of labels m.
      dtype: output dtype.

    Returns:
      ``[batch, num_labels]`` tensor of 0/1 (a repeated id counts once).

    Raises:
      ValueError: as :func:`target_label_ids`.
      tf.errors.InvalidArgumentError: an id is >= num_labels (from
        ``tf.scatter_nd``'s bounds check).

    Source: the one-vs-all targets of Schultheis & Babbar, Sec. 2, eq. 2.

    >>> dense_targets(tf.constant([[2, -1], [0, 1]]), 3).numpy()
    array([[0., 0., 1.],
           [1., 1., 0.]], dtype=float32)
    >>> dense_targets(tf.constant([[2., -1.], [0., 1.]]), 3).numpy()  # ids
    array([[0., 0., 1.],
           [1., 1., 0.]], dtype=float32)
    """
    return _dispatch_targets(
        y_true, num_labels,
        on_ids=lambda ids: _ids_to_dense(ids, num_labels, dtype),
        on_dense=lambda y: tf.cast(y, dtype))
