"""The head registry: config -> head, loaded model -> head, and a new head
added from outside the package works with build_model / predict."""


import keras
import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import decoding
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.layers import MachHead, UniformSparseDense
from xmc_tf.job.build import build_model
from xmc_tf.job.scoring import predict_top_k


def _config(head, loss="squared_hinge"):
    c = xconfig.base(head if head in xconfig.HEAD_DEFAULTS else
                     xconfig.DEFAULT_HEAD)
    c.model.head = head
    c.loss = loss
    c.model.encoder_dims = (8,)
    c.model.intermediate_dim = 16
    c.model.connections_per_label = 4
    if head == "mach":
        c.model.num_buckets = 4
        c.model.num_repetitions = 2
    return c


def test_registry_names_and_errors():
    assert {"dense", "uniform_sparse", "mach"} <= set(heads.names())
    with pytest.raises(ValueError, match="expected one of"):
        heads.get_head(_config("nope"))
    with pytest.raises(ValueError, match="does not fit head 'mach'"):
        heads.get_head(_config("mach", "squared_hinge"))
    with pytest.raises(ValueError, match="does not fit head 'dense'"):
        heads.get_head(_config("dense", "hinge"))


@pytest.mark.parametrize("name,loss,layer_type", [
    ("dense", "bce", keras.layers.Dense),
    ("uniform_sparse", "squared_hinge", UniformSparseDense),
    ("mach", "bce", MachHead)])
def test_built_model_is_recognised(name, loss, layer_type):
    head = heads.get_head(_config(name, loss))
    model = build_model(head.config, 20, 12, sparse_input=True, head=head)
    layer = decoding.scoring_layer(model)
    assert isinstance(layer, layer_type) and layer.name == "output"
    assert decoding.scores_every_label(model) == (name != "mach")
    assert callable(head.make_loss(layer))
    # SET only for the uniform-sparse head; held-out P@k for MACH.
    cbs = [type(c).__name__ for c in head.callbacks(layer, val_data=object())]
    assert ("SetRewiring" in cbs) == (name == "uniform_sparse")
    assert ("TopKEvaluation" in cbs) == (name == "mach")


def test_a_new_head_touches_one_module():
    @heads.register
    class BiasFreeHead(heads.Head):
        """Scores labels with a bias-free Dense layer (test head)."""
        name = "test_bias_free"
        losses = ("bce",)

        def build_layer(self, num_labels, input_dim, sparse_input=False):
            return keras.layers.Dense(num_labels, use_bias=False,
                                      name=heads.OUTPUT_LAYER)

        def make_loss(self, layer):
            return keras.losses.BinaryCrossentropy(from_logits=True)

    try:
        config = _config("test_bias_free", "bce")
        model = build_model(config, 20, 12, sparse_input=True)
        assert decoding.scoring_layer(model).use_bias is False
        x = sp.random(30, 20, density=0.3, format="csr", random_state=0,
                      dtype=np.float32)
        y = sp.csr_matrix((np.ones(30, np.float32),
                           (np.arange(30), np.arange(30) % 12)), shape=(30, 12))
        data = xdata.XCDataset(x, y)
        ids = np.concatenate([i for i, _ in predict_top_k(model, data, 3, 16)])
        scores = np.asarray(model(xdata.make_tf_dataset(data, 64)
                                  .get_single_element()[0]))
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :3]
        np.testing.assert_array_equal(ids, expected)
    finally:
        heads.base._REGISTRY.pop("test_bias_free", None)
        xconfig.HEAD_DEFAULTS.pop("test_bias_free", None)


@pytest.mark.parametrize("name,loss", [("uniform_sparse", "squared_hinge"),
                                       ("dense", "bce"), ("dense", "softmax")])
def test_prior_output_bias(name, loss):
    # labels 0..3 in 6, 3, 1 and 0 of 12 instances (label 3 never seen)
    rng = np.random.default_rng(0)
    counts = [6, 3, 1, 0]
    y = np.zeros((12, 4), np.float32)
    for j, n in enumerate(counts):
        y[rng.choice(12, n, replace=False), j] = 1
    train = xdata.XCDataset(sp.csr_matrix(rng.random((12, 5)).astype(np.float32)),
                            sp.csr_matrix(y))
    head = heads.get_head(_config(name, loss))
    head.prepare(train)
    model = build_model(head.config, 5, 4, sparse_input=True, head=head)
    layer = decoding.scoring_layer(model)
    head.initialize(layer)
    p = (np.array(counts) + 0.5) / 13.0
    expected = {"squared_hinge": 2 * p - 1, "bce": np.log(p / (1 - p)),
                "softmax": np.log(p)}[loss]
    np.testing.assert_allclose(layer.bias.numpy(), expected, rtol=1e-5)

    zeros = _config(name, loss)
    zeros.model.output_bias_init = "zeros"
    head = heads.get_head(zeros)
    head.prepare(train)
    model = build_model(zeros, 5, 4, sparse_input=True, head=head)
    head.initialize(decoding.scoring_layer(model))
    np.testing.assert_array_equal(decoding.scoring_layer(model).bias.numpy(), 0.0)


def test_prior_output_bias_errors():
    bad = _config("uniform_sparse")
    bad.model.output_bias_init = "ones"
    with pytest.raises(ValueError, match="output_bias_init='ones'.*prior"):
        heads.get_head(bad)
    head = heads.get_head(_config("uniform_sparse"))
    head.prepare(xdata.XCDataset(sp.csr_matrix(np.ones((2, 5), np.float32)),
                                 sp.csr_matrix(np.eye(2, 3, dtype=np.float32))))
    model = build_model(head.config, 5, 4, sparse_input=True, head=head)
    with pytest.raises(ValueError, match="3 labels, the output layer 4"):
        head.initialize(decoding.scoring_layer(model))


def test_a_new_head_is_one_module_and_its_registration(monkeypatch):
    """A head defined outside xmc_tf (here, in this test module) brings
    its own config field through ``@heads.register``: the schema builds its
    configs, the field has the declared default, the head reads it, and
    the job's config check and model builder take it -- no other edit."""
    from xmc_tf.job.heads.dense import DenseHead
    from xmc_tf.losses import SquaredHinge
    from xmc_tf.job.checks import check_config

    monkeypatch.setattr(heads.base, "_REGISTRY", dict(heads.base._REGISTRY))
    monkeypatch.setattr(xconfig, "HEAD_DEFAULTS", dict(xconfig.HEAD_DEFAULTS))

    @heads.register
    class WideMarginHead(DenseHead):
        name = "test_wide_margin"
        config_defaults = {"model": {"hinge_margin": 2.0}}

        def make_loss(self, layer):
            return SquaredHinge(margin=self.config.model.hinge_margin)

    c = xconfig.base("test_wide_margin")
    assert c.model.head == "test_wide_margin" and c.model.hinge_margin == 2.0
    c.model.update(hinge_margin=3.0, encoder_dims=(8,), intermediate_dim=16,
                   wide_connections=0)
    head = check_config(c)
    assert isinstance(head, WideMarginHead)
    assert head.make_loss(None).margin == 3.0
    model = build_model(c, 20, 6, sparse_input=True, head=head)
    assert decoding.scoring_layer(model).units == 6
    with pytest.raises(AttributeError):
        c.model.hinge_margn = 1.0  # the schema is locked: typos are refused
    xconfig.HEAD_DEFAULTS["test_clash"] = {"model": {"x": 1}}
    with pytest.raises(ValueError, match="differ"):
        @heads.register
        class Clash(DenseHead):  # another schema entry under that name
            name = "test_clash"
            config_defaults = {"model": {"y": 2}}
