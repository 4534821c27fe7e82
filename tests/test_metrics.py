"""Tests for xmc_tf.metrics against plain brute-force references."""

import json
import math

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import metrics as M


# ---------------------------------------------------------------------------
# Independent brute-force reference (plain loops, full sorting)
# ---------------------------------------------------------------------------


def ref_ranking(row):
    """All label ids sorted by descending score, ties by ascending id."""
    return sorted(range(len(row)), key=lambda l: (-row[l], l))


def ref_metrics(scores, label_sets, ks, inv_prop=None):
    """Reference metrics in percent, computed instance by instance."""
    n = len(label_sets)
    out = {}
    for k in ks:
        p = ndcg = rec = 0.0
        psp_num = psp_den = 0.0
        for i in range(n):
            y = set(int(l) for l in label_sets[i])
            top = ref_ranking(list(scores[i]))[:k]
            hits = [1.0 if l in y else 0.0 for l in top]
            p += sum(hits) / k
            dcg = sum(h / math.log2(r + 2) for r, h in enumerate(hits))
            idcg = sum(1.0 / math.log2(r + 2) for r in range(min(k, len(y))))
            ndcg += dcg / idcg if y else 0.0
            rec += sum(hits) / len(y) if y else 0.0
            if inv_prop is not None:
                psp_num += sum(h * inv_prop[l] for h, l in zip(hits, top))
                best = sorted((inv_prop[l] for l in y), reverse=True)[:k]
                psp_den += sum(best)
        out[f"P@{k}"] = 100 * p / n
        out[f"nDCG@{k}"] = 100 * ndcg / n
        out[f"R@{k}"] = 100 * rec / n
        if inv_prop is not None:
            out[f"PSP@{k}"] = 100 * psp_num / psp_den if psp_den else 0.0
    out["num_instances"] = n
    return out


def random_problem(rng, n=40, num_labels=12, max_pos=5, tie_scores=False,
                   empty_frac=0.2):
    """Random scores and label sets; some instances have no labels."""
    if tie_scores:
        scores = rng.integers(0, 4, size=(n, num_labels)).astype(np.float32)
    else:
        scores = rng.standard_normal((n, num_labels)).astype(np.float32)
    label_sets = []
    for _ in range(n):
        if rng.random() < empty_frac:
            label_sets.append(np.zeros(0, dtype=np.int64))
        else:
            m = rng.integers(1, max_pos + 1)
            label_sets.append(np.sort(rng.choice(num_labels, m, replace=False)))
    return scores, label_sets


def to_csr(label_sets, num_labels):
    rows = np.repeat(np.arange(len(label_sets)), [len(s) for s in label_sets])
    cols = np.concatenate(label_sets) if rows.size else np.zeros(0, int)
    return sp.csr_matrix((np.ones(rows.size), (rows, cols)),
                         shape=(len(label_sets), num_labels))


def to_padded(label_sets, width=None):
    width = width or max(1, max(len(s) for s in label_sets))
    out = -np.ones((len(label_sets), width), dtype=np.int64)
    for i, s in enumerate(label_sets):
        out[i, : len(s)] = s
    return out


def to_dense(label_sets, num_labels):
    out = np.zeros((len(label_sets), num_labels), dtype=np.float32)
    for i, s in enumerate(label_sets):
        out[i, s] = 1.0
    return out


def assert_dicts_close(got, want, tol=1e-9):
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=tol), key


# ---------------------------------------------------------------------------
# Propensities
# ---------------------------------------------------------------------------


def test_inverse_propensities_hand_computed():
    n, a, b = 100, 0.55, 1.5
    counts = np.array([0, 1, 5, 100])
    c = (math.log(n) - 1) * (b + 1) ** a
    want = []
    for n_l in counts:
        p = 1.0 / (1.0 + c * math.exp(-a * math.log(n_l + b)))
        want.append(1.0 / p)
    got = M.inverse_propensities(counts, num_instances=n)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # Spot value by hand: N=100, N_l=0 -> 1 + (ln100 - 1) * 2.5**.55 * 1.5**-.55
    assert got[0] == pytest.approx(1 + 3.605170 * 1.655263 * 0.800110, rel=1e-5)
    # Rare labels get larger weights.
    assert np.all(np.diff(got) < 0)


def test_inverse_propensities_from_matrix_and_params():
    rng = np.random.default_rng(0)
    dense = (rng.random((30, 7)) < 0.3).astype(np.float32)
    counts = dense.sum(0).astype(np.float64)
    want = M.inverse_propensities(counts, num_instances=30, A=0.6, B=2.6)
    np.testing.assert_allclose(
        M.inverse_propensities(sp.csr_matrix(dense), A=0.6, B=2.6), want)
    np.testing.assert_allclose(M.inverse_propensities(dense, A=0.6, B=2.6), want)
    c = (math.log(30) - 1) * 3.6 ** 0.6
    np.testing.assert_allclose(want, 1 + c * (counts + 2.6) ** -0.6)
    with pytest.raises(ValueError):
        M.inverse_propensities(counts)  # frequencies need num_instances
    with pytest.raises(ValueError):
        M.inverse_propensities(np.array([-1, 2]), num_instances=5)
    with pytest.raises(ValueError):
        M.inverse_propensities(np.zeros((2, 2, 2)))


# ---------------------------------------------------------------------------
# top_k
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ties", [False, True])
def test_top_k_matches_full_sort(ties):
    rng = np.random.default_rng(1)
    scores, _ = random_problem(rng, n=50, num_labels=15, tie_scores=ties)
    for k in (1, 2, 5, 14, 15):
        got = M.top_k(scores, k)
        assert got.dtype == np.int64 and got.shape == (50, k)
        want = [ref_ranking(list(row))[:k] for row in scores]
        np.testing.assert_array_equal(got, want)


def test_top_k_ties_lower_id_first():
    scores = np.array([[0.0, 0.0, 0.0, 0.0, 0.0],
                       [1.0, 2.0, 2.0, 1.0, 2.0],
                       [5.0, 1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(
        M.top_k(scores, 3), [[0, 1, 2], [1, 2, 4], [0, 1, 2]])
    np.testing.assert_array_equal(M.top_k(scores, 2), [[0, 1], [1, 2], [0, 1]])


def test_top_k_errors():
    with pytest.raises(ValueError):
        M.top_k(np.zeros((2, 3)), 0)
    with pytest.raises(ValueError):
        M.top_k(np.zeros((2, 3)), 4)
    with pytest.raises(ValueError):
        M.top_k(np.zeros(3), 1)
    with pytest.raises(ValueError):
        M.top_k(np.array([[0.0, np.nan]]), 1)
    assert M.top_k(np.zeros((0, 3)), 2).shape == (0, 2)


# ---------------------------------------------------------------------------
# XMCEvaluator
# ---------------------------------------------------------------------------


def test_hand_computed_toy():
    # 3 labels, 2 instances.
    scores = np.array([[0.1, 0.7, 0.2],    # ranking 1, 2, 0
                       [0.6, 0.3, 0.1]])   # ranking 0, 1, 2
    labels = [np.array([1, 0]), np.array([2])]
    inv_p = np.array([1.0, 2.0, 4.0])
    r = M.evaluate_scores([scores], to_csr(labels, 3), ks=(1, 2, 3),
                          inv_propensities=inv_p)
    assert r["P@1"] == pytest.approx(50.0)               # (1 + 0) / 2
    assert r["P@2"] == pytest.approx(25.0)               # (1/2 + 0) / 2
    assert r["P@3"] == pytest.approx(100 * (2 / 3 + 1 / 3) / 2)
    assert r["R@1"] == pytest.approx(25.0)               # (1/2 + 0) / 2
    assert r["R@3"] == pytest.approx(100.0)
    # nDCG@3, instance 0: hits at ranks 1, 3 over IDCG of 2 labels;
    # instance 1: hit at rank 3 over IDCG of 1 label.
    d = [1 / math.log2(r + 1) for r in (1, 2, 3)]
    want = ((d[0] + d[2]) / (d[0] + d[1]) + d[2] / d[0]) / 2
    assert r["nDCG@3"] == pytest.approx(100 * want)
    # PSP@1: numerators 2 (label 1) and 0; denominators 2 and 4.
    assert r["PSP@1"] == pytest.approx(100 * (2 + 0) / (2 + 4))
    # PSP@3: numerators 2 + 1 and 4; denominators 2 + 1 and 4 -> 100 %.
    assert r["PSP@3"] == pytest.approx(100.0)
    assert r["num_instances"] == 2


def test_result_keys_and_units():
    ev = M.XMCEvaluator(ks=(5, 1, 3, 3))
    assert ev.ks == (1, 3, 5)
    ev.update(np.array([[0, 1, 2, 3, 4]]), [np.array([0, 1, 2, 3, 4])])
    r = ev.result()
    assert set(r) == {"P@1", "P@3", "P@5", "nDCG@1", "nDCG@3", "nDCG@5",
                      "R@1", "R@3", "R@5", "num_instances"}
    assert r["P@5"] == 100.0 and r["nDCG@5"] == pytest.approx(100.0)
    assert r["R@1"] == pytest.approx(20.0)
    ev = M.XMCEvaluator(ks=(1,), inv_propensities=np.ones(5))
    assert "PSP@1" in ev.result() and ev.result()["PSP@1"] == 0.0


@pytest.mark.parametrize("ties", [False, True])
def test_evaluator_matches_reference_all_label_formats(ties):
    rng = np.random.default_rng(2 + ties)
    num_labels = 12
    scores, label_sets = random_problem(rng, n=60, num_labels=num_labels,
                                        tie_scores=ties)
    inv_p = M.inverse_propensities(rng.integers(0, 50, num_labels),
                                   num_instances=200)
    ks = (1, 3, 5, 8)
    want = ref_metrics(scores, label_sets, ks, inv_p)
    formats = [to_csr(label_sets, num_labels), label_sets,
               to_padded(label_sets), to_padded(label_sets, width=9),
               to_dense(label_sets, num_labels),
               to_dense(label_sets, num_labels) > 0]
    for fmt in formats:
        ev = M.XMCEvaluator(ks=ks, inv_propensities=inv_p)
        ev.update_scores(scores, fmt)
        assert_dicts_close(ev.result(), want)
    # Without propensities: no PSP keys.
    ev = M.XMCEvaluator(ks=ks)
    ev.update(M.top_k(scores, 8), label_sets)
    assert_dicts_close(ev.result(),
                       {k: v for k, v in want.items() if not k.startswith("PSP")})


def test_duplicate_and_padding_labels_count_once():
    ev1 = M.XMCEvaluator(ks=(1, 2), inv_propensities=[1.0, 2.0, 3.0])
    ev1.update(np.array([[2, 0]]), [np.array([0, 0, -1, 2, 2])])
    ev2 = M.XMCEvaluator(ks=(1, 2), inv_propensities=[1.0, 2.0, 3.0])
    ev2.update(np.array([[2, 0]]), [np.array([0, 2])])
    assert ev1.result() == ev2.result()
    assert ev1.result()["R@1"] == pytest.approx(50.0)


def test_instances_without_labels():
    scores = np.array([[0.3, 0.2, 0.1], [0.1, 0.2, 0.3]])
    ev = M.XMCEvaluator(ks=(1, 3), inv_propensities=np.array([1.0, 2.0, 3.0]))
    ev.update_scores(scores, [np.array([], dtype=np.int64), np.array([2])])
    r = ev.result()
    # The empty instance counts 0 in every average (but is counted).
    assert r["num_instances"] == 2
    assert r["P@1"] == pytest.approx(50.0)
    assert r["nDCG@1"] == pytest.approx(50.0)
    assert r["R@3"] == pytest.approx(50.0)
    # PSP: empty instance adds 0 to numerator and denominator.
    assert r["PSP@1"] == pytest.approx(100.0)
    # Only empty instances: all zeros, no division by zero.
    ev = M.XMCEvaluator(ks=(1, 3), inv_propensities=np.array([1.0, 2.0, 3.0]))
    ev.update_scores(scores, sp.csr_matrix((2, 3)))
    r = ev.result()
    assert all(v == 0.0 for key, v in r.items() if key != "num_instances")


def test_k_larger_than_number_of_true_labels():
    # One true label, ranked first; k = 5 > |y| = 1.
    ev = M.XMCEvaluator(ks=(5,), inv_propensities=np.arange(1.0, 7.0))
    ev.update(np.array([[3, 0, 1, 2, 4]]), [np.array([3])])
    r = ev.result()
    assert r["P@5"] == pytest.approx(20.0)
    assert r["nDCG@5"] == pytest.approx(100.0)   # IDCG uses min(k, |y|) = 1
    assert r["R@5"] == pytest.approx(100.0)
    assert r["PSP@5"] == pytest.approx(100.0)    # best achievable is w_3 only


def test_negative_prediction_ids_are_misses():
    ev = M.XMCEvaluator(ks=(1, 2))
    ev.update(np.array([[-1, 0]]), [np.array([0])])
    assert ev.result()["P@1"] == 0.0 and ev.result()["P@2"] == 50.0


def test_batched_equals_one_shot():
    rng = np.random.default_rng(4)
    num_labels = 20
    scores, label_sets = random_problem(rng, n=97, num_labels=num_labels)
    labels = to_csr(label_sets, num_labels)
    inv_p = M.inverse_propensities(labels)
    one = M.evaluate_scores([scores], labels, inv_propensities=inv_p)
    for bs in (1, 7, 32, 96):
        batches = (scores[i:i + bs] for i in range(0, len(scores), bs))
        assert_dicts_close(
            M.evaluate_scores(batches, labels, inv_propensities=inv_p), one)
    # Streaming in arbitrary order with update() gives the same result.
    ev = M.XMCEvaluator(inv_propensities=inv_p)
    perm = rng.permutation(len(scores))
    for chunk in np.array_split(perm, 5):
        ev.update(M.top_k(scores[chunk], 5), labels[chunk])
    assert_dicts_close(ev.result(), one)
    assert_dicts_close(one, ref_metrics(scores, label_sets, (1, 3, 5), inv_p))


def test_evaluator_errors():
    with pytest.raises(ValueError):
        M.XMCEvaluator(ks=(0, 1))
    with pytest.raises(ValueError):
        M.XMCEvaluator(ks=())
    with pytest.raises(ValueError):
        M.XMCEvaluator(inv_propensities=np.ones((2, 2)))
    ev = M.XMCEvaluator(ks=(1, 3), inv_propensities=np.ones(4))
    with pytest.raises(ValueError):  # too few columns
        ev.update(np.array([[0, 1]]), [np.array([0])])
    with pytest.raises(ValueError):  # row mismatch
        ev.update(np.array([[0, 1, 2]]), [np.array([0]), np.array([1])])
    with pytest.raises(ValueError):  # repeated predicted id
        ev.update(np.array([[0, 1, 0]]), [np.array([0])])
    with pytest.raises(ValueError):  # id outside the propensities
        ev.update(np.array([[0, 1, 2]]), [np.array([7])])
    with pytest.raises(ValueError):  # max(ks) > L
        ev.update_scores(np.zeros((1, 2)), [np.array([0])])
    with pytest.raises(ValueError):
        ev.update(np.array([[0.0, 1.0, 2.0]]), [np.array([0])])
    labels = sp.csr_matrix(np.eye(4))
    with pytest.raises(ValueError):  # fewer score rows than labels
        M.evaluate_scores([np.zeros((3, 4))], labels)
    with pytest.raises(ValueError):  # more score rows than labels
        M.evaluate_scores([np.zeros((3, 4)), np.zeros((2, 4))], labels)


# ---------------------------------------------------------------------------
# Keras metrics
# ---------------------------------------------------------------------------


def keras_metrics(k, inv_p):
    return {"P": M.PrecisionAtK(k), "nDCG": M.NDCGAtK(k), "R": M.RecallAtK(k),
            "PSP": M.PSPAtK(k, inv_p)}


@pytest.mark.parametrize("encoding", ["ids", "ids_int32", "dense", "bool"])
def test_keras_metrics_match_numpy(encoding):
    rng = np.random.default_rng(5)
    num_labels = 12
    scores, label_sets = random_problem(rng, n=50, num_labels=num_labels,
                                        tie_scores=True)
    inv_p = M.inverse_propensities(rng.integers(0, 30, num_labels),
                                   num_instances=100)
    ks = (1, 3, 5)
    want = M.evaluate_scores([scores], to_csr(label_sets, num_labels), ks=ks,
                             inv_propensities=inv_p)
    for k in ks:
        ms = keras_metrics(k, inv_p)
        for lo, hi in ((0, 17), (17, 18), (18, 50)):  # several batches
            sets = label_sets[lo:hi]
            if encoding.startswith("ids"):
                y = to_padded(sets, width=6)
                if encoding == "ids_int32":
                    y = y.astype(np.int32)
            else:
                y = to_dense(sets, num_labels)
                if encoding == "bool":
                    y = y > 0
            for m in ms.values():
                m.update_state(tf.constant(y), tf.constant(scores[lo:hi]))
        for name, m in ms.items():
            assert float(m.result()) * 100 == pytest.approx(
                want[f"{name}@{k}"], abs=1e-4), (name, k)


def test_keras_metrics_graph_mode_unknown_shapes():
    rng = np.random.default_rng(6)
    scores, label_sets = random_problem(rng, n=20, num_labels=10)
    inv_p = M.inverse_propensities(rng.integers(0, 30, 10), num_instances=50)
    want = M.evaluate_scores([scores], to_csr(label_sets, 10), ks=(3,),
                             inv_propensities=inv_p)
    ms = keras_metrics(3, inv_p)
    for name, m in ms.items():
        fn = tf.function(m.update_state, input_signature=[
            tf.TensorSpec([None, None], tf.int64),
            tf.TensorSpec([None, None], tf.float32)])
        fn(to_padded(label_sets[:10]), scores[:10])
        fn(to_padded(label_sets[10:], width=7), scores[10:])
        assert float(m.result()) * 100 == pytest.approx(want[f"{name}@3"],
                                                        abs=1e-4)


def test_keras_hand_computed_and_no_labels():
    y_pred = tf.constant([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.5, 0.5, 0.5]])
    y_true = tf.constant([[1, 0], [2, -1], [-1, -1]])  # last: no labels
    m = M.PrecisionAtK(1)
    m.update_state(y_true, y_pred)
    assert float(m.result()) == pytest.approx(1 / 3)
    m = M.NDCGAtK(3)
    m.update_state(y_true, y_pred)
    # Rankings: [1, 2, 0] (hits at ranks 1, 3), [0, 1, 2] (hit at rank 3).
    d = [1 / math.log2(r + 1) for r in (1, 2, 3)]
    want = ((d[0] + d[2]) / (d[0] + d[1]) + d[2] / d[0] + 0.0) / 3
    assert float(m.result()) == pytest.approx(want, abs=1e-6)
    m = M.RecallAtK(1)
    m.update_state(y_true, y_pred)
    assert float(m.result()) == pytest.approx((0.5 + 0 + 0) / 3)
    # All instances without labels -> 0, not NaN.
    m = M.PSPAtK(2, [1.0, 2.0, 3.0])
    m.update_state(tf.constant([[-1]]), y_pred[:1])
    assert float(m.result()) == 0.0
    # Single id per instance, shape [b].
    m = M.PrecisionAtK(1)
    m.update_state(tf.constant([1, 1, 0]), y_pred)
    assert float(m.result()) == pytest.approx(2 / 3)  # ties -> id 0 for row 3


def test_keras_sample_weight_equals_repetition():
    rng = np.random.default_rng(7)
    scores, label_sets = random_problem(rng, n=8, num_labels=6)
    inv_p = np.linspace(1.0, 3.0, 6)
    y = to_padded(label_sets, width=5)
    reps = np.array([1, 2, 0, 3, 1, 1, 2, 1])
    for name in ("P", "nDCG", "R", "PSP"):
        a = keras_metrics(3, inv_p)[name]
        b = keras_metrics(3, inv_p)[name]
        a.update_state(y, scores, sample_weight=reps.astype(np.float32))
        b.update_state(np.repeat(y, reps, 0), np.repeat(scores, reps, 0))
        assert float(a.result()) == pytest.approx(float(b.result()), abs=1e-6)


def test_keras_reset_state():
    inv_p = np.array([1.0, 2.0, 5.0])
    y_pred = np.array([[0.1, 0.2, 0.9]], np.float32)
    for m in keras_metrics(1, inv_p).values():
        m.update_state(np.array([[0]]), y_pred)   # miss
        assert float(m.result()) == 0.0
        m.reset_state()
        m.update_state(np.array([[2]]), y_pred)   # hit
        assert float(m.result()) == pytest.approx(1.0)
    psp = M.PSPAtK(1, inv_p)
    psp.reset_state()   # must not wipe the propensities
    np.testing.assert_array_equal(psp.inv_propensities, inv_p)


def test_keras_serialization_round_trip():
    inv_p = np.array([1.5, 2.0, 7.25])
    y_true = np.array([[2, 0, -1], [1, -1, -1]])
    y_pred = np.array([[0.1, 0.5, 0.9], [0.3, 0.2, 0.1]], np.float32)
    for m in [M.PrecisionAtK(2, name="p2"), M.NDCGAtK(3), M.RecallAtK(1),
              M.PSPAtK(2, inv_p)]:
        cfg = keras.metrics.serialize(m)

        json.dumps(cfg)  # JSON-serialisable
        m2 = keras.metrics.deserialize(cfg)
        assert type(m2) is type(m)
        assert m2.name == m.name and m2.k == m.k
        m2b = type(m).from_config(m.get_config())
        for mm in (m, m2, m2b):
            mm.update_state(y_true, y_pred)
        assert float(m2.result()) == pytest.approx(float(m.result()))
        assert float(m2b.result()) == pytest.approx(float(m.result()))
    m = M.PSPAtK(1, inv_p, serialize_propensities=False)
    cfg = m.get_config()
    assert cfg["inv_propensities"] is None
    with pytest.raises(ValueError):
        M.PSPAtK.from_config(cfg)


def test_keras_errors():
    for cls in (M.PrecisionAtK, M.NDCGAtK, M.RecallAtK):
        with pytest.raises(ValueError):
            cls(0)
    with pytest.raises(ValueError):
        M.PSPAtK(0, [1.0])
    with pytest.raises(ValueError):
        M.PSPAtK(1)
    with pytest.raises(ValueError):  # k > L
        M.PrecisionAtK(4).update_state(np.array([[0]]), np.zeros((1, 3)))
    # A float [b, n] narrower than L is float ids (a strategy's cast), so
    # the width check applies to SparseTensor targets, whose width is L.
    with pytest.raises(ValueError, match="SparseTensor with 2 columns"):
        M.PrecisionAtK(1).update_state(
            tf.sparse.from_dense(np.ones((1, 2), np.float32)),
            np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="y_pred must be"):
        M.PrecisionAtK(1).update_state(np.array([[0]]),
                                       np.zeros((1, 3, 1), np.float32))


def test_keras_model_evaluate():
    rng = np.random.default_rng(8)
    num_labels = 9
    x = rng.standard_normal((32, 4)).astype(np.float32)
    _, label_sets = random_problem(rng, n=32, num_labels=num_labels)
    inv_p = np.linspace(1.0, 4.0, num_labels)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(num_labels)])
    model.compile(loss=lambda y_true, y_pred: tf.reduce_mean(y_pred) * 0.0,
                  metrics=[M.PrecisionAtK(3), M.NDCGAtK(3), M.RecallAtK(3),
                           M.PSPAtK(3, inv_p)])
    logs = model.evaluate(x, to_padded(label_sets), batch_size=10,
                          return_dict=True, verbose=0)
    want = M.evaluate_scores([model.predict(x, verbose=0)],
                             to_csr(label_sets, num_labels), ks=(3,),
                             inv_propensities=inv_p)
    assert logs["precision_at_3"] * 100 == pytest.approx(want["P@3"], abs=1e-4)
    assert logs["ndcg_at_3"] * 100 == pytest.approx(want["nDCG@3"], abs=1e-4)
    assert logs["recall_at_3"] * 100 == pytest.approx(want["R@3"], abs=1e-4)
    assert logs["psp_at_3"] * 100 == pytest.approx(want["PSP@3"], abs=1e-4)
