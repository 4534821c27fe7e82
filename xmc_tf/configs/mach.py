"""MACH: R meta-classifiers over B hashed buckets (Medini et al. 2019).

sparse TF-IDF input -> SparseEmbeddingBag encoder (ReLU) -> intermediate
Dense (ReLU; its width d sets the head size) -> MachHead(num_labels, B, R):
one ``[R, d, B]`` kernel, ``4 R B (d + 1)`` bytes instead of ``4 m (d + 1)``
for a dense output layer.  Loss ``"bce"`` (the paper's multi-label variant)
or ``"softmax"`` (multi-class data); top-k labels from the exact decoder op
``Xmc>MachTopK``.  B^R >> m keeps labels distinguishable; MACH saves memory
over a dense head only when R B << m (docs/notes/mach.md).  B=32, R=16 are round
defaults: set them for your m::

    xmc-tf train --config=mach \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --config.model.num_buckets=4096 --config.model.num_repetitions=16 \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import base


def get_config():
    c = base("mach")
    c.model.dropout = 0.5  # chosen on Delicious' val P@3 (docs/notes/defaults.md)
    # d, the learning rate and min_delta: chosen on the mean validation P@3
    # of Bibtex, Delicious and WordNetHypernyms (docs/notes/defaults.md)
    c.model.intermediate_dim = 256
    c.train.learning_rate = 5e-3
    c.train.min_delta = 1e-3
    return c
