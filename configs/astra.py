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

Sizes: ``k_h = 32`` (ASTRA: O(log L); its Table 11 uses 15-50) and ``k_r
= 256`` for large label spaces, capped by ``sampler.max_fraction = 0.25``
(:func:`xmc_tf.heads.sampled.sampler_sizes`: at most a quarter of the
labels per row, the two parts shrunk in proportion): Bibtex (m = 159)
k_h = 4, k_r = 35; Delicious (983) 27 + 218; >= 1,152 labels: 32 + 256.
Chosen on Bibtex's validation split (10 % of the xcsplit training file,
not the test file), val P@1 / P@3 after 6 epochs, seed 0: uncapped (32 +
256 candidates per row of 159 labels, 1.83 m labels scored per row) 58.4
/ 34.0, capped (0.26 m per row) 57.8 / 33.3 -- the same curve (55.7 vs
55.1 after 5 epochs; uncapped reached 64.1 / 37.4 after 8) at a seventh
of the scored labels.  Delicious was not swept: there the cap changes 288
candidates to 245.

``sampler.shared = "auto"`` (the default; or True / False): on
multi-class data (at most one label per instance) one candidate set per
batch, scored by every row in one matrix product -- a pool of the rows'
hard negatives and the batch's positives scored exactly plus ``k_r`` uniform draws (unbiased, see
:mod:`xmc_tf.samplers.mixture`); per row on multi-label data (validation:
Bibtex equal, Delicious val P@1 67.6 vs 70.0 per row).  Multi-class
data: ManNextWord (50k classes, softmax, 1 epoch) P@1 9.05 at 14 s/epoch
vs 7.14 at 38 s per row and 9.09 at 119 s for the full softmax
(docs/sampled.md).

Other samplers (``sampler.kind``): ``"uniform"`` (``num_negatives``
uniform negatives), ``"in_batch"``, ``"ann"`` (hard only), ``"lsh"`` (see
configs/lsh.py).  Losses: ``"auto"`` (the default: ``"softmax"`` on
multi-class data, ``"squared_hinge"`` on multi-label data), or one of
them, or ``"bce"``.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uniform_sparse  # noqa: E402


def get_config():
    c = uniform_sparse.get_config()
    c.model.head = "sampled"
    # measured with lr 2e-3 and a ReLU intermediate layer, uniform_sparse.py's
    # values until its prior output bias came with 1e-3 and leaky ReLU (that
    # bias is for label-wise heads only)
    c.train.learning_rate = 2e-3
    c.model.intermediate_activation = "relu"
    # measured without the wide path and train.min_delta of label-wise
    # heads (docs/real_data.md)
    c.model.wide_connections = 0
    del c.train["min_delta"]
    c.model.sampled_layer = "uniform_sparse"  # or "dense"
    # "auto": read from the training labels (xmc_tf.heads.sampled.
    # regime_choices, logged): the sampled softmax on multi-class data
    # (ASTRA's weighted squared hinge: P@1 0.03 after an epoch on 50k
    # classes), the squared hinge on multi-label data.
    c.loss = "auto"
    # type_safe=False: `shared` takes True, False or "auto".
    c.sampler = ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
        kind="mixture",  # "uniform", "in_batch", "ann", "mixture", "lsh"
        num_negatives=256,  # k of "uniform" / "in_batch" / "ann" / "lsh"
        num_hard=32,  # k_h (ASTRA: O(log L))
        num_uniform=256,  # k_r
        index="auto",  # exact up to 16k labels, IVFFlat-IP above
        nprobe=16,
        refresh_start_epoch=1,  # tau_s: first epoch with hard negatives
        refresh_every_epochs=1,  # tau_r
        refresh_every_steps=0,  # 0: epoch schedule only
        max_fraction=0.25,  # cap on candidates per row, fraction of m
        # one candidate set per batch ("uniform", "mixture", "lsh"); "auto":
        # shared on multi-class data, per row on multi-label data
        shared="auto",
        pool_positives=True,  # shared "mixture": batch positives in the pool
        hash="simhash", K=9, L=50, query="embedding",  # "lsh" only
        weighting="inverse_probability",  # "lsh": or "none"
        min_probability=0.0,  # "lsh": floor of p_j (0: 1 / m)
        rehash_every_steps=50, rehash_decay=0.95,
    ))
    return c
