"""LSH negatives: a sampled head whose negatives come from hash tables.

As the ``astra`` config with ``sampler.kind = "lsh"``: ``L`` hash tables of
``K``-bit SimHash (or DWTA) meta-hashes over the head's label vectors; per
instance the labels in the buckets hit by its embedding
(``sampler.query="embedding"``) or by its positive labels' vectors
(``"label"``) are the negatives (LSH paper, Sec. 2, Algorithm 1).  How the
defaults were chosen: docs/notes/defaults.md.  Network and schedule follow the
training labels' regime as in the ``astra`` config (multi-class data:
configs/scent.py's; multi-label: the sampled head's; an explicit value
is kept).

    xmc-tf train --config=lsh \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import get_config as packaged


def get_config():
    c = packaged("astra")
    c.loss = "softmax"  # the paper's loss; the weighted hinge diverged
    c.sampler.kind = "lsh"
    return c
