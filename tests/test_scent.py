"""SCENT (Algorithm 26 of scent-extreme-multiclass): loss, trainer, head.

References are independent of the implementation: a NumPy transcription of
the algorithm's dual step in float64 and plain sums (the paper's formula
as printed, SOX with its step ``alpha_i = gamma exp(-nu)`` substituted
into it), the dense full-softmax logits of the same model, the conditional
entropy of a toy data set (the full softmax's optimum), and Algorithm 26's
momentum recursion written out in NumPy.
"""

import math
import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.job.heads.scent import ScentHead
from xmc_tf.models import ScentTrainer, scent_optimizer
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.losses import ScentLoss, multiclass_labels
from xmc_tf.job.build import build_model
from op_requirements import needs_ops


needs_op = needs_ops("xmc_uniform_sparse_sampled_matmul")


# ---------------------------------------------------------------------------
# NumPy transcription of the dual step (Sec. 6.3, "Closed-form update").


def np_scent_step(nu, visits, scores, labels, columns, ids, alpha,
                  variant="scent", negatives="multiset", log_weight=None):
    """One step of Algorithm 26's dual update, in float64 with plain sums.

    Returns (new nu, new visits, objective, per-row S (nan if unused),
    per-row new nu (nan if unused)).
    """
    scores = np.asarray(scores, np.float64)
    nu_new, visits_new = nu.copy(), visits.copy()
    col = {int(c): k for k, c in enumerate(columns)}
    valid = [i for i in range(len(labels)) if labels[i] >= 0]
    terms, s_rows, nu_rows = [], np.full(len(labels), np.nan), \
        np.full(len(labels), np.nan)
    for i in valid:
        r = scores[i] - scores[i, col[int(labels[i])]]          # R_ij
        if negatives == "multiset":   # the multiset Y_t \ y_i
            others = [int(labels[k]) for k in valid if k != i]
        else:                         # each other class once
            others = sorted({int(labels[k]) for k in valid} - {int(labels[i])})
        if not others:
            continue
        vals = [math.exp(r[col[j]]) * (1.0 if log_weight is None else
                                       math.exp(log_weight[j]))
                for j in others]
        s = sum(vals) / len(others)
        old = nu[ids[i]]
        if visits[ids[i]] == 0:
            new = math.log(s)
        else:
            a = alpha if variant == "scent" else alpha * math.exp(-old)
            new = old + math.log(1 + a * s) - math.log(1 + a * math.exp(old))
        nu_new[ids[i]] = new
        visits_new[ids[i]] += 1
        terms.append(s * math.exp(-new) + new - 1)
        s_rows[i], nu_rows[i] = s, new
    obj = float(np.mean(terms)) if terms else 0.0
    return nu_new, visits_new, obj, s_rows, nu_rows


def _random_batches(rng, n, num_labels, steps, b):
    """Batches of (scores, labels, columns, ids) with revisits, a repeated id
    within a batch, an unlabelled row and repeated labels."""
    batches = []
    for t in range(steps):
        ids = rng.choice(n - 1, size=b, replace=False)  # n - 1: never seen
        if t % 2 == 1:
            ids[1] = ids[0]                 # the same instance twice
        labels = rng.integers(0, num_labels, size=b)
        labels[2] = labels[3]               # a shared label
        if t == 2:
            labels[4] = -1                  # a row without label
        if t % 2 == 1:
            labels[1] = labels[0]
        columns = np.unique(labels[labels >= 0])
        rng.shuffle(columns)
        scores = rng.normal(0, 1.5, size=(b, columns.size))
        if t % 2 == 1:
            scores[1] = scores[0]
        batches.append((scores.astype(np.float32), labels, columns, ids))
    return batches


@pytest.mark.parametrize("variant,negatives,alpha", [
    ("scent", "multiset", 0.7), ("scent", "multiset", 50.0),
    ("sox", "multiset", 0.3), ("scent", "unique", 2.0)])
def test_dual_updates_match_the_numpy_transcription(variant, negatives, alpha):
    rng = np.random.default_rng(0)
    n, m = 15, 9
    loss = ScentLoss(n, alpha, variant=variant, negatives=negatives,
                     num_labels=m)
    nu, visits = np.zeros(n), np.zeros(n, np.int64)
    for scores, labels, columns, ids in _random_batches(rng, n, m, 8, 7):
        got = float(loss(tf.constant(scores), tf.constant(labels),
                         tf.constant(columns), tf.constant(ids),
                         training=True))
        nu, visits, want, _, _ = np_scent_step(
            nu, visits, scores, labels, columns, ids, alpha, variant,
            negatives)
        np.testing.assert_allclose(loss.nu.numpy(), nu, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(loss.visits.numpy(), visits)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert visits.max() >= 3 and (visits == 0).any()  # revisits and unseen


def test_log_q_weights_match_the_numpy_transcription():
    rng = np.random.default_rng(1)
    n, m = 12, 6
    counts = np.array([40, 20, 10, 5, 3, 2], np.float64)
    log_weight = np.log(counts.sum()) - math.log(m) - np.log(counts)
    loss = ScentLoss(n, 0.5, correction="log_q", num_labels=m,
                     label_counts=counts)
    nu, visits = np.zeros(n), np.zeros(n, np.int64)
    for scores, labels, columns, ids in _random_batches(rng, n, m, 5, 6):
        got = float(loss(scores, labels, columns, ids, training=True))
        nu, visits, want, _, _ = np_scent_step(
            nu, visits, scores, labels, columns, ids, 0.5,
            log_weight=log_weight)
        np.testing.assert_allclose(loss.nu.numpy(), nu, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_log_q_validation_weights_unseen_classes_as_counted_once():
    """Held-out batches may hold classes absent from training (count 0,
    weight +inf): in validation they get the weight of a class counted
    once; in training they stay an error.  Reference: mean log S_i of the
    NumPy transcription with that weight substituted."""
    n, m = 6, 4
    counts = np.array([6.0, 3.0, 0.0, 1.0])
    loss = ScentLoss(n, 1.0, correction="log_q", num_labels=m,
                     label_counts=counts)
    log_weight = np.log(counts.sum()) - math.log(m) - np.log([6, 3, 1, 1])
    rng = np.random.default_rng(4)
    labels = np.array([0, 2, 1, 2, 3])
    columns = np.array([2, 0, 3, 1])
    scores = rng.normal(0, 1, size=(5, 4)).astype(np.float32)
    got = float(loss(scores, labels, columns, training=False))
    _, _, _, s_rows, _ = np_scent_step(
        np.zeros(n), np.zeros(n, np.int64), scores, labels, columns,
        np.arange(5), 1.0, log_weight=log_weight)
    np.testing.assert_allclose(got, np.mean(np.log(s_rows)), rtol=1e-5)
    assert not loss.visits.numpy().any()
    with pytest.raises(tf.errors.InvalidArgumentError, match="count 0"):
        loss(scores, labels, columns, np.arange(5), training=True)


def test_log_q_estimator_is_unbiased_for_the_full_mean():
    """Averaged over batches drawn with the label frequencies, the corrected
    S_i equals (1/K) sum_j exp(R_ij); the paper's plain S_i does not."""
    rng = np.random.default_rng(2)
    m, b = 5, 6
    q = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = np.array([0.0, 0.5, 1.0, 1.5, 2.0])  # same for every row
    plain = ScentLoss(10, 1.0, num_labels=m)
    corr = ScentLoss(10, 1.0, correction="log_q", num_labels=m,
                     label_counts=q * 1000)
    est_plain, est_corr = [], []
    for _ in range(400):
        labels = rng.choice(m, size=b, p=q)
        labels[0] = 0
        columns = np.unique(labels)
        scores = np.tile(logits[columns], (b, 1)).astype(np.float32)
        for loss, out in ((plain, est_plain), (corr, est_corr)):
            log_s, _ = loss.log_inner(scores, labels, columns)
            out.append(math.exp(float(log_s[0])))
    full = np.mean(np.exp(logits - logits[0]))
    assert abs(np.mean(est_corr) / full - 1) < 0.05
    assert abs(np.mean(est_plain) / full - 1) > 0.2


def test_stable_for_large_logits_and_duals():
    """R_ij ~ 300 and nu ~ 300 overflow exp in float32; the log-domain step
    stays finite and equals the float64 log-sum-exp reference."""
    loss = ScentLoss(3, 0.5, num_labels=4)
    scores = np.array([[0.0, 300.0, 290.0], [0.0, 0.0, 1.0],
                       [5.0, 0.0, 0.0]], np.float32)
    labels, columns, ids = [0, 1, 2], [0, 1, 2], [0, 1, 2]
    for step in range(3):
        obj = float(loss(scores, labels, columns, ids, training=True))
        assert np.isfinite(obj) and np.all(np.isfinite(loss.nu.numpy()))
    # row 0: S = (e^300 + e^290) / 2, so log S = 300 + log((1 + e^-10) / 2)
    want = 300 + np.log1p(np.exp(-10.0)) - np.log(2.0)
    np.testing.assert_allclose(loss.nu.numpy()[0], want, rtol=1e-6)


def test_gradient_wrt_scores_is_that_of_the_paper_batch_loss():
    """d/ds of the returned objective = d/ds (1/B) sum_i S_i exp(-nu_i,t)
    with nu_i,t fixed (the paper's L_t), from NumPy."""
    rng = np.random.default_rng(3)
    scores, labels, columns, ids = _random_batches(rng, 10, 6, 1, 6)[0]
    _, _, _, s_rows, nu_rows = np_scent_step(
        np.zeros(10), np.zeros(10, np.int64), scores, labels, columns, ids,
        1.0)
    loss = ScentLoss(10, 1.0)
    x = tf.Variable(scores)
    with tf.GradientTape() as tape:
        obj = loss(x, labels, columns, ids, training=True)
    got = tape.gradient(obj, x).numpy()
    want = np.zeros_like(scores, np.float64)
    col = {int(c): k for k, c in enumerate(columns)}
    active = [i for i in range(len(labels)) if not np.isnan(s_rows[i])]
    for i in active:
        own = col[int(labels[i])]
        others = [int(labels[k]) for k in active if k != i]
        for j in others:
            want[i, col[j]] += math.exp(scores[i, col[j]] - scores[i, own]
                                        - nu_rows[i]) / len(others)
        want[i, own] -= s_rows[i] * math.exp(-nu_rows[i])
    np.testing.assert_allclose(got, want / len(active), rtol=1e-4, atol=1e-6)


def test_validation_call_changes_nothing_and_returns_mean_log_s():
    rng = np.random.default_rng(4)
    scores, labels, columns, ids = _random_batches(rng, 10, 6, 1, 6)[0]
    loss = ScentLoss(10, 1.0)
    got = float(loss(scores, labels, columns, training=False))
    _, _, _, s_rows, _ = np_scent_step(np.zeros(10), np.zeros(10, np.int64),
                                       scores, labels, columns, ids, 1.0)
    np.testing.assert_allclose(got, np.nanmean(np.log(s_rows)), rtol=1e-5)
    assert not loss.nu.numpy().any() and not loss.visits.numpy().any()


def test_rows_without_negatives_are_skipped():
    loss = ScentLoss(4, 1.0, negatives="unique")
    # one distinct label: no negative for anyone under "unique"
    obj = loss(np.zeros((2, 1), np.float32), [3, 3], [3], [0, 1],
               training=True)
    assert float(obj) == 0.0 and not loss.visits.numpy().any()
    loss = ScentLoss(4, 1.0)
    obj = loss(np.zeros((2, 1), np.float32), [3, -1], [3], [0, 1],
               training=True)  # one labelled row: B - 1 = 0
    assert float(obj) == 0.0 and not loss.visits.numpy().any()


def test_loss_errors():
    loss = ScentLoss(5, 1.0, num_labels=4)
    s = np.zeros((2, 2), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_examples"):
        loss(s, [0, 1], [0, 1], [0, 5], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=">= 0"):
        loss(s, [0, 1], [0, 1], [-1, 2], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one of column"):
        loss(s, [0, 2], [0, 1], [0, 1], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="distinct"):
        loss(s, [0, 0], [0, 0], [0, 1], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_labels"):
        loss(s, [0, 4], [0, 4], [0, 1], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="len"):
        loss(np.zeros((3, 2), np.float32), [0, 1], [0, 1], [0, 1],
             training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry"):
        loss(s, [0, 1], [0, 1], [0, 1, 2], training=True)
    with pytest.raises(TypeError, match="integer"):
        loss(s, [0, 1], [0, 1], [0.0, 1.0], training=True)
    with pytest.raises(ValueError, match="example_ids"):
        loss(s, [0, 1], [0, 1], training=True)
    assert not loss.visits.numpy().any()  # nothing was half-applied
    for kwargs, match in [
            (dict(num_examples=0), "num_examples"),
            (dict(alpha=0.0), "alpha"), (dict(alpha=float("inf")), "alpha"),
            (dict(variant="sgd"), "variant"),
            (dict(negatives="all"), "negatives"),
            (dict(correction="x"), "correction"),
            (dict(correction="log_q"), "num_labels"),
            (dict(correction="log_q", num_labels=3, negatives="unique"),
             "multiset"),
            (dict(correction="log_q", num_labels=3, label_counts=[1, 2]),
             "entries"),
            (dict(label_counts=[1, 2]), "only used")]:
        args = dict(num_examples=4, alpha=1.0)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            ScentLoss(**args)
    zero = ScentLoss(4, 1.0, correction="log_q", num_labels=3,
                     label_counts=[5, 0, 5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="count 0"):
        zero(s, [0, 1], [0, 1], [0, 1], training=True)


def test_multiclass_labels():
    np.testing.assert_array_equal(
        multiclass_labels(tf.constant([[4, -1], [-1, -1], [0, -1]])).numpy(),
        [4, -1, 0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="multi-class"):
        multiclass_labels(tf.constant([[1, 2], [0, -1]]))
    with pytest.raises(TypeError):
        multiclass_labels(tf.constant([[1.0]]))


# ---------------------------------------------------------------------------
# Trainer and head.

M, D = 20, 30


def _config(layer="dense", **scent):
    c = xconfig.get_config("scent")
    c.model.sampled_layer = layer
    c.model.encoder_dims = (16,)
    c.model.connections_per_label = 6
    c.train.optimizer = "scent_momentum"  # the paper's update
    c.train.learning_rate = 0.5
    c.scent.correction = "none"  # the paper's estimator
    c.scent.update(scent)
    return c


def _multiclass_data(n=96, seed=0, num_labels=M):
    rng = np.random.default_rng(seed)
    x = sp.random(n, D, density=0.2, format="csr", random_state=seed,
                  dtype=np.float32)
    labels = rng.integers(0, num_labels, size=n)
    y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)),
                      shape=(n, num_labels))
    return xdata.XCDataset(x, y)


def _trainer(layer, data, **scent):
    config = _config(layer, **scent)
    head = heads.get_head(config)
    head.prepare(data)
    keras.utils.set_random_seed(0)
    model = build_model(config, D, M, sparse_input=True, head=head)
    out = decoding.scoring_layer(model)
    trainer = head.training_model(model, out)
    head.compile(trainer, out, head.make_optimizer())
    return config, head, model, trainer


@pytest.mark.parametrize("layer", [
    "dense", pytest.param("uniform_sparse", marks=needs_op)])
def test_scores_equal_full_logits_and_gradient_touches_batch_rows(layer):
    data = _multiclass_data()
    _, _, model, trainer = _trainer(layer, data)
    x, y, ids = xdata.make_tf_dataset(data, 16, shuffle=True, seed=1,
                                      with_example_ids=True).take(1).get_single_element()
    labels = multiclass_labels(y).numpy()
    classes = np.unique(labels)
    queries = trainer.body(x)
    np.testing.assert_allclose(
        trainer.score_classes(queries, classes).numpy(),
        tf.gather(model(x), classes, axis=1).numpy(), rtol=1e-5, atol=1e-6)
    out = decoding.scoring_layer(model)
    with tf.GradientTape() as tape:
        loss, _, _ = trainer._loss(x, y, ids, training=True)
    grads = tape.gradient(loss, [out.kernel, out.bias])
    for g in grads:
        assert isinstance(g, tf.IndexedSlices)
        assert set(np.unique(g.indices.numpy())) <= set(classes.tolist())


def test_train_step_requires_example_ids():
    data = _multiclass_data()
    _, _, _, trainer = _trainer("dense", data)
    with pytest.raises(ValueError, match="with_example_ids"):
        trainer.fit(xdata.make_tf_dataset(data, 16), epochs=1, verbose=0)
    x, y = xdata.make_tf_dataset(data, 16).take(1).get_single_element()
    with pytest.raises(ValueError, match="with_example_ids"):
        trainer.train_on_batch(x, y)
    assert not trainer.scent_loss.visits.numpy().any()


@pytest.mark.parametrize("layer", [
    "dense", pytest.param("uniform_sparse", marks=needs_op)])
def test_step_moves_only_batch_rows_and_their_momentum(layer):
    data = _multiclass_data()
    _, _, model, trainer = _trainer(layer, data)
    out = decoding.scoring_layer(model)
    ds = xdata.make_tf_dataset(data, 12, shuffle=True, seed=2,
                               with_example_ids=True)
    x, y, ids = ds.take(1).get_single_element()
    before = out.kernel.numpy().copy()
    trainer.fit(tf.data.Dataset.from_tensors((x, y, ids)), epochs=1,
                verbose=0)
    changed = set(np.flatnonzero(np.any(before != out.kernel.numpy(),
                                        axis=1)).tolist())
    classes = set(multiclass_labels(y).numpy().tolist())
    assert changed and changed <= classes
    moment = trainer.optimizer.momentums[
        trainer.optimizer._get_variable_index(out.kernel)].numpy()
    assert set(np.flatnonzero(np.any(moment != 0, axis=1)).tolist()) == changed
    np.testing.assert_array_equal(
        np.flatnonzero(trainer.scent_loss.visits.numpy()),
        np.unique(ids.numpy()))


def test_optimizer_is_algorithm_26_momentum_on_batch_rows():
    """W and V after three sparse steps equal the NumPy recursion
    V[C] = (1 - beta) V[C] + beta Z[C]; W[C] -= eta V[C] on the rows C of
    each step only."""
    rng = np.random.default_rng(5)
    eta, beta = 0.3, 0.25
    w0 = rng.normal(size=(8, 3)).astype(np.float32)
    w = keras.Variable(w0)
    opt = scent_optimizer(eta, beta)
    ref_w, ref_v = w0.astype(np.float64), np.zeros((8, 3))
    for rows in ([1, 4, 4, 6], [0, 1], [6, 7, 2]):
        z = rng.normal(size=(len(rows), 3)).astype(np.float32)
        opt.apply([tf.IndexedSlices(tf.constant(z), tf.constant(rows),
                                    tf.constant([8, 3]))], [w])
        zfull = np.zeros((8, 3))
        np.add.at(zfull, rows, z)
        c = np.unique(rows)
        ref_v[c] = (1 - beta) * ref_v[c] + beta * zfull[c]
        ref_w[c] -= eta * ref_v[c]
        np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(-opt.momentums[0].numpy() / eta, ref_v,
                                   rtol=1e-5, atol=1e-6)


def test_duals_and_visits_survive_save_and_load(tmp_path):
    data = _multiclass_data()
    _, _, _, trainer = _trainer("dense", data)
    trainer.fit(xdata.make_tf_dataset(data, 16, shuffle=True, seed=3,
                                      with_example_ids=True),
                epochs=2, verbose=0, shuffle=False)
    nu = trainer.scent_loss.nu.numpy().copy()
    visits = trainer.scent_loss.visits.numpy().copy()
    assert (visits == 2).all() and np.all(nu != 0)
    names = [v.path for v in trainer.non_trainable_variables]
    assert any(p.endswith("nu") for p in names)
    path = str(tmp_path / "trainer.weights.h5")
    trainer.save_weights(path)
    _, _, _, fresh = _trainer("dense", data)
    fresh.optimizer.build(fresh.trainable_variables)
    assert not fresh.scent_loss.visits.numpy().any()
    fresh.load_weights(path)
    np.testing.assert_array_equal(fresh.scent_loss.nu.numpy(), nu)
    np.testing.assert_array_equal(fresh.scent_loss.visits.numpy(), visits)
    for a, b in zip(trainer.optimizer.variables, fresh.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_objective_decreases_to_the_full_softmax_optimum():
    """Toy problem, uniform label marginal (so in-batch classes are a uniform
    sample): 8 one-hot contexts, p(y = c | c) = 0.5, else uniform.  With a
    free logit per (context, class) the full softmax optimum is the
    empirical conditional entropy H(Y|X); SCENT's training cross-entropy
    decreases to it and its logged objective to H(Y|X) - log K."""
    rng = np.random.default_rng(6)
    k, n = 8, 4096
    ctx = np.repeat(np.arange(k), n // k)
    p = np.full((k, k), 0.5 / (k - 1))
    np.fill_diagonal(p, 0.5)
    y = np.array([rng.choice(k, p=p[c]) for c in ctx])
    joint = np.zeros((k, k))
    np.add.at(joint, (ctx, y), 1)
    cond = joint / joint.sum(1, keepdims=True)
    h_emp = -np.sum(joint / n * np.log(np.where(cond > 0, cond, 1)))
    features = np.eye(k, dtype=np.float32)[ctx]
    labels = sp.csr_matrix((np.ones(n, np.float32), y, np.arange(n + 1)),
                           shape=(n, k))
    data = xdata.XCDataset(features, labels)
    keras.utils.set_random_seed(0)
    inp = keras.Input((k,), name="features")
    model = keras.Model(inp, LabelDense(k, name="output")(inp))
    trainer = ScentTrainer(model, ScentLoss(n, alpha=1.0, num_labels=k))
    trainer.compile(optimizer=scent_optimizer(1.0, 0.5), jit_compile=False)
    ds = xdata.make_tf_dataset(data, 64, shuffle=True, seed=0,
                               with_example_ids=True)

    def full_ce():
        logits = model(features).numpy().astype(np.float64)
        lse = np.log(np.exp(logits).sum(1))
        return float(np.mean(lse - logits[np.arange(n), y]))

    ces = [full_ce()]
    objs = []
    for _ in range(8):
        hist = trainer.fit(ds, epochs=1, verbose=0)
        ces.append(full_ce())
        objs.append(hist.history["loss"][0])
    # Measured (seed 0): CE 2.198 -> 1.666 after one epoch -> 1.652 after 8,
    # H = 1.651; objective -0.266 -> -0.426, H - log K = -0.4285.
    assert ces[0] > h_emp + 0.5
    assert np.mean(ces[5:]) < np.mean(ces[1:4]) < ces[0]
    assert ces[-1] - h_emp < 0.006, (ces, h_emp)
    assert all(b < a + 0.01 for a, b in zip(objs, objs[1:])), objs
    assert abs(objs[-1] - (h_emp - math.log(k))) < 0.01, (objs, h_emp)


@pytest.mark.parametrize("layer,decoder", [
    ("dense", "LabelDense"),
    pytest.param("uniform_sparse", "UniformSparseDense", marks=needs_op)])
def test_head_fits_and_is_decoded_by_its_layer_head(layer, decoder):
    data = _multiclass_data(n=128)
    val = _multiclass_data(n=32, seed=9)
    config, head, model, trainer = _trainer(layer, data)
    assert isinstance(head, ScentHead)
    assert head.dataset_kwargs() == {"with_example_ids": True}
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)
    ds = xdata.make_tf_dataset(data, 32, shuffle=True, seed=0,
                               **head.dataset_kwargs())
    hist = trainer.fit(ds, validation_data=xdata.make_tf_dataset(val, 32),
                       epochs=2, verbose=0,
                       callbacks=head.callbacks(decoding.scoring_layer(model),
                                                val))
    assert np.isfinite(hist.history["loss"]).all()
    assert "val_loss" in hist.history and "val_precision_at_1" in hist.history
    assert type(decoding.scoring_layer(trainer)).__name__ == decoder
    top = decoding.top_k_function(trainer, 3)
    ids, _ = top(xdata.make_tf_dataset(val, 32).take(1).get_single_element()[0])
    assert ids.shape == (32, 3)
    assert head.results(decoding.scoring_layer(model))["scent_variant"] == "scent"


def test_head_errors():
    with pytest.raises(ValueError, match="sampled_layer"):
        heads.get_head(_config("mach"))
    with pytest.raises(ValueError, match="variant"):
        heads.get_head(_config(variant="sgd"))
    with pytest.raises(ValueError, match="alpha"):
        heads.get_head(_config(alpha=0.0))
    with pytest.raises(ValueError, match="multiset"):
        heads.get_head(_config(correction="log_q", negatives="unique"))
    with pytest.raises(ValueError, match="beta"):
        heads.get_head(_config(beta=0.0))
    c = _config()
    c.loss = "softmax"
    with pytest.raises(ValueError, match="config.loss"):
        heads.get_head(c)
    head = heads.get_head(_config())
    model = build_model(_config(), D, M, sparse_input=True, head=head)
    with pytest.raises(ValueError, match="prepare"):
        head.training_model(model, decoding.scoring_layer(model))
    multi = xdata.make_synthetic(20, D, M, labels_per_instance=3, seed=0)
    with pytest.raises(ValueError, match="multi-class"):
        head.prepare(multi)
    dense_model = keras.Sequential([keras.Input((4,)),
                                    keras.layers.Dense(3, name="output")])
    with pytest.raises(ValueError, match="no layer that scores labels"):
        ScentTrainer(dense_model, ScentLoss(4))


def test_log_q_head_counts_training_labels():
    data = _multiclass_data()
    _, head, _, trainer = _trainer("dense", data, correction="log_q")
    counts = np.bincount(data.labels.indices, minlength=M).astype(np.float64)
    with np.errstate(divide="ignore"):
        want = np.log(counts.sum()) - np.log(M) - np.log(counts)
    np.testing.assert_allclose(trainer.scent_loss.log_weight.numpy(), want,
                               rtol=1e-6)


# ---------------------------------------------------------------------------
# The job (xmc_tf.job.run.train_and_evaluate, what `xmc-tf train` runs).

# One label per row (labels_per_instance=1: k_i = 1 + Poisson(0)); 200 rows,
# 10 % validation: 180 / 32 -> 6 steps per epoch.
_SYN_MC = ("synthetic:num_instances=200,num_features=60,num_labels=12,"
           "labels_per_instance=1,seed={seed}")
_JOB_STEPS = 6


def _job_config():
    """configs/scent.py as shipped (log_q, LazyAdam), shrunk."""
    c = xconfig.get_config("scent")
    c.data.train = _SYN_MC.format(seed=2)
    c.data.test = _SYN_MC.format(seed=3)
    c.data.validation_fraction = 0.1
    c.model.encoder_dims = (16,)
    c.train.batch_size = 32
    c.train.epochs = 2
    c.train.early_stopping_patience = 10  # no early stop: 2 epochs run
    c.train.verbose = 0
    return c


class _Crash(Exception):
    pass


class _Duals(keras.callbacks.Callback):
    """Copies nu / visits of the trainer at train begin and each epoch end;
    raises :class:`_Crash` after optimizer step ``crash_at`` (a killed run:
    the checkpoint of the last finished epoch is all that survives)."""

    def __init__(self, crash_at=0):
        super().__init__()
        self.crash_at = crash_at
        self.begin, self.epochs = None, []

    def _get(self):
        loss = self.model.scent_loss
        return loss.nu.numpy().copy(), loss.visits.numpy().copy()

    def on_train_begin(self, logs=None):
        self.begin = self._get()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(self._get())

    def on_train_batch_end(self, batch, logs=None):
        if self.crash_at and int(self.model.optimizer.iterations) == \
                self.crash_at:
            raise _Crash()


def test_job_trains_exports_and_resumes_with_the_saved_duals(tmp_path):
    """configs/scent.py through train_and_evaluate: a run killed in its second
    epoch resumes with nu / visits equal, bit for bit, to the ones at the
    end of its first epoch (and in the checkpoint), then finishes and
    exports; every instance was visited once per epoch over both processes
    (duals not restored would give 1 visit).  ~2 x 10 s."""
    from xmc_tf.job import checkpoint as xckpt
    from xmc_tf.job.run import train_and_evaluate
    from xmc_tf.job.workdir import Workdir

    config = _job_config()
    run_dir = str(tmp_path / "killed")
    killed = _Duals(crash_at=_JOB_STEPS + 3)
    with pytest.raises(_Crash):
        train_and_evaluate(config, run_dir, callbacks=[killed])
    assert len(killed.epochs) == 1
    state = xckpt.load(os.path.join(run_dir, "backup"))
    assert state.meta["epochs_done"] == 1 and state.meta["phase"] == "training"
    paths = [p for p, _, _ in state.meta["model"]]
    saved = {name: state.array(f"model/{paths.index(p):06d}")
             for name in ("nu", "visits")
             for p in paths if p.endswith(f"scent_loss/{name}")}
    nu1, visits1 = killed.epochs[0]
    np.testing.assert_array_equal(saved["nu"], nu1)
    np.testing.assert_array_equal(saved["visits"], visits1)
    assert (visits1 == 1).all() and np.isfinite(nu1).all() and nu1.any()
    # The crash came after the duals moved again in epoch 2.
    assert not np.array_equal(killed.model.scent_loss.nu.numpy(), nu1)

    resumed = _Duals()
    metrics = train_and_evaluate(config, run_dir, callbacks=[resumed])
    np.testing.assert_array_equal(resumed.begin[0], nu1)
    np.testing.assert_array_equal(resumed.begin[1], visits1)
    assert len(resumed.epochs) == 1
    nu2, visits2 = resumed.epochs[0]
    assert (visits2 == 2).all() and not np.array_equal(nu2, nu1)

    assert Workdir(run_dir).check_complete() == metrics
    assert metrics["run"]["resumes"] == 1 and metrics["epochs"] == 2
    assert metrics["head"] == "scent" and metrics["scent_correction"] == "log_q"
    assert os.path.isdir(os.path.join(run_dir, "saved_model"))
    assert not os.path.exists(os.path.join(run_dir, "backup"))
    assert 0 <= metrics["P@1"] <= 100 and metrics["P@5"] <= 100 / 5
    # The exported model is the full-scoring one, decoded by its scores.
    exported = keras.models.load_model(os.path.join(run_dir, "model.keras"),
                                       compile=False)
    assert decoding.scores_every_label(exported)
    assert exported.output_shape[-1] == 12


@pytest.mark.parametrize("correction", ["none", "log_q"])
def test_own_term_adds_the_own_class_to_the_inner_mean(correction):
    # NumPy reference: log_q adds exp(0)/K to the importance-weighted
    # estimate; "none" averages exp(R) over the whole multiset including
    # the row's own label (R = 0 there).  Bounded below: log S >= -log K
    # (log_q) or -log |Y_t| (none), however large the margins.
    K = 6
    labels = np.array([0, 1, 1, 3], np.int64)
    columns = np.array([0, 1, 3], np.int64)
    scores = np.array([[50., -40., -45.], [1., 2., -1.], [0.5, -30., 2.],
                       [-3., 0., 60.]], np.float32)
    counts = np.array([5, 20, 1, 2, 1, 1], np.float32)
    kw = dict(num_labels=K, label_counts=counts) if correction == "log_q" else {}
    paper = ScentLoss(4, correction=correction, **kw)
    own = ScentLoss(4, correction=correction, own_term=True, **kw)
    ls_paper, active = paper.log_inner(scores, labels, columns)
    ls_own, _ = own.log_inner(scores, labels, columns)
    assert np.all(active.numpy())
    s_paper = np.exp(ls_paper.numpy().astype(np.float64))
    if correction == "log_q":
        want = s_paper + 1.0 / K
        assert np.all(ls_own.numpy() >= -np.log(K) - 1e-6)
    else:
        n = len(labels)  # multiset of the batch's labels, own one included
        want = (1.0 + (n - 1) * s_paper) / n
        assert np.all(ls_own.numpy() >= -np.log(n) - 1e-6)
    np.testing.assert_allclose(ls_own.numpy(), np.log(want), rtol=1e-5,
                               atol=1e-5)
    assert own.get_config()["own_term"] is True
