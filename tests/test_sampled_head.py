"""SampledTrainer against the full-output model it trains.

With a sampler that returns every negative with weight 1, the sampled
squared hinge / BCE equal the full losses, so the trainer's loss and
gradients must equal those of the full model with SquaredHinge /
BinaryCrossentropy (independent reference: the full op and Keras' own
gradient).  With a real sampler only the scored label rows receive a
gradient, and LazyAdam leaves every other row (and its slots) untouched.
"""


import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.models import SampledTrainer
from xmc_tf.losses import BinaryCrossentropy, SquaredHinge
from xmc_tf.losses.sampled import (SampledBinaryCrossentropy,
                                   SampledSquaredHinge)
from xmc_tf.job.build import build_model
from op_requirements import needs_ops
from xmc_tf.samplers import (Candidates, NegativeSampler,
                             UniformNegativeSampler, mask_accidental_hits)
from xmc_tf.samplers.base import shared_candidates


M, D = 24, 30


class AllNegatives(NegativeSampler):
    """Every label as a candidate, positives masked, weight 1 (test); per
    row or shared by the batch."""

    supports_shared = True

    def sample_shared(self, queries, positives, step):
        m = self.num_labels
        return shared_candidates(tf.range(m), positives, tf.zeros([m]),
                                 tf.ones([m]))

    def sample(self, queries, positives, step):
        b = tf.shape(positives)[0]
        ids = tf.tile(tf.range(self.num_labels, dtype=tf.int32)[None], [b, 1])
        mask = mask_accidental_hits(ids, positives)
        return Candidates(ids, mask, tf.zeros(tf.shape(ids)),
                          tf.cast(mask, tf.float32))


def _config(layer, loss="squared_hinge", kind="uniform"):
    c = xconfig.base("sampled")
    c.model.sampled_layer = layer
    c.loss = loss
    c.model.encoder_dims = (16,)
    c.model.dropout = 0.0
    c.model.intermediate_dim = 12
    c.model.connections_per_label = 5
    c.sampler.update(dict(
        kind=kind, num_negatives=6, num_hard=3, num_uniform=4, index="flat",
        nprobe=4, refresh_start_epoch=0, refresh_every_epochs=1,
        refresh_every_steps=0, hash="simhash", K=4, L=8, query="embedding",
        shared=False, max_fraction=None))  # per row, every candidate asked
    c.set.enabled = False
    return c


def _data(seed=0, n=64):
    x = sp.random(n, D, density=0.3, format="csr", random_state=seed,
                  dtype=np.float32)
    y = sp.random(n, M, density=0.12, format="csr", random_state=seed + 1)
    y.data[:] = 1.0
    return xdata.XCDataset(x, y.astype(np.float32))


def _model(layer, loss="squared_hinge", kind="uniform"):
    config = _config(layer, loss, kind)
    head = heads.get_head(config)
    keras.utils.set_random_seed(0)
    model = build_model(config, D, M, sparse_input=True, head=head)
    return config, head, model


needs_op = needs_ops("xmc_uniform_sparse_sampled_matmul")


@needs_op
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("layer", ["uniform_sparse", "dense"])
@pytest.mark.parametrize("loss,full_loss,sampled_loss", [
    ("squared_hinge", SquaredHinge, SampledSquaredHinge),
    ("bce", BinaryCrossentropy, SampledBinaryCrossentropy)])
def test_all_negatives_equal_the_full_loss_and_gradient(layer, loss, full_loss,
                                                        sampled_loss, shared):
    _, _, model = _model(layer, loss)
    trainer = SampledTrainer(model, AllNegatives(M, M), sampled_loss(),
                             shared=shared)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)
    x, y = xdata.make_tf_dataset(_data(), 64).get_single_element()
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        sampled, fraction, _ = trainer._loss(x, y, training=False)
    got = tape.gradient(sampled, variables)
    with tf.GradientTape() as tape:
        full = full_loss()(y, model(x, training=False))
    want = tape.gradient(full, variables)
    np.testing.assert_allclose(float(sampled), float(full), rtol=1e-5)
    np.testing.assert_allclose(fraction.numpy(), 1.0, rtol=1e-6)  # all M
    for v, g, w in zip(variables, got, want):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                                   tf.convert_to_tensor(w).numpy(),
                                   rtol=1e-4, atol=1e-6, err_msg=v.path)


@needs_op
@pytest.mark.parametrize("layer", ["uniform_sparse", "dense"])
def test_only_scored_rows_move_with_lazy_adam(layer):
    from xmc_tf.optimizers import LazyAdam
    _, _, model = _model(layer)
    sampler = UniformNegativeSampler(M, 2, seed=1)
    trainer = SampledTrainer(model, sampler, SampledSquaredHinge())
    trainer.compile(optimizer=LazyAdam(0.01), jit_compile=False)
    data = _data(n=4)
    x, y = xdata.make_tf_dataset(data, 4).get_single_element()
    kernel = decoding.scoring_layer(model).kernel
    before = kernel.numpy().copy()
    cands = sampler.sample(tf.zeros([4, 12]), y,
                           tf.constant(0, tf.int64)).ids.numpy()
    trainer.train_on_batch(x, y)
    after = kernel.numpy()
    rows = set(np.asarray(y).ravel().tolist()) | set(cands.ravel().tolist())
    rows.discard(-1)
    changed = set(np.flatnonzero(np.any(before != after, axis=1)).tolist())
    assert changed and changed <= rows


@needs_op
@pytest.mark.parametrize("layer,kind", [("uniform_sparse", "uniform"),
                                        ("dense", "mixture"),
                                        ("dense", "in_batch")])
def test_fit_improves_and_evaluates_exactly(layer, kind):
    if kind == "mixture":
        pytest.importorskip("faiss")
    config, head, model = _model(layer, "squared_hinge", kind)
    out = decoding.scoring_layer(model)
    trainer = head.training_model(model, out)
    trainer.compile(optimizer=keras.optimizers.Adam(0.02), jit_compile=False)
    data = _data(n=128)
    ds = xdata.make_tf_dataset(data, 32, shuffle=True, seed=0)
    cbs = head.callbacks(out, val_data=data)
    history = trainer.fit(ds, epochs=6, verbose=0, callbacks=cbs, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0]
    assert "val_precision_at_1" in history.history
    # Evaluation goes through the full-scoring layer: top-k of model(x).
    assert decoding.scoring_layer(trainer) is decoding.scoring_layer(model)
    from xmc_tf.job.scoring import predict_top_k
    ids = np.concatenate([i for i, _ in predict_top_k(trainer, data, 3, 50)])
    scores = model(xdata.make_tf_dataset(data, 1000).get_single_element()[0])
    expected = np.argsort(-np.asarray(scores), axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(ids, expected)


def test_config_errors():
    with pytest.raises(ValueError, match="sampled_layer"):
        c = _config("nope")
        heads.get_head(c)
    with pytest.raises(ValueError, match="sampler.kind"):
        heads.get_head(_config("dense", kind="nope"))
    with pytest.raises(ValueError, match="does not fit head 'sampled'"):
        heads.get_head(_config("dense", loss="hinge"))


def test_sampler_sizes_cap_relative_to_num_labels():
    from xmc_tf.job.samplers import sampler_sizes
    sc = _config("dense").sampler
    sc.num_negatives, sc.num_hard, sc.num_uniform = 256, 32, 256
    # No cap: the sizes as given.
    assert sampler_sizes(sc, 159) == {"num_negatives": 256, "num_hard": 32,
                                      "num_uniform": 256}
    sc.max_fraction = 0.25
    # cap = floor(0.25 * 159) = 39; 32 : 256 shrunk in proportion.
    assert sampler_sizes(sc, 159) == {"num_negatives": 39, "num_hard": 4,
                                      "num_uniform": 35}
    # Large label spaces keep the absolute sizes.
    assert sampler_sizes(sc, 50_000) == {"num_negatives": 256,
                                         "num_hard": 32, "num_uniform": 256}
    # Tiny ones keep at least one of each.
    assert sampler_sizes(sc, 4) == {"num_negatives": 1, "num_hard": 1,
                                    "num_uniform": 1}
    sc.max_fraction = 1.5
    with pytest.raises(ValueError, match="max_fraction"):
        sampler_sizes(sc, 159)


def test_make_sampler_applies_cap_and_lsh_options():
    from xmc_tf.job.samplers import make_sampler
    from xmc_tf.samplers import lsh_auto_K
    sc = _config("dense", kind="uniform").sampler
    sc.num_negatives = 256
    sc.max_fraction = 0.25
    assert make_sampler(sc, 159, seed=0).num_candidates == 39
    sc.kind, sc.K = "lsh", 0
    sc.weighting, sc.min_probability = "none", 0.01
    s = make_sampler(sc, 159, seed=0)
    assert (s.num_candidates, s.K, s.weighting, s.min_probability) == (
        39, lsh_auto_K(159, 39, sc.L), "none", 0.01)
    # K = floor(log2(L m / k)), clipped to [1, 16].
    assert lsh_auto_K(159, 39, 50) == 7
    assert lsh_auto_K(50_000, 256, 50) == 13
    assert lsh_auto_K(10**7, 1, 50) == 16
    assert lsh_auto_K(2, 256, 1) == 1


@needs_op
@pytest.mark.parametrize("shared", [False, True])
def test_lsh_label_query_gradients_are_finite(shared):
    # LSH-label queries retrieve each positive itself (cosine 1, masked as
    # an accidental hit); a gradient through the inclusion probabilities'
    # arccos would be infinite there and turn every weight NaN.
    config = _config("dense", "softmax", "lsh")
    config.sampler.query = "label"
    config.sampler.shared = shared
    config.sampler.num_hard = 4
    config.sampler.num_uniform = 4
    head = heads.get_head(config)
    keras.utils.set_random_seed(0)
    model = build_model(config, D, M, sparse_input=True, head=head)
    trainer = head.training_model(model, decoding.scoring_layer(model))
    trainer.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)
    trainer.sampler.refresh()
    x, y = xdata.make_tf_dataset(_data(), 64).get_single_element()
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss, _, _ = trainer._loss(x, y, training=True)
    grads = tape.gradient(loss, variables)
    assert np.isfinite(float(loss))
    for v, g in zip(variables, grads):
        assert np.all(np.isfinite(tf.convert_to_tensor(g).numpy())), v.path


@pytest.mark.parametrize("kind,needs_faiss", [("ann", True), ("mixture", True),
                                              ("uniform", False), ("lsh", False)])
def test_missing_faiss_is_a_config_error_before_training(monkeypatch, kind,
                                                         needs_faiss):
    """Without faiss, an ANN sampler is refused at the config check (the
    CLI's one-line error, exit 2), not an epoch in at the first refresh."""
    import importlib.util

    from xmc_tf.errors import ConfigError
    from xmc_tf.job.checks import check_config
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "faiss"
                        else real(name, *a))
    c = _config("uniform_sparse", kind=kind)
    if needs_faiss:
        with pytest.raises(ConfigError, match="needs faiss.*xmc_tf\\[ann\\]"):
            check_config(c)
    else:
        check_config(c)


@pytest.mark.parametrize("kind", ["mixture", "lsh", "ann"])
def test_auto_loss_and_candidates_follow_the_data_regime(kind):
    """``config.loss = "auto"`` and ``sampler.shared = "auto"`` (the
    astra/lsh configs' defaults) become the sampled softmax on one shared
    candidate set for multi-class training labels, the squared hinge on
    per-row candidates for multi-label ones; set values are kept."""
    from xmc_tf.losses.sampled import SampledSoftmax
    from xmc_tf.samplers.mixture import MixtureSampler
    config = _config("dense", "auto", kind)
    config.sampler.shared = "auto"
    rows = np.arange(40)
    multi_class = xdata.XCDataset(
        _data(n=40).features,
        sp.csr_matrix((np.ones(40, np.float32), (rows, rows % M)),
                      shape=(40, M)))
    for data, loss_cls, shared in ((multi_class, SampledSoftmax, True),
                                   (_data(), SampledSquaredHinge, False)):
        head = heads.get_head(config)
        head.prepare(data)
        model = build_model(config, D, M, sparse_input=True, head=head)
        trainer = head.training_model(model, decoding.scoring_layer(model))
        want_shared = shared and kind != "ann"  # "ann" has no shared mode
        assert isinstance(trainer.sampled_loss, loss_cls)
        assert head.choices()["shared"] is want_shared
        assert trainer.shared is want_shared
        if kind == "lsh":  # a shared LSH sampler is a mixture with a pool
            assert isinstance(trainer.sampler, MixtureSampler) is want_shared
    config.loss, config.sampler.shared = "bce", "False"  # as the CLI gives it
    head = heads.get_head(config)
    head.prepare(multi_class)
    assert head.choices() == {"loss": "bce", "shared": False,
                              "multi_class": True}
    config.sampler.shared = "sometimes"
    with pytest.raises(ValueError, match="sampler.shared"):
        heads.get_head(config)
