"""benchmarks/signal_density.py: the density of the squared hinge's signal
on a toy model whose zero pattern is known (scores = the output bias, the
kernel zero)."""

import keras
import numpy as np
import tensorflow as tf

import xmc_tf
from repo_module import load_repo_module

bench = load_repo_module("benchmarks/signal_density.py", "signal_density")


def test_signal_density_counts_entries_and_columns():
    g = np.array([[0.0, 1.0, 0.0, 0.0],
                  [0.0, -2.0, 3.0, 0.0]], np.float32)
    nz, cols = bench.signal_density(g)
    assert nz == 3 / 8
    assert cols == 2 / 4


def test_output_signal_of_a_toy_model_has_the_hinges_zeros():
    # Scores = bias (kernel zero): label 0 positive at +2 and label 1
    # negative at -2 hold their margins (zero signal); labels 2 and 3 are
    # negatives at 0 and 0.5 (non-zero).
    x_in = keras.Input((3,))
    h = keras.layers.Dense(8, name="intermediate")(x_in)
    layer = xmc_tf.layers.UniformSparseDense(
        4, 2, kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant([2.0, -2.0, 0.0, 0.5]),
        name="output")
    model = keras.Model(x_in, layer(h))
    model.compile(loss=xmc_tf.losses.SquaredHinge())
    from xmc_tf import decoding
    assert decoding.scoring_layer(model) is layer
    x = tf.random.normal([5, 3], seed=0)
    y = tf.constant([[0, -1]] * 5, tf.int32)
    g, hh = bench.output_signal(model, layer, x, y, training=False)
    assert g.shape == (5, 4) and hh.shape == (5, 8)
    g = g.numpy()
    assert (g[:, :2] == 0).all() and (g[:, 2:] != 0).all()
    assert bench.signal_density(g) == (0.5, 0.5)
    dense = bench.dense_signal(tf.constant(g)).numpy()
    assert (dense != 0).all() and (dense[:, 2:] == g[:, 2:]).all()
