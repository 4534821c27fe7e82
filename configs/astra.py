"""ASTRA: a sampled head trained on stale ANN hard negatives + uniform ones.

sparse TF-IDF input -> SparseEmbeddingBag encoder (ReLU) -> intermediate
Dense (ReLU) -> head "sampled": a uniform-sparse layer
(``model.sampled_layer="uniform_sparse"``) or a label-major dense one
(``"dense"``), scored during training only on each instance's positives,
``sampler.num_hard`` hard negatives from a faiss inner-product index over
the head's label vectors (rebuilt every ``sampler.refresh_every_epochs``
epochs from epoch ``sampler.refresh_start_epoch``: ASTRA's tau_r and tau_s)
and ``sampler.num_uniform`` fresh uniform negatives weighted by
``(m - |P| - k_h) / k_r`` (ASTRA, Mehta et al., Algorithm 1, Eq. 2).
LazyAdam updates only the scored label rows.  Evaluation is exact (all
labels scored).  Needs faiss (``pip install xmc_tf[ann]``).

    xmc-tf train --config=configs/astra.py \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR

Other samplers (``sampler.kind``): ``"uniform"`` (``num_negatives``
uniform negatives), ``"in_batch"``, ``"ann"`` (hard only), ``"lsh"`` (see
configs/lsh.py).  Losses: ``"squared_hinge"``, ``"bce"``, ``"softmax"``
(sampled softmax with log-Q correction; multi-class data).
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uniform_sparse  # noqa: E402


def get_config():
    c = uniform_sparse.get_config()
    c.model.head = "sampled"
    c.model.sampled_layer = "uniform_sparse"  # or "dense"
    c.sampler = ml_collections.ConfigDict(dict(
        kind="mixture",  # "uniform", "in_batch", "ann", "mixture", "lsh"
        num_negatives=256,  # k of "uniform" / "in_batch" / "ann" / "lsh"
        num_hard=32,  # k_h (ASTRA: O(log L))
        num_uniform=256,  # k_r
        index="auto",  # exact up to 16k labels, IVFFlat-IP above
        nprobe=16,
        refresh_start_epoch=1,  # tau_s: first epoch with hard negatives
        refresh_every_epochs=1,  # tau_r
        refresh_every_steps=0,  # 0: epoch schedule only
        hash="simhash", K=9, L=50, query="embedding",  # "lsh" only
        rehash_every_steps=50, rehash_decay=0.95,
    ))
    return c
