"""ASTRA: a sampled head trained on stale ANN hard negatives + uniform ones.

sparse TF-IDF input -> SparseEmbeddingBag encoder (ReLU) -> intermediate
Dense (ReLU) -> head "sampled" (``model.sampled_layer``: uniform-sparse or
label-major dense), scored during training only on each instance's
positives, ``sampler.num_hard`` hard negatives from a faiss index over the
head's label vectors (rebuilt every ``sampler.refresh_every_epochs``) and
``sampler.num_uniform`` uniform ones (ASTRA, Mehta et al., Algorithm 1,
Eq. 2); evaluation scores all labels.  Needs faiss (``pip install
xmc_tf[ann]``).  Sampler fields: :data:`xmc_tf.config.HEAD_DEFAULTS`;
how they were chosen: docs/notes/defaults.md.

The network and schedule follow the training labels' regime
(:func:`xmc_tf.config.by_regime`, resolved and logged when the data is
read; ``metrics.json`` lists them under ``regime``): on multi-class data
(every instance at most one label) configs/scent.py's measured network
and schedule (:data:`xmc_tf.config.MULTI_CLASS_DEFAULTS`: encoder 512, no
intermediate layer, dropout 0.5, a label-major dense head, l2 features,
5 % validation, batch 256, lr 1e-2 down to 1e-3, patience 2), with which
the shared ASTRA head tied SCENT on ManNextWord (docs/notes/sampled.md); on
multi-label data the sampled head's defaults (encoder 1024 ->
intermediate 4096 -> uniform-sparse head, batch 64, lr 2e-3), measured on
Bibtex / Delicious.  A value set in a config file or on the command line
(``--config.model.encoder_dims="(1024,)"``) is kept.  ``loss`` and
``sampler.shared`` are read from the labels too (``"auto"``:
:func:`xmc_tf.job.heads.sampled.regime_choices`).

    xmc-tf train --config=astra \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import REGIME_FIELDS, base, by_regime


def get_config():
    # the head's defaults (docs/notes/defaults.md, ASTRA); network and schedule
    # by the data's regime (multi-class: SCENT's, docs/notes/sampled.md)
    return by_regime(base("sampled"), REGIME_FIELDS)
