"""FeatureNormalization (xmc_tf.layers) against the NumPy/SciPy reference
:func:`xmc_tf.data.normalize_features`, on sparse and dense batches, and
through a save / reload."""

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import data as xdata
from xmc_tf.layers import FeatureNormalization


def _counts(n=60, d=25, seed=0):
    x = sp.random(n, d, density=0.2, format="csr", random_state=seed,
                  dtype=np.float32)
    x.data = np.ceil(x.data * 5)
    keep = np.ones(n, np.float32)
    keep[3] = 0  # an all-zero row stays zero
    x = sp.csr_matrix(sp.diags(keep) @ x)
    x.eliminate_zeros()
    return x


def _batch(x):
    data = xdata.XCDataset(sp.csr_matrix(x, dtype=np.float32),
                           sp.csr_matrix((x.shape[0], 2), dtype=np.float32))
    return xdata.make_tf_dataset(data, x.shape[0]).get_single_element()[0]


@pytest.mark.parametrize("method", ["tfidf", "l2", "none"])
def test_matches_normalize_features_sparse_and_dense(method):
    x = _counts()
    want, idf = xdata.normalize_features(x, method)
    layer = FeatureNormalization(x.shape[1], method, idf=idf)
    got = layer(_batch(x))
    assert isinstance(got, tf.SparseTensor)
    np.testing.assert_allclose(tf.sparse.to_dense(got).numpy(),
                               want.toarray(), rtol=1e-6, atol=1e-7)
    dense = layer(x.toarray())
    np.testing.assert_allclose(dense.numpy(), want.toarray(), rtol=1e-6,
                               atol=1e-7)
    assert not np.any(dense.numpy()[3])


def test_idf_is_a_saved_non_trainable_weight(tmp_path):
    x = _counts()
    want, idf = xdata.normalize_features(x, "tfidf")
    inp = keras.Input((x.shape[1],), sparse=True)
    layer = FeatureNormalization(x.shape[1], "tfidf", name="normalize")
    out = keras.layers.Dense(3, kernel_initializer="ones")(layer(inp))
    model = keras.Model(inp, out)
    layer.set_idf(idf)
    assert layer.trainable_weights == [] and len(layer.weights) == 1
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(
        loaded.get_layer("normalize").idf.numpy(), idf)
    np.testing.assert_allclose(loaded(_batch(x)).numpy(),
                               want.toarray() @ np.ones((x.shape[1], 3)),
                               rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="method"):
        FeatureNormalization(4, "bm25")
    with pytest.raises(ValueError, match="num_features"):
        FeatureNormalization(0)
    with pytest.raises(ValueError, match="idf has 3"):
        FeatureNormalization(4, "tfidf", idf=np.ones(3))
    layer = FeatureNormalization(4, "tfidf")
    with pytest.raises(ValueError, match="idf has 5"):
        layer.set_idf(np.ones(5))
