"""SCENT: full-softmax training of a multi-class head on in-batch classes.

sparse input -> SparseEmbeddingBag encoder (ReLU) -> head "scent": a
label-major dense layer (``model.sampled_layer="dense"``) or a uniform-sparse
one (``"uniform_sparse"``), trained by SCENT (Algorithm 26 of
``scent-extreme-multiclass``, Sec. 6.3): per-instance duals ``nu_i`` updated
in closed form with step ``scent.alpha`` (``scent.variant="sox"``: SOX's
gamma), only the batch's classes scored, and the paper's row-sparse momentum
step (``train.optimizer="scent_momentum"``, weight ``scent.beta`` on the new
gradient).  Multi-class data only (one label per instance).

    xmc-tf train --config=configs/scent.py \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR

Defaults chosen on a 100k-instance subsample of ManNextWord (see
``docs/scent.md`` / ``benchmarks/scent.py``).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.loss = "scent"
    c.data = ml_collections.ConfigDict(dict(
        train="",  # xmc_tf.data.load_dataset spec or XC file (multi-class)
        test="",
        normalize="l2",  # sparse features: "tfidf", "l2" or "none"
        validation_fraction=0.05,  # of train, for LR schedule / early stop
    ))
    c.model = ml_collections.ConfigDict(dict(
        head="scent",
        sampled_layer="dense",  # or "uniform_sparse"
        encoder="sparse_embedding",
        encoder_dims=(256,),
        dropout=0.0,
        intermediate_dim=0,  # none: encoder output -> head
        connections_per_label=64,  # uniform_sparse only
    ))
    c.scent = ml_collections.ConfigDict(dict(
        variant="scent",  # or "sox"
        alpha=1.0,  # dual step alpha (SOX: gamma)
        negatives="multiset",  # paper; "unique": each other class once
        correction="none",  # paper; "log_q": unbiased for Zipfian labels
        beta=0.1,  # momentum weight of Algorithm 26 (scent_momentum)
    ))
    c.train = ml_collections.ConfigDict(dict(
        batch_size=256,
        epochs=5,
        optimizer="scent_momentum",  # or "lazy_adam"
        learning_rate=0.5,
        min_learning_rate=0.01,
        lr_patience=1,
        early_stopping_patience=2,
        tensorboard=False,
        verbose=2,
    ))
    c.set = ml_collections.ConfigDict(dict(
        enabled=False, every_n_steps=1000, fraction=0.1))
    c.eval = ml_collections.ConfigDict(dict(
        ks=(1, 3, 5), batch_size=1024, propensity_a=0.55, propensity_b=1.5))
    return c
