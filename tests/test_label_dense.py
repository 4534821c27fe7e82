"""Tests of LabelDense and of the candidate scoring of both head layers.

References: ``keras.layers.Dense`` with the transposed kernel, the full
layer's logits followed by ``tf.gather(..., batch_dims=1)``, and NumPy.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.layers import LabelDense, UniformSparseDense
from op_requirements import needs_ops

needs_sampled_op = needs_ops("xmc_uniform_sparse_sampled_matmul")


def _dense_twin(layer, **kwargs):
    """A keras Dense with the same weights (kernel transposed)."""
    dense = keras.layers.Dense(layer.units, **kwargs)
    dense.build((None, layer.input_dim))
    weights = [layer.kernel.numpy().T]
    if layer.use_bias:
        weights.append(layer.bias.numpy())
    dense.set_weights(weights)
    return dense


@pytest.mark.parametrize("activation", [None, "sigmoid"])
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
def test_outputs_equal_dense(activation, shape):
    rng = np.random.default_rng(0)
    layer = LabelDense(11, activation=activation,
                       bias_initializer="random_normal")
    x = rng.normal(size=shape).astype(np.float32)
    y = layer(x)
    assert tuple(layer.kernel.shape) == (11, 8)
    assert y.shape == shape[:-1] + (11,)
    ref = _dense_twin(layer, activation=activation)(x)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.compute_output_shape(shape) == shape[:-1] + (11,)


@pytest.mark.parametrize("initializer", [
    lambda: keras.initializers.GlorotUniform(seed=3),
    lambda: keras.initializers.HeNormal(seed=4),       # fan_in only
    lambda: keras.initializers.LecunUniform(seed=5)])
def test_initializer_uses_dense_fans(initializer):
    """Same seeded initializer -> exactly the transpose of Dense's kernel
    (fan_in = input_dim, not units), at a shape where fans differ 50x."""
    label = LabelDense(400, kernel_initializer=initializer())
    dense = keras.layers.Dense(400, kernel_initializer=initializer())
    x = np.ones((1, 8), np.float32)
    label(x)
    dense(x)
    np.testing.assert_array_equal(label.kernel.numpy(), dense.kernel.numpy().T)
    # He normal with fan_in = 8: std sqrt(2 / 8) = 0.5; fan_in = 400 would
    # give 0.07.
    if isinstance(label.kernel_initializer, keras.initializers.HeNormal):
        assert 0.35 < label.kernel.numpy().std() < 0.6


def test_score_candidates_is_gather_of_logits_without_activation():
    rng = np.random.default_rng(1)
    layer = LabelDense(30, activation="sigmoid",
                       bias_initializer="random_normal")
    x = rng.normal(size=(4, 6)).astype(np.float32)
    layer(x)
    cand = rng.integers(0, 30, size=(4, 7)).astype(np.int32)
    cand[1] = cand[0]
    logits = x @ layer.kernel.numpy().T + layer.bias.numpy()
    got = layer.score_candidates(x, cand)
    np.testing.assert_allclose(got.numpy(), np.take_along_axis(logits, cand, 1),
                               rtol=1e-5, atol=1e-5)
    graph = tf.function(layer.score_candidates)
    np.testing.assert_allclose(graph(x, cand).numpy(), got.numpy(), rtol=1e-6)


def test_score_candidates_gradients_update_only_candidate_rows():
    rng = np.random.default_rng(2)
    layer = LabelDense(40, bias_initializer="random_normal")
    x = rng.normal(size=(3, 5)).astype(np.float32)
    layer(x)
    cand = rng.integers(0, 20, size=(3, 4)).astype(np.int32)  # labels < 20
    kernel0, bias0 = layer.kernel.numpy(), layer.bias.numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer.score_candidates(x, cand)))
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    keras.optimizers.SGD(0.05).apply_gradients(
        zip(grads, layer.trainable_variables))
    # Dense reference: d loss / d kernel[r] = sum over (i, j) with
    # cand[i, j] = r of 2 * score[i, j] * x[i].
    scores = np.take_along_axis(x @ kernel0.T + bias0, cand, 1)
    ref_k = np.zeros_like(kernel0)
    ref_b = np.zeros_like(bias0)
    np.add.at(ref_k, cand.ravel(), (2 * scores[:, :, None] * x[:, None, :])
              .reshape(-1, 5))
    np.add.at(ref_b, cand.ravel(), 2 * scores.ravel())
    np.testing.assert_allclose(layer.kernel.numpy(), kernel0 - 0.05 * ref_k,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.bias.numpy(), bias0 - 0.05 * ref_b,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(layer.kernel.numpy()[20:], kernel0[20:])


def _dense_reads(fn, *args):
    """Captured tensors that fn's graph reads with ReadVariableOp."""
    graph = tf.function(fn).get_concrete_function(*args).graph
    external = {internal.name: ext for ext, internal in graph.captures}
    return ([op.type for op in graph.get_operations()],
            [external.get(op.inputs[0].name) for op in graph.get_operations()
             if op.type == "ReadVariableOp"])


def test_score_candidates_reads_only_candidate_rows():
    """No dense read of kernel or bias (copy-on-read after sparse updates):
    rows come from ResourceGather, in the forward and in the gradient."""
    layer = LabelDense(20)
    x = tf.ones((2, 3))
    layer(x)
    cand = tf.constant([[1, 2], [3, 19]])

    def step(a):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer.score_candidates(a, cand))
        return tape.gradient(loss, layer.trainable_variables)

    types, reads = _dense_reads(step, x)
    assert "ResourceGather" in types
    assert reads == []


def test_label_vectors():
    layer = LabelDense(9, bias_initializer="random_normal")
    layer(np.ones((1, 4), np.float32))
    v = layer.label_vectors()
    assert v.dtype == np.float32 and v.shape == (9, 4) and v.flags.c_contiguous
    np.testing.assert_array_equal(v, layer.kernel.numpy())
    v[:] = 0  # a copy: the layer is unchanged
    assert layer.kernel.numpy().any()
    vb = layer.label_vectors(include_bias=True)
    assert vb.shape == (9, 5)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(vb @ np.append(x, 1.0), layer(x[None])[0],
                               rtol=1e-5, atol=1e-6)
    no_bias = LabelDense(3, use_bias=False)
    no_bias(np.ones((1, 4), np.float32))
    assert no_bias.label_vectors(include_bias=True).shape == (3, 4)


def test_not_built_and_bad_arguments():
    with pytest.raises(ValueError, match="units must be >= 1"):
        LabelDense(0)
    layer = LabelDense(5)
    with pytest.raises(ValueError, match="not built"):
        layer.score_candidates(np.ones((1, 3), np.float32), [[0]])
    with pytest.raises(ValueError, match="not built"):
        layer.label_vectors()
    layer(np.ones((2, 3), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"candidates\[1, 0\] = 5 is out of range "
                             r"\[0, 5\) \(num_labels\)"):
        layer.score_candidates(np.ones((2, 3), np.float32), [[0, 4], [5, 1]])


def test_serialization_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 6)).astype(np.float32)
    model = keras.Sequential([keras.Input((6,)),
                              LabelDense(7, activation="relu", name="head")])
    y = model(x)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    head = loaded.get_layer("head")
    assert isinstance(head, LabelDense)
    assert head.get_config()["units"] == 7
    np.testing.assert_allclose(loaded(x).numpy(), y.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(head.kernel.numpy(),
                                  model.get_layer("head").kernel.numpy())
    clone = LabelDense.from_config(model.get_layer("head").get_config())
    assert clone.units == 7 and clone.activation is keras.activations.relu


def test_fit_with_full_logits():
    """The layer trains like Dense through model.fit (full logits path)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 3)) > 0).astype(np.float32)
    model = keras.Sequential([keras.Input((5,)), LabelDense(3)])
    model.compile(keras.optimizers.Adam(0.05),
                  keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(x, y, epochs=30, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]


# ---------------------------------------------------------------------------
# UniformSparseDense.score_candidates.

@needs_sampled_op
def test_uniform_sparse_score_candidates_is_gather_of_logits():
    rng = np.random.default_rng(5)
    layer = UniformSparseDense(50, 4, activation="sigmoid",
                               bias_initializer="random_normal", seed=0)
    x = rng.normal(size=(3, 16)).astype(np.float32)
    layer(x)
    cand = rng.integers(0, 50, size=(3, 6)).astype(np.int32)
    cand[2] = cand[0]
    logits = xmc_tf.ops.uniform_sparse_matmul(
        x, layer.indices, layer.kernel) + layer.bias
    got = layer.score_candidates(x, cand)
    np.testing.assert_allclose(got.numpy(),
                               tf.gather(logits, cand, batch_dims=1).numpy(),
                               rtol=1e-6, atol=1e-6)
    graph = tf.function(layer.score_candidates)
    np.testing.assert_allclose(graph(x, cand).numpy(), got.numpy(), rtol=1e-6)


@needs_sampled_op
def test_uniform_sparse_score_candidates_gradients_are_row_sparse():
    rng = np.random.default_rng(6)
    layer = UniformSparseDense(60, 3, bias_initializer="random_normal", seed=1)
    x = tf.constant(rng.normal(size=(4, 12)).astype(np.float32))
    layer(x)
    cand = rng.integers(0, 30, size=(4, 5)).astype(np.int32)   # labels < 30
    g = rng.normal(size=(4, 5)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        sampled = layer.score_candidates(x, cand)
        full = tf.gather(layer(x), cand, batch_dims=1)
    got = tape.gradient(sampled, [x] + layer.trainable_variables,
                        output_gradients=g)
    ref = tape.gradient(full, [x] + layer.trainable_variables,
                        output_gradients=g)
    assert isinstance(got[1], tf.IndexedSlices)   # kernel
    assert isinstance(got[2], tf.IndexedSlices)   # bias
    for a, b in zip(got, ref):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                   tf.convert_to_tensor(b).numpy(),
                                   rtol=1e-5, atol=1e-5)
    indices0 = layer.indices.numpy().copy()
    kernel0 = layer.kernel.numpy().copy()
    keras.optimizers.SGD(0.1).apply_gradients(
        zip(got[1:], layer.trainable_variables))
    np.testing.assert_array_equal(layer.kernel.numpy()[30:], kernel0[30:])
    assert (layer.kernel.numpy()[np.unique(cand)] != kernel0[np.unique(cand)]
            ).any()
    np.testing.assert_array_equal(layer.indices.numpy(), indices0)


@needs_sampled_op
def test_uniform_sparse_score_candidates_reads_kernel_in_place():
    layer = UniformSparseDense(40, 3, seed=0)
    x = tf.ones((2, 8))
    layer(x)
    cand = tf.constant([[1, 2], [3, 39]])

    def step(a):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer.score_candidates(a, cand))
        return tape.gradient(loss, layer.trainable_variables)

    grads = step(x)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    types, reads = _dense_reads(step, x)
    assert "Xmc>ResourceUniformSparseSampledMatmul" in types
    kernel, bias = layer.kernel.value.handle, layer.bias.value.handle
    assert len(reads) == 1 and reads[0] is layer.indices.value.handle
    assert not any(r is kernel or r is bias for r in reads)


@needs_sampled_op
def test_uniform_sparse_score_candidates_errors():
    layer = UniformSparseDense(10, 2, seed=0)
    with pytest.raises(ValueError, match="not built"):
        layer.score_candidates(np.ones((1, 4), np.float32), [[0]])
    layer(np.ones((1, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"candidates\[0, 1\] = 10 is out of range"):
        layer.score_candidates(np.ones((1, 4), np.float32), [[0, 10]])
