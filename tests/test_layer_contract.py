"""Keras' own layer contract (``keras.src.testing.TestCase.run_layer_test``)
for the public layers: build from shapes, ``compute_output_spec`` equal to
the output (also under ``mixed_float16``), ``get_config`` / ``from_config``
and serialization round trips, the weight counts, a training step."""

import numpy as np
from keras.src import testing

from xmc_tf import layers


class LayerContractTest(testing.TestCase):

    def test_uniform_sparse_dense(self):
        self.run_layer_test(
            layers.UniformSparseDense,
            init_kwargs={"units": 50, "connections_per_label": 4, "seed": 0},
            input_shape=(3, 12), expected_output_shape=(3, 50),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=1)

    def test_uniform_sparse_dense_on_sparse_input(self):
        self.run_layer_test(
            layers.UniformSparseDense,
            init_kwargs={"units": 50, "connections_per_label": 4, "seed": 0},
            input_shape=(3, 12), input_sparse=True,
            expected_output_shape=(3, 50), run_training_check=False)

    def test_label_dense(self):
        self.run_layer_test(
            layers.LabelDense, init_kwargs={"units": 40},
            input_shape=(3, 8), expected_output_shape=(3, 40),
            expected_num_trainable_weights=2)

    def test_mach_head(self):
        self.run_layer_test(
            layers.MachHead,
            init_kwargs={"num_labels": 100, "num_buckets": 16,
                         "num_repetitions": 3},
            input_shape=(4, 8), expected_output_shape=(4, 3, 16))

    def test_sparse_embedding_bag(self):
        self.run_layer_test(
            layers.SparseEmbeddingBag, init_kwargs={"units": 6},
            input_shape=(4, 20), input_sparse=True,
            expected_output_shape=(4, 6), expected_num_trainable_weights=2,
            run_training_check=False)

    def test_sparse_dropout(self):
        self.run_layer_test(
            layers.SparseDropout, init_kwargs={"rate": 0.5},
            input_shape=(4, 20), input_sparse=True,
            expected_output_shape=(4, 20), expected_output_sparse=True,
            run_training_check=False)

    def test_feature_normalization(self):
        idf = np.linspace(1.0, 2.0, 20).astype(np.float32)
        for sparse in (False, True):
            self.run_layer_test(
                layers.FeatureNormalization,
                init_kwargs={"num_features": 20, "method": "tfidf",
                             "idf": idf},
                input_shape=(4, 20), input_sparse=sparse,
                expected_output_shape=(4, 20),
                expected_output_sparse=sparse, run_training_check=False)

    def test_outputs_match_a_dense_reference(self):
        # The contract above checks shapes and round trips; the values of
        # one layer against NumPy, so that a layer returning zeros fails.
        layer = layers.UniformSparseDense(7, 3, seed=1, use_bias=False)
        x = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
        out = layer(x).numpy()
        w = np.zeros((5, 7), np.float32)
        for label, (cols, ws) in enumerate(zip(layer.indices.numpy(),
                                               layer.kernel.numpy())):
            np.add.at(w[:, label], cols, ws)
        np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-6)
