"""Every loss and Keras metric takes y_true in the four label forms.

The forms (``xmc_tf.losses.targets``): int ids padded with -1, the same ids
cast to float (what Keras' build under ``tf.distribute`` feeds), a dense
multi-hot ``[b, m]`` and a ``tf.SparseTensor`` ``[b, m]`` (what Keras 3.15
hands a loss for a scipy CSR ``y``: checked below).  Each loss is compared
with a NumPy formula, each metric with the NumPy evaluator
(:class:`xmc_tf.metrics.XMCEvaluator`).  Also: ``fit(X_csr, Y_csr)`` of a
plain Keras model; sampled / SCENT losses refused by ``compile`` with one
message; ``get_config`` round trips of every public loss and metric.
"""

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from op_requirements import needs_ops
from xmc_tf import losses as L
from xmc_tf import metrics as M
from xmc_tf.data import label_matrix, padded_label_ids
from xmc_tf.ops.mach import PRIME, MachHashing

NUM_LABELS = 13


def _problem(seed=0, b=9, m=NUM_LABELS):
    rng = np.random.default_rng(seed)
    sets = [sorted(set(rng.integers(0, m, size=rng.integers(0, 4)).tolist()))
            for _ in range(b)]
    sets[0] = []  # a row without labels
    scores = rng.normal(size=(b, m)).astype(np.float32)
    return sets, scores


def _forms(sets, m=NUM_LABELS):
    """The four y_true forms of the same labels, by name."""
    csr = label_matrix([np.asarray(s, np.int64) for s in sets], m)
    ids = padded_label_ids(csr, m, width=4)
    coo = csr.tocoo()
    sparse = tf.SparseTensor(np.stack([coo.row, coo.col], 1).astype(np.int64),
                             coo.data.astype(np.float32), coo.shape)
    return {"ids": tf.constant(ids),
            "float_ids": tf.constant(ids.astype(np.float32)),
            "multi_hot": tf.constant(csr.toarray()),
            "sparse": sparse}


def _dense(sets, m=NUM_LABELS):
    y = np.zeros((len(sets), m), np.float64)
    for i, s in enumerate(sets):
        y[i, s] = 1.0
    return y


# ---------------------------------------------------------------------------
# The shared conversion.


def test_target_label_ids_of_every_form():
    sets, _ = _problem()
    for name, y in _forms(sets).items():
        ids = L.target_label_ids(y, NUM_LABELS).numpy()
        got = [sorted(set(r[r >= 0].tolist())) for r in ids]
        assert got == sets, name
    # One id per instance ([b]), int and float.
    for y in (tf.constant([3, -1, 0]), tf.constant([3.0, -1.0, 0.0])):
        np.testing.assert_array_equal(L.target_label_ids(y, 5).numpy(),
                                      [[3], [-1], [0]])
    with pytest.raises(ValueError, match="SparseTensor with 4 columns"):
        L.target_label_ids(tf.sparse.from_dense(tf.ones([2, 4])), 5)
    # Width known only at run time: ids and multi-hot decided then.
    fn = tf.function(lambda y: L.target_label_ids(y, NUM_LABELS),
                     input_signature=[tf.TensorSpec([None, None], tf.float32)])
    forms = _forms(sets)
    for name in ("float_ids", "multi_hot"):
        ids = fn(forms[name]).numpy()
        assert [sorted(set(r[r >= 0].tolist())) for r in ids] == sets, name


# ---------------------------------------------------------------------------
# Losses against NumPy.


def _np_squared_hinge(y, s):
    return np.mean(np.sum(np.maximum(0, 1 - (2 * y - 1) * s) ** 2, -1))


def _np_bce(y, s):
    return np.mean(np.sum(np.maximum(s, 0) - s * y + np.log1p(np.exp(-abs(s))),
                          -1))


def _np_softmax(y, s):
    lse = np.log(np.exp(s).sum(-1))
    n = y.sum(-1)
    per = np.where(n > 0, (n * lse - (y * s).sum(-1)) / np.maximum(n, 1), 0.0)
    return per.mean()


@pytest.mark.parametrize("loss, ref", [
    (L.SquaredHinge(), _np_squared_hinge),
    (L.BinaryCrossentropy(), _np_bce),
    (L.SoftmaxCrossentropy(), _np_softmax)])
@pytest.mark.parametrize("form", ["ids", "float_ids", "multi_hot", "sparse"])
def test_losses_agree_with_numpy_in_every_form(loss, ref, form):
    sets, scores = _problem(1)
    want = ref(_dense(sets), scores.astype(np.float64))
    got = float(loss(_forms(sets)[form], tf.constant(scores)))
    assert got == pytest.approx(want, rel=1e-5)
    # Inside a graph too (the fused squared hinge takes the ids there).
    fn = tf.function(lambda y, s: loss(y, s))
    assert float(fn(_forms(sets)[form], tf.constant(scores))) == (
        pytest.approx(want, rel=1e-5))


def _np_buckets(h):
    j = np.arange(h.num_labels, dtype=np.int64)[:, None]
    a, b = np.asarray(h.hash_a, np.int64), np.asarray(h.hash_b, np.int64)
    return ((a[None] * j + b[None]) % PRIME) % h.num_buckets  # [m, R]


@pytest.mark.parametrize("form", ["ids", "float_ids", "multi_hot", "sparse"])
def test_mach_losses_agree_with_numpy_in_every_form(form):
    sets, _ = _problem(2)
    h = MachHashing.random(NUM_LABELS, 4, 3, seed=5)
    R, B = 3, 4
    logits = np.random.default_rng(3).normal(size=(len(sets), R, B))
    buckets = _np_buckets(h)
    soft, hard = np.zeros((len(sets), R, B)), np.zeros((len(sets), R, B))
    for i, s in enumerate(sets):
        for j in s:
            soft[i, np.arange(R), buckets[j]] += 1.0 / len(s)
            hard[i, np.arange(R), buckets[j]] = 1.0
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want_soft = np.mean(np.mean(-(soft * logp).sum(-1), -1))
    bce = (np.maximum(logits, 0) - logits * hard
           + np.log1p(np.exp(-abs(logits))))
    want_hard = np.mean(np.mean(bce.sum(-1), -1))
    y = _forms(sets)[form]
    x = tf.constant(logits, tf.float32)
    assert float(L.MachSoftmaxCrossentropy(h)(y, x)) == pytest.approx(
        want_soft, rel=1e-5)
    assert float(L.MachBinaryCrossentropy(h)(y, x)) == pytest.approx(
        want_hard, rel=1e-5)


# ---------------------------------------------------------------------------
# Metrics against the NumPy evaluator.


@pytest.mark.parametrize("form", ["ids", "float_ids", "multi_hot", "sparse"])
def test_metrics_agree_with_numpy_evaluator_in_every_form(form):
    sets, scores = _problem(4, b=40)
    inv_p = np.linspace(1.0, 3.0, NUM_LABELS)
    ev = M.XMCEvaluator(ks=(1, 3), inv_propensities=inv_p)
    ev.update_scores(scores, [np.asarray(s, np.int64) for s in sets])
    want = ev.result()
    y = _forms(sets)[form]
    for k in (1, 3):
        for metric, key in ((M.PrecisionAtK(k), "P"), (M.NDCGAtK(k), "nDCG"),
                            (M.RecallAtK(k), "R"),
                            (M.PSPAtK(k, inv_p), "PSP")):
            metric.update_state(y, scores)
            assert float(metric.result()) * 100 == pytest.approx(
                want[f"{key}@{k}"], rel=1e-6, abs=1e-9), (key, k, form)


@needs_ops("xmc_mach_top_k")
@pytest.mark.parametrize("form", ["ids", "float_ids", "multi_hot", "sparse"])
def test_mach_precision_agrees_with_numpy_in_every_form(form):
    sets, _ = _problem(5, b=30)
    h = MachHashing.random(NUM_LABELS, 5, 3, seed=1)
    logits = np.random.default_rng(6).normal(size=(30, 3, 5)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    buckets = _np_buckets(h)
    dense = probs[:, np.arange(3)[None, :], buckets].mean(-1)  # [b, m]
    ev = M.XMCEvaluator(ks=(2,))
    ev.update_scores(dense, [np.asarray(s, np.int64) for s in sets])
    metric = M.MachPrecisionAtK(2, h, activation="softmax")
    metric.update_state(_forms(sets)[form], logits)
    assert float(metric.result()) * 100 == pytest.approx(ev.result()["P@2"])


# ---------------------------------------------------------------------------
# A plain Keras model fitted on scipy CSR features and labels.


def test_keras_hands_a_sparse_tensor_for_a_csr_y():
    seen = []

    class Spy(keras.losses.Loss):
        def __call__(self, y_true, y_pred, sample_weight=None):
            seen.append((type(y_true).__name__, y_true.dtype.name))
            return tf.reduce_mean(y_pred)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)])
    model.compile("sgd", Spy())
    y = sp.csr_matrix(np.eye(8, 5, dtype=np.float32))
    model.fit(np.ones((8, 3), np.float32), y, batch_size=4, verbose=0)
    assert set(seen) == {("SparseTensor", "float32")}


@pytest.mark.parametrize("output", ["uniform_sparse", "dense"])
def test_plain_model_fits_csr_features_and_labels(output):
    data = xmc_tf.data.make_synthetic(512, 60, 40, labels_per_instance=2,
                                      features_per_instance=8, noise=0.05,
                                      seed=3)
    X, Y = data.features.astype(np.float32), data.labels
    assert sp.issparse(X) and sp.issparse(Y)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((X.shape[1],), sparse=True)
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    head = (xmc_tf.layers.UniformSparseDense(40, 16, seed=0)
            if output == "uniform_sparse" else keras.layers.Dense(40))
    model = keras.Model(inputs, head(hidden))
    model.compile(keras.optimizers.Adam(0.01), L.SquaredHinge(),
                  metrics=[M.PrecisionAtK(1)], jit_compile=False)
    hist = model.fit(X, Y, batch_size=64, epochs=4, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    logs = model.evaluate(X, Y, batch_size=128, verbose=0, return_dict=True)
    ev = M.XMCEvaluator(ks=(1,))
    ev.update_scores(model.predict(X, batch_size=128, verbose=0), Y)
    assert logs["precision_at_1"] * 100 == pytest.approx(ev.result()["P@1"],
                                                         abs=1e-4)
    assert logs["precision_at_1"] > 0.5  # learnt (chance: ~0.05)
    # The squared hinge of the same predictions, by NumPy.
    scores = model.predict(X, batch_size=128, verbose=0).astype(np.float64)
    assert logs["loss"] == pytest.approx(
        _np_squared_hinge(Y.toarray(), scores), rel=1e-4)


# ---------------------------------------------------------------------------
# Losses that need a trainer, refused by compile with one message.


@pytest.mark.parametrize("loss, trainer", [
    (L.SampledSquaredHinge(), "xmc_tf.models.SampledTrainer(model, sampler"),
    (L.SampledBinaryCrossentropy(), "xmc_tf.models.SampledTrainer(model, "),
    (L.SampledSoftmax(), "xmc_tf.models.SampledTrainer(model, sampler"),
    (L.ScentLoss(16), "xmc_tf.models.ScentTrainer(model")])
def test_sampled_and_scent_losses_in_compile_name_their_trainer(loss,
                                                                 trainer):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)])
    model.compile("sgd", loss, jit_compile=False)
    x = np.ones((16, 4), np.float32)
    y = np.zeros((16, 2), np.int32)
    with pytest.raises(ValueError, match="cannot be the loss of model.compile"
                       ) as info:
        model.fit(x, y, epochs=1, verbose=0)
    assert trainer in str(info.value)


# ---------------------------------------------------------------------------
# get_config round trips.


def _same_config(a, b):
    assert type(a) is type(b)
    assert a.get_config() == b.get_config()


@pytest.mark.parametrize("make", [
    lambda: L.SquaredHinge(margin=0.5, reduction="sum", name="sh"),
    lambda: L.BinaryCrossentropy(reduction="sum"),
    lambda: L.SoftmaxCrossentropy(name="ce"),
    lambda: L.MachSoftmaxCrossentropy(MachHashing.random(NUM_LABELS, 4, 3,
                                                         seed=5)),
    lambda: L.MachBinaryCrossentropy(MachHashing.random(NUM_LABELS, 4, 3,
                                                        seed=5))])
def test_losses_round_trip_through_keras_serialization(make):
    loss = make()
    back = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(loss))
    _same_config(loss, back)
    sets, scores = _problem(7)
    y = _forms(sets)["ids"]
    if "Mach" in type(loss).__name__:
        scores = np.random.default_rng(1).normal(size=(len(sets), 3, 4))
    x = tf.constant(scores, tf.float32)
    assert float(back(y, x)) == pytest.approx(float(loss(y, x)), rel=1e-6)
    assert float(back(y, x)) != 0.0


def test_sampled_and_scent_losses_round_trip():
    from xmc_tf.samplers import Candidates
    c = Candidates(tf.constant([[5, 6]]), tf.constant([[True, True]]),
                   tf.constant([[-1.0, -2.0]]), tf.constant([[3.0, 1.0]]))
    args = (tf.constant([[0.5]]), tf.constant([[True]]),
            tf.constant([[0.2, -0.3]]), c)
    for loss in (L.SampledSquaredHinge(margin=2.0, reduction="sum"),
                 L.SampledBinaryCrossentropy(name="x"), L.SampledSoftmax()):
        back = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(loss))
        _same_config(loss, back)
        assert float(back(*args)) == pytest.approx(float(loss(*args)))
    scent = L.ScentLoss(10, alpha=3.0, variant="sox", own_term=True)
    back = L.ScentLoss.from_config(scent.get_config())
    _same_config(scent, back)


@pytest.mark.parametrize("make", [
    lambda: M.PrecisionAtK(2), lambda: M.NDCGAtK(3, name="n"),
    lambda: M.RecallAtK(2),
    lambda: M.PSPAtK(2, np.linspace(1.0, 2.0, NUM_LABELS)),
    lambda: M.MachPrecisionAtK(2, MachHashing.random(NUM_LABELS, 5, 3, seed=1),
                               activation="sigmoid")])
def test_metrics_round_trip_through_keras_serialization(make):
    metric = make()
    back = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(metric))
    _same_config(metric, back)
    sets, scores = _problem(8, b=20)
    if isinstance(metric, M.MachPrecisionAtK):
        scores = np.random.default_rng(2).normal(size=(20, 3, 5))
    y = _forms(sets)["ids"]
    for m in (metric, back):
        m.update_state(y, tf.constant(scores, tf.float32))
    assert float(back.result()) == float(metric.result())
    assert float(metric.result()) > 0.0
