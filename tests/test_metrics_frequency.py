"""Metrics per label-frequency bucket (xmc_tf.metrics.evaluate_by_frequency)
against plain-Python loops over the definition."""

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf.metrics import (evaluate_by_frequency, frequency_buckets,
                            inverse_propensities)


def _reference(topk, truth, counts, edges, k, w=None):
    """{bucket name: (n, P@k, R@k, PSP@k)} by loops over instances."""
    bucket, names = frequency_buckets(counts, edges)
    out = {}
    for b, name in [(-1, "0")] + list(enumerate(names)):
        p = r = num = den = 0.0
        n = 0
        for i, labels in enumerate(truth):
            cut = {l for l in labels if bucket[l] == b}
            if not cut:
                continue
            n += 1
            hits = [l for l in topk[i, :k] if l in cut]
            p += len(hits) / k
            r += len(hits) / len(cut)
            if w is not None:
                num += sum(w[l] for l in hits)
                den += sum(sorted((w[l] for l in cut), reverse=True)[:k])
        if n:
            out[name] = (n, 100 * p / n, 100 * r / n,
                         None if w is None else 100 * num / den)
    return out


@pytest.mark.parametrize("multi_label", [False, True])
def test_matches_loops_over_the_definition(multi_label):
    rng = np.random.default_rng(0)
    L, n, k = 300, 500, 5
    counts = rng.zipf(1.6, size=L).clip(max=200)
    counts[:7] = 0  # labels never seen in training
    truth = []
    for _ in range(n):
        size = rng.integers(1, 4) if multi_label else 1
        truth.append(sorted(set(rng.integers(0, L, size).tolist())))
    topk = np.stack([rng.permutation(L)[:k] for _ in range(n)])
    # Make some predictions right, so that every bucket has hits.
    for i in range(0, n, 3):
        topk[i, rng.integers(0, k)] = -2 if truth[i][0] in topk[i] else \
            truth[i][0]
    topk = np.where(topk == -2, -1, topk)
    w = inverse_propensities(counts, num_instances=1000)
    edges = (1, 2, 4, 9, 33)
    got = evaluate_by_frequency(topk, [np.array(t) for t in truth], counts,
                                ks=(1, k), inv_propensities=w, edges=edges)
    want = _reference(topk, truth, counts, edges, k, w)
    assert [row["bucket"] for row in got] == list(want)
    assert got[0]["bucket"] == "0"
    for row in got:
        n_b, p, r, psp = want[row["bucket"]]
        assert row["num_instances"] == n_b
        np.testing.assert_allclose(row[f"P@{k}"], p, rtol=1e-12)
        np.testing.assert_allclose(row[f"R@{k}"], r, rtol=1e-12)
        np.testing.assert_allclose(row[f"PSP@{k}"], psp, rtol=1e-12)
    assert sum(row["num_instances"] for row in got) >= n  # multi-label: more


def test_multi_class_bucket_p1_is_accuracy_of_its_instances():
    counts = np.array([1, 2, 8, 100])
    y = np.array([0, 1, 1, 2, 3, 3, 3])
    pred = np.array([[0, 3], [1, 0], [3, 1], [2, 3], [3, 0], [0, 3], [3, 2]])
    rows = {r["bucket"]: r
            for r in evaluate_by_frequency(pred, y, counts, ks=(1, 2))}
    assert rows["1"]["P@1"] == 100.0 and rows["1"]["num_instances"] == 1
    assert rows["2-3"]["P@1"] == 50.0 and rows["2-3"]["num_instances"] == 2
    assert rows["4-8"]["P@1"] == 100.0
    np.testing.assert_allclose(rows["33+"]["P@1"], 200 / 3)
    assert "9-32" not in rows


def test_sparse_truth_and_custom_edges():
    counts = np.array([0, 5, 50])
    truth = sp.csr_matrix(np.array([[1, 1, 0], [0, 0, 1], [1, 0, 1]]))
    pred = np.array([[1, 0], [2, 1], [0, 2]])
    rows = evaluate_by_frequency(pred, truth, counts, ks=(2,), edges=(1, 10))
    assert [(r["bucket"], r["num_instances"], r["labels"]) for r in rows] == \
        [("0", 2, 1), ("1-9", 1, 1), ("10+", 2, 1)]
    assert [r["P@2"] for r in rows] == [50.0, 50.0, 50.0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(train_counts=np.array([[1, 2]])), "1-D"),
    (dict(train_counts=np.array([1, -1])), "non-negative"),
    (dict(train_counts=np.array([1, 2]), edges=(2, 2)), "increasing"),
    (dict(train_counts=np.array([1, 2]), edges=()), "increasing"),
    (dict(train_counts=np.array([1])), "true label id 1"),
])
def test_bad_input_is_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        evaluate_by_frequency(np.array([[0, 1]]), [[1]], **kwargs)
