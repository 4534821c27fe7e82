"""Shortlist and re-rank: the label tree, the shortlists of the fused
scorers and the P@k engine that reads fusion weights on them."""

from xmc_tf.shortlist.tree import (LabelTree, TreeTopology, fit_label_tree,
                                   label_tree_bytes)

__all__ = ["LabelTree", "TreeTopology", "fit_label_tree", "label_tree_bytes"]
