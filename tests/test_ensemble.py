"""Ensembles (``config.model.ensemble_size``, :mod:`xmc_tf.job.ensemble`): the
averaged model against a NumPy mean of its members' scores, its reload and
SavedModel export, the job's members (seeds, shared validation split,
reuse on rerun, config checks)."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from xmc_tf.job import artifacts
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf import metrics, saving
from xmc_tf import decoding
from xmc_tf.job import ensemble, heads
from xmc_tf.layers import FusedScores, ScoreAverage, UniformSparseDense
from xmc_tf.errors import ConfigError
from xmc_tf.job.preprocessing import load_for_model
from xmc_tf.job.workdir import Workdir
from xmc_tf.job.checks import check_config
from xmc_tf.job.run import member_config, train_and_evaluate
from xmc_tf.job.inputs import validation_split


SYN = "synthetic:num_instances=300,num_features=80,num_labels=20,seed=1"


def _dense_member(seed, d=5, m=4):
    x = keras.Input((d,))
    y = keras.layers.Dense(m, kernel_initializer=keras.initializers.
                           RandomNormal(seed=seed))(x)
    return keras.Model(x, y)


def test_average_scores_is_the_mean_of_the_members():
    members = [_dense_member(s) for s in range(3)]
    x = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    want = np.mean([m(x).numpy() for m in members], axis=0)
    model = ensemble.average_scores(members)
    np.testing.assert_allclose(model(x).numpy(), want, rtol=1e-6, atol=1e-6)
    assert [m.name for m in model.layers if isinstance(m, keras.Model)] == [
        "member_0", "member_1", "member_2"]
    # Decoded as its first member: the average lists it first.
    assert decoding.scoring_layer(model) is decoding.scoring_layer(members[0])


def test_average_scores_rejects_members_of_other_shapes():
    with pytest.raises(ValueError, match="at least one"):
        ensemble.average_scores([])
    with pytest.raises(ValueError, match="different inputs"):
        ensemble.average_scores([_dense_member(0, d=5), _dense_member(1, d=6)])
    x = keras.Input((5,))
    with pytest.raises(ValueError, match="one shape"):
        ScoreAverage()([keras.layers.Dense(3)(x),
                                 keras.layers.Dense(4)(x)])


def _config(**overrides):
    c = xconfig.get_config("uniform_sparse")
    c.data.train = c.data.test = SYN
    c.model.update(encoder_dims=(16,), intermediate_dim=32,
                   connections_per_label=8, wide_connections=4)
    c.train.update(epochs=2, batch_size=32, verbose=0)
    c.set.every_n_steps = 3
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def test_member_configs_differ_in_seed_and_share_the_split():
    c = _config(**{"model.ensemble_size": 3})
    c.seed = 5
    members = [member_config(c, i) for i in range(3)]
    assert [m.seed for m in members] == [5, 6, 7]
    assert all(m.data.split_seed == 5 and m.model.ensemble_size == 1
               for m in members)
    assert c.model.ensemble_size == 3 and c.data.split_seed is None
    train = xdata.load_dataset(SYN)
    vals = [validation_split(train, m)[1].features.toarray() for m in members]
    np.testing.assert_array_equal(vals[0], vals[2])
    # a plain run splits with its own seed: another split than seed 6's
    other = _config()
    other.seed = 6
    assert not np.array_equal(
        validation_split(train, other)[1].features.toarray(), vals[0])


def test_ensemble_size_config_checks():
    for bad in (0, -2):
        with pytest.raises(ConfigError, match="ensemble_size"):
            check_config(_config(**{"model.ensemble_size": bad}))
    c = xconfig.get_config("mach")
    c.model.ensemble_size = 2
    with pytest.raises(ConfigError, match="scores every label"):
        check_config(c)


def _scores(model, dataset):
    out = [model(x, training=False).numpy()
           for x, _ in xdata.make_tf_dataset(dataset, 128)]
    return np.concatenate(out)


def test_ensemble_job_averages_its_members_and_reuses_them(tmp_path):
    wd = str(tmp_path / "ens")
    config = _config(**{"model.ensemble_size": 2})
    result = train_and_evaluate(config, wd)
    members = [os.path.join(wd, "members", str(i)) for i in range(2)]
    member_runs = [Workdir(d).check_complete() for d in members]
    seeds = [json.load(open(os.path.join(d, "config.json")))["seed"]
             for d in members]
    assert seeds == [0, 1]
    assert result["ensemble_size"] == 2 and result["epochs"] == sum(
        m["epochs"] for m in member_runs)

    # Independent reference: the NumPy mean of the reloaded members' scores
    # on the normalised test set, ranked and scored by the evaluator.
    test = load_for_model(SYN, wd)
    mean = np.mean([_scores(artifacts.load_model(d), test) for d in members],
                   axis=0)
    ev = metrics.XMCEvaluator(ks=(1, 3, 5))
    ev.update(np.argsort(-mean, axis=1, kind="stable")[:, :5], test.labels)
    want = ev.result()
    for k in ("P@1", "P@3", "P@5"):
        assert result[k] == pytest.approx(want[k], abs=1e-9)
    assert "val_P@1" in result and set(result["members"]) == {"0", "1"}

    # The exported files: model.keras and the SavedModel give those scores.
    model = artifacts.load_model(wd)
    # its members are fused with the tree: the ensemble ranks the mean of
    # their exact scores (a fused layer decodes by shortlist only alone)
    assert isinstance(decoding.scoring_layer(model),
                      (UniformSparseDense, FusedScores))
    assert decoding.scores_every_label(model)
    np.testing.assert_allclose(_scores(model, test), mean, rtol=1e-5,
                               atol=1e-5)
    loaded = saving.load_saved_model(os.path.join(wd, "saved_model"))
    x, _ = xdata.make_tf_dataset(test, 64).take(1).get_single_element()
    out = loaded.serve(x.indices, x.values, x.dense_shape)
    top = tf.math.top_k(mean[:64], k=5)
    np.testing.assert_allclose(out["scores"].numpy(), top.values.numpy(),
                               rtol=1e-5, atol=1e-5)

    # Rerun after losing member 1 and the ensemble's files (a kill before
    # the export): member 0 is reused as it is, member 1 retrained.
    run_id = member_runs[0]["run"]["id"]
    shutil.rmtree(members[1])
    for name in ("metrics.json", "model.keras", "saved_model"):
        path = os.path.join(wd, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    again = train_and_evaluate(config, wd)
    assert Workdir(members[0]).check_complete()["run"]["id"] == run_id
    assert Workdir(members[1]).check_complete()["run"]["complete"]
    assert again["members"]["0"] == result["members"]["0"]

    # A finished member of another config is refused, not reused.
    os.remove(os.path.join(wd, "metrics.json"))
    changed = _config(**{"model.ensemble_size": 2,
                         "model.intermediate_dim": 24})
    with pytest.raises(ConfigError, match="another config"):
        train_and_evaluate(changed, wd)
