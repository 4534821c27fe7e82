"""Generic uniform-sparse configuration (the paper's architecture).

sparse TF-IDF input -> Dense encoder (ReLU) -> intermediate Dense (ReLU,
Sec. 3.4) -> UniformSparseDense(num_labels, connections_per_label), squared
hinge loss (Sec. 3.3), Adam 1e-3 halved on validation-P@3 plateaus down to
1e-4, then early stopping (Sec. 4.1), SET every 1000 steps moving 10 % of
each label's connections (Sec. 4.1).

    xmc-tf train --config=configs/uniform_sparse.py \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.loss = "squared_hinge"  # or "bce"
    c.data = ml_collections.ConfigDict(dict(
        train="bibtex:train",  # xmc_tf.data.load_dataset spec or XC file
        test="bibtex:test",
        normalize="tfidf",  # sparse features: "tfidf", "l2" or "none"
        validation_fraction=0.1,  # of train, for LR schedule / early stop
    ))
    c.model = ml_collections.ConfigDict(dict(
        head="uniform_sparse",  # or "dense"
        encoder_dims=(1024,),
        dropout=0.5,
        intermediate_dim=4096,
        connections_per_label=32,
    ))
    c.train = ml_collections.ConfigDict(dict(
        batch_size=64,
        epochs=60,
        learning_rate=1e-3,
        min_learning_rate=1e-4,
        lr_patience=1,
        early_stopping_patience=3,
        tensorboard=False,
        verbose=2,  # Keras: 1 = progress bar, 2 = one line per epoch
    ))
    c.set = ml_collections.ConfigDict(dict(
        enabled=True, every_n_steps=1000, fraction=0.1))
    c.eval = ml_collections.ConfigDict(dict(
        ks=(1, 3, 5), batch_size=1024, propensity_a=0.55, propensity_b=1.5))
    return c
