"""ASTRA: a sampled head trained on stale ANN hard negatives + uniform ones.

sparse TF-IDF input -> SparseEmbeddingBag encoder (ReLU) -> intermediate
Dense (ReLU) -> head "sampled" (``model.sampled_layer``: uniform-sparse or
label-major dense), scored during training only on each instance's
positives, ``sampler.num_hard`` hard negatives from a faiss index over the
head's label vectors (rebuilt every ``sampler.refresh_every_epochs``) and
``sampler.num_uniform`` uniform ones (ASTRA, Mehta et al., Algorithm 1,
Eq. 2); evaluation scores all labels.  Needs faiss (``pip install
xmc_tf[ann]``).  Sampler fields: :data:`xmc_tf.config.HEAD_DEFAULTS`;
how they were chosen: docs/defaults.md.

    xmc-tf train --config=astra \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf.config import base


def get_config():
    return base("sampled")  # the head's defaults (docs/defaults.md, ASTRA)
