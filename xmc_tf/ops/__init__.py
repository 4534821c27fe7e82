"""Thin Python wrappers over the compiled xmc_tf ops, with their gradients."""

from xmc_tf.ops._loader import OpLibraryError, load
from xmc_tf.ops.uniform_sparse import uniform_sparse_matmul

__all__ = ["OpLibraryError", "load", "uniform_sparse_matmul"]
