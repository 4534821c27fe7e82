"""Fused Adam updates (op family ``ops/optimizers/``).

:func:`resource_sparse_apply_adam` applies one Adam step to the rows of a
variable that a ``tf.IndexedSlices`` gradient touches, in one in-place pass
(op ``Xmc>ResourceSparseApplyAdam``).  It is the CPU fast path of
:class:`xmc_tf.optimizers.LazyAdam`, whose composite update (``ResourceGather``
of the weight and moment rows, nine element-wise ops, three scatters) moves
every touched element about a dozen times; on the sparse-input encoder's
``[num_features, 1024]`` table that composite was the largest part of a
training step.  :func:`resource_apply_adam` is the same update on every
element (op ``Xmc>ResourceApplyAdam``), LazyAdam's CPU path for dense
gradients: one pass where Keras' Adam runs nine element-wise ops and three
assignments, with the same results.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader

__all__ = ["fused_adam_supported", "resource_apply_adam",
           "resource_sparse_apply_adam"]

_DTYPES = (tf.float32, tf.float64)


def _optimizer_ops():
    lib = _loader.load()
    if not hasattr(lib, "xmc_resource_apply_adam"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>ResourceApplyAdam op "
            "(built before ops/optimizers/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


def fused_adam_supported(variable) -> bool:
    """Whether the fused ops (:func:`resource_apply_adam`,
    :func:`resource_sparse_apply_adam`) can update ``variable``.

    True for a plain resource ``tf.Variable`` (not a ``tf.distribute``
    variable) of dtype float32/float64 placed on a CPU, when the op library
    has the op; False otherwise (then use the composite update).

    Args:
      variable: a ``tf.Variable`` (e.g. from
        :func:`xmc_tf.optimizers.rows.tf_variable`).
    """
    if (not isinstance(variable, tf.Variable)
            or isinstance(variable, tf.distribute.DistributedValues)
            or not hasattr(variable, "handle")
            or variable.dtype not in _DTYPES):
        return False
    device = tf.DeviceSpec.from_string(variable.device or "")
    if (device.device_type or "CPU").upper() != "CPU":
        return False
    try:
        _optimizer_ops()
    except OpLibraryError:
        return False
    return True


def _scalars(dtype, alpha, beta1, beta2, epsilon):
    # 1 - beta formed before the cast (in double for Python numbers), as
    # keras.optimizers.Adam does.
    return dict(alpha=tf.cast(alpha, dtype),
                one_minus_beta1=tf.cast(1 - beta1, dtype),
                one_minus_beta2=tf.cast(1 - beta2, dtype),
                epsilon=tf.cast(epsilon, dtype))


def resource_apply_adam(variable, m, v, alpha, beta1, beta2, epsilon, grad,
                        name=None):
    """One in-place Adam step on every element of ``variable``.

    ``m += (grad - m) * (1 - beta1)``, ``v += (grad**2 - v) * (1 - beta2)``,
    ``variable -= (m * alpha) / (sqrt(v) + epsilon)``: Kingma & Ba, "Adam",
    ICLR 2015, Algorithm 1 with the bias corrections folded into ``alpha``
    (Sec. 2), the operations of ``keras.optimizers.Adam`` in its order, so
    the same float results in one multi-threaded pass.

    Args:
      variable, m, v: three distinct resource ``tf.Variable`` of one shape
        and dtype float32 or float64, on the CPU.
      alpha, beta1, beta2, epsilon: scalars, as
        :func:`resource_sparse_apply_adam`.
      grad: the gradient, ``variable``'s shape and dtype.
      name: optional op name.

    Returns:
      None when run eagerly; the ``tf.Operation`` inside a ``tf.function``.

    Raises:
      tf.errors.InvalidArgumentError: shapes or dtypes that do not match, or
        ``variable``, ``m``, ``v`` not distinct.
      tf.errors.FailedPreconditionError: an uninitialised variable.
      xmc_tf.errors.OpLibraryError: the op library lacks the op.

    Example:
      >>> w = tf.Variable([1.0, 2.0])
      >>> m, v = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
      >>> _ = resource_apply_adam(w, m, v, 0.1, 0.9, 0.999, 1e-7, [1.0, -1.0])
      >>> [round(float(x), 4) for x in w.numpy()]
      [0.6838, 2.3162]
    """
    dtype = variable.dtype
    return _optimizer_ops().xmc_resource_apply_adam(
        var=variable.handle, m=m.handle, v=v.handle,
        grad=tf.convert_to_tensor(grad, dtype),
        name=name, **_scalars(dtype, alpha, beta1, beta2, epsilon))


def resource_sparse_apply_adam(variable, m, v, alpha, beta1, beta2, epsilon,
                               grad, indices, name=None):
    """One in-place Adam step on the rows ``indices`` of ``variable``.

    For each ``r``, with ``i = indices[r]`` and ``g = grad[r]``::

        m[i] += (g - m[i]) * (1 - beta1)
        v[i] += (g * g - v[i]) * (1 - beta2)
        variable[i] -= (m[i] * alpha) / (sqrt(v[i]) + epsilon)

    Rows not in ``indices`` are not touched.  Kingma & Ba, "Adam", ICLR 2015,
    Algorithm 1 per row, with the bias corrections folded into ``alpha``
    (their Sec. 2): ``alpha = lr * sqrt(1 - beta2**t) / (1 - beta1**t)``.
    The same arithmetic as ``keras.optimizers.Adam`` on those rows.

    Args:
      variable, m, v: three distinct resource ``tf.Variable`` of one shape
        ``[N, ...]`` (rank >= 1) and dtype float32 or float64, on the CPU.
      alpha: scalar, the bias-corrected step size of this step.
      beta1, beta2, epsilon: scalars (Adam's hyperparameters); ``1 - beta``
        is formed before the cast to the variable's dtype (in double for
        Python floats, as Keras' Adam), so results equal Keras' to the bit on
        the same rows.
      grad: ``[k] + variable.shape[1:]`` rows of the gradient, the
        variable's dtype.
      indices: ``[k]`` int32/int64 row ids in ``[0, N)``, **unique** (sum
        the rows of repeated ids first, e.g. with
        :func:`xmc_tf.optimizers.rows.deduplicate`).
      name: optional op name.

    Returns:
      None when run eagerly; the ``tf.Operation`` inside a ``tf.function``
      or graph (it has no outputs).

    Raises:
      tf.errors.InvalidArgumentError: an id out of range or repeated, shapes
        or dtypes that do not match, or ``variable``, ``m``, ``v`` not
        distinct (checked before anything is written).
      tf.errors.FailedPreconditionError: an uninitialised variable.
      xmc_tf.errors.OpLibraryError: the op library lacks the op.

    Example:
      >>> import numpy as np
      >>> w = tf.Variable(np.ones((3, 2), np.float32))
      >>> m = tf.Variable(tf.zeros((3, 2)))
      >>> v = tf.Variable(tf.zeros((3, 2)))
      >>> _ = resource_sparse_apply_adam(w, m, v, 0.1, 0.9, 0.999, 1e-7,
      ...                                tf.ones((1, 2)), [1])
      >>> [round(float(x), 4) for x in w.numpy()[:, 0]]  # 1 - 0.1 * 0.1 / sqrt(.001)
      [1.0, 0.6838, 1.0]
    """
    dtype = variable.dtype
    return _optimizer_ops().xmc_resource_sparse_apply_adam(
        var=variable.handle, m=m.handle, v=v.handle,
        grad=tf.convert_to_tensor(grad, dtype), indices=indices, name=name,
        **_scalars(dtype, alpha, beta1, beta2, epsilon))
