"""Row access to variables that receive row-sparse (``tf.IndexedSlices``) updates.

Why a helper is needed: on the TensorFlow runtime, a resource variable that
has once been touched by a sparse op (``ResourceGather``, ``ResourceScatter*``)
switches to *copy-on-read* mode, after which **every dense read**
(``ReadVariableOp``, e.g. ``tf.convert_to_tensor(var)``, ``var + 0``,
``tf.sparse.sparse_dense_matmul(x, var)``) copies the whole buffer.  Measured
on the development machine (2 CPU cores): a ``[200000, 512]`` float32
variable read by a ``tf.function`` takes 1 ms before and ~400 ms after one
``scatter_add``.  Layers and optimizers that update rows lazily must
therefore read the rows they need with ``ResourceGather`` and never read the
whole table; :func:`gather_rows` does that for a ``keras.Variable``, whose
``.value`` may be an autocast copy under a mixed-precision policy.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["deduplicate", "gather_rows", "tf_variable"]


def tf_variable(variable):
    """The ``tf.Variable`` behind a ``keras.Variable`` (or ``variable`` itself).

    Args:
      variable: a ``keras.Variable`` of the TensorFlow backend or a
        ``tf.Variable`` (also a ``tf.distribute`` variable).

    Returns:
      The underlying ``tf.Variable``; reading it does not autocast.

    Raises:
      TypeError: ``variable`` is not backed by a ``tf.Variable`` (for
        example, an uninitialised symbolic variable).

    >>> import keras
    >>> v = keras.Variable(tf.zeros([3, 2]))
    >>> isinstance(tf_variable(v), tf.Variable)
    True
    """
    if isinstance(variable, tf.Variable):
        return variable
    # keras 3 TF backend: keras.Variable keeps the tf.Variable in `_value`;
    # `.value` returns it too unless an autocast scope is active.
    inner = getattr(variable, "_value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"expected a keras.Variable or tf.Variable backed by a "
                    f"tf.Variable, got {type(variable).__name__}")


def gather_rows(variable, indices, dtype=None):
    """Rows ``variable[indices]`` read with ``ResourceGather`` (no full read).

    The gradient of the result with respect to ``variable`` is a
    ``tf.IndexedSlices`` over ``indices`` (TensorFlow's gather gradient).

    Args:
      variable: ``keras.Variable`` or ``tf.Variable`` of shape ``[N, ...]``.
      indices: int32/int64 tensor ``[k]``; values in ``[0, N)``.
      dtype: optional dtype to cast the rows to (e.g. the layer's compute
        dtype under mixed precision); ``None`` keeps the variable's dtype.

    Returns:
      Tensor ``[k, ...]`` of the variable's dtype (or ``dtype``).

    Raises:
      tf.errors.InvalidArgumentError: an index outside ``[0, N)`` (CPU
        kernel; validate indices before calling on GPU, where the gather
        kernel writes zeros instead).
      TypeError: as :func:`tf_variable`.

    >>> import keras
    >>> v = keras.Variable([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> gather_rows(v, tf.constant([2, 0])).numpy().tolist()
    [[5.0, 6.0], [1.0, 2.0]]
    """
    rows = tf.gather(tf_variable(variable), indices)
    if dtype is not None and rows.dtype != tf.as_dtype(dtype):
        rows = tf.cast(rows, dtype)
    return rows


def deduplicate(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sums the rows of an ``IndexedSlices`` that share an index.

    The dense tensor the slices stand for is unchanged; afterwards every
    index occurs once (in order of first occurrence).  When the indices are
    already unique the values are passed through without a segment sum.

    Args:
      gradient: ``tf.IndexedSlices`` with ``values [k, ...]`` and int32/int64
        ``indices [k]``.

    Returns:
      ``tf.IndexedSlices`` with ``values [u, ...]``, unique ``indices [u]``
      (same dtype as the input's) and the input's ``dense_shape``.

    >>> g = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]),
    ...                      tf.constant([3, 1, 3]), tf.constant([5, 1]))
    >>> d = deduplicate(g)
    >>> d.indices.numpy().tolist(), d.values.numpy().tolist()
    ([3, 1], [[5.0], [2.0]])
    """
    unique, positions = tf.unique(gradient.indices, out_idx=tf.int32)
    num_unique = tf.size(unique)
    values = tf.cond(
        tf.equal(num_unique, tf.size(gradient.indices)),
        lambda: gradient.values,
        lambda: tf.math.unsorted_segment_sum(gradient.values, positions,
                                             num_unique))
    return tf.IndexedSlices(values, unique, gradient.dense_shape)
