"""Keras layers of xmc_tf (one module per layer family)."""

from xmc_tf.layers.label_dense import LabelDense
from xmc_tf.layers.mach import MachDecoder, MachHead
from xmc_tf.layers.sparse_input import SparseEmbeddingBag
from xmc_tf.layers.uniform_sparse import UniformSparseDense, random_connections

__all__ = ["MachDecoder", "MachHead", "UniformSparseDense", "random_connections"]
__all__ += ["LabelDense"]
__all__ += ["SparseEmbeddingBag"]
