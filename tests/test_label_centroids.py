"""label_centroids (a frozen nearest-centroid scorer) and FusedScores,
against NumPy: the cosine of each instance with each label's truncated
centroid, and model + weight * scorer."""

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from xmc_tf.layers import FusedScores, label_centroids


def _problem(seed=0, n=60, e=40, m=7):
    rng = np.random.default_rng(seed)
    x = sp.random(n, e, density=0.15, random_state=seed, format="csr",
                  dtype=np.float32)
    x.data = rng.random(x.nnz).astype(np.float32) + 0.1
    y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n),
                                                rng.integers(0, m, n))),
                      shape=(n, m))
    return x, y


def _sparse_tensor(x):
    coo = x.tocoo()
    return tf.sparse.reorder(tf.SparseTensor(
        np.stack([coo.row, coo.col], 1).astype(np.int64), coo.data,
        coo.shape))


@pytest.mark.parametrize("fan_in", [3, 40])
def test_scores_are_cosines_with_the_truncated_centroids(fan_in):
    x, y = _problem()
    layer = label_centroids(x, y, fan_in, seed=1)
    assert not layer.trainable and layer.bias is None
    # NumPy: each label's summed features, its fan_in largest kept, l2 rows.
    agg = (y.T @ x).toarray()
    cent = np.zeros_like(agg)
    for j, row in enumerate(agg):
        keep = np.argsort(-row, kind="stable")[:fan_in]
        cent[j, keep] = row[keep]
    cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
    queries = x[:10]
    want = queries.toarray() @ cent.T
    np.testing.assert_allclose(layer(_sparse_tensor(queries)).numpy(), want,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer(queries.toarray()).numpy(), want,
                               rtol=1e-5, atol=1e-6)
    # Its own instances score highest for their own label on average.
    own = want[np.arange(10), y[:10].indices]
    assert own.mean() > want.mean() + 0.1


def test_fused_scores_add_the_weighted_centroids_and_round_trip(tmp_path):
    x, y = _problem(1)
    m = y.shape[1]
    inputs = keras.Input((x.shape[1],), sparse=True)
    keras.utils.set_random_seed(0)
    hidden = xmc_tf.layers.SparseEmbeddingBag(8)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(m)(hidden))
    scorer = label_centroids(x, y, 5, seed=0)
    fused = keras.Model(inputs, FusedScores(model, [scorer], [2.5])(inputs),
                        name="centroid_fused")
    batch = _sparse_tensor(x[:9])
    want = model(batch).numpy() + 2.5 * scorer(batch).numpy()
    np.testing.assert_allclose(fused(batch).numpy(), want, rtol=1e-5,
                               atol=1e-6)
    assert fused.name == "centroid_fused"
    path = str(tmp_path / "fused.keras")
    fused.save(path)
    again = keras.models.load_model(path)
    np.testing.assert_allclose(again(batch).numpy(), want, rtol=1e-5,
                               atol=1e-6)
    assert not again.layers[-1].scorers[0].trainable
    ids, _ = xmc_tf.decoding.top_k_function(again, 3)(batch)
    np.testing.assert_array_equal(ids.numpy(), np.argsort(-want, 1)[:, :3])


def test_bad_input_is_one_clear_error():
    x, y = _problem()
    with pytest.raises(ValueError, match="connections_per_label=41"):
        label_centroids(x, y, 41)
    dense_in = keras.Input((x.shape[1],))
    dense_model = keras.Model(dense_in, keras.layers.Dense(y.shape[1])(
        dense_in))
    with pytest.raises(ValueError, match="weights"):
        FusedScores(dense_model, [label_centroids(x, y, 3)], [1.0, 2.0])
