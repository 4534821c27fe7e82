"""The fused model's validation P@k driving LR halving and early stopping
(``config.train.monitor``, :func:`xmc_tf.job.plan.monitor_plan`,
:class:`xmc_tf.job.finalize.FusedValidation`) and the scores it reads
(:meth:`xmc_tf.job.finalize.FusionScores.with_scorer`)."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data as xdata
from xmc_tf.errors import ConfigError
from xmc_tf.job import finalize as xfinalize
from xmc_tf.job import fit as xfit
from xmc_tf.job import plan as xplan
from xmc_tf.job.run import JobData, train_and_evaluate

from test_neighbour_fusion import _config, _few_shot


def _data(n=150, m=300, seed=5):
    rng = np.random.default_rng(seed)
    labels = sp.random(n, m, density=0.01, random_state=rng, format="csr")
    labels.data[:] = 1
    truth = labels.toarray()
    scores = {"deep": rng.normal(size=(n, m)).astype(np.float32) + truth,
              "a": rng.normal(size=(n, m)).astype(np.float32) + 2 * truth,
              "b": rng.random((n, m)).astype(np.float32) + truth}
    return scores, labels


def _reference(scores, labels, weights, ks, shortlist, held):
    """P@k (percent) of the documented rule, row by row: the shortlist is
    the union of every scorer's top ``shortlist``; a scorer in ``held``
    keeps its own score at the labels of the held scorers' shortlists and
    its lowest shortlisted score elsewhere; the others are exact."""
    n, m = labels.shape
    y = labels.toarray() != 0
    hits = {k: 0 for k in ks}
    for i in range(n):
        top = {name: set(np.argsort(-s[i], kind="stable")[:shortlist])
               for name, s in scores.items()}
        held_ids = set().union(*(top[name] for name in held))
        union = sorted(set().union(*top.values()))
        fused = []
        for label in union:
            total = 0.0
            for name, w in weights.items():
                s = scores[name][i]
                if name in held and label not in held_ids:
                    value = min(s[list(top[name])])
                else:
                    value = s[label]
                total += w * value
            fused.append(total)
        order = [union[j] for j in np.argsort(-np.asarray(fused),
                                              kind="stable")]
        for k in ks:
            hits[k] += sum(y[i, label] for label in order[:k])
    return {k: 100.0 * hits[k] / (k * n) for k in ks}


def test_with_scorer_adds_a_scorer_as_documented():
    scores, labels = _data()
    n, m = labels.shape
    ks = (1, 3, 5)
    others = {k: v for k, v in scores.items() if k != "deep"}

    def blocks(arrays, size):
        return [({k: v[i:i + size] for k, v in arrays.items()},
                 labels[i:i + size]) for i in range(0, n, size)]

    # a full shortlist: the same sums as scoring all three at once
    held = xfinalize.FusionScores.collect(blocks(others, 64), shortlist=m)
    added = held.with_scorer("deep", [scores["deep"][i:i + 40]
                                      for i in range(0, n, 40)], shortlist=m)
    at_once = xfinalize.FusionScores.collect(blocks(scores, 64), shortlist=m)
    for weights in ({"deep": 1.0}, {"deep": 1.0, "a": 0.5},
                    {"deep": 1.0, "a": 2.0, "b": 4.0}):
        assert added.precision(weights, ks) == pytest.approx(
            at_once.precision(weights, ks))
    # a short one: the floors where only the new scorer shortlisted
    held = xfinalize.FusionScores.collect(blocks(others, 50), shortlist=8)
    added = held.with_scorer("deep", [scores["deep"][i:i + 70]
                                      for i in range(0, n, 70)], shortlist=8)
    assert added.ids.shape[1] == 24
    for weights in ({"deep": 1.0}, {"deep": 1.0, "a": 0.5},
                    {"deep": 0.5, "a": 2.0, "b": 4.0}, {"a": 1.0}):
        assert added.precision(weights, ks) == pytest.approx(_reference(
            scores, labels, weights, ks, 8, held=("a", "b")))
    # one scorer alone stays exact, the new one too
    full = xfinalize.FusionScores.collect(blocks(scores, 64), shortlist=m)
    for name in scores:
        assert added.precision({name: 1.0}, ks) == pytest.approx(
            full.precision({name: 1.0}, ks))
    with pytest.raises(ValueError, match="held already"):
        held.with_scorer("a", [scores["a"]])
    with pytest.raises(ValueError, match="scored 100 of the 150"):
        held.with_scorer("deep", [scores["deep"][:100]])
    with pytest.raises(ValueError, match="gave"):
        held.with_scorer("deep", [scores["deep"][:, :10]])
    with pytest.raises(ValueError, match="collect"):
        xfinalize.FusionScores(held.ids, held.valid, held.hits,
                               held.scores).with_scorer("deep", [])


def test_monitor_plan():
    on = {"centroids.enabled": True, "neighbours.enabled": False}
    assert xplan.monitor_plan(_config(**on), True)[0]
    assert xplan.monitor_plan(
        _config(**{"centroids.enabled": False,
                   "neighbours.enabled": True}), True)[0]
    for why, config, has_val in (
            ("fixed weight", _config(**on, **{"centroids.weight": 2.0}),
             True),
            ("few-shot scorers off",
             _config(**{"centroids.enabled": False,
                        "neighbours.enabled": False}), True),
            ("no validation", _config(**on), False),
            ("network", _config(**on, **{"train.monitor": "network"}),
             True)):
        assert not xplan.monitor_plan(config, has_val)[0], why
    assert not xplan.monitor_plan(_config(**on), True, multi_class=False)[0]
    fused = _config(**{"train.monitor": "fused", "centroids.enabled": False,
                       "neighbours.enabled": False})
    assert xplan.monitor_plan(fused, True)[0]
    assert xplan.monitor_plan(fused, False)[0]  # the job raises (below)
    with pytest.raises(ConfigError, match="train.monitor"):
        xplan.check_config(_config(**{"train.monitor": "val_loss"}))
    # the one resolver: "auto" becomes "fused" on few-shot labels
    train = _few_shot()
    run, regime = xplan.resolve_config(_config(), train)
    assert run.train.monitor == "fused"
    assert regime["fields"]["train.monitor"] == "fused"
    run, _ = xplan.resolve_config(_config(**{"centroids.enabled": False,
                                             "neighbours.enabled": False}),
                                  train)
    assert run.train.monitor == "network"
    # multi-label training labels: the network's own monitor
    two = sp.hstack([train.labels, train.labels[:, ::-1]], format="csr")
    multi = xdata.XCDataset(train.features, two)
    run, _ = xplan.resolve_config(_config(**on), multi)
    assert run.train.monitor == "network"


def _history(wd):
    with open(os.path.join(wd, "history.csv")) as f:
        return list(csv.DictReader(f))


def test_fused_model_drives_early_stopping_and_finalize_agrees(tmp_path):
    train, test = _few_shot(), _few_shot(seed=1)
    wd = str(tmp_path / "fused")
    result = train_and_evaluate(_config(**{"train.epochs": 8}), wd,
                                data=JobData(train, test))
    history = _history(wd)
    assert xfinalize.FUSED_MONITOR in history[0]
    assert xfinalize.NETWORK_MONITOR in history[0]
    assert "val_loss" not in history[0]  # the fused pass replaces it
    fused = [float(row[xfinalize.FUSED_MONITOR]) for row in history]
    # Keras' rule: progress is a rise by FUSED_MIN_DELTA over the best so
    # far; early stopping after 2 epochs without (the multi-class regime)
    best, best_value = 0, fused[0]
    for epoch, value in enumerate(fused):
        if value - xfit.FUSED_MIN_DELTA > best_value:
            best, best_value = epoch, value
    assert len(history) == min(8, best + 3)
    # finalize reads the weights on the same instances with the best
    # epoch's network: the P@k the monitor saw at that epoch
    parts = [p for p in ("label_tree", "centroids", "neighbours")
             if "validation" in result.get(p, {})]
    assert parts
    for part in parts:
        row = result[part]["validation"][str(result[part]["weight"])]
        assert np.mean(list(row.values())) == pytest.approx(
            100 * fused[best], abs=0.01)
    assert result["fusion"]["validation_instances"] == 45
    # "network": the head's own validation drives it, as before
    wd = str(tmp_path / "network")
    train_and_evaluate(_config(**{"train.epochs": 2,
                                  "train.monitor": "network"}), wd,
                       data=JobData(train, test))
    history = _history(wd)
    assert xfinalize.FUSED_MONITOR not in history[0]
    assert "val_loss" in history[0]


def test_fused_monitor_without_a_weight_to_read_is_a_config_error(tmp_path):
    config = _config(**{"train.monitor": "fused", "tree.enabled": False,
                        "centroids.enabled": False,
                        "neighbours.enabled": False})
    with pytest.raises(ConfigError, match="weight read on validation"):
        train_and_evaluate(config, str(tmp_path / "run"),
                           data=JobData(_few_shot()))
    config = _config(**{"train.monitor": "fused",
                        "data.validation_fraction": 0.0})
    with pytest.raises(ConfigError, match="needs validation instances"):
        train_and_evaluate(config, str(tmp_path / "run2"),
                           data=JobData(_few_shot()))
