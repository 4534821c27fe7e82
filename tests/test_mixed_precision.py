"""UniformSparseDense and LabelDense under Keras mixed-precision policies.

Each layer, under ``"mixed_float16"`` and ``"mixed_bfloat16"``, scores
(full ``call``, ``score_candidates``, ``score_shared``) like a float32
copy with the same weights, within the policy's compute dtype's
precision, and trains a few steps (plain ``fit`` and the sampled trainer);
the half / bfloat16 CPU kernels of the uniform-sparse and sampled ops agree
with the float32 op on the same values, gradients included; SetRewiring
runs inside the LossScaleOptimizer Keras puts around the optimizer under
``"mixed_float16"``.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from op_requirements import needs_ops
from xmc_tf.callbacks import SetRewiring
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.ops import uniform_sparse_matmul, uniform_sparse_sampled_matmul

pytestmark = needs_ops("xmc_uniform_sparse_matmul")

POLICIES = {"mixed_float16": tf.float16, "mixed_bfloat16": tf.bfloat16}
# Relative tolerance of one rounding of the inputs and weights to the
# compute dtype (11 and 8 significant bits), with room for the sum.
RTOL = {"mixed_float16": 4e-3, "mixed_bfloat16": 3e-2}
M, D, S = 30, 16, 6


@pytest.fixture(autouse=True)
def float32_policy_after():
    yield
    keras.mixed_precision.set_global_policy("float32")


def make_layer(kind):
    if kind == "uniform_sparse":
        return UniformSparseDense(M, S, seed=0, bias_initializer="ones")
    return LabelDense(M, bias_initializer="ones")


def built_pair(kind, policy):
    """A float32 layer and a layer under ``policy`` with the same weights."""
    keras.mixed_precision.set_global_policy("float32")
    ref = make_layer(kind)
    ref(keras.ops.ones((1, D)))
    keras.mixed_precision.set_global_policy(policy)
    mixed = make_layer(kind)
    mixed(keras.ops.ones((1, D)))
    for a, b in zip(mixed.weights, ref.weights):
        a.assign(b)
    return ref, mixed


def close(got, want, policy):
    got = np.asarray(tf.cast(got, tf.float32))
    want = np.asarray(want, np.float32)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL[policy] * scale)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", ["uniform_sparse", "label_dense"])
def test_scores_match_float32(kind, policy):
    ref, mixed = built_pair(kind, policy)
    assert mixed.kernel.dtype == "float32"  # variables stay float32
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, D)).astype(np.float32)
    cand = rng.integers(0, M, size=(8, 5)).astype(np.int32)
    shared = np.array([3, 0, 29, 7], np.int32)
    out = mixed(x)
    assert out.dtype == POLICIES[policy]
    close(out, ref(x), policy)
    xc = tf.cast(x, POLICIES[policy])
    got = mixed.score_candidates(xc, cand)
    assert got.dtype == POLICIES[policy]
    close(got, ref.score_candidates(x, cand), policy)
    close(mixed.score_shared(xc, shared), ref.score_shared(x, shared), policy)
    # The float32 reference itself agrees with NumPy.
    full = np.asarray(ref(x))
    np.testing.assert_allclose(np.asarray(ref.score_candidates(x, cand)),
                               np.take_along_axis(full, cand, 1), rtol=1e-5,
                               atol=1e-5)


def toy_data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)).astype(np.float32)
    centers = rng.normal(size=(M, D)).astype(np.float32)
    label = np.argmax(x @ centers.T, axis=1)
    return x, label


# Final training loss of a mixed run relative to the float32 run's (same
# seed, data and initial weights; the trajectories part by rounding).
LOSS_RTOL = {"mixed_float16": 0.03, "mixed_bfloat16": 0.1}


def fit_losses(kind, policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    x, label = toy_data()
    y = keras.ops.convert_to_numpy(tf.one_hot(label, M))
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(32),
                              make_layer(kind)])
    model.compile(keras.optimizers.Adam(1e-2),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    loss = model.fit(x, y, batch_size=32, epochs=4, shuffle=False,
                     verbose=0).history["loss"]
    head = model.layers[-1]
    assert head.kernel.dtype == "float32"
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(head.kernel)))
    return np.array(loss)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", ["uniform_sparse", "label_dense"])
def test_fit_trains_under_mixed_policy(kind, policy):
    want = fit_losses(kind, "float32")
    got = fit_losses(kind, policy)
    assert np.all(np.isfinite(got)) and np.all(np.diff(got) < 0), got
    np.testing.assert_allclose(got[-1], want[-1], rtol=LOSS_RTOL[policy])


def sampled_losses(kind, policy, shared):
    from xmc_tf.losses import SampledSoftmax
    from xmc_tf.models import SampledTrainer
    from xmc_tf.samplers import UniformNegativeSampler
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    x, label = toy_data()
    inputs = keras.Input((D,))
    model = keras.Model(inputs, make_layer(kind)(keras.layers.Dense(32)(inputs)))
    trainer = SampledTrainer(model, UniformNegativeSampler(M, 8, seed=0),
                             SampledSoftmax(), shared=shared)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    data = tf.data.Dataset.from_tensor_slices(
        (x, label[:, None].astype(np.int32))).batch(32)
    return np.array(trainer.fit(data, epochs=4, verbose=0).history["loss"])


# mixed_float16: CandidateTrainer.train_step scales the loss for Keras'
# LossScaleOptimizer (optimizer.scale_loss), whose apply() unscales the
# gradients; without it Adam's steps shrank 2^15-fold (loss 2.11 vs 1.38).
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("kind", ["uniform_sparse", "label_dense"])
@pytest.mark.parametrize("shared", [False, True])
def test_sampled_trainer_under_mixed_policy(kind, policy, shared):
    """score_candidates (per row) / score_shared (shared) in training."""
    want = sampled_losses(kind, "float32", shared)
    got = sampled_losses(kind, policy, shared)
    assert np.all(np.isfinite(got)) and got[-1] < got[0], got
    np.testing.assert_allclose(got[-1], want[-1], rtol=LOSS_RTOL[policy])


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_uniform_sparse_ops_in_half_and_bfloat16_match_float32(dtype):
    """The ops' non-float CPU kernels (float accumulation) against the
    float32 op on the same (rounded) values, forward and gradients."""
    rng = np.random.default_rng(0)
    x32 = tf.cast(tf.cast(rng.normal(size=(5, D)), dtype), tf.float32)
    w32 = tf.cast(tf.cast(rng.normal(size=(M, S)), dtype), tf.float32)
    idx = tf.constant(np.stack([rng.choice(D, S, replace=False)
                                for _ in range(M)]).astype(np.int32))
    cand = tf.constant(rng.integers(0, M, size=(5, 4)).astype(np.int32))
    up = tf.constant(rng.normal(size=(5, M)).astype(np.float32))
    up_c = tf.gather(up, tf.range(4), axis=1)
    tol = 1e-2 if dtype == tf.float16 else 6e-2

    def run(x, w, t):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, w])
            full = uniform_sparse_matmul(x, idx, w)
            sampled = uniform_sparse_sampled_matmul(x, idx, w, cand)
            loss_full = tf.reduce_sum(tf.cast(full, tf.float32) * up)
            loss_s = tf.reduce_sum(tf.cast(sampled, tf.float32) * up_c)
        grads = [tape.gradient(loss_full, x), tape.gradient(loss_full, w),
                 tape.gradient(loss_s, x),
                 tf.convert_to_tensor(tape.gradient(loss_s, w))]
        assert full.dtype == t and sampled.dtype == t
        return [full, sampled] + grads

    want = run(x32, w32, tf.float32)
    got = run(tf.cast(x32, dtype), tf.cast(w32, dtype), dtype)
    for g, w in zip(got, want):
        g = np.asarray(tf.cast(g, tf.float32))
        w = np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=0, atol=tol * np.abs(w).max())


def test_set_rewiring_under_mixed_float16():
    """compile wraps the optimizer in a LossScaleOptimizer; SetRewiring
    rewires and zeroes the inner Adam's moments at the moved positions."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    x, label = toy_data(64)
    y = keras.ops.convert_to_numpy(tf.one_hot(label, M))
    head = make_layer("uniform_sparse")
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(32), head])
    model.compile(keras.optimizers.Adam(1e-2),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
    before = keras.ops.convert_to_numpy(head.indices).copy()
    cb = SetRewiring(every_n_steps=1, fraction=0.5, seed=0)
    cb.set_model(model)
    cb.on_train_begin()
    cb.rewire_now()
    after = keras.ops.convert_to_numpy(head.indices)
    moved = after != before
    assert cb.rewires == 1 and moved.sum() == M * S // 2
    kernel = keras.ops.convert_to_numpy(head.kernel)
    assert np.all(kernel[moved] == 0)
    inner = model.optimizer.inner_optimizer
    slots = [v for v in inner.variables
             if tuple(v.shape) == (M, S) and v is not head.kernel]
    assert len(slots) == 2  # Adam's two moments of the kernel
    for slot in slots:
        value = keras.ops.convert_to_numpy(slot)
        assert np.all(value[moved] == 0) and np.any(value[~moved] != 0)
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                        callbacks=[SetRewiring(every_n_steps=1, seed=0)])
    assert np.isfinite(history.history["loss"][0])
