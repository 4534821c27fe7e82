"""LSH negatives: a sampled head whose negatives come from hash tables.

As configs/astra.py with ``sampler.kind = "lsh"``: ``L`` hash tables of
``K``-bit SimHash (or DWTA) meta-hashes over the head's label vectors;
per instance the labels in the buckets hit by its embedding
(``query="embedding"``) or by its positive labels' vectors (``"label"``)
are the negatives, drawn in O(1) per sample and weighted by their inclusion
probability; tables are re-hashed every ``rehash_every_steps`` steps with a
decaying frequency (LSH paper, Sec. 2, Algorithm 1; SimHash K=9, L=50 as
its Text8 setting).

    xmc-tf train --config=configs/lsh.py \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import astra  # noqa: E402


def get_config():
    c = astra.get_config()
    c.sampler.kind = "lsh"
    c.sampler.num_negatives = 256
    c.sampler.hash = "simhash"  # or "dwta"
    c.sampler.K = 9
    c.sampler.L = 50
    c.sampler.query = "embedding"  # or "label"
    return c
