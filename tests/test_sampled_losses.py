"""Tests of the sampled losses (xmc_tf.losses.sampled).

References: NumPy float64 formulas, the full-score losses of
xmc_tf.losses.hinge (all labels as candidates), ``tf.nn.sampled_softmax_loss``
(single-label rows, same sampled ids and expected counts), and Monte-Carlo
averages over many stateless draws for the unbiasedness of the
importance-weighted one-vs-all estimates (ASTRA Lemma 4.1).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.losses import (BinaryCrossentropy, SampledBinaryCrossentropy,
                           SampledSoftmax, SampledSquaredHinge, SquaredHinge)
from xmc_tf.samplers import (AnnNegativeSampler, Candidates, MixtureSampler,
                             UniformNegativeSampler)


def np_sqh_terms(s, sign, margin=1.0):
    return np.maximum(0.0, margin - sign * s) ** 2


def np_bce_terms(s, sign):
    return np.logaddexp(0.0, -sign * s)


def random_problem(rng, b=6, n=4, k=9):
    pos_scores = rng.normal(size=(b, n)).astype(np.float32) * 2
    pos_mask = rng.random((b, n)) < 0.7
    pos_mask[0] = False
    neg_scores = rng.normal(size=(b, k)).astype(np.float32) * 2
    mask = rng.random((b, k)) < 0.8
    mask[1] = False
    weights = np.where(mask, rng.random((b, k)) * 5, 0).astype(np.float32)
    log_q = np.where(mask, rng.normal(size=(b, k)), 0).astype(np.float32)
    ids = rng.integers(0, 100, size=(b, k)).astype(np.int32)
    return pos_scores, pos_mask, neg_scores, Candidates(
        tf.constant(ids), tf.constant(mask), tf.constant(log_q),
        tf.constant(weights))


@pytest.mark.parametrize("loss_cls,terms", [
    (SampledSquaredHinge, np_sqh_terms), (SampledBinaryCrossentropy, np_bce_terms)])
def test_one_vs_all_losses_match_numpy(loss_cls, terms):
    rng = np.random.default_rng(0)
    ps, pm, ns, c = random_problem(rng)
    w = c.weights.numpy().astype(np.float64)
    ref = (np.where(pm, terms(ps.astype(np.float64), 1.0), 0).sum(1)
           + (np.where(c.mask.numpy(), w, 0) * terms(ns.astype(np.float64), -1.0)).sum(1))
    sw = rng.random(6).astype(np.float32)
    for reduction, expected in [("sum_over_batch_size", ref.mean()),
                                ("sum", ref.sum()), (None, ref), ("none", ref)]:
        out = loss_cls(reduction=reduction)(ps, pm, ns, c)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    out = loss_cls()(ps, pm, ns, c, sample_weight=sw)
    np.testing.assert_allclose(out.numpy(), (ref * sw).sum() / 6, rtol=1e-5)


def test_masked_candidates_ignore_their_weights_and_scores():
    rng = np.random.default_rng(1)
    ps, pm, ns, c = random_problem(rng)
    garbage = Candidates(c.ids, c.mask, c.log_q,
                         tf.where(c.mask, c.weights, 1e6))
    ns2 = np.where(c.mask.numpy(), ns, 1e4).astype(np.float32)
    for loss in (SampledSquaredHinge(), SampledBinaryCrossentropy(), SampledSoftmax()):
        np.testing.assert_allclose(loss(ps, pm, ns2, garbage).numpy(),
                                   loss(ps, pm, ns, c).numpy(), rtol=1e-6)


@pytest.mark.parametrize("sampled_cls,full_cls", [
    (SampledSquaredHinge, SquaredHinge), (SampledBinaryCrossentropy, BinaryCrossentropy)])
def test_all_labels_as_candidates_equal_the_full_loss(sampled_cls, full_cls):
    """Every negative label a candidate, weights 1 -> the full-score loss."""
    rng = np.random.default_rng(2)
    b, m, n = 5, 23, 4
    scores = (rng.normal(size=(b, m)) * 2).astype(np.float32)
    positives = rng.integers(0, m, size=(b, n)).astype(np.int32)
    positives[rng.random((b, n)) < 0.3] = -1
    positives[0] = -1
    positives[1, :2] = positives[1, 2]  # duplicate positive ids
    # the trainer scores each distinct positive once
    pos_ids = np.full((b, n), 0, np.int32)
    pos_mask = np.zeros((b, n), bool)
    for i in range(b):
        distinct = sorted(set(positives[i][positives[i] >= 0].tolist()))
        pos_ids[i, :len(distinct)] = distinct
        pos_mask[i, :len(distinct)] = True
    all_ids = np.tile(np.arange(m, dtype=np.int32), (b, 1))
    mask = np.ones((b, m), bool)
    for i in range(b):
        mask[i, positives[i][positives[i] >= 0]] = False
    c = Candidates(tf.constant(all_ids), tf.constant(mask),
                   tf.zeros((b, m)), tf.cast(mask, tf.float32))
    pos_scores = np.take_along_axis(scores, pos_ids, 1)
    for reduction in ("sum_over_batch_size", "sum", None):
        sampled = sampled_cls(reduction=reduction)(pos_scores, pos_mask, scores, c)
        full = full_cls(reduction=reduction)(tf.constant(positives), scores)
        np.testing.assert_allclose(sampled.numpy(), full.numpy(), rtol=1e-5)


def test_sampled_softmax_single_label_equals_tf_sampled_softmax_loss():
    rng = np.random.default_rng(3)
    b, d, m, k = 16, 8, 50, 12
    weights = rng.normal(size=(m, d)).astype(np.float32)
    biases = rng.normal(size=m).astype(np.float32)
    inputs = rng.normal(size=(b, d)).astype(np.float32)
    labels = rng.integers(0, m, size=(b, 1)).astype(np.int64)
    labels[0, 0] = 0  # the log-uniform sampler draws small ids often: hits
    sampled_values = tf.random.log_uniform_candidate_sampler(
        true_classes=labels, num_true=1, num_sampled=k, unique=False,
        range_max=m, seed=7)
    sampled, true_expected, sampled_expected = (v.numpy() for v in sampled_values)
    for remove_hits in (True, False):
        ref = tf.nn.sampled_softmax_loss(
            weights, biases, labels, inputs, num_sampled=k, num_classes=m,
            sampled_values=sampled_values,
            remove_accidental_hits=remove_hits).numpy()
        pos_scores = (np.einsum("bd,bd->b", inputs, weights[labels[:, 0]])
                      + biases[labels[:, 0]])[:, None]
        neg_scores = inputs @ weights[sampled].T + biases[sampled]
        ids = np.tile(sampled.astype(np.int32), (b, 1))
        mask = np.ones((b, k), bool)
        c = Candidates(tf.constant(ids), tf.constant(mask),
                       tf.constant(np.tile(np.log(sampled_expected), (b, 1))),
                       tf.ones((b, k)))
        pos_log_q = np.log(true_expected)
        loss = SampledSoftmax(reduction=None)
        if remove_hits:
            # hits masked by the loss from the positive ids
            out = loss(pos_scores, np.ones((b, 1), bool), neg_scores, c,
                       pos_log_q=pos_log_q, positives=labels)
            assert (ids == labels).any()  # the test does exercise hits
        else:
            out = loss(pos_scores, np.ones((b, 1), bool), neg_scores, c,
                       pos_log_q=pos_log_q)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


def np_multilabel_softmax(ps, pm, ns, mask, log_q, pos_log_q=None):
    out = np.zeros(ps.shape[0])
    for i in range(ps.shape[0]):
        neg = (ns[i] - log_q[i])[mask[i]].astype(np.float64)
        losses = []
        for j in np.flatnonzero(pm[i]):
            a = ps[i, j] - (0 if pos_log_q is None else pos_log_q[i, j])
            logits = np.concatenate([[a], neg])
            losses.append(np.log(np.exp(logits - logits.max()).sum())
                          + logits.max() - a)
        out[i] = np.mean(losses) if losses else 0.0
    return out


def test_sampled_softmax_multilabel_matches_numpy():
    rng = np.random.default_rng(4)
    ps, pm, ns, c = random_problem(rng)
    pos_log_q = rng.normal(size=ps.shape).astype(np.float32)
    for plq in (None, pos_log_q):
        ref = np_multilabel_softmax(ps, pm, ns, c.mask.numpy(), c.log_q.numpy(), plq)
        out = SampledSoftmax(reduction=None)(ps, pm, ns, c, pos_log_q=plq)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_sampled_softmax_other_positives_are_never_negatives():
    """A candidate equal to another positive of the row is removed when the
    loss is given the positive ids; the result equals dropping it."""
    ps = np.array([[1.0, 2.0]], np.float32)
    pm = np.ones((1, 2), bool)
    ns = np.array([[2.0, 0.5]], np.float32)  # candidate 0 is positive 11
    c = Candidates(tf.constant([[11, 30]]), tf.constant([[True, True]]),
                   tf.zeros((1, 2)), tf.ones((1, 2)))
    out = SampledSoftmax(reduction=None)(ps, pm, ns, c,
                                         positives=np.array([[10, 11]]))
    ref = np_multilabel_softmax(ps, pm, ns, np.array([[False, True]]),
                                np.zeros((1, 2)))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_gradients_are_finite_without_any_valid_candidate():
    ps = tf.Variable([[0.3, -0.2]])
    ns = tf.Variable([[1.0, 2.0]])
    c = Candidates(tf.constant([[1, 2]]), tf.constant([[False, False]]),
                   tf.zeros((1, 2)), tf.zeros((1, 2)))
    for loss in (SampledSquaredHinge(), SampledBinaryCrossentropy(), SampledSoftmax()):
        with tf.GradientTape() as tape:
            value = loss(ps, tf.constant([[True, False]]), ns, c)
        grads = tape.gradient(value, [ps, ns])
        for g in grads:
            assert np.all(np.isfinite(g.numpy()))
        np.testing.assert_array_equal(grads[1].numpy(), 0.0)
    # softmax with no candidates: the positive alone, loss 0
    assert float(SampledSoftmax()(ps, tf.constant([[True, False]]), ns, c)) == 0.0


def test_softmax_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    ps, pm, ns, c = random_problem(rng, b=3, n=3, k=5)
    pm[:] = True
    x = tf.Variable(np.concatenate([ps, ns], 1).astype(np.float64))
    loss = SampledSoftmax(reduction="sum")

    def f(v):
        v = tf.cast(v, tf.float32)
        return loss(v[:, :3], pm, v[:, 3:], c)
    with tf.GradientTape() as tape:
        value = f(x)
    grad = tape.gradient(value, x).numpy()
    eps = 1e-2
    base = x.numpy()
    num = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        up, down = base.copy(), base.copy()
        up[idx] += eps
        down[idx] -= eps
        num[idx] = (float(f(up)) - float(f(down))) / (2 * eps)
    np.testing.assert_allclose(grad, num, atol=2e-3)


def full_loss(terms, scores, positives):
    out = []
    for i, row in enumerate(scores):
        y = np.zeros(len(row), bool)
        y[positives[i][positives[i] >= 0]] = True
        out.append(terms(row[y], 1.0).sum() + terms(row[~y], -1.0).sum())
    return np.array(out)


def monte_carlo(sampler_fn, loss, scores, positives, reps, steps):
    """Mean and standard error of the sampled loss over reps x steps draws."""
    b, m = scores.shape
    tiled_pos = np.tile(positives, (reps, 1))
    tiled_scores = np.tile(scores, (reps, 1))
    estimates = []
    for step in range(steps):
        c = sampler_fn(tiled_pos, step)
        neg_scores = np.take_along_axis(tiled_scores, c.ids.numpy(), 1)
        n = positives.shape[1]
        pos_ids = np.maximum(tiled_pos, 0)
        pos_scores = np.take_along_axis(tiled_scores, pos_ids, 1)
        per = loss(reduction=None)(pos_scores, tiled_pos >= 0, neg_scores, c)
        estimates.append(per.numpy().reshape(reps, b))
    estimates = np.concatenate(estimates).astype(np.float64)  # [reps*steps, b]
    return estimates.mean(0), estimates.std(0) / np.sqrt(len(estimates))


@pytest.mark.parametrize("loss_cls,terms", [
    (SampledSquaredHinge, np_sqh_terms), (SampledBinaryCrossentropy, np_bce_terms)])
def test_uniform_weights_give_unbiased_one_vs_all_loss(loss_cls, terms):
    rng = np.random.default_rng(6)
    b, m = 4, 60
    scores = (rng.normal(size=(b, m)) + np.linspace(-2, 2, m)).astype(np.float32)
    # many positives per row, so that weights m / k instead of (m - |P|) / k
    # (ignoring that positives are never drawn) would be a visible bias
    positives = -np.ones((b, 20), np.int32)
    positives[0, :20] = rng.choice(m, 20, replace=False)
    positives[1, :12] = rng.choice(m, 12, replace=False)
    positives[3, :3] = [0, 1, m - 1]
    sampler = UniformNegativeSampler(m, 8, seed=11)
    mean, se = monte_carlo(lambda p, s: sampler.sample(None, p, s), loss_cls,
                           scores, positives, reps=500, steps=4)
    ref = full_loss(terms, scores.astype(np.float64), positives)
    assert np.all(np.abs(mean - ref) < 4.5 * se + 1e-4 * ref), (mean, ref, se)

    def wrong(p, step):  # the classic mistake: weights m / k
        c = sampler.sample(None, p, step)
        return c._replace(weights=tf.fill(tf.shape(c.weights), m / 8))
    biased, _ = monte_carlo(wrong, loss_cls, scores, positives, reps=500, steps=4)
    assert np.all(np.abs(biased - ref)[:2] > 8 * se[:2])


class FixedHead(keras.layers.Layer):
    """Label-major head with given weights (a stand-in for LabelDense)."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = tf.Variable(kernel)
        self.bias = None
        self.units = kernel.shape[0]


@pytest.mark.parametrize("loss_cls,terms", [
    (SampledSquaredHinge, np_sqh_terms), (SampledBinaryCrossentropy, np_bce_terms)])
def test_mixture_eq2_weights_give_unbiased_one_vs_all_loss(loss_cls, terms):
    pytest.importorskip("faiss")
    rng = np.random.default_rng(7)
    b, m, d, k_h, k_r = 4, 150, 6, 10, 6
    kernel = rng.normal(size=(m, d)).astype(np.float32)
    queries = rng.normal(size=(b, d)).astype(np.float32)
    scores = queries @ kernel.T
    positives = np.array([[3, 50, -1], [7, -1, -1], [-1, -1, -1], [0, 1, 149]],
                         np.int32)
    mix = MixtureSampler(AnnNegativeSampler(m, k_h, index="flat"),
                         UniformNegativeSampler(m, k_r, seed=2))
    mix.bind(FixedHead(kernel))
    mix.refresh()
    reps = 400

    def sample(p, step):
        return mix.sample(np.tile(queries, (reps, 1)), p, step)
    mean, se = monte_carlo(sample, loss_cls, scores, positives, reps, steps=4)
    ref = full_loss(terms, scores.astype(np.float64), positives)
    assert np.all(np.abs(mean - ref) < 4.5 * se + 1e-4 * ref), (mean, ref, se)
    # Power check: the same draws with weight 1 on the uniform part (no Eq. 2
    # correction) give an estimate far from the full loss.
    def unweighted(p, step):
        c = sample(p, step)
        return c._replace(weights=tf.cast(c.mask, tf.float32))
    biased, se_b = monte_carlo(unweighted, loss_cls, scores, positives, reps,
                               steps=1)
    assert np.all(np.abs(biased - ref) > 10 * se_b)


def test_config_round_trip_and_argument_checks():
    for loss in (SampledSquaredHinge(margin=0.5, reduction="sum"),
                 SampledBinaryCrossentropy(reduction=None),
                 SampledSoftmax(name="s")):
        config = loss.get_config()
        clone = type(loss).from_config(config)
        assert clone.get_config() == config
        restored = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(loss))
        assert type(restored) is type(loss) and restored.get_config() == config
    with pytest.raises(ValueError):
        SampledSoftmax(reduction="mean")
    c = Candidates(tf.zeros((2, 3), tf.int32), tf.ones((2, 3), tf.bool),
                   tf.zeros((2, 3)), tf.ones((2, 3)))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        SampledSquaredHinge()(tf.zeros((2, 2)), tf.ones((2, 2), tf.bool),
                              tf.zeros((2, 4)), c)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        SampledSquaredHinge()(tf.zeros((2, 2)), tf.ones((2, 3), tf.bool),
                              tf.zeros((2, 3)), c)
    assert xmc_tf.losses.SampledSoftmax is SampledSoftmax
