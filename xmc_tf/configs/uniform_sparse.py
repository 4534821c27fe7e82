"""The paper's uniform-sparse model: the schema's defaults, unchanged.

sparse TF-IDF input -> SparseEmbeddingBag encoder (1024, ReLU) ->
intermediate Dense (1024, leaky ReLU) -> UniformSparseDense(num_labels,
connections_per_label) plus the wide path, squared hinge loss, output bias
at the loss's prior, batches of 256 (fewer above 131,072 labels:
``train.batch_scores_mib``), LazyAdam 2e-3 halved on val-P@3 plateaus,
early stopping, SET
(Schultheis & Babbar); after training, a label tree of L2 linear rankers
(Parabel-style, :mod:`xmc_tf.shortlist.tree`) fit on the same features, its
log-scores added with a weight read on the validation split
(``config.tree``).  Fields and defaults: :mod:`xmc_tf.config`; how they
were chosen: docs/notes/defaults.md, docs/notes/real_data.md::

    xmc-tf train --config=uniform_sparse \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import base


def get_config():
    return base("uniform_sparse")
