"""Linear one-vs-all baseline (DiSMEC-like): no hidden layer.

sparse TF-IDF input -> output head directly: the squared hinge over all
labels of a linear model (Babbar & Schoelkopf, "DiSMEC", WSDM 2017, without
its weight pruning), the baseline a practitioner compares a deep model
against.  With ``model.head="dense"`` the head is a
:class:`~xmc_tf.layers.SparseEmbeddingBag` ``[D, m]`` (row-sparse updates
of the batch's features; ``4 D m`` bytes, so mind D x m); with
``"uniform_sparse"`` every label keeps ``connections_per_label`` of the D
features (random, rewired by SET).

    xmc-tf train --config=configs/linear.py \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uniform_sparse  # noqa: E402


def get_config():
    c = uniform_sparse.get_config()
    c.model.head = "dense"  # or "uniform_sparse"
    c.model.encoder_dims = ()
    c.model.intermediate_dim = 0
    c.model.dropout = 0.0
    c.set.enabled = False
    c.train.learning_rate = 1e-2
    return c
