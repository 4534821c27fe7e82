"""Fused one-vs-all squared hinge from padded label ids (``ops/hinge/``).

``Xmc>SquaredHingeLoss`` computes, per row, the squared hinge of
:class:`xmc_tf.losses.SquaredHinge` over all ``m`` labels straight from the
``[batch, n]`` label ids, and ``Xmc>SquaredHingeLossGrad`` its gradient
w.r.t. the scores, each in one pass over the ``[batch, m]`` scores: no
multi-hot targets, no sign / margin / relu / square temporaries, and no
autodiff chain over them.  At 670k labels, batch 32, those element-wise
temporaries took about as long as the uniform-sparse layer's forward pass
(``docs/notes/scaling.md``).

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 2 (eq. 2) and Sec. 3.3 (the gradient is
exactly zero where the margin holds; the uniform-sparse backward kernels
skip those entries).
"""

from __future__ import annotations

import math

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader

__all__ = ["squared_hinge_loss", "squared_hinge_loss_supported"]


def _ops():
    """The op module, checked to hold the ops of ``ops/hinge/``."""
    lib = _loader.load()
    if not hasattr(lib, "xmc_squared_hinge_loss"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>SquaredHingeLoss op (built "
            "before ops/hinge/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


def squared_hinge_loss_supported() -> bool:
    """Whether the op library has ``Xmc>SquaredHingeLoss`` (and its grad).

    Returns:
      bool; False when the library is missing, stale or lacks the ops.
    """
    try:
        _ops()
    except OpLibraryError:
        return False
    return True


def squared_hinge_loss(scores, labels, margin=1.0, name=None):
    """Per-row one-vs-all squared hinge over all labels, from label ids.

    ``loss[i] = sum_j relu(margin - s_ij * scores[i, j])**2`` with
    ``s_ij = +1`` when ``j`` is among ``labels[i, :]`` and ``-1`` otherwise.
    A repeated id in a row counts once and ``-1`` is padding, as for the
    multi-hot targets of :func:`xmc_tf.losses.dense_targets`.

    Gradient (registered): w.r.t. ``scores`` only,
    ``grad[i, j] = -2 s_ij relu(margin - s_ij scores[i, j]) * upstream[i]``
    from ``Xmc>SquaredHingeLossGrad`` in one pass; exactly 0 where the margin
    holds (even for a non-finite ``upstream[i]``).

    Args:
      scores: float32 ``[batch, num_labels]``; float16 and bfloat16 on the
        CPU (computed in float32 from their float32 values; the gradient
        has the scores' dtype, rounded once; the loss stays float32).
      labels: int32 or int64 ``[batch, n]`` positive ids padded with -1;
        every entry in ``[-1, num_labels)``.
      margin: finite Python float (an op attribute: one kernel per value).
      name: optional op name.

    Returns:
      float32 ``[batch]`` (for every scores dtype): the loss of every row
      (accumulated in float64 over column blocks).

    Raises:
      tf.errors.InvalidArgumentError: ``scores`` or ``labels`` not a matrix,
        their batch sizes differ, or an id is out of range
        (``labels[1, 0] = 7 is out of range [-1, 5) (num_labels; -1 is
        padding)``).  In graph mode static shape mismatches raise
        ``ValueError`` when the op is created.
      ValueError: ``margin`` is not finite.
      TypeError: ``labels`` are not integers.
      xmc_tf.errors.OpLibraryError: the op library is missing or stale.

    >>> import numpy as np, xmc_tf
    >>> s = np.array([[2.0, -0.5, 0.0]], np.float32)
    >>> xmc_tf.ops.squared_hinge_loss(s, np.array([[0, -1]])).numpy()
    array([1.25], dtype=float32)
    """
    margin = float(margin)
    if not math.isfinite(margin):
        raise ValueError(f"margin must be finite, got {margin}")
    labels = tf.convert_to_tensor(labels)
    if not labels.dtype.is_integer:
        raise TypeError(f"labels must be integer ids, got {labels.dtype.name}"
                        " (round float ids first, as "
                        "xmc_tf.losses.SquaredHinge does)")
    if labels.dtype not in (tf.int32, tf.int64):
        labels = tf.cast(labels, tf.int64)
    return _ops().xmc_squared_hinge_loss(scores=scores, labels=labels,
                                         margin=margin, name=name)


@tf.RegisterGradient("Xmc>SquaredHingeLoss")
def _squared_hinge_loss_grad(op, grad):
    """Gradient w.r.t. scores in one fused pass; none w.r.t. the ids."""
    scores, labels = op.inputs
    grad_scores = _ops().xmc_squared_hinge_loss_grad(
        scores=scores, labels=labels, upstream=grad,
        margin=op.get_attr("margin"))
    return [grad_scores, None]
