"""A new sampler is one module + registration; head layers are LabelScorers.

The toy sampler below lives in this test module only: it is registered under
a new ``config.sampler.kind`` and trained through the ordinary sampled-head
path (``heads.get_head(config)`` ... ``fit``) with no edit to any xmc_tf
module.  That its candidates were the ones scored is checked against the
data independently: with a row-sparse optimizer only scored label rows
move, and the logged ``sampled_fraction`` is the mean of ``(|P_i| + k) / m``
computed here from the labels.
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
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.layers.scorer import LabelScorer, check_label_scorer, label_layout
from xmc_tf.job.build import build_model
from xmc_tf.optimizers import LazyAdam
from xmc_tf.samplers import Candidates, NegativeSampler, mask_accidental_hits
from xmc_tf.job.samplers import (kinds, register_sampler, sampler_kind,
                                 shared_kinds)
from op_requirements import needs_ops


M, D, K = 30, 40, 5
#: The toy sampler's candidates: labels 0..K-1 for every row.
FIXED = np.arange(K)
#: Training labels are drawn from here only: disjoint from FIXED and from
#: the never-scored labels K..M-8.
POSITIVE_LABELS = np.arange(M - 8, M)


# --- the new sampler: this module only -------------------------------------

class FixedSampler(NegativeSampler):
    """The same ``k`` labels ``0..k-1`` as every row's candidates (weight 1,
    accidental hits masked)."""

    def sample(self, queries, positives, step):
        b = tf.shape(positives)[0]
        ids = tf.tile(tf.range(self.num_candidates, dtype=tf.int32)[None],
                      [b, 1])
        mask = mask_accidental_hits(ids, positives)
        return Candidates(ids, mask, tf.zeros(tf.shape(ids)),
                          tf.cast(mask, tf.float32))


class CountEpochs(keras.callbacks.Callback):
    """The toy kind's own refresh callback (records the epochs it saw)."""

    def __init__(self, sampler):
        super().__init__()
        self.sampler, self.epochs = sampler, []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)


def _count_epochs(sampler, sampler_config, set_callback=None):
    return [CountEpochs(sampler)]


@register_sampler("fixed_test", refresh_callbacks=_count_epochs)
def _make_fixed(sampler_config, num_labels, seed, shared):
    return FixedSampler(num_labels, int(sampler_config.num_negatives),
                        seed=seed)


@register_sampler("needs_missing_module_test",
                  requires={"xmc_tf_no_such_module": "pip install nothing"})
def _make_needs_missing(sampler_config, num_labels, seed, shared):
    return FixedSampler(num_labels, 1, seed=seed)


# ---------------------------------------------------------------------------

def _config(kind="fixed_test"):
    c = xconfig.base("sampled")
    c.model.sampled_layer = "dense"
    c.loss = "squared_hinge"
    c.model.encoder_dims = (16,)
    c.model.dropout = 0.0
    c.model.intermediate_dim = 12
    c.sampler.update(dict(kind=kind, num_negatives=K, shared=False))
    c.set.enabled = False
    return c


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(n, D, density=0.3, format="csr", random_state=seed,
                  dtype=np.float32)
    rows, cols = [], []
    for i in range(n):
        labels = rng.choice(POSITIVE_LABELS, size=rng.integers(1, 4),
                            replace=False)
        rows += [i] * len(labels)
        cols += labels.tolist()
    y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                      shape=(n, M))
    return xdata.XCDataset(x, y)


@needs_ops("xmc_uniform_sparse_sampled_matmul")
def test_registered_sampler_trains_through_the_head_path():
    assert "fixed_test" in kinds() and "fixed_test" not in shared_kinds()
    config = _config()
    head = heads.get_head(config)  # accepts the new kind
    data = _data()
    head.prepare(data)
    keras.utils.set_random_seed(0)
    model = build_model(config, D, M, sparse_input=True, head=head)
    layer = decoding.scoring_layer(model)
    trainer = head.training_model(model, layer)
    assert isinstance(trainer.sampler, FixedSampler)
    head.compile(trainer, layer, LazyAdam(0.05))
    callbacks = head.callbacks(layer, val_data=None)
    counters = [cb for cb in callbacks if isinstance(cb, CountEpochs)]
    assert len(counters) == 1 and counters[0].sampler is trainer.sampler

    before = np.array(layer.kernel.numpy())
    history = trainer.fit(xdata.make_tf_dataset(data, 32, shuffle=True, seed=0),
                          epochs=2, verbose=0, callbacks=callbacks)
    after = np.array(layer.kernel.numpy())
    assert counters[0].epochs == [0, 1]

    # Only scored rows move under LazyAdam: the fixed candidates and the
    # positives; labels K .. M-9 are never scored.
    changed = set(np.flatnonzero(np.any(before != after, axis=1)).tolist())
    assert set(FIXED.tolist()) <= changed
    assert changed <= set(FIXED.tolist()) | set(POSITIVE_LABELS.tolist())
    # Each row scores its positives and all K candidates (none is a hit).
    per_row = np.diff(data.labels.indptr)
    expected = np.mean((per_row + K) / M)
    np.testing.assert_allclose(history.history["sampled_fraction"],
                               [expected, expected], rtol=1e-5)


def test_registry_rejects_unknown_kinds_and_missing_requirements():
    with pytest.raises(ValueError, match="config.sampler.kind='nope'.*"
                                         "fixed_test"):
        heads.get_head(_config("nope"))
    with pytest.raises(ValueError, match="needs xmc_tf_no_such_module.*"
                                         "pip install nothing"):
        heads.get_head(_config("needs_missing_module_test"))
    with pytest.raises(ValueError, match="already registered"):
        register_sampler("fixed_test")(lambda *a: None)
    assert sampler_kind("fixed_test").factory is _make_fixed


@pytest.mark.parametrize("make", [lambda: LabelDense(7),
                                  lambda: UniformSparseDense(7, 3, seed=0)])
def test_head_layers_are_label_scorers(make):
    layer = make()
    x = np.random.default_rng(0).normal(size=(4, 9)).astype(np.float32)
    layer(x)  # builds it
    layer.bias.assign(np.arange(7, dtype=np.float32))
    full = np.asarray(layer(x))
    assert isinstance(layer, LabelScorer) and layer.num_labels == 7
    assert check_label_scorer(layer) is layer
    # label_vectors: <[x, 1], v_l> is the layer's own logit of l.
    v = layer.label_vectors(include_bias=True)
    np.testing.assert_allclose(np.c_[x, np.ones(4)] @ v.T, full, rtol=1e-5,
                               atol=1e-5)
    ids = np.array([[6, 0, 3]] * 4, np.int32)
    np.testing.assert_allclose(layer.score_candidates(x, ids),
                               np.take_along_axis(full, ids, 1), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(layer.score_shared(x, ids[0]),
                               full[:, ids[0]], rtol=1e-5, atol=1e-5)
    assert label_layout(layer).num_labels == 7


def test_a_non_scorer_is_rejected_naming_what_it_lacks():
    dense = keras.layers.Dense(5)
    dense.build((None, 3))
    assert not isinstance(dense, LabelScorer)
    with pytest.raises(ValueError, match="Dense cannot score candidates.*"
                       "lacks num_labels, label_layout, label_vectors, "
                       "score_candidates, score_shared"):
        check_label_scorer(dense)

    class HalfScorer(keras.layers.Layer):
        num_labels = 5

        def score_candidates(self, inputs, candidates):
            return inputs

    with pytest.raises(ValueError, match="lacks label_layout, label_vectors, "
                                         "score_shared$"):
        check_label_scorer(HalfScorer())
    # Samplers read a plain Dense as a feature-major kernel [d, m].
    layout = label_layout(dense)
    assert layout.feature_major and layout.num_labels == 5
    assert layout.input_dim == 3
