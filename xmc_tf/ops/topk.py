"""Top-k of score rows by partial selection (``ops/topk/``, ``Xmc>TopK``).

Evaluation and prediction take the top ``k`` (5, say) of ``[batch, m]``
score blocks with ``m`` in the hundreds of thousands to millions.
``tf.math.top_k``'s CPU kernel costs about 1 ns per score there (71 ms for a
``[100, 670k]`` block on the 2-core development machine, 18x the time of
one read of the block; ``docs/notes/scaling.md``).  ``Xmc>TopK`` makes one pass
over each row that compares groups of 64 scores with the worst of the ``k``
best seen so far (vectorised) and hands the few that pass to
``std::nth_element``: memory-bound, ``O(m)`` per row even on adversarial
rows.  :func:`top_k` uses it and falls back to ``tf.math.top_k`` where it
does not apply.

Order: that of ``tf.math.top_k(sorted=True)`` on rows without NaN -- larger
value first, equal values (``-0.0 == +0.0``) by the lower column id, also
across the ``k``-th position -- so the two give identical results.  NaN
ranks below every number (``-inf`` included), NaNs among themselves by the
lower id; ``tf.math.top_k`` has no consistent NaN order (its result on a row
with NaN changes with ``k``).
"""

from __future__ import annotations

import collections

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

__all__ = ["TopK", "top_k", "top_k_supported"]

# The dtypes of Xmc>TopK (CPU): float16 and bfloat16 are ranked by their
# float32 values (exact), so in the same order.
_DTYPES = (tf.float32, tf.float16, tf.bfloat16)

#: ``(values, indices)``, as ``tf.math.top_k`` returns them.
TopK = collections.namedtuple("TopK", ["values", "indices"])


def top_k_supported() -> bool:
    """Whether :func:`top_k` runs ``Xmc>TopK`` here.

    Returns:
      bool: True when the op library has ``Xmc>TopK`` and TensorFlow sees no
      GPU (the op has a CPU kernel only; on a GPU ``tf.math.top_k`` keeps
      the scores on the device).  False when the library is missing or
      stale, and inside :func:`xmc_tf.ops.stock.stock_ops`.
    """
    if stock.stock_ops_only():
        return False
    try:
        lib = _loader.load()
    except OpLibraryError:
        return False
    if not hasattr(lib, "xmc_top_k"):
        return False
    return not tf.config.list_logical_devices("GPU")


def _in_xla_context() -> bool:
    """Whether the current graph is compiled by XLA (``jit_compile=True``),
    which cannot compile custom ops."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(
            ops.get_default_graph()))
    except (ImportError, AttributeError):  # private API moved: be safe
        return not tf.executing_eagerly()


def top_k(scores, k: int, name=None) -> TopK:
    """The ``k`` largest scores along the last axis and their ids, best first.

    A drop-in for ``tf.math.top_k(scores, k, sorted=True)`` on float32,
    float16 and bfloat16 scores: identical values and indices on rows
    without NaN (ties by the lower id; see the module docstring for NaN).
    Runs ``Xmc>TopK`` when :func:`top_k_supported`, else ``tf.math.top_k``
    (other dtypes, a tensor
    ``k``, no op library, a visible GPU, or inside an XLA-compiled function,
    e.g. a Keras model compiled with ``jit_compile=True``).

    Args:
      scores: float ``[..., m]`` tensor (rank >= 1).
      k: Python int in ``[0, m]``.
      name: op name scope.

    Returns:
      :data:`TopK` ``(values [..., k] scores.dtype, indices [..., k] int32)``.

    Raises:
      ValueError: ``scores`` of rank 0, or a known ``m < k`` (at trace time).
      tf.errors.InvalidArgumentError: ``k`` out of ``[0, m]`` at run time.

    Example:
      >>> import numpy as np
      >>> v, i = top_k(np.array([[0.25, 0.5, 0.25, 0.125]], np.float32), 3)
      >>> i.numpy().tolist(), v.numpy().tolist()
      ([[1, 0, 2]], [[0.5, 0.25, 0.25]])
    """
    with tf.name_scope(name or "xmc_top_k"):
        scores = tf.convert_to_tensor(scores)
        if scores.shape.rank == 0:
            raise ValueError("scores must have rank >= 1, got a scalar")
        if (not isinstance(k, int) or isinstance(k, bool)
                or scores.dtype not in _DTYPES or not top_k_supported()
                or _in_xla_context()):
            top = tf.math.top_k(scores, k=k, sorted=True)
            return TopK(top.values, top.indices)
        m = scores.shape[-1]
        if k < 0 or (m is not None and k > m):
            raise ValueError(f"k={k} must be in [0, m={m}]")
        if scores.shape.rank == 2:
            values, indices = _loader.load().xmc_top_k(scores, k=k)
            return TopK(values, indices)
        # Any other rank: rows are the leading axes flattened.
        lead = tf.shape(scores)[:-1]
        values, indices = _loader.load().xmc_top_k(
            tf.reshape(scores, [-1, tf.shape(scores)[-1]]), k=k)
        shape = tf.concat([lead, [k]], axis=0)
        values, indices = tf.reshape(values, shape), tf.reshape(indices, shape)
        static = scores.shape[:-1].concatenate([k])
        values.set_shape(static)
        indices.set_shape(static)
        return TopK(values, indices)
