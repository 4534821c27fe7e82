"""The head registry: config -> head, loaded model -> head, and a new head
added from outside the package works with build_model / predict."""

import os
import sys

import keras
import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data as xdata
from xmc_tf import heads
from xmc_tf.layers import MachHead, UniformSparseDense
from xmc_tf.models import build_model
from xmc_tf.predict import predict_top_k

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "configs"))
import uniform_sparse  # noqa: E402


def _config(head, loss="squared_hinge"):
    c = uniform_sparse.get_config()
    c.model.head = head
    c.loss = loss
    c.model.encoder_dims = (8,)
    c.model.intermediate_dim = 16
    c.model.connections_per_label = 4
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
    layer = heads.output_layer(model)
    assert isinstance(layer, layer_type) and layer.name == "output"
    assert heads.head_for_model(model) is type(head)
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
        layer_types = ()

        def build_layer(self, num_labels, input_dim, sparse_input=False):
            return keras.layers.Dense(num_labels, use_bias=False,
                                      name=heads.OUTPUT_LAYER)

        def make_loss(self, layer):
            return keras.losses.BinaryCrossentropy(from_logits=True)

    try:
        config = _config("test_bias_free", "bce")
        model = build_model(config, 20, 12, sparse_input=True)
        assert heads.output_layer(model).use_bias is False
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
