"""Tests of the synthetic power-law XMC generator."""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data


def test_shapes_dtypes_and_structure():
    ds = data.make_synthetic(2000, 300, 500, labels_per_instance=4,
                             features_per_instance=20, seed=0)
    assert (ds.num_instances, ds.num_features, ds.num_labels) == (
        2000, 300, 500)
    for m in (ds.features, ds.labels):
        assert isinstance(m, sp.csr_matrix)
        assert m.dtype == np.float32
        assert m.has_canonical_format
        m2 = m.copy()
        m2.has_canonical_format = False
        m2.sum_duplicates()
        np.testing.assert_array_equal(m.indices, m2.indices)
    assert set(np.unique(ds.labels.data).tolist()) == {1.0}
    per_row = ds.labels.getnnz(axis=1)
    assert per_row.min() >= 1
    assert 3.5 < per_row.mean() < 4.5
    assert ds.features.getnnz(axis=1).min() >= 1
    assert 12 < ds.features.getnnz(axis=1).mean() <= 20
    assert (ds.features.data >= 1).all()  # token counts


def test_deterministic_by_seed():
    a = data.make_synthetic(300, 50, 1000, seed=7)
    b = data.make_synthetic(300, 50, 1000, seed=7)
    c = data.make_synthetic(300, 50, 1000, seed=8)
    assert (a.features != b.features).nnz == 0
    assert (a.labels != b.labels).nnz == 0
    assert (a.labels != c.labels).nnz > 0


def test_power_law_label_frequencies():
    ds = data.make_synthetic(20000, 100, 10000, labels_per_instance=5,
                             power_law_exponent=1.0, seed=1)
    freq = np.asarray(ds.labels.sum(axis=0)).ravel()
    # Head much more frequent than tail; frequency ~ rank^-1.
    assert freq[0] > 50 * freq[1000:2000].mean()
    assert freq[:10].mean() > 5 * freq[100:110].mean()
    ranks = np.arange(20, 1000)
    slope = np.polyfit(np.log(ranks + 1), np.log(freq[ranks] + 0.5), 1)[0]
    assert -1.3 < slope < -0.7
    flat = data.make_synthetic(20000, 100, 100, power_law_exponent=0.0,
                               seed=1)
    f = np.asarray(flat.labels.sum(axis=0)).ravel()
    assert f.max() < 1.5 * f.min()


def test_planted_signal_is_learnable():
    ds = data.make_synthetic(6000, 2000, 200, labels_per_instance=3,
                             features_per_instance=30, noise=0.2, seed=2)
    x, _ = data.normalize_features(ds.features, "l2")
    tr, te = slice(0, 5000), slice(5000, 6000)
    w = (x[tr].T @ ds.labels[tr]).tocsc()          # label centroids [D, L]
    col_norm = np.sqrt(np.asarray(w.multiply(w).sum(axis=0))).ravel()
    scores = (x[te] @ w).toarray() / np.maximum(col_norm, 1e-12)
    top1 = scores.argmax(axis=1)
    y_te = ds.labels[te]
    p_at_1 = np.mean([y_te[i, top1[i]] for i in range(y_te.shape[0])])
    # Predicting the most frequent label:
    head = np.asarray(ds.labels[tr].sum(axis=0)).ravel().argmax()
    baseline = y_te[:, head].mean()
    assert p_at_1 > 0.8 and p_at_1 > baseline + 0.4, (p_at_1, baseline)


def test_millions_of_labels_without_dense_memory():
    n, num_labels = 3000, 3_000_000
    tracemalloc.start()
    try:
        ds = data.make_synthetic(n, 5000, num_labels, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ds.labels.shape == (n, num_labels)
    # A dense [N, L] float32 matrix would be 36 GB; we allow O(L) tables.
    assert peak < 100 * num_labels, peak
    assert ds.labels.indices.max() > 1000  # the tail is used


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_labels"):
        data.make_synthetic(10, 10, 0)
    with pytest.raises(ValueError, match="noise"):
        data.make_synthetic(10, 10, 10, noise=1.5)
    with pytest.raises(ValueError, match="labels_per_instance"):
        data.make_synthetic(10, 10, 10, labels_per_instance=0.5)
    with pytest.raises(ValueError, match="num_instances"):
        data.make_synthetic(2.5, 10, 10)
