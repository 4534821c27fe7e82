"""Stock-TensorFlow tracing: TensorFlow's own ops wherever an ``Xmc>`` op
has an equivalent.

Some of the custom ops are faster versions of something TensorFlow already
does: ``Xmc>TopK`` (``tf.math.top_k``) and ``Xmc>EmbeddingBag``
(``tf.sparse.sparse_dense_matmul``).  Inside :func:`stock_ops`, the code
that picks between the two (:func:`xmc_tf.ops.topk.top_k_supported`,
:func:`xmc_tf.ops.embedding_bag.embedding_bag_supported`) picks
TensorFlow's op.  The forward ops that have no single TensorFlow
equivalent are written in TensorFlow's ops there:
``Xmc>UniformSparseMatmul`` and ``Xmc>UniformSparseMatmulSparseInput``
(:func:`xmc_tf.ops.uniform_sparse.uniform_sparse_matmul_stock`, a blocked
gather and reduction) and MACH's decoder ``Xmc>MachTopK``
(:func:`xmc_tf.ops.mach.mach_top_k_stock`, blocked brute force with the
op's scores and tie order).  So a model's inference graph traced there uses
no ``Xmc>`` op (training-only ops -- gradients, sampled products, LSH,
optimizers -- keep theirs).  :func:`xmc_tf.saving.export_saved_model`
traces the serving signatures this way: a SavedModel without ``Xmc>`` ops
loads in TensorFlow (e.g. TF Serving) without xmc_tf.

The switch is per thread (tracing runs in the calling thread) and nests.

Example:
  >>> from xmc_tf.ops import topk
  >>> with stock_ops():
  ...     topk.top_k_supported()
  False
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["stock_ops", "stock_ops_only", "stock_formulations",
           "custom_op_types"]

_STATE = threading.local()

#: Op type prefix of this library's ops (``REGISTER_OP("Xmc>...")``).
CUSTOM_PREFIX = "Xmc>"


@contextlib.contextmanager
def stock_ops(formulations: bool = True):
    """Within this context (this thread), ops with a TensorFlow equivalent
    trace to TensorFlow's op instead of the ``Xmc>`` one.

    Args:
      formulations: also trace the ops that have no single TensorFlow
        equivalent (the uniform-sparse products, MACH's decoder) as their
        TensorFlow formulations, which serve several times slower on the
        CPU (benchmarks/serving.py).  False keeps their ``Xmc>`` ops and
        swaps only ``Xmc>TopK`` and ``Xmc>EmbeddingBag``.
    """
    previous = (getattr(_STATE, "on", False),
                getattr(_STATE, "formulations", False))
    _STATE.on, _STATE.formulations = True, bool(formulations)
    try:
        yield
    finally:
        _STATE.on, _STATE.formulations = previous


def stock_ops_only() -> bool:
    """Whether this thread is inside :func:`stock_ops`."""
    return bool(getattr(_STATE, "on", False))


def stock_formulations() -> bool:
    """Whether this thread is inside ``stock_ops(formulations=True)``."""
    return stock_ops_only() and bool(getattr(_STATE, "formulations", False))


def custom_op_types(graph_defs) -> list[str]:
    """The ``Xmc>`` op types in graphs, their function libraries included.

    Args:
      graph_defs: iterable of ``tf.compat.v1.GraphDef`` (e.g.
        ``concrete_function.graph.as_graph_def()``).

    Returns:
      Sorted distinct op type names starting with ``Xmc>``.
    """
    found = set()
    for graph_def in graph_defs:
        nodes = list(graph_def.node)
        for function in graph_def.library.function:
            nodes.extend(function.node_def)
        found.update(n.op for n in nodes if n.op.startswith(CUSTOM_PREFIX))
    return sorted(found)
