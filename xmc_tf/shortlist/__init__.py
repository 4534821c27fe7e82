"""Shortlist and re-rank: the label tree (its fit, its topology and the
NumPy references of its beam search), and the P@k engine that reads the
fusion weights of :class:`xmc_tf.layers.FusedScores` on shortlists.

The Keras side is in :mod:`xmc_tf.layers`:
:class:`~xmc_tf.layers.LabelTreeScores` (shortlists by beam search, scores
given labels), :class:`~xmc_tf.layers.NearestNeighbourScores`,
:func:`~xmc_tf.layers.label_centroids` and
:class:`~xmc_tf.layers.FusedScores`, which unites their shortlists and
re-ranks them.

Example:
    >>> import numpy as np, scipy.sparse as sp
    >>> from xmc_tf.shortlist import fit_label_tree
    >>> x = sp.csr_matrix(np.eye(8, dtype=np.float32))
    >>> tree = fit_label_tree(x, sp.csr_matrix(np.eye(8)), leaf_size=2)
    >>> ids, scores = tree.beam_search(x[:2], beam=2, k=3)
    >>> ids[:, 0].tolist()  # each instance's own label first
    [0, 1]
"""

from xmc_tf.shortlist.fusion import (NETWORK, FusionChoice, FusionPart,
                                     ShortlistScores, choose_fusion_weights,
                                     exact_blocks, shortlist_blocks)
from xmc_tf.shortlist.tree import (LabelTree, TreeTopology,
                                   fit_centroid_tree, fit_label_tree,
                                   label_tree_bytes)

__all__ = ["LabelTree", "TreeTopology", "fit_label_tree",
           "fit_centroid_tree", "label_tree_bytes",
           "NETWORK", "FusionChoice", "FusionPart", "ShortlistScores",
           "choose_fusion_weights", "exact_blocks", "shortlist_blocks"]
