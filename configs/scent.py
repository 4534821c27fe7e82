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

Defaults chosen on ManNextWord (``benchmarks/scent.py --dev``: 50k training
instances, 2 epochs, 10k held-out training instances; docs/scent.md):

* ``scent.correction="log_q"`` (P@1 13.3 vs 10.3 for the paper's plain
  in-batch estimator at its best setting): in-batch classes are drawn with
  the label frequencies, which the paper's estimator does not correct.
* ``scent.alpha=1000``: the effective weight of the new batch estimate in
  the dual step is ``a / (1 + a)`` with ``a = alpha exp(nu)``; with
  ``exp(nu)`` around 1e-2..1e-4 once the model fits, alpha ~ 1 leaves the
  duals stale between an instance's visits (one per epoch) and the loss
  unstable (LibAUC's default alpha is e^10 = 22026).
* ``train.optimizer="lazy_adam"``, 1e-2: the paper's momentum step
  (``"scent_momentum"``) trains the classifier of fixed features; with an
  embedding learned from scratch it barely moves off the initial point in a
  few epochs (P@1 5.7 at its best learning rate, 5.0).  2e-2 made the dual
  objective blow up in the second epoch.
* ``encoder_dims=(512,)``, ``dropout=0.5``, ``epochs=20`` (early stopping
  on validation P@3, LR halved on plateaus), chosen with ``xmc-tf train`` on
  the full ManNextWord training file's 5 % validation split (the test file
  unused): without dropout every head overfitted after 2-3 epochs (LSH
  shared, dim 256: validation P@1 20.2 at best); with dropout 0.5 after 8
  epochs dim 256
  reached 21.7, dim 512 22.5, still rising; dim 512 for 20 epochs peaked at
  24.0 and stopped after 19.  Test P@1 afterwards: 21.34 (P@3/5
  10.18/6.97) against Omikuji 20.48 on the same files
  (``benchmarks/results/mannextword_dropout.json``, docs/scent.md).
Paper-faithful setting: ``correction="none"``, ``optimizer="scent_momentum"``.
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
        encoder_dims=(512,),
        dropout=0.5,  # after the encoder; see the docstring
        intermediate_dim=0,  # none: encoder output -> head
        connections_per_label=64,  # uniform_sparse only
    ))
    c.scent = ml_collections.ConfigDict(dict(
        variant="scent",  # or "sox"
        alpha=1000.0,  # dual step alpha (SOX: gamma)
        negatives="multiset",  # paper; "unique": each other class once
        correction="log_q",  # "none": the paper's in-batch estimator
        own_term=True,  # own class in the inner mean (False: paper; NaN on
        # ManNextWord's 400k instances from epoch 2, see xmc_tf.losses.scent)
        beta=0.1,  # momentum weight of Algorithm 26 (scent_momentum)
    ))
    c.train = ml_collections.ConfigDict(dict(
        batch_size=256,
        epochs=20,  # early stopping on validation P@3 decides
        optimizer="lazy_adam",  # or "scent_momentum" (Algorithm 26)
        learning_rate=1e-2,
        min_learning_rate=1e-3,
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
