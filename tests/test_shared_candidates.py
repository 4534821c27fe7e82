"""Shared candidates: one candidate set per batch, scored by every row.

References: the full layers' logits and gradients (``layer(x)`` and Keras'
own gradient), and Monte Carlo means of the samplers' estimates against the
exact sums over each row's negatives (NumPy).  The trainer with every label
shared equals the full losses: tests/test_sampled_head.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf import data as xdata
from xmc_tf.models import SampledTrainer
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.losses.sampled import SampledSoftmax
from xmc_tf.samplers import (Candidates, MixtureSampler, NegativeSampler,
                             UniformNegativeSampler, mask_accidental_hits)
from xmc_tf.samplers.base import shared_candidates

from test_sampled_head import D, M, _data, _model, needs_op


def _layer(kind, m=30, d=12):
    keras.utils.set_random_seed(3)
    layer = (UniformSparseDense(m, 4, seed=0, bias_initializer="random_normal")
             if kind == "uniform_sparse" else
             LabelDense(m, bias_initializer="random_normal"))
    x = tf.random.stateless_normal([5, d], seed=[1, 2])
    layer(x)
    return layer, x


@needs_op
@pytest.mark.parametrize("kind", ["uniform_sparse", "dense"])
def test_score_shared_equals_full_logits_and_gradient(kind):
    layer, x = _layer(kind)
    ids = tf.constant([7, 0, 29, 7, 13], tf.int32)  # a repeat included
    upstream = tf.random.stateless_normal([5, 5], seed=[3, 4])
    with tf.GradientTape() as tape:
        got = layer.score_shared(x, ids)
        loss = tf.reduce_sum(got * upstream)
    g_got = tape.gradient(loss, layer.trainable_variables)
    with tf.GradientTape() as tape:
        full = layer(x)
        want = tf.gather(full, ids, axis=1)
        loss = tf.reduce_sum(want * upstream)
    g_want = tape.gradient(loss, layer.trainable_variables)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for v, g, w in zip(layer.trainable_variables, g_got, g_want):
        assert isinstance(g, tf.IndexedSlices), v.path
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                                   tf.convert_to_tensor(w).numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=v.path)


@pytest.mark.parametrize("kind", ["uniform_sparse", "dense"])
def test_score_shared_rejects_out_of_range(kind):
    layer, x = _layer(kind)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        layer.score_shared(x, tf.constant([1, 30], tf.int32))


def test_trainer_rejects_shared_without_support():
    _, _, model = _model("dense")

    class PerRowOnly(NegativeSampler):
        pass

    with pytest.raises(ValueError, match="shared"):
        SampledTrainer(model, PerRowOnly(M, 3), SampledSoftmax(), shared=True)


POSITIVES = np.array([[3, 5, -1], [0, -1, -1], [7, 8, 9], [2, 4, 6]], np.int32)


def _exact_and_estimate(sampler, steps, m, queries=None):
    """Exact ``sum_{l not in P_i} f(i, l)`` and the Monte Carlo means of the
    sampler's weighted and log-Q estimates of it."""
    rng = np.random.default_rng(0)
    f = rng.uniform(0.5, 2.0, size=(len(POSITIVES), m)).astype(np.float32)
    exact = np.array([f[i].sum() - f[i, p[p >= 0]].sum()
                      for i, p in enumerate(POSITIVES)])
    by_weight, by_log_q = np.zeros(len(POSITIVES)), np.zeros(len(POSITIVES))

    @tf.function
    def one(step):
        c = sampler.sample_shared(queries, POSITIVES, step)
        vals = tf.gather(tf.constant(f), c.ids, axis=1)
        w = tf.reduce_sum(c.weights * vals, 1)
        q = tf.reduce_sum(tf.where(c.mask, tf.exp(-c.log_q) * vals, 0.0), 1)
        return c, w, q

    for step in range(steps):
        c, w, q = one(tf.constant(step, tf.int64))
        by_weight += w.numpy()
        by_log_q += q.numpy()
    return exact, by_weight / steps, by_log_q / steps, c


def test_uniform_shared_is_unbiased_and_masks_hits():
    m, k = 40, 8
    sampler = UniformNegativeSampler(m, k, seed=5)
    exact, by_w, by_q, c = _exact_and_estimate(sampler, 1500, m)
    ids, mask = c.ids.numpy(), c.mask.numpy()
    assert ids.shape == (k,) and mask.shape == (len(POSITIVES), k)
    np.testing.assert_array_equal(mask, mask_accidental_hits(ids, POSITIVES))
    w = c.weights.numpy()
    np.testing.assert_allclose(w[mask], m / k)
    np.testing.assert_array_equal(w[~mask], 0.0)
    np.testing.assert_allclose(c.log_q.numpy()[mask], np.log(k / m), rtol=1e-6)
    np.testing.assert_allclose(by_w, exact, rtol=0.04)
    np.testing.assert_allclose(by_q, exact, rtol=0.04)


class FixedHard(NegativeSampler):
    """Row i's hard negatives: ids 10 + 3 i, 11 + 3 i, 0 (test); the 0 is a
    positive of row 1 and is masked there."""

    def sample(self, queries, positives, step):
        b = tf.shape(positives)[0]
        base = 10 + 3 * tf.range(b, dtype=tf.int32)[:, None]
        ids = tf.concat([base, base + 1, tf.zeros([b, 1], tf.int32)], 1)
        mask = mask_accidental_hits(ids, positives)
        w = tf.cast(mask, tf.float32)
        return Candidates(ids, mask, tf.zeros_like(w), w)


@pytest.mark.parametrize("pool_positives", [True, False])
def test_mixture_shared_pool_exact_uniform_rest_unbiased(pool_positives):
    m, k_r = 40, 8
    mix = MixtureSampler(FixedHard(m, 3), UniformNegativeSampler(m, k_r, seed=2),
                         pool_positives=pool_positives)
    exact, by_w, by_q, c = _exact_and_estimate(mix, 1500, m)
    ids, mask, lq, w = (t.numpy() for t in c)
    # Row 1 has 0 as a positive, so its hard set excludes it; the pool is
    # the union over rows (and of the batch's positives).
    pool = {10, 11, 13, 14, 16, 17, 19, 20, 0}
    if pool_positives:
        pool |= set(POSITIVES[POSITIVES >= 0].tolist())
    pool = np.array(sorted(pool))
    assert sorted(ids[:len(pool)].tolist()) == pool.tolist()
    hits = mask_accidental_hits(ids, POSITIVES).numpy()
    np.testing.assert_array_equal(mask[:, :len(pool)], hits[:, :len(pool)])
    np.testing.assert_array_equal(w[:, :len(pool)][mask[:, :len(pool)]], 1.0)
    np.testing.assert_array_equal(lq[:, :len(pool)], 0.0)
    drawn = ids[len(pool):]
    in_pool = np.isin(drawn, pool)
    np.testing.assert_array_equal(mask[:, len(pool):],
                                  hits[:, len(pool):] & ~in_pool[None, :])
    np.testing.assert_allclose(w[:, len(pool):][mask[:, len(pool):]], m / k_r)
    np.testing.assert_allclose(by_w, exact, rtol=0.04)
    np.testing.assert_allclose(by_q, exact, rtol=0.04)


@needs_op
@pytest.mark.parametrize("kind", ["uniform", "mixture", "lsh"])
def test_shared_config_trains_through_the_head(kind):
    if kind == "mixture":
        pytest.importorskip("faiss")
    from xmc_tf.job import heads
    from test_sampled_head import _config
    from xmc_tf.job.build import build_model
    config = _config("dense", "softmax", kind)
    config.sampler.shared = True
    head = heads.get_head(config)
    keras.utils.set_random_seed(0)
    model = build_model(config, D, M, sparse_input=True, head=head)
    out = decoding.scoring_layer(model)
    trainer = head.training_model(model, out)
    assert trainer.shared
    if kind == "lsh":  # the LSH tables retrieve the mixture's pool
        assert isinstance(trainer.sampler, MixtureSampler)
        assert type(trainer.sampler.hard).__name__ == "LshNegativeSampler"
    trainer.compile(optimizer=keras.optimizers.Adam(0.02), jit_compile=False)
    data = _data(n=128)
    ds = xdata.make_tf_dataset(data, 32, shuffle=True, seed=0)
    history = trainer.fit(ds, epochs=5, verbose=0, shuffle=False,
                          callbacks=head.callbacks(out, val_data=None))
    losses = history.history["loss"]
    assert losses[-1] < losses[0]


def test_shared_config_rejects_other_kinds():
    from xmc_tf.job import heads
    from test_sampled_head import _config
    config = _config("dense", "softmax", "in_batch")
    config.sampler.shared = True
    with pytest.raises(ValueError, match="shared"):
        heads.get_head(config)
