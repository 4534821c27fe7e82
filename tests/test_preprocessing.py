"""Normalisation inside the model (issue 30 item 3, xmc_tf.job.preprocessing):
the idf is fitted on the fit split only, the exported model.keras and
SavedModel take raw feature values, and older work directories (whose
normalisation is outside the model) still evaluate."""

import os

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.job import artifacts
from xmc_tf import decoding
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf import metrics, saving
from xmc_tf.job import heads, preprocessing
from xmc_tf.layers import FeatureNormalization, FusedScores, UniformSparseDense
from xmc_tf.job.run import train_and_evaluate


def _counts(n, d=40, m=6, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(n, d, density=0.15, format="csr", random_state=seed,
                  dtype=np.float32)
    x.data = np.ceil(x.data * 4)  # counts: "auto" picks tf-idf
    y = sp.csr_matrix((rng.random((n, m)) < 0.25).astype(np.float32))
    return xdata.XCDataset(x, y)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prep")
    train, test = _counts(200), _counts(60, seed=1)
    xdata.write_xc(tmp / "train.txt", train)
    xdata.write_xc(tmp / "test.txt", test)
    c = xconfig.get_config("uniform_sparse")
    c.data.train, c.data.test = str(tmp / "train.txt"), str(tmp / "test.txt")
    c.model.update(encoder_dims=(8,), intermediate_dim=16,
                   connections_per_label=4, wide_connections=3)
    c.train.update(epochs=1, batch_size=32, verbose=0)
    result = train_and_evaluate(c, str(tmp / "wd"))
    return tmp, c, train, test, result


def test_idf_is_fitted_on_the_fit_split_only(run):
    tmp, c, train, _, _ = run
    order = np.random.default_rng(c.seed).permutation(200)
    fit_rows = np.sort(order[int(round(0.1 * 200)):])
    _, want = xdata.normalize_features(train.features[fit_rows], "tfidf")
    _, all_rows = xdata.normalize_features(train.features, "tfidf")
    saved = np.load(tmp / "wd" / "preprocessing.npz")
    assert str(saved["method"]) == "tfidf" and bool(saved["in_model"])
    np.testing.assert_allclose(saved["idf"], want, rtol=1e-6)
    assert not np.allclose(saved["idf"], all_rows)  # validation rows left out
    model = artifacts.load_model(str(tmp / "wd"))
    np.testing.assert_allclose(
        model.get_layer(preprocessing.NORMALIZATION_LAYER).idf.numpy(), want,
        rtol=1e-6)


def test_exported_models_take_raw_features(run):
    tmp, _, _, test, result = run
    wd = str(tmp / "wd")
    model = artifacts.load_model(wd)
    assert isinstance(model.layers[1], FeatureNormalization)
    # the network, or the network fused with the tree
    assert isinstance(decoding.scoring_layer(model),
                      (UniformSparseDense, FusedScores))
    raw = xdata.load_dataset(str(tmp / "test.txt"))
    np.testing.assert_array_equal(raw.features.toarray(),
                                  test.features.toarray())
    as_model_takes = preprocessing.load_for_model(str(tmp / "test.txt"), wd)
    np.testing.assert_array_equal(as_model_takes.features.toarray(),
                                  raw.features.toarray())  # raw: in the model
    x, _ = xdata.make_tf_dataset(raw, 60).get_single_element()
    scores = model(x, training=False).numpy()
    ev = metrics.XMCEvaluator(ks=(1, 3, 5), inv_propensities=np.load(
        os.path.join(wd, "inv_propensities.npy")))
    ev.update(np.argsort(-scores, axis=1, kind="stable")[:, :5], raw.labels)
    for k in ("P@1", "P@3", "PSP@5"):
        assert ev.result()[k] == pytest.approx(result[k], abs=1e-9)
    served = saving.load_saved_model(os.path.join(wd, "saved_model"))
    out = served.serve(x.indices, x.values, x.dense_shape)
    np.testing.assert_allclose(out["scores"].numpy(),
                               tf.math.top_k(scores, 5).values.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_older_workdirs_are_normalised_outside_the_model(tmp_path):
    data = _counts(30)
    xdata.write_xc(tmp_path / "d.txt", data)
    want, idf = xdata.normalize_features(data.features, "tfidf")
    np.savez(tmp_path / "preprocessing.npz", method="tfidf", idf=idf)  # no in_model
    got = preprocessing.load_for_model(str(tmp_path / "d.txt"), str(tmp_path))
    np.testing.assert_allclose(got.features.toarray(), want.toarray(),
                               rtol=1e-6)
    np.savez(tmp_path / "preprocessing.npz", method="tfidf", idf=idf[:5])
    with pytest.raises(preprocessing.DataError, match="trained on 5"):
        preprocessing.load_for_model(str(tmp_path / "d.txt"), str(tmp_path))
