"""Keras layers of xmc_tf (one module per layer family)."""

from xmc_tf.layers.label_dense import LabelDense
from xmc_tf.layers.mach import MachDecoder, MachHead
from xmc_tf.layers.normalization import FeatureNormalization
from xmc_tf.layers.sparse_input import SparseDropout, SparseEmbeddingBag
from xmc_tf.layers.uniform_sparse import (UniformSparseDense,
                                          label_centroids,
                                          label_feature_connections,
                                          random_connections)

__all__ = ["MachDecoder", "MachHead", "UniformSparseDense",
           "label_feature_connections", "label_centroids",
           "random_connections"]
__all__ += ["LabelDense"]
__all__ += ["SparseDropout", "SparseEmbeddingBag"]
__all__ += ["FeatureNormalization"]
from xmc_tf.layers.label_tree import LabelTreeScores  # noqa: E402
__all__ += ["LabelTreeScores"]
from xmc_tf.layers.neighbours import NearestNeighbourScores  # noqa: E402
__all__ += ["NearestNeighbourScores"]
from xmc_tf.layers.fused import (FusedScores, NormalizedScorer,  # noqa: E402
                                 candidate_scorer, merge_shortlists)
__all__ += ["FusedScores", "NormalizedScorer", "candidate_scorer",
            "merge_shortlists"]
from xmc_tf.layers.ensemble import ScoreAverage  # noqa: E402
__all__ += ["ScoreAverage"]
