"""The labels' nearest-centroid scores in the job (``config.centroids``,
:mod:`xmc_tf.job.scorers.centroids`, :func:`xmc_tf.job.finalize.finalize`):
when "auto" turns them on, the weight read on validation against a
brute-force choice, the exported model against network + weight *
centroids recomputed from its layers, and the config checks."""

import dataclasses
import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.errors import ConfigError
from xmc_tf.job import artifacts
from xmc_tf.job import plan as xplan
from xmc_tf.job import checks as xchecks
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.classifier import load_config
from xmc_tf.job.run import JobData, train_and_evaluate
from xmc_tf.layers import UniformSparseDense


def _few_shot(n_labels=60, per_label=3, d=300, seed=0):
    """Multi-class data with `per_label` training instances per class: each
    class owns 4 features, an instance shows 2-3 of them plus 2 noise
    features (the centroid is informative, the network sees each class
    only a few times)."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(d)[:4 * n_labels].reshape(n_labels, 4)
    rows, cols, vals, labels = [], [], [], []
    for i in range(n_labels * per_label):
        c = i % n_labels
        feats = np.concatenate([rng.choice(owner[c], rng.integers(2, 4),
                                           replace=False),
                                rng.choice(d, 2, replace=False)])
        feats = np.unique(feats)
        rows += [i] * feats.size
        cols += feats.tolist()
        vals += [1.0] * feats.size
        labels.append(c)
    n = len(labels)
    x = sp.csr_matrix((np.float32(vals), (rows, cols)), shape=(n, d))
    y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)),
                      shape=(n, n_labels))
    order = rng.permutation(n)
    return xdata.XCDataset(x[order], y[order])


def _config(**overrides):
    """The scent config, small, with dotted-field ``overrides`` applied by
    the job's own :func:`xmc_tf.job.classifier.load_config`."""
    return load_config("scent", {"model.encoder_dims": (16,),
                                 "train.epochs": 2, "train.batch_size": 32,
                                 "train.verbose": 0,
                                 "data.validation_fraction": 0.25, "seed": 0,
                                 # the neighbour votes apart
                                 # (tests/test_neighbour_fusion.py)
                                 "neighbours.enabled": False,
                                 **overrides})


def _summary(train, **changes):
    return dataclasses.replace(xplan.summarize(train), **changes)


def _plan(config, head, summary, has_validation):
    return xscorers.get("centroids").plan(config, head, summary,
                                          has_validation)


def test_plan_reads_the_labels_frequency_profile():
    train = _few_shot()
    summary = xplan.summarize(train)
    assert summary.label_instances_median == 3.0
    c = _config()
    head = xchecks.check_config(c)
    assert _plan(c, head, summary, True)[0]
    # off: many instances per label, dense input, no validation, too many
    # labels or entries, MACH (no full scores), or set off
    assert not _plan(
        c, head, _summary(train, label_instances_median=40.0), True)[0]
    assert not _plan(c, head, _summary(train, sparse=False),
                                   True)[0]
    assert not _plan(c, head, summary, False)[0]
    assert not _plan(
        c, head, _summary(train, num_labels=10**6), True)[0]
    assert not _plan(
        c, head, _summary(train, label_nnz=10**9), True)[0]
    mach = xconfig.get_config("mach")
    assert not _plan(mach, xchecks.check_config(mach), summary,
                                   True)[0]
    off = _config(**{"centroids.enabled": "False"})
    assert not _plan(off, xchecks.check_config(off), summary,
                                   True)[0]
    # a fixed weight needs no validation split
    fixed = _config(**{"centroids.weight": "2"})
    assert _plan(fixed, xchecks.check_config(fixed), summary,
                               False)[0]
    run, regime = xplan.resolve_config(c, train)
    assert run.centroids.enabled is True
    run, _ = xplan.resolve_config(xconfig.get_config("uniform_sparse"),
                                  xdata.load_dataset("bibtex:train"))
    assert run.centroids.enabled is False  # Bibtex: tens per label


def test_config_checks_name_the_field():
    for key, bad in (("centroids.enabled", "yes"),
                     ("centroids.weight", -1.0),
                     ("centroids.connections", 0),
                     ("centroids.max_labels", 0),
                     ("centroids.idf", "sometimes")):
        with pytest.raises(ConfigError, match=key):
            xchecks.check_config(_config(**{key: bad}))
    mach = xconfig.get_config("mach")
    mach.centroids.enabled = True
    with pytest.raises(ConfigError, match="scores every label"):
        xchecks.check_config(mach)
    with pytest.raises(ConfigError, match="validation"):
        xchecks.check_config(_config(**{"centroids.enabled": True,
                                      "data.validation_fraction": 0.0}))


def _fused_parts(model):
    """(network, centroid scorer, weight) of an exported model fused with
    the centroids: the scorer is the ``label_centroids`` layer, or the
    ``idf_centroids`` :class:`~xmc_tf.layers.NormalizedScorer` around
    it."""
    fused = model.layers[-1]
    names = [s.name for s in getattr(fused, "scorers", [])]
    assert any(n.endswith("centroids") for n in names), names
    index = next(i for i, n in enumerate(names) if n.endswith("centroids"))
    return (fused.network, fused.scorers[index],
            float(fused.fusion_weights[index]))


def _normed_batch(model, features, labels):
    """(the exported model's input batch, its normalised features)."""
    batch = next(iter(xdata.make_tf_dataset(
        xdata.XCDataset(features, labels), features.shape[0])))[0]
    return batch, model.layers[1](batch)


def test_job_fuses_the_centroids_with_the_weight_read_on_validation(tmp_path):
    train = _few_shot()
    test = _few_shot(seed=1)
    wd = str(tmp_path / "run")
    result = train_and_evaluate(_config(), wd, data=JobData(train, test))
    info = result["centroids"]
    table = info["validation"]
    best = max(table, key=lambda a: (np.mean(list(table[a].values())),
                                     -float(a)))
    assert info["weight"] == float(best) > 0
    assert info["connections"] == 32
    # idf="auto": both variants read, the one with the better mean kept.
    variants = info["variants"]
    assert set(variants) == {"label_centroids", "idf_centroids"}
    kept = variants["idf_centroids" if info["idf"] else "label_centroids"]
    assert kept["weight"] == info["weight"]
    assert kept["mean_P@k"] == max(v["mean_P@k"] for v in variants.values())
    assert kept["mean_P@k"] == round(float(np.mean(list(
        table[best].values()))), 2)
    saved = json.load(open(os.path.join(wd, "metrics.json")))
    assert saved["config"]["centroids"]["enabled"] is True
    # The exported model: deep(x) + weight * centroids(x) on the
    # normalised features, the centroid layer frozen.
    model = artifacts.load_model(wd)
    deep, scorer, weight = _fused_parts(model)
    layer = scorer.scorer if info["idf"] else scorer
    assert isinstance(layer, UniformSparseDense) and not layer.trainable
    assert weight == info["weight"]
    batch, normed = _normed_batch(model, test.features[:20],
                                  test.labels[:20])
    want = deep(normed).numpy() + weight * scorer(normed).numpy()
    np.testing.assert_allclose(model(batch).numpy(), want, rtol=1e-5,
                               atol=1e-5)
    # With the centroids the test P@1 is not below the weight-0 model's
    # validation choice would allow: weight 0 was among the candidates.
    assert table[str(info["weight"])]["P@1"] >= table["0.0"]["P@1"]


def test_centroids_off_or_at_weight_zero_export_the_plain_model(tmp_path):
    train = _few_shot()
    for name, overrides in (("off", {"centroids.enabled": False}),
                            ("zero", {"centroids.enabled": True,
                                      "centroids.weight": 0})):
        wd = str(tmp_path / name)
        result = train_and_evaluate(_config(**overrides), wd,
                                    data=JobData(train))
        model = artifacts.load_model(wd)
        scorers = [s.name for l in model.layers
                   for s in getattr(l, "scorers", [])]
        assert not any(n.endswith("centroids") for n in scorers), scorers
        if name == "off":
            assert "centroids" not in result
        else:
            assert result["centroids"]["weight"] == 0.0
            assert "validation" not in result["centroids"]


def test_idf_centroids_against_numpy(tmp_path):
    """centroids.idf=True at a fixed weight (no validation split, so the fit
    split is the whole training set): the exported model is deep(x) +
    weight * cosine(idf-weighted x, the labels' centroids of the
    idf-weighted training rows), all recomputed with NumPy/SciPy."""
    train = _few_shot()
    test = _few_shot(seed=1)
    wd = str(tmp_path / "idf")
    result = train_and_evaluate(
        _config(**{"centroids.enabled": True, "centroids.weight": 1.5,
                   "centroids.idf": True, "data.validation_fraction": 0.0}),
        wd, data=JobData(train))
    info = result["centroids"]
    assert info["idf"] is True and info["weight"] == 1.5
    assert "variants" not in info and "validation" not in info
    model = artifacts.load_model(wd)
    deep, scorer, weight = _fused_parts(model)
    assert scorer.name == "idf_centroids" and weight == 1.5
    norm = model.layers[1]  # the job's own normalisation (the config's)
    model_idf = norm.idf.numpy() if norm.method == "tfidf" else None
    fit, _ = xdata.normalize_features(train.features, norm.method)
    weighted, idf = xdata.normalize_features(fit, "tfidf")
    centroids = (sp.csr_matrix(train.labels).T @ weighted).toarray()
    # Each class has at most 10 features here: no truncation at 32.
    assert (centroids != 0).sum(axis=1).max() <= 32
    centroids /= np.maximum(np.linalg.norm(centroids, axis=1,
                                           keepdims=True), 1e-12)
    x = test.features[:25]
    query, _ = xdata.normalize_features(
        xdata.normalize_features(x, norm.method, model_idf)[0], "tfidf", idf)
    batch, normed = _normed_batch(model, x, test.labels[:25])
    want = deep(normed).numpy() + 1.5 * (query @ centroids.T)
    np.testing.assert_allclose(model(batch).numpy(), want, rtol=1e-4,
                               atol=1e-4)


def test_fixed_weight_with_idf_auto_keeps_the_plain_centroids(tmp_path):
    train = _few_shot()
    wd = str(tmp_path / "fixed")
    result = train_and_evaluate(
        _config(**{"centroids.enabled": True, "centroids.weight": 2.0}), wd,
        data=JobData(train))
    assert result["centroids"]["idf"] is False
    _, scorer, weight = _fused_parts(artifacts.load_model(wd))
    assert isinstance(scorer, UniformSparseDense) and weight == 2.0
