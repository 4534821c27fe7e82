"""SCENT: full-softmax training of a multi-class head on in-batch classes.

sparse input -> SparseEmbeddingBag encoder (ReLU) -> head "scent": a
label-major dense layer (``model.sampled_layer="dense"``) or a
uniform-sparse one, trained by SCENT (Algorithm 26 of
``scent-extreme-multiclass``, Sec. 6.3): per-instance duals updated in
closed form with step ``scent.alpha``, only the batch's classes scored.
Multi-class data only (one label per instance).  Paper-faithful setting:
``scent.correction="none"``, ``train.optimizer="scent_momentum"``.  How
the defaults were chosen (ManNextWord): docs/notes/defaults.md, docs/notes/scent.md.

    xmc-tf train --config=scent \\
        --config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz \\
        --workdir=DIR
"""

from xmc_tf_cli.schema import base


def get_config():
    c = base("scent")
    c.data.train = ""  # multi-class data to be named (Bibtex is multi-label)
    c.data.test = ""
    c.data.normalize = "l2"  # as measured (docs/notes/scent.md)
    c.data.validation_fraction = 0.05  # large multi-class training files
    c.model.encoder_dims = (512,)  # 512 beat 256 on ManNextWord's val P@1
    c.model.dropout = 0.5  # without it every head overfitted in 2-3 epochs
    c.model.intermediate_dim = 0  # encoder output -> head
    c.train.batch_size = 256
    c.train.epochs = 20  # early stopping on val P@3 decides
    c.train.learning_rate = 1e-2  # 2e-2 blew up the dual objective
    c.train.min_learning_rate = 1e-3
    c.train.early_stopping_patience = 2
    c.train.min_delta = None  # measured without it
    return c
