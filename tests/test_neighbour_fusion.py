"""The nearest-neighbour votes (:class:`xmc_tf.layers.NearestNeighbourScores`)
against a brute-force kNN in NumPy, and the votes in the job
(``config.neighbours``, :mod:`xmc_tf.job.scorers.neighbours`): the plan
rule, the checks, and the exported model against network + weights x
scorers recomputed from its layers."""

import dataclasses
import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import data as xdata
from xmc_tf.errors import ConfigError
from xmc_tf.job import artifacts
from xmc_tf.job import plan as xplan
from xmc_tf.job import checks as xchecks
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.classifier import load_config
from xmc_tf.job.run import JobData, train_and_evaluate
from xmc_tf.layers import NearestNeighbourScores


def _sparse_tensor(x):
    coo = sp.coo_matrix(x)
    return tf.SparseTensor(np.stack([coo.row, coo.col], 1).astype(np.int64),
                           coo.data.astype(np.float32), coo.shape)


def _brute_force(queries, train, labels, k, power):
    """The votes by definition: per query, the k training rows of largest
    positive dot product (ties: lower row first) each add dot ** power to
    their labels."""
    sims = (sp.csr_matrix(queries) @ sp.csr_matrix(train).T).toarray()
    y = sp.csr_matrix(labels).toarray()
    out = np.zeros((sims.shape[0], y.shape[1]))
    for i, row in enumerate(sims):
        near = sorted((t for t in range(row.size) if row[t] > 0),
                      key=lambda t: (-row[t], t))[:k]
        for t in near:
            out[i] += row[t] ** power * y[t]
    return out


@pytest.mark.parametrize("k,power", [(1, 2.0), (5, 2.0), (7, 1.0),
                                     (500, 0.0)])
def test_votes_match_a_brute_force_knn(k, power):
    rng = np.random.default_rng(k)
    train = sp.random(300, 40, density=0.1, random_state=rng,
                      format="csr", dtype=np.float32)
    # repeated rows: ties broken by the lower instance id
    train = sp.vstack([train, train[:20]]).tocsr()
    labels = sp.random(320, 25, density=0.08, random_state=rng, format="csr")
    labels.data[:] = 1.0
    queries = sp.random(23, 40, density=0.15, random_state=rng,
                        format="csr", dtype=np.float32)
    layer = NearestNeighbourScores.from_data(train, labels, neighbours=k,
                                             power=power)
    got = layer(_sparse_tensor(queries)).numpy()
    want = _brute_force(queries, train, labels, k, power)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a dense batch is made sparse first
    dense = layer(tf.constant(queries.toarray())).numpy()
    np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-5)


def test_layer_edge_cases_and_errors():
    train = sp.csr_matrix(np.array([[1., 0., 0.], [0., 1., 0.]], np.float32))
    labels = sp.csr_matrix(np.array([[1, 0], [0, 1]]))
    layer = NearestNeighbourScores.from_data(train, labels, neighbours=3)
    # no shared feature: no votes; empty batch: [0, m]
    out = layer(_sparse_tensor(np.array([[0., 0., 2.]], np.float32)))
    assert out.numpy().tolist() == [[0.0, 0.0]]
    empty = tf.SparseTensor(np.zeros((0, 2), np.int64),
                            np.zeros(0, np.float32), [0, 3])
    assert layer(empty).shape == (0, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_features"):
        layer(tf.SparseTensor([[0, 5]], [1.0], [1, 6]))
    with pytest.raises(ValueError, match="neighbours"):
        NearestNeighbourScores(3, 2, 2, 2, 2, neighbours=0)
    with pytest.raises(ValueError, match="rows"):
        NearestNeighbourScores.from_data(train, labels[:1])
    with pytest.raises(ValueError, match="sizes"):
        layer.set_data(train[:1], labels[:1])


def test_layer_saves_and_reloads(tmp_path):
    rng = np.random.default_rng(0)
    train = sp.random(50, 12, density=0.3, random_state=rng, format="csr",
                      dtype=np.float32)
    labels = sp.csr_matrix((np.ones(50), (np.arange(50),
                                          rng.integers(0, 6, 50))),
                           shape=(50, 6))
    layer = NearestNeighbourScores.from_data(train, labels, neighbours=4)
    inputs = keras.Input((12,), sparse=True)
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "knn.keras")
    model.save(path)
    again = keras.models.load_model(path)
    q = _sparse_tensor(train[:7])
    np.testing.assert_array_equal(again(q).numpy(), model(q).numpy())
    assert again.layers[-1].get_config()["neighbours"] == 4


def _few_shot(n_labels=60, per_label=3, d=300, seed=0):
    """Multi-class data, `per_label` training instances per class: each
    class owns 4 features, an instance shows 2-3 of them plus 2 noise
    features."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(d)[:4 * n_labels].reshape(n_labels, 4)
    rows, cols, labels = [], [], []
    for i in range(n_labels * per_label):
        c = i % n_labels
        feats = np.unique(np.concatenate([
            rng.choice(owner[c], rng.integers(2, 4), replace=False),
            rng.choice(d, 2, replace=False)]))
        rows += [i] * feats.size
        cols += feats.tolist()
        labels.append(c)
    n = len(labels)
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                      shape=(n, d))
    y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)),
                      shape=(n, n_labels))
    order = rng.permutation(n)
    return xdata.XCDataset(x[order], y[order])


def _config(**overrides):
    return load_config("scent", {"model.encoder_dims": (16,),
                                 "train.epochs": 2, "train.batch_size": 32,
                                 "train.verbose": 0,
                                 "data.validation_fraction": 0.25, "seed": 0,
                                 **overrides})


def test_plan_and_config_checks():
    train = _few_shot()
    summary = xplan.summarize(train)
    df = np.bincount(train.features.indices, minlength=train.num_features)
    assert summary.postings_per_instance == pytest.approx(
        (df.astype(float) ** 2).sum() / train.num_instances)
    c = _config()
    head = xchecks.check_config(c)
    plan = xscorers.get("neighbours").plan
    assert plan(c, head, summary, True)[0]
    for changes in (dict(label_instances_median=40.0), dict(sparse=False),
                    dict(postings_per_instance=1e9)):
        assert not plan(c, head, dataclasses.replace(summary, **changes),
                        True)[0]
    assert not plan(c, head, summary, False)[0]
    # Above max_labels the votes stay off where every label is scored, and
    # are on where the fused model ranks shortlists (the votes shortlist).
    many = dataclasses.replace(summary, num_labels=10**6)
    exact = _config(**{"shortlist.enabled": False})
    assert not plan(exact, xchecks.check_config(exact), many, True)[0]
    on, why = plan(c, head, many, True)
    assert on and "shortlisted" in why
    for key, bad in (("neighbours.enabled", "yes"),
                     ("neighbours.weight", -1.0), ("neighbours.k", 0),
                     ("neighbours.power", -2.0),
                     ("neighbours.idf", "sometimes"),
                     ("neighbours.shortlist", -1)):
        with pytest.raises(ConfigError, match=key):
            xchecks.check_config(_config(**{key: bad}))


def fused_layer(model):
    """The :class:`xmc_tf.layers.FusedScores` of an exported fused model
    (the model is that layer on the raw features)."""
    from xmc_tf.layers import FusedScores
    assert len(model.layers) == 3 and isinstance(model.layers[-1],
                                                 FusedScores)
    return model.layers[-1]


def test_job_fuses_the_votes_with_the_weights_read_on_validation(tmp_path):
    train = _few_shot()
    test = _few_shot(seed=1)
    wd = str(tmp_path / "run")
    result = train_and_evaluate(_config(**{"tree.enabled": False,
                                           "centroids.enabled": False}),
                                wd, data=JobData(train, test))
    info = result["neighbours"]
    assert set(info["variants"]) == {"label_neighbours", "idf_neighbours"}
    table = info["validation"]
    best = max(table, key=lambda a: (np.mean(list(table[a].values())),
                                     -float(a)))
    assert info["weight"] == float(best) > 0
    assert result["fusion"]["validation_instances"] == 45
    # The exported model: network + w * votes on the normalised features,
    # the votes recomputed from the stored rows.
    model = artifacts.load_model(wd)
    fused, model_norm = fused_layer(model), model.layers[1]
    assert fused.fusion_weights == [info["weight"]]
    scorer, = fused.scorers
    assert scorer.name == ("idf_neighbours" if info["idf"]
                           else "label_neighbours")
    x = test.features[:30]
    batch = next(iter(xdata.make_tf_dataset(
        xdata.XCDataset(x, test.labels[:30]), 30)))[0]
    normed = model_norm(batch)
    want = (fused.network(normed).numpy() +
            info["weight"] * scorer(normed).numpy())
    np.testing.assert_allclose(model(batch).numpy(), want, rtol=1e-5,
                               atol=1e-5)
    # the votes against a brute-force kNN over the fit split's rows
    layer = scorer.scorer if info["idf"] else scorer
    q = scorer.normalization(normed) if info["idf"] else normed
    rows = sp.csr_matrix((q.values.numpy(), (q.indices.numpy()[:, 0],
                                             q.indices.numpy()[:, 1])),
                         shape=q.dense_shape.numpy())
    idx = layer.indptr.numpy()
    stored = sp.csc_matrix((layer.values.numpy(), layer.instances.numpy(),
                            idx), shape=(layer.num_instances,
                                         layer.num_features))
    stored_labels = sp.csr_matrix(
        (np.ones(layer.num_label_entries), layer.label_ids.numpy(),
         layer.label_indptr.numpy()),
        shape=(layer.num_instances, layer.num_labels))
    np.testing.assert_allclose(
        layer(q).numpy(), _brute_force(rows, stored, stored_labels, 100, 2.0),
        rtol=1e-4, atol=1e-5)
    assert os.path.exists(os.path.join(wd, "metrics.json"))


def test_votes_off_or_at_weight_zero_export_without_them(tmp_path):
    train = _few_shot()
    for name, overrides in (("off", {"neighbours.enabled": False}),
                            ("zero", {"neighbours.enabled": True,
                                      "neighbours.weight": 0})):
        wd = str(tmp_path / name)
        result = train_and_evaluate(_config(**overrides), wd,
                                    data=JobData(train))
        model = artifacts.load_model(wd)
        scorers = [s.name for l in model.layers
                   for s in getattr(l, "scorers", [])]
        assert not any("neighbours" in n for n in scorers), scorers
        if name == "off":
            assert "neighbours" not in result
        else:
            assert result["neighbours"]["weight"] == 0.0
            assert "validation" not in result["neighbours"]
