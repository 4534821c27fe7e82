"""The fused model's validation P@k driving LR halving and early stopping
(``config.train.monitor``, :func:`xmc_tf.job.plan.monitor_plan`,
:class:`xmc_tf.job.finalize.FusedValidation`) and the shortlists it reads
(:meth:`xmc_tf.job.finalize.FusionPlan.shortlist_scores`)."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data as xdata
from xmc_tf.errors import ConfigError
from xmc_tf.job import finalize as xfinalize
from xmc_tf.job import build as xbuild
from xmc_tf.job import fit as xfit
from xmc_tf.job import inputs as xinputs
from xmc_tf.job import plan as xplan
from xmc_tf.job import checks as xchecks
from xmc_tf.job.run import JobData, train_and_evaluate
from xmc_tf.job.workdir import Workdir
from xmc_tf.shortlist.fusion import NETWORK

from test_neighbour_fusion import _config, _few_shot


def test_shortlist_scores_are_exact_at_the_shortlisted_labels(tmp_path):
    """With the shortlist on, the validation pass holds the union of the
    tree's and the votes' shortlists, each part's score there equal to its
    full scores gathered, the network's added per call."""
    train = _few_shot()
    config = _config(**{"shortlist.enabled": True, "tree.shortlist": 5,
                        "neighbours.shortlist": 3})
    run, _ = xplan.resolve_config(config, train)
    split = xinputs.prepare_splits(run, train, str(tmp_path))
    fit_data, val_data = split[0], split[1]
    network = xbuild.build_model(run, fit_data.num_features,
                                 fit_data.num_labels, True)
    plan = xfinalize.prepare_fusion(run, Workdir(str(tmp_path)), fit_data,
                                    val_data)
    assert plan.shortlist and plan.reads_weights
    scores = plan.shortlist_scores(network)
    fused = plan.fused(network)
    x = next(iter(xdata.make_tf_dataset(plan.rows, plan.rows.num_instances)))[0]
    ids = scores.ids
    valid = ids >= 0
    for name, layer in [(NETWORK, network)] + [(s.name, s)
                                               for s in fused.scorers]:
        full = layer(x).numpy()
        want = np.take_along_axis(full, np.maximum(ids, 0), 1)
        np.testing.assert_allclose(scores.scores[name][valid], want[valid],
                                   rtol=1e-4, atol=1e-5)
    tree = fused.scorers[0].shortlist(x, 5)[0].numpy()
    for i in range(ids.shape[0]):
        assert set(tree[i]) - {-1} <= set(ids[i])
        assert (scores.sources["label_tree"][i]
                == np.isin(ids[i], tree[i]) & valid[i]).all()
    # a second network: only its column changes
    other = xbuild.build_model(run, fit_data.num_features,
                               fit_data.num_labels, True)
    again = plan.shortlist_scores(other)
    assert (again.ids == ids).all()
    np.testing.assert_array_equal(again.scores["label_tree"],
                                  scores.scores["label_tree"])
    full = other(x).numpy()
    np.testing.assert_allclose(
        again.scores[NETWORK][valid],
        np.take_along_axis(full, np.maximum(ids, 0), 1)[valid], rtol=1e-4,
        atol=1e-5)


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
        xchecks.check_config(_config(**{"train.monitor": "val_loss"}))
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
