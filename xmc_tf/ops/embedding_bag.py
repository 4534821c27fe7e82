"""Weighted bags of table rows: the CPU product of the sparse-input encoder.

Op family ``ops/embedding_bag/``: ``Xmc>EmbeddingBag`` computes
``out[i] = sum_{e: rows[e] = i} weights[e] * table[positions[e]]`` and
``Xmc>EmbeddingBagGradTable`` its gradient w.r.t. ``table``, both
multi-threaded over output rows.  :class:`xmc_tf.layers.SparseEmbeddingBag`
uses them on the CPU in place of ``tf.sparse.sparse_dense_matmul``, whose
CPU kernel (forward and adjoint) was about a fifth of a training step of the
default model on a 53k-feature, 19.6k-label set.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

__all__ = ["embedding_bag", "embedding_bag_supported"]

# float16 and bfloat16 are summed in float32 (one rounding per output).
_DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16)


def _ops():
    lib = _loader.load()
    if not hasattr(lib, "xmc_embedding_bag"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>EmbeddingBag op (built "
            "before ops/embedding_bag/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


def embedding_bag_supported(dtype, device: str = "") -> bool:
    """Whether :func:`embedding_bag` serves ``dtype`` on ``device``.

    Args:
      dtype: the table's dtype (float32, float64, float16 and bfloat16 are
        supported; float16 and bfloat16 are summed in float32).
      device: device string of the table's variable ("" = unknown, taken as
        the CPU); GPU placements return False (no GPU kernel: use
        ``tf.sparse.sparse_dense_matmul`` there).

    Returns:
      bool; False also when the op library lacks the ops, and inside
      :func:`xmc_tf.ops.stock.stock_ops`.
    """
    if stock.stock_ops_only():
        return False
    if tf.as_dtype(dtype) not in _DTYPES:
        return False
    spec = tf.DeviceSpec.from_string(device or "")
    if (spec.device_type or "CPU").upper() != "CPU":
        return False
    try:
        _ops()
    except OpLibraryError:
        return False
    return True


def embedding_bag(rows, positions, weights, table, batch_size, name=None):
    """``out[i] = sum_{e: rows[e] = i} weights[e] * table[positions[e]]``.

    The product of a ``[batch_size, u]`` sparse matrix given as COO entries
    ``(rows[e], positions[e], weights[e])`` with the dense ``table [u, d]``,
    i.e. ``tf.sparse.sparse_dense_matmul`` (equal up to float rounding of the
    summation order; repeated entries add up, a row without entries is 0).

    Gradients: w.r.t. ``table`` ``[u, d]`` by ``Xmc>EmbeddingBagGradTable``
    (``grad[p] = sum_{e: positions[e] = p} weights[e] * backward[rows[e]]``);
    w.r.t. ``weights`` ``[nnz]`` as ``sum(backward[rows] * table[positions],
    -1)`` (TensorFlow ops; pruned from a graph that does not use it); none
    for the integer inputs.

    Args:
      rows: ``[nnz]`` int64 output rows, in ``[0, batch_size)``.
      positions: ``[nnz]`` int64 table rows, in ``[0, u)``.
      weights: ``[nnz]`` float32/float64/float16/bfloat16 entry values
        (float16 and bfloat16 products are summed in float32 and rounded
        once per output value).
      table: ``[u, d]``, the dtype of ``weights``.
      batch_size: scalar int64, rows of the output.
      name: optional op name.

    Returns:
      ``[batch_size, d]`` tensor, the dtype of ``table``.

    Raises:
      tf.errors.InvalidArgumentError: an entry out of range, or inconsistent
        shapes (at run time).
      xmc_tf.errors.OpLibraryError: the op library lacks the op.

    Example:
      >>> out = embedding_bag([0, 0, 2], [1, 0, 1], [0.5, 2.0, 1.0],
      ...                     [[1.0, 0.0], [0.0, 1.0]], 3)
      >>> out.numpy().tolist()
      [[2.0, 0.5], [0.0, 0.0], [0.0, 1.0]]
    """
    table = tf.convert_to_tensor(table)
    return _ops().xmc_embedding_bag(
        rows=tf.cast(rows, tf.int64), positions=tf.cast(positions, tf.int64),
        weights=tf.convert_to_tensor(weights, table.dtype), table=table,
        batch_size=tf.cast(batch_size, tf.int64), name=name)


@tf.RegisterGradient("Xmc>EmbeddingBag")
def _embedding_bag_grad(op, grad):
    """Gradients w.r.t. weights and table (see :func:`embedding_bag`)."""
    rows, positions, weights, table, _ = op.inputs
    grad_table = _ops().xmc_embedding_bag_grad_table(
        backward=grad, rows=rows, positions=positions, weights=weights,
        num_table_rows=tf.shape(table, out_type=tf.int64)[0])
    grad_weights = tf.reduce_sum(
        tf.gather(grad, rows) * tf.gather(table, positions), axis=-1)
    return None, None, grad_weights, grad_table, None
