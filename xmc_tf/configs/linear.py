"""Linear one-vs-all baseline (DiSMEC-like): no hidden layer.

sparse TF-IDF input -> output head directly: the squared hinge over all
labels of a linear model (Babbar & Schoelkopf, "DiSMEC", WSDM 2017, without
its weight pruning), the baseline a practitioner compares a deep model
against.  With ``model.head="dense"`` the head is a
:class:`~xmc_tf.layers.SparseEmbeddingBag` ``[D, m]`` (row-sparse updates
of the batch's features; ``4 D m`` bytes, so mind D x m); with
``"uniform_sparse"`` every label keeps ``connections_per_label`` of the D
features (random, rewired by SET).

    xmc-tf train --config=linear \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import base


def get_config():
    c = base("dense")  # or "uniform_sparse"
    c.model.encoder_dims = ()  # no hidden layer: a linear model
    c.model.intermediate_dim = 0
    c.model.dropout = 0.0  # no encoder to drop out of
    c.model.wide_connections = 0  # the model is linear: no wide path to add
    c.train.learning_rate = 1e-2  # one layer: a larger step
    return c
